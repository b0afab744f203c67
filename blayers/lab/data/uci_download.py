"""`blayers.lab.uci_download`, the UCI downloader, under its earlier name: `python -m
blayers.lab.data.uci_download` still runs it (after importing the data package, which loads
TensorFlow: `python -m blayers.lab.uci_download` starts in a second)."""

import runpy
import sys

from blayers.lab.uci_download import UCI_DATASETS, UCI_DATASETS_URL, download_uci

__all__ = ["UCI_DATASETS", "UCI_DATASETS_URL", "download_uci"]

if __name__ == "__main__":
    sys.argv[0] = "blayers.lab.uci_download"
    runpy.run_module("blayers.lab.uci_download", run_name="__main__", alter_sys=True)
