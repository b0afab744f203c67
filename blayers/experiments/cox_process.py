"""The Cox process of the paper's Figure 8 (Sec. 2.5) on real point patterns.

A GP prior on the rate, softplus, `PoissonProcess` (model program) and sparse GP layers
(posterior program), fitted by variational inference over the two programs
(`blayers.lab.models.cox_process`), on the coal-mining disasters (1-D) and the bramble canes (2-D),
each split `--splits` times by independent thinning (half the events held out). Writes a table
of the held-out log-likelihood per held-out event (original units, mean +- standard error over
splits) of the Cox process, the kernel-intensity baseline and the homogeneous process; each run
keeps its `intensity.png` (posterior mean and 5-95% band with the events).

    python -m blayers.experiments.cox_process --root=runs/cox --splits=5 --parallel=2
    python -m blayers.experiments.cox_process --gin_file=cox_process_smoke --splits=2 --root=runs/cox_smoke

Resume, failures and Ctrl-C are the sweep's. Writes `results.md`, `results.csv`,
`results.json` in `--root`.
"""

import json
import os

from absl import app, flags

from blayers.experiments.base import Experiment, ReportEntry
from blayers.launch import sweep

# The 2-D pattern needs more inducing points and a coarser grid per dimension.
PATTERN_BINDINGS = {
    "coal": {},
    "brambles": {
        "cox_process.num_inducing": "64",
        "cox_process.num_quadrature_points": "16",
        "cox_process.num_samples": "2",
    },
}
METRICS = [
    ("Cox process (ours)", "test_log_likelihood"),
    ("kernel intensity", "kde_test_log_likelihood"),
    ("homogeneous", "homogeneous_test_log_likelihood"),
]


def plan(patterns, splits):
    runs = []
    for pattern in patterns:
        if pattern not in PATTERN_BINDINGS:
            raise app.UsageError(f"Unknown pattern {pattern!r}; one of {list(PATTERN_BINDINGS)}.")
        for split in range(splits):
            bindings = {
                "point_pattern.name": repr(pattern),
                "point_pattern.split_seed": str(split),
                **PATTERN_BINDINGS[pattern],
            }
            runs.append((f"{pattern}_split{split}", bindings))
    return runs


def summarize(results):
    groups = {}
    for name, _, status, final in results:
        if status.startswith(("finished", "skipped")):
            groups.setdefault(name.rsplit("_split", 1)[0], []).append(final)
    rows = []
    for pattern, finals in groups.items():
        row = {"pattern": pattern, "splits": len(finals)}
        for _, key in METRICS:
            # per held-out event: the splits hold out different counts
            row[key] = sweep.mean_se([f[key] / f["test_count"] for f in finals])
        row["elbo_per_point"] = sweep.mean_se([f["train_elbo_per_point"] for f in finals])
        rows.append(row)
    return rows


def write_tables(rows, root):
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    header = ["pattern", "splits", *[label for label, _ in METRICS]]
    table = [
        [r["pattern"], r["splits"], *[f"{r[k][0]:.3f} +- {r[k][1]:.3f}" for _, k in METRICS]]
        for r in rows
    ]
    markdown = sweep.write_table(header, table, root)
    print("\nHeld-out log-likelihood per held-out event (nats, original units):\n" + markdown)
    return markdown


class CoxProcess(Experiment):
    name = "cox_process"
    gin_file = "cox_process_coal"
    report = ReportEntry(
        "fig8",
        "Figure 8: Cox process (probabilistic programs, GP layers, PoissonProcess)",
        "A code figure: the paper reports no number.",
        order=8,
        gin_prefixes=("cox_process",),
        experiments=("cox_process",),
        command="python -m blayers.experiments.cox_process --gin_file=cox_process_smoke --splits=2 "
        "--root=runs/cox --parallel=2",
    )

    def define_options(self):
        flags.DEFINE_list("patterns", list(PATTERN_BINDINGS), "Point patterns.")
        flags.DEFINE_integer("splits", 5, "Independent-thinning splits of each pattern.")

    def plan(self, patterns, splits):
        return plan(patterns, splits)

    def summarize(self, root, results):
        rows = summarize(results)
        write_tables(rows, root)
        return rows


EXPERIMENT = CoxProcess()


def run_experiment(root, patterns, splits, gin_file, gin_params, parallel):
    return EXPERIMENT.run(root, gin_file, gin_params, parallel, patterns=patterns, splits=splits)


if __name__ == "__main__":
    EXPERIMENT.main()
