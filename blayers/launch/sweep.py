"""Run a grid of gin bindings as trainer subprocesses, then tabulate their final metrics.

    python -m blayers.launch.sweep --gin_file=digits_mlp \
        --sweep "mlp.dense_layer=['DenseFlipout','Dense']" --sweep 'seed=[0,1,2]' \
        --parallel 2 --root runs/digits

Each point of the Cartesian product runs `python -m blayers.train` with its bindings in its own
`model_dir` under `--root` (output in `log.txt` there). A failing run does not stop the others.
The sweep writes `results.csv` and `results.md` (one row per run: its bindings, status and final
metrics) and prints the Markdown table. Re-running the same sweep skips finished runs.

Nothing outlives the sweep (`launch.local`, `launch.ray_backend`): Ctrl-C or SIGTERM stops every
trainer, which checkpoints; the tables are written and the sweep exits. A run folder is locked by
its trainer, so a re-run never starts a second trainer on a run that is still going.

The parts: `launch.plan` (the runs of a grid or random search), the backends `launch.local`
and `launch.ray_backend` (one `run_grid` contract), `launch.results` (tables, exit status).
This module is the command line and the experiments' entry (`run_experiment_grid`).
"""

import argparse
import os
import sys

from blayers.launch import local
from blayers.launch.plan import parse_distribution, parse_sweep, plan_random, plan_runs, plan_sweep
from blayers.launch.results import (
    DEFAULT_COLUMNS,
    SUCCESS_STATUSES,
    exit_code,
    mean_se,
    write_experiment_record,
    write_hparams,
    write_results_table,
    write_table,
)

run_grid = local.run_grid  # the default backend

__all__ = [
    "DEFAULT_COLUMNS",
    "SUCCESS_STATUSES",
    "exit_code",
    "exit_stopped",
    "main",
    "mean_se",
    "parse_distribution",
    "parse_sweep",
    "plan_random",
    "plan_runs",
    "plan_sweep",
    "run",
    "run_experiment_grid",
    "run_grid",
    "run_sweep",
    "write_experiment_record",
    "write_hparams",
    "write_table",
]


def run_sweep(args):
    """Runs the planned sweep (`plan_sweep`) on the chosen backend; returns `[(run, bindings,
    status, final metrics)]`."""
    planned, names = plan_sweep(args)
    backend = getattr(args, "backend", "local")
    if backend == "ray":
        from blayers.launch import ray_backend

        rows, stopped = ray_backend.run_grid(planned, args)
    elif backend == "local":
        if getattr(args, "scheduler", None) not in (None, "", "none"):
            raise ValueError(f"--scheduler={args.scheduler}: early stopping needs --backend=ray.")
        rows, stopped = run_grid(planned, args)
    else:
        raise ValueError(f"--backend={backend!r}: use 'local' or 'ray'.")
    markdown = write_results_table(rows, names, args.root, DEFAULT_COLUMNS)
    print("\n" + markdown)
    if stopped:
        raise local.SweepStopped(stopped)
    return rows


# `--refuse_gin_imports` of an experiment's command line: every grid it runs checks its gin
# files and bindings first and passes the flag to its trainers.
REFUSE_GIN_IMPORTS = False
# The runs of this process's experiment grids that failed (the script's exit status is 1).
FAILED_RUNS = []


def check_gin_imports(gin_files, gin_params, planned=()):
    """`--refuse_gin_imports` before any trainer starts: the files, the bindings of every run
    and of the planned grid (`GinImportsRefused` names each import)."""
    from blayers.lab import gin_files as gin_files_lib

    paths = [gin_files_lib.find_config_file(name) for name in gin_files]
    bindings = [f"{name} = {value}" for _, row in planned for name, value in row.items()]
    gin_files_lib.refuse_imports(paths, [*gin_params, *bindings])


def run_experiment_grid(
    planned, root, gin_file, gin_params=(), parallel=1, quiet=True, refuse_imports=None
):
    """`run_grid` of `planned` on each learner's own devices, each run with `gin_file` and
    `gin_params` (`quiet`: and `train.progress = False`, no progress bar), then the runs'
    status table (`runs.md`, `runs.csv` in `root`) and each unfinished run named on stderr:
    what an experiment script does before its own tables. `refuse_imports` (default: the
    command line's `REFUSE_GIN_IMPORTS`) checks the gin before anything starts and passes
    `--refuse_gin_imports` to the trainers. Returns `(results, stopped)` as `run_grid`."""
    refuse = REFUSE_GIN_IMPORTS if refuse_imports is None else refuse_imports
    if refuse:
        check_gin_imports([gin_file], gin_params, planned)
    args = argparse.Namespace(
        refuse_gin_imports=refuse,
        gin_file=[gin_file],
        gin_param=[*(["train.progress = False"] if quiet else []), *gin_params],
        root=root,
        parallel=parallel,
        strategy=None,
        tpu=None,
    )
    write_experiment_record(root, gin_file=gin_file, gin_param=list(gin_params))
    results, stopped = run_grid(planned, args)
    write_table(
        ["run", "status"], [[name, status] for name, _, status, _ in results], args.root, "runs"
    )
    # Each run's status was printed as it ended; failures are named once more at the end.
    for name, _, status, _ in results:
        if status.startswith("failed"):
            print(f"{name}: {status}", file=sys.stderr)
            FAILED_RUNS.append(os.path.join(root, name))
    return results, stopped


