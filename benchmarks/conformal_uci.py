"""Conformal regression on the UCI sets, blayers against MAPIE on the same predictions.

For each data set and split (the 20-split format; `--uci_dir` is your folder), with the
split's training rows standardized:

* **split conformal**: an MLP (50 ReLU units, squared error) trained on the first 80% of the
  training rows; the other 20% calibrate `|y - mu(x)|` (`SplitConformalRegressor`);
* **CQR**: the same MLP with a `QuantileOutput` head (levels alpha/2, 0.5, 1 - alpha/2; the
  pinball loss) on the same rows, calibrated on the same 20%
  (`ConformalizedQuantileRegressor`);
* **CV+**: `K` MLPs, model `k` trained on every training row outside fold `k`, trained as one
  network of `K` replicas (`blayers.replicas`: `DenseReparameterization(replicas=K)` with
  deterministic weights); the out-of-fold residuals give the intervals
  (`CrossConformalRegressor`, Barber et al., 2021).

MAPIE 1.6 computes each method's intervals from the same predictions (its estimators are
wrappers that return blayers' numbers); the table gives the test coverage and the mean width (in
the target's units) of both, and the largest difference between their interval ends.

    python benchmarks/conformal_uci.py --uci_dir=YOUR/UCI --out benchmarks/results/conformal_uci.json
"""

import argparse
import os
import sys
import time

import numpy as np
from common import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

METHODS = ("split_conformal", "cqr", "cv_plus")
LABELS = {"split_conformal": "split conformal", "cqr": "CQR", "cv_plus": "CV+"}


def _arrays(data):
    from blayers.lab.tasks.base import features, targets

    return (
        features(data.train).astype("float32"),
        targets(data.train)[:, 0].astype("float32"),
        features(data.test).astype("float32"),
        targets(data.test)[:, 0].astype("float32"),
    )


def _mlp(d, head, replicas=None):
    import keras

    from blayers.layers import DenseReparameterization

    if replicas is None:
        hidden = keras.layers.Dense(50, activation="relu")
        return keras.Sequential([keras.Input((d,)), hidden, head])
    dense = {"kernel_initializer": "glorot_uniform", "replicas": replicas}
    return keras.Sequential(
        [
            keras.Input((None, d)),
            DenseReparameterization(50, activation="relu", **dense),
            DenseReparameterization(1, **dense),
        ]
    )


def _fit(model, loss, xs, ys, steps, seed, batch=64):
    """Adam on `loss(y, prediction)` summed over replicas; `xs [R, n, d]` or `[n, d]`."""
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.Adam(1e-3)
    rng = np.random.default_rng(seed)
    replicated = xs.ndim == 3

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(tf.reduce_mean(loss(y, model(x, training=True)), axis=-1))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    n = xs.shape[-2]
    for _ in range(steps):
        if replicated:  # each replica its own batch of its own rows
            rows = np.stack([rng.choice(n, min(batch, n), replace=False) for _ in xs])
            step(np.take_along_axis(xs, rows[..., None], 1), np.take_along_axis(ys, rows, 1))
        else:
            rows = rng.choice(n, min(batch, n), replace=False)
            step(xs[rows], ys[rows])
    return model


