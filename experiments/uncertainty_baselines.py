"""The uncertainty-baselines CIFAR-10 comparison on one gin config (Nado et al., 2021).

Trains, on the same network (`blayers.lab.models.uncertainty_baseline`) and data, the deterministic
network, MC dropout, a mean-field Flipout BNN, a rank-1 BNN and BatchEnsemble (4 members each)
and SNGP, one run per method (`uncertainty_baseline.method`), and writes per method: accuracy,
NLL, ECE, OOD AUROC (predictive entropy), training time and parameter count (trainable, and as
a multiple of the deterministic network's).

    python -m experiments.uncertainty_baselines --root=runs/ub_cifar10          # WRN-28-10
    python -m experiments.uncertainty_baselines --gin_file=uncertainty_baselines_smoke \
        --root=runs/ub_smoke --parallel=2                                      # digits, CPU

Resume, failures and Ctrl-C are the sweep's. Writes `results.md`, `results.csv` and
`results.json` in `--root`.
"""

import json
import os

from absl import app, flags

from blayers.lab.runs import RunDir
from launch import sweep

METHODS = ("deterministic", "mc_dropout", "flipout", "rank1", "batch_ensemble", "sngp")
LABELS = {
    "deterministic": "Deterministic",
    "mc_dropout": "MC dropout",
    "flipout": "Mean-field VI (Flipout)",
    "rank1": "Rank-1 BNN (4)",
    "batch_ensemble": "BatchEnsemble (4)",
    "sngp": "SNGP",
}
METRICS = (
    ("accuracy", "accuracy"),
    ("NLL", "nll"),
    ("ECE", "ece"),
    ("OOD AUROC", "ood_auroc_entropy"),
)

FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags (defined only when run as a script)."""
    flags.DEFINE_string("root", "runs/uncertainty_baselines", "Folder of the runs and tables.")
    flags.DEFINE_list("methods", list(METHODS), f"Methods, among {', '.join(METHODS)}.")
    flags.DEFINE_string("gin_file", "uncertainty_baselines_cifar10", "Gin file of every run.")
    flags.DEFINE_multi_string("gin_param", [], "Gin bindings of every run.")
    flags.DEFINE_integer("parallel", 1, "Runs at a time.")


def plan(methods):
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise app.UsageError(f"Unknown method(s) {unknown}; choose among {list(METHODS)}.")
    return [(method, {"uncertainty_baseline.method": repr(method)}) for method in methods]


def summarize(results, root):
    """One row per finished method: its metrics, seconds and parameters."""
    rows = []
    for name, _, status, final in results:
        if not status.startswith(("finished", "skipped")):
            continue
        summary = RunDir(os.path.join(root, name)).metrics()
        rows.append(
            {
                "method": name,
                **{key: final.get(key) for _, key in METRICS},
                "train_seconds": summary["train_seconds"],
                "parameters": summary["parameters"]["trainable"],
            }
        )
    base = next((r["parameters"] for r in rows if r["method"] == "deterministic"), None)
    for row in rows:
        row["parameter_ratio"] = row["parameters"] / base if base else None
    return rows


def _cell(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def write_tables(rows, root):
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    header = ["method", *[label for label, _ in METRICS], "train s", "parameters", "x det."]
    table = [
        [
            LABELS[r["method"]],
            *[_cell(r[key]) for _, key in METRICS],
            f"{r['train_seconds']:.0f}",
            f"{r['parameters']:,}",
            _cell(r["parameter_ratio"], 2),
        ]
        for r in rows
    ]
    markdown = sweep.write_table(header, table, root)
    print("\nTest metrics per method (one run each):\n" + markdown)
    return markdown


def run_experiment(root, methods, gin_file, gin_params, parallel):
    results, stopped = sweep.run_experiment_grid(
        plan(methods), root, gin_file, gin_params, parallel
    )
    rows = summarize(results, root)
    write_tables(rows, root)
    if stopped:
        sweep.exit_stopped(root)
    return rows


def main(argv):
    del argv
    run_experiment(FLAGS.root, FLAGS.methods, FLAGS.gin_file, FLAGS.gin_param, FLAGS.parallel)


if __name__ == "__main__":
    define_flags()
    app.run(main)