def exit_stopped(root, signum=None):
    """Ends an experiment script that a Ctrl-C or SIGTERM stopped: one line, no traceback, and
    the shell's status for that signal (130 for Ctrl-C, 143 for SIGTERM)."""
    print(
        f"Stopped: the running trainers checkpointed under {root}; re-run the same command to "
        "resume (finished runs are skipped).",
        file=sys.stderr,
        flush=True,
    )
    number = signum if isinstance(signum, int) and not isinstance(signum, bool) else 2
    raise SystemExit(128 + int(number))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument(
        "--gin_param", action="append", default=[], help="binding for every run (repeatable)"
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        help="NAME=[V1, V2, ...] (repeatable; the grid is their product)",
    )
    parser.add_argument(
        "--search",
        choices=["grid", "random"],
        default="grid",
        help="grid: the product of --sweep lists; random: --num_samples draws of --sweep "
        "distributions (NAME=loguniform(a, b), uniform, randint, normal, choice([...]) or a list)",
    )
    parser.add_argument("--num_samples", type=int, default=10, help="draws of --search=random")
    parser.add_argument("--seed", type=int, default=0, help="seed of --search=random's draws")
    parser.add_argument(
        "--parallel", type=int, default=1, help="runs at a time (Ray: at most; 0 for no limit)"
    )
    parser.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: subprocesses here; ray: Ray Tune trials (pip install -e '.[ray]')",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster: 'auto' (this node's cluster) or ray://host:10001; default starts a "
        "local Ray instance",
    )
    parser.add_argument(
        "--cpus_per_run",
        type=float,
        default=1,
        help="Ray resources per run (also each trainer's TensorFlow threads)",
    )
    parser.add_argument("--gpus_per_run", type=float, default=0, help="Ray resources per run")
    parser.add_argument(
        "--ray_num_cpus", type=int, default=None, help="CPUs of a local Ray instance (default all)"
    )
    parser.add_argument(
        "--scheduler",
        choices=["none", "asha"],
        default="none",
        help="asha: Ray Tune's ASHA early stopping on --metric (needs --backend=ray)",
    )
    parser.add_argument(
        "--metric", default="eval/nll", help="kind/key of a trainer history record (ASHA)"
    )
    parser.add_argument("--mode", choices=["min", "max"], default="min", help="of --metric")
    parser.add_argument("--grace_period", type=int, default=1, help="ASHA: reports before a stop")
    parser.add_argument("--reduction_factor", type=float, default=2, help="ASHA's halving rate")
    parser.add_argument("--max_t", type=int, default=100, help="ASHA: most reports of a run")
    parser.add_argument("--root", required=True, help="folder of the runs and tables")
    parser.add_argument(
        "--strategy", default=None, help="passed to the trainer (default: the learner's own)"
    )
    parser.add_argument("--tpu", default=None, help="passed to the trainer (--strategy=tpu)")
    parser.add_argument(
        "--refuse_gin_imports",
        action="store_true",
        help="refuse gin files or bindings that import Python modules (checked before any run "
        "starts, and passed to every trainer): gin files are code",
    )
    args = parser.parse_args(argv)
    if args.backend == "local" and args.scheduler != "none":
        parser.error("--scheduler=asha needs --backend=ray.")
    if args.search == "random" and args.num_samples < 1:
        parser.error("--num_samples must be at least 1.")
    try:
        planned, _ = plan_sweep(args)
        for name, _ in planned:  # a name that leaves --root, before anything starts
            local.run_folder(args.root, name)
        if args.refuse_gin_imports:
            check_gin_imports(args.gin_file, args.gin_param, planned)
    except ValueError as error:
        parser.error(str(error))
    try:
        rows = run_sweep(args)
    except KeyboardInterrupt as stopped:  # one line, the status of the signal that stopped it
        print(
            f"Stopped: the running trainers checkpointed under {args.root}; re-run the same "
            "command to resume (finished runs are skipped).",
            file=sys.stderr,
        )
        return 128 + int(getattr(stopped, "signal", 2))
    return exit_code(rows)


def run():
    sys.exit(main())


if __name__ == "__main__":
    run()