def one_split(name, split, uci_dir, alpha, folds, steps, seed):
    import keras
    import mapie.regression as mapie_regression
    from sklearn.base import BaseEstimator, RegressorMixin
    from sklearn.model_selection import KFold

    from blayers.lab.data.uci import uci
    from blayers.layers import QuantileOutput
    from blayers.layers.quantile import pinball_loss
    from blayers.posthoc import (
        ConformalizedQuantileRegressor,
        CrossConformalRegressor,
        SplitConformalRegressor,
    )

    class Fixed(RegressorMixin, BaseEstimator):
        """Predicts `values[row]` for index rows: MAPIE sees blayers' predictions."""

        def __init__(self, values=None):
            self.values = values

        def fit(self, x, y):
            self.n_features_in_ = 1
            return self

        def predict(self, x):
            return self.values[np.asarray(x)[:, 0].astype(int)]

    class FoldModel(Fixed):
        """A CV+ fold's model: `fit` finds the fold from the rows it is given."""

        def __init__(self, table=None, fold_of=None):
            self.table, self.fold_of = table, fold_of

        def fit(self, x, y):
            kept = np.zeros(len(self.fold_of), bool)
            kept[np.asarray(x)[:, 0].astype(int)] = True
            folds = np.unique(self.fold_of[~kept])
            # MAPIE also fits one model on every row (its point predictions, not the
            # intervals): the folds' mean stands in for it.
            self.values = self.table[folds[0]] if len(folds) == 1 else self.table.mean(0)
            self.n_features_in_ = 1
            return self

    data = uci(name, split=split, root=uci_dir)
    x, y, x_test, y_test = _arrays(data)
    scale = float(data.target_scale)
    n, d = x.shape
    cut = int(0.8 * n)
    row = {"dataset": name, "split": split}
    keras.utils.set_random_seed(seed)
    start = time.perf_counter()

    def score(lower, upper, theirs):
        inside = (y_test >= lower) & (y_test <= upper)
        return {
            "coverage": float(np.mean(inside)),
            "width": float(np.mean(upper - lower) * scale),
            "mapie_coverage": float(np.mean((y_test >= theirs[0]) & (y_test <= theirs[1]))),
            "mapie_width": float(np.mean(theirs[1] - theirs[0]) * scale),
            "max_difference": float(
                max(np.max(np.abs(lower - theirs[0])), np.max(np.abs(upper - theirs[1]))) * scale
            ),
        }

    all_x = np.concatenate([x, x_test])
    index = np.arange(len(all_x))[:, None]
    cal_rows, test_rows = index[cut:n], index[n:]

    # Split conformal on a mean network.
    mean_model = _fit(
        _mlp(d, keras.layers.Dense(1)),
        lambda t, p: keras.ops.square(t - p[:, 0]),
        x[:cut],
        y[:cut],
        steps,
        seed,
    )
    means = mean_model.predict(all_x, verbose=0)[:, 0].astype(np.float64)
    ours = SplitConformalRegressor(alpha).fit(means[cut:n], y[cut:])
    mapie = mapie_regression.SplitConformalRegressor(
        Fixed(means).fit(index, None), confidence_level=1 - alpha, prefit=True
    )
    mapie.conformalize(cal_rows, y[cut:])
    _, intervals = mapie.predict_interval(test_rows)
    row["split_conformal"] = score(
        *ours.predict_interval(means[n:]), (intervals[:, 0, 0], intervals[:, 1, 0])
    )

    # CQR on a quantile network.
    levels = (alpha / 2, 0.5, 1 - alpha / 2)
    quantile_model = _fit(
        _mlp(d, QuantileOutput(1, quantiles=levels)),
        lambda t, p: pinball_loss(t[:, None], p, levels)[..., None],
        x[:cut],
        y[:cut],
        steps,
        seed,
    )
    q = quantile_model.predict(all_x, verbose=0)[:, 0].astype(np.float64)
    ours = ConformalizedQuantileRegressor(alpha).fit(q[cut:n, 0], q[cut:n, 2], y[cut:])
    mapie = mapie_regression.ConformalizedQuantileRegressor(
        [Fixed(q[:, i]).fit(index, None) for i in (0, 2, 1)],
        confidence_level=1 - alpha,
        prefit=True,
    )
    mapie.conformalize(cal_rows, y[cut:])
    _, intervals = mapie.predict_interval(test_rows, symmetric_correction=True)
    row["cqr"] = score(
        *ours.predict_interval(q[n:, 0], q[n:, 2]), (intervals[:, 0, 0], intervals[:, 1, 0])
    )

    # CV+: K fold models trained as K replicas of one network.
    cv = KFold(folds)
    fold_of = np.empty(n, int)
    kept = []
    for fold, (train, held_out) in enumerate(cv.split(x)):
        fold_of[held_out] = fold
        kept.append(train)
    size = min(len(k) for k in kept)  # replicas train on rows of one count
    rng = np.random.default_rng(seed)
    kept = [rng.permutation(k)[:size] for k in kept]
    replicas = _fit(
        _mlp(d, None, replicas=folds),
        lambda t, p: keras.ops.square(t - p[..., 0]),
        np.stack([x[k] for k in kept]),
        np.stack([y[k] for k in kept]),
        steps,
        seed,
    )
    table = keras.ops.convert_to_numpy(replicas(np.broadcast_to(all_x, (folds, *all_x.shape))))[
        ..., 0
    ].astype(np.float64)
    out_of_fold = table[fold_of, np.arange(n)]
    ours = CrossConformalRegressor(alpha).fit(out_of_fold, y, fold_of)
    lower, upper = ours.predict_interval(table[:, n:])
    mapie = mapie_regression.CrossConformalRegressor(
        FoldModel(table, fold_of), confidence_level=1 - alpha, method="plus", cv=cv
    )
    mapie.fit_conformalize(index[:n], y)
    _, intervals = mapie.predict_interval(test_rows)
    row["cv_plus"] = score(lower, upper, (intervals[:, 0, 0], intervals[:, 1, 0]))
    row["seconds"] = time.perf_counter() - start
    return row


