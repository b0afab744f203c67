"""The uncertainty-baselines CIFAR-10 comparison on one gin config (Nado et al., 2021).

Trains, on the same network (`blayers.lab.models.uncertainty_baseline`) and data, the deterministic
network, MC dropout, a mean-field Flipout BNN, a rank-1 BNN and BatchEnsemble (4 members each)
and SNGP, one run per method (`uncertainty_baseline.method`), and writes per method: accuracy,
NLL, ECE, OOD AUROC (predictive entropy), training time and parameter count (trainable, and as
a multiple of the deterministic network's).

    python -m blayers.experiments.uncertainty_baselines --root=runs/ub_cifar10          # WRN-28-10
    python -m blayers.experiments.uncertainty_baselines --gin_file=uncertainty_baselines_smoke \
        --root=runs/ub_smoke --parallel=2                                      # digits, CPU

Resume, failures and Ctrl-C are the sweep's. Writes `results.md`, `results.csv` and
`results.json` in `--root`.
"""

import json
import os

from absl import app, flags

from blayers.experiments.base import Experiment, ReportEntry
from blayers.lab.runs import RunDir
from blayers.launch import sweep

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


class UncertaintyBaselines(Experiment):
    name = "uncertainty_baselines"
    gin_file = "uncertainty_baselines_cifar10"
    report = ReportEntry(
        "ub",
        "uncertainty-baselines' CIFAR-10 comparison",
        "Published for WRN-28-10 (uncertainty-baselines, baselines/cifar): deterministic 96.0% / "
        "NLL 0.159 / ECE 0.0231; BatchEnsemble (4) 96.3% / 0.136 / 0.0177; rank-1 BNN (4) "
        "96.3% / 0.128 / 0.008; SNGP 96.0% / 0.134 / 0.007; MC dropout 95.9% / 0.160 / 0.0241.",
        order=20,
        gin_prefixes=("uncertainty_baselines",),
        experiments=("uncertainty_baselines",),
        command="python -m blayers.experiments.uncertainty_baselines "
        "--gin_file=uncertainty_baselines_smoke --root=runs/ub --parallel=2",
    )

    def define_options(self):
        flags.DEFINE_list("methods", list(METHODS), f"Methods, among {', '.join(METHODS)}.")

    def plan(self, methods):
        return plan(methods)

    def summarize(self, root, results):
        rows = summarize(results, root)
        write_tables(rows, root)
        return rows


EXPERIMENT = UncertaintyBaselines()


def run_experiment(root, methods, gin_file, gin_params, parallel):
    return EXPERIMENT.run(root, gin_file, gin_params, parallel, methods=methods)


if __name__ == "__main__":
    EXPERIMENT.main()
