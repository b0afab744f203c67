"""A sweep's results: which runs finished (their `metrics.json`), the results tables
(`results.md`/`.csv`), TensorBoard's HParams view, the experiment record the report reads, and the
sweep's exit status. Shared by every backend and by the experiment scripts.
"""

import csv
import math
import os
import shlex
import sys

from blayers.lab.runs import RunDir
from blayers.lab.runs.files import read_json

__all__ = [
    "DEFAULT_COLUMNS",
    "SUCCESS_STATUSES",
    "elsewhere_status",
    "exit_code",
    "finished",
    "mean_se",
    "stopped_status",
    "write_experiment_record",
    "write_hparams",
    "write_results_table",
    "write_table",
]

DEFAULT_COLUMNS = (
    "accuracy",
    "nll",
    "ece",
    "brier",
    "ood_auroc_entropy",
    "rmse",
    "test_log_likelihood",
    "coverage_95",
)


def finished(model_dir, command=None):
    """A finished run's summary (`metrics.json`), or None. With `command` (the trainer's
    argument list a sweep would start), also None when the run was started with other gin files
    or bindings (its `command.json`): the sweep then starts the trainer, which trains on to a
    longer `train_steps`, scores the run again, or refuses the change naming it, instead of the
    sweep reporting a run of another setting as this one."""
    run = RunDir(model_dir)
    summary = run.metrics()
    if not summary or summary.get("status") != "finished":
        return None
    if command is not None:
        recorded = read_json(run.file(RunDir.COMMAND)) or {}
        wanted = {
            key: [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{key}=")]
            for key in ("gin_file", "gin_param")
        }
        if any(key in recorded and recorded[key] != wanted[key] for key in wanted):
            return None
    return summary


def stopped_status(model_dir):
    """The table's status of a run its sweep stopped (both backends)."""
    return f"stopped (checkpointed; re-run the sweep to resume, {model_dir})"


def write_results_table(rows, names, root, columns):
    metric_names = [c for c in columns if any(c in r[3] for r in rows)]
    metric_names += sorted({k for r in rows for k in r[3]} - set(metric_names))
    header = ["run", *names, "status", *metric_names]
    table = []
    for run_name, bindings, status, metrics in rows:
        table.append(
            [
                run_name,
                *[bindings[n] for n in names],
                status,
                # a metric a finished run lacks does not apply to it (a deterministic model's
                # mutual information); an unfinished run has none
                *[
                    f"{metrics[m]:.4f}" if m in metrics else ("n/a" if metrics else "")
                    for m in metric_names
                ],
            ]
        )
    return write_table(header, table, root)


def mean_se(values):
    """`(mean, standard error)` of a list of numbers (the error is NaN for one value)."""
    values = [float(v) for v in values]
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def write_table(header, rows, root, stem="results"):
    """Writes `stem.csv` and `stem.md` (a Markdown table) in `root`; returns the Markdown."""
    rows = [[str(cell) for cell in row] for row in rows]
    with open(os.path.join(root, f"{stem}.csv"), "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    markdown = "\n".join(lines) + "\n"
    with open(os.path.join(root, f"{stem}.md"), "w") as f:
        f.write(markdown)
    return markdown


def write_hparams(results, root):
    """The grid on TensorBoard's HParams dashboard (`tensorboard --logdir ROOT/hparams`): one
    session per finished run with its bindings as hyper-parameters and its final metrics."""
    finished = [r for r in results if r[2].startswith(("finished", "skipped")) and r[3]]
    if not finished:
        return
    from blayers.lab import cli_env

    tf = cli_env.quiet_tensorflow()  # no start-up log in the sweep's own output
    from tensorboard.plugins.hparams import api as hp

    names = sorted({k for _, bindings, _, _ in finished for k in bindings})
    metrics = sorted(
        {k for *_, final in finished for k, v in final.items() if isinstance(v, (int, float))}
    )
    directory = os.path.join(root, "hparams")
    with tf.summary.create_file_writer(directory).as_default():
        hp.hparams_config(
            hparams=[hp.HParam(n) for n in names], metrics=[hp.Metric(m) for m in metrics]
        )
    for name, bindings, _, final in finished:
        with tf.summary.create_file_writer(os.path.join(directory, name)).as_default():
            hp.hparams({hp.HParam(k): str(bindings.get(k, "")) for k in names}, trial_id=name)
            for key in metrics:
                if isinstance(final.get(key), (int, float)):
                    tf.summary.scalar(key, float(final[key]), step=0)


def write_experiment_record(root, **fields):
    """`root/experiment.json`: the running experiment's command and `fields`, which the
    reproduction report (`experiments.report`) reads."""
    record = {"command": " ".join(shlex.quote(a) for a in _experiment_argv()), **fields}
    RunDir(root).write_experiment(record)


def _experiment_argv():
    """`python -m <module> args...` of the running experiment script (or this sweep)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return ["python", "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    return ["python", *sys.argv]


# A run that ends in one of these did what was asked: an early stop by the scheduler is its
# verdict on the run, not a failure.
SUCCESS_STATUSES = ("finished", "skipped", "stopped early", "running elsewhere")


def elsewhere_status(holder):
    """The table's status of a run another process is training (another sweep on the root)."""
    return (
        f"running elsewhere (PID {holder.get('pid')} on {holder.get('host')}; its result "
        "lands in the run folder)"
    )


def exit_code(rows):
    """0 when every run finished, was skipped, was stopped early by the scheduler or is being
    trained by another process; 1 when any failed (or did not start)."""
    return 0 if all(status.startswith(SUCCESS_STATUSES) for _, _, status, _ in rows) else 1