def summarize(rows):
    table = {}
    for name in dict.fromkeys(r["dataset"] for r in rows):
        group = [r for r in rows if r["dataset"] == name]
        entry = {"splits": len(group)}
        for method in METHODS:
            for key in ("coverage", "width", "mapie_coverage", "mapie_width"):
                values = np.array([r[method][key] for r in group])
                se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else np.nan
                entry[f"{method}/{key}"] = (float(values.mean()), float(se))
            entry[f"{method}/max_difference"] = max(r[method]["max_difference"] for r in group)
        table[name] = entry
    return table


def markdown(table, alpha):
    lines = [
        (
            f"Target coverage {1 - alpha:.2f}; coverage and mean width (target units) on the "
            "test rows, mean ± standard error over splits; blayers / MAPIE on the same "
            "predictions."
        ),
        "",
        (
            "| data set | splits | method | coverage | width | MAPIE coverage | MAPIE width | "
            "largest end difference |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in table.items():
        for method in METHODS:
            cells = []
            for key, digits in (("coverage", 3), ("width", 2)):
                for prefix in ("", "mapie_"):
                    mean, se = entry[f"{method}/{prefix}{key}"]
                    cells.append(
                        f"{mean:.{digits}f}" + ("" if np.isnan(se) else f" ± {se:.{digits}f}")
                    )
            cells = [cells[0], cells[2], cells[1], cells[3]]
            lines.append(
                f"| {name} | {entry['splits']} | {LABELS[method]} | "
                + " | ".join(cells)
                + f" | {entry[f'{method}/max_difference']:.1e} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uci_dir", required=True, help="your folder of UCI data-set folders")
    from blayers.experiments.uci_regression import DATASETS  # the UCI table's seven sets

    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--splits", type=int, default=5, help="the first N splits of each set")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--folds", type=int, default=5, help="K of CV+")
    parser.add_argument("--steps", type=int, default=3000, help="Adam steps of each network")
    parser.add_argument("--out", default="benchmarks/results/conformal_uci.json")
    args = parser.parse_args(argv)
    from blayers.lab.data.uci import uci_num_splits

    start = time.perf_counter()
    rows = []
    for name in args.datasets.split(","):
        for split in range(min(args.splits, uci_num_splits(name, args.uci_dir))):
            row = one_split(name, split, args.uci_dir, args.alpha, args.folds, args.steps, split)
            rows.append(row)
            print(f"[conformal] {name} split {split}: {row}", flush=True)
    table = summarize(rows)
    write_results(
        args.out,
        {
            "alpha": args.alpha,
            "folds": args.folds,
            "steps": args.steps,
            "wall_seconds": time.perf_counter() - start,
            "rows": rows,
            "table": table,
        },
        markdown(table, args.alpha),
    )
    return table


if __name__ == "__main__":
    main()
