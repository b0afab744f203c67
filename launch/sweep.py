"""Run a grid of gin bindings as trainer subprocesses, then tabulate their final metrics.

    python -m launch.sweep --gin_file=digits_mlp \
        --sweep "mlp.dense_layer=['DenseFlipout','Dense']" --sweep 'seed=[0,1,2]' \
        --parallel 2 --root runs/digits

Each point of the Cartesian product runs `python -m blayers.train` with its bindings in its own
`model_dir` under `--root` (output in `log.txt` there). A failing run does not stop the others.
The sweep writes `results.csv` and `results.md` (one row per run: its bindings, status and final
metrics) and prints the Markdown table. Re-running the same sweep skips finished runs.

Nothing outlives the sweep: each trainer gets the parent-death signal SIGTERM (Linux
`prctl(PR_SET_PDEATHSIG)`), so `kill -9` of the sweep stops its trainers, which checkpoint on
SIGTERM; Ctrl-C or SIGTERM of the sweep forwards SIGTERM to every running trainer, waits for
their checkpoints, writes the tables and exits. A run folder is locked by its trainer, so a
re-run never starts a second trainer on a run that is still going.
"""

import argparse
import ast
import csv
import ctypes
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np

__all__ = [
    "main",
    "parse_distribution",
    "parse_sweep",
    "plan_random",
    "plan_runs",
    "plan_sweep",
    "run",
    "run_grid",
    "run_sweep",
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


def _split_top_level(text):
    """Splits `a, [b, c], 'd,e'` at top-level commas."""
    parts, depth, quote, current = [], 0, None, ""
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def parse_sweep(spec):
    """`'name=[v1, v2]'` -> `(name, ['v1', 'v2'])` with each value as gin text."""
    if "=" not in spec:
        raise ValueError(f"--sweep {spec!r}: expected NAME=[VALUE, ...].")
    name, values = (s.strip() for s in spec.split("=", 1))
    if not (values.startswith("[") and values.endswith("]")):
        raise ValueError(f"--sweep {spec!r}: the values must be a [list].")
    try:
        texts = [repr(v) for v in ast.literal_eval(values)]
    except (ValueError, SyntaxError):  # gin references such as @DenseFlipout
        texts = _split_top_level(values[1:-1])
    if not texts:
        raise ValueError(f"--sweep {spec!r}: no values.")
    return name, texts


# Random search: `NAME=dist(args)`, sampled with numpy from `--seed` (so a re-run draws the
# same runs and resumes them). A plain list is `choice`.
DISTRIBUTIONS = {
    "uniform": lambda rng, low, high: rng.uniform(low, high),
    "loguniform": lambda rng, low, high: float(np.exp(rng.uniform(np.log(low), np.log(high)))),
    "randint": lambda rng, low, high: int(rng.integers(low, high)),  # high excluded
    "normal": lambda rng, mean, stddev: rng.normal(mean, stddev),
    "choice": lambda rng, values: values[int(rng.integers(len(values)))],
}


def parse_distribution(spec):
    """`'name=loguniform(1e-4, 1e-2)'` -> `(name, 'loguniform', (1e-4, 1e-2))`; a list
    `'name=[a, b]'` -> `(name, 'choice', ([a, b],))` (values as Python literals)."""
    if "=" not in spec:
        raise ValueError(f"--sweep {spec!r}: expected NAME=dist(args) or NAME=[VALUE, ...].")
    name, text = (s.strip() for s in spec.split("=", 1))
    match = re.fullmatch(r"(\w+)\((.*)\)", text, re.DOTALL)
    if match is None:
        if text.startswith("["):
            return name, "choice", (ast.literal_eval(text),)
        raise ValueError(f"--sweep {spec!r}: expected dist(args) or a [list].")
    kind, arg_text = match.groups()
    if kind not in DISTRIBUTIONS:
        raise ValueError(
            f"--sweep {spec!r}: unknown distribution {kind!r} ({sorted(DISTRIBUTIONS)})."
        )
    try:
        args = ast.literal_eval(f"({arg_text},)")
    except (ValueError, SyntaxError):
        raise ValueError(f"--sweep {spec!r}: the arguments must be Python literals.") from None
    if kind == "loguniform" and not 0 < args[0] < args[1]:
        raise ValueError(f"--sweep {spec!r}: loguniform needs 0 < low < high.")
    return name, kind, args


def _short(value):
    """A sampled float rounded to 6 significant digits (its binding and its run name agree)."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def plan_random(specs, num_samples, seed=0):
    """`[(run_name, {name: value_text})]`: `num_samples` draws of the distributions `specs`
    (`parse_distribution` strings) from a numpy generator seeded with `seed`."""
    parsed = [parse_distribution(s) for s in specs]
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(num_samples):
        values = {name: _short(DISTRIBUTIONS[kind](rng, *args)) for name, kind, args in parsed}
        label = "_".join(f"{_slug(n.split('.')[-1])}-{_slug(repr(v))}" for n, v in values.items())
        runs.append((f"trial{i:03d}_{label}"[:120], {n: repr(v) for n, v in values.items()}))
    return runs


def _slug(text):
    return re.sub(r"[^A-Za-z0-9_.-]+", "", text.replace(" ", ""))[:40] or "v"


def plan_runs(sweeps):
    """`[(run_name, {name: value_text})]` for the Cartesian product of the sweeps."""
    names = [name for name, _ in sweeps]
    runs, seen = [], set()
    for values in itertools.product(*[texts for _, texts in sweeps]):
        bindings = dict(zip(names, values))
        run_name = "_".join(f"{_slug(n.split('.')[-1])}-{_slug(v)}" for n, v in bindings.items())
        run_name = run_name or "run"
        base, i = run_name, 1
        while run_name in seen:
            run_name, i = f"{base}-{i}", i + 1
        seen.add(run_name)
        runs.append((run_name, bindings))
    return runs


def _finished(model_dir):
    path = os.path.join(model_dir, "metrics.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    return summary if summary.get("status") == "finished" else None


def stopped_status(model_dir):
    """The table's status of a run its sweep stopped (both backends)."""
    return f"stopped (checkpointed; re-run the sweep to resume, {model_dir})"


def _die_with_parent():
    """In the child, before exec: SIGTERM when the sweep dies, however it dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: Ctrl-C and SIGTERM of the sweep still stop the children
        pass


def _command(model_dir, bindings, args):
    command = [
        sys.executable,
        "-m",
        "blayers.train",
        f"--model_dir={model_dir}",
        f"--strategy={args.strategy}",
    ]
    if args.tpu:
        command.append(f"--tpu={args.tpu}")
    command += [f"--gin_file={f}" for f in args.gin_file]
    command += [f"--gin_param={p}" for p in args.gin_param]
    command += [f"--gin_param={name} = {value}" for name, value in bindings.items()]
    return command


class _Run:
    """One trainer subprocess of the grid, its log in `model_dir/log.txt`."""

    def __init__(self, run_name, bindings, args):
        self.name, self.bindings = run_name, bindings
        self.model_dir = os.path.join(args.root, run_name)
        self.process, self.result = None, None
        done = _finished(self.model_dir)
        if done:
            self.result = (run_name, bindings, "skipped (finished)", done["final"])

    def start(self, args):
        os.makedirs(self.model_dir, exist_ok=True)
        command = _command(self.model_dir, self.bindings, args)
        log = open(os.path.join(self.model_dir, "log.txt"), "a")  # noqa: SIM115 - child holds it
        log.write(" ".join(command) + "\n")
        log.flush()
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - the sweep starts no threads
        )
        log.close()

    def poll(self):
        code = self.process.poll()
        if code is None:
            return False
        done = _finished(self.model_dir)
        if code == 0 and done:
            self.result = (self.name, self.bindings, "finished", done["final"])
        elif code in (-signal.SIGTERM, 130, -signal.SIGINT):
            status = stopped_status(self.model_dir)
            self.result = (self.name, self.bindings, status, {})
        else:
            status = f"failed (exit {code}, see {self.model_dir}/log.txt)"
            self.result = (self.name, self.bindings, status, {})
        return True


class _Stop:
    """Ctrl-C or SIGTERM of the sweep: stop starting runs and SIGTERM the running ones."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        self._previous = {
            s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)
        }
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False


def _write_tables(rows, names, root, columns):
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
                *[f"{metrics[m]:.4f}" if m in metrics else "" for m in metric_names],
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


def plan_sweep(args):
    """`(planned runs, binding names)` of the `--sweep` grid (their product) or, with
    `--search=random`, of `--num_samples` draws of their distributions."""
    search = getattr(args, "search", "grid")
    if search == "random":
        planned = plan_random(args.sweep, args.num_samples, args.seed)
        return planned, [parse_distribution(s)[0] for s in args.sweep]
    if search != "grid":
        raise ValueError(f"--search={search!r}: use 'grid' or 'random'.")
    for spec in args.sweep:
        if re.fullmatch(r"[^=]+=\s*\w+\(.*\)\s*", spec, re.DOTALL):
            raise ValueError(f"--sweep {spec!r}: a distribution needs --search=random.")
    sweeps = [parse_sweep(s) for s in args.sweep]
    return plan_runs(sweeps), [n for n, _ in sweeps]


def run_sweep(args):
    """Runs the planned sweep (`plan_sweep`) on the chosen backend; returns `[(run, bindings,
    status, final metrics)]`."""
    planned, names = plan_sweep(args)
    backend = getattr(args, "backend", "local")
    if backend == "ray":
        from launch import ray_backend

        rows, stopped = ray_backend.run_grid(planned, args)
    elif backend == "local":
        if getattr(args, "scheduler", None) not in (None, "", "none"):
            raise ValueError(f"--scheduler={args.scheduler}: early stopping needs --backend=ray.")
        rows, stopped = run_grid(planned, args)
    else:
        raise ValueError(f"--backend={backend!r}: use 'local' or 'ray'.")
    markdown = _write_tables(rows, names, args.root, DEFAULT_COLUMNS)
    print("\n" + markdown)
    if stopped:
        raise KeyboardInterrupt
    return rows


def run_experiment_grid(planned, root, gin_file, gin_params=(), parallel=1, quiet=True):
    """`run_grid` of `planned` on CPU, each run with `gin_file` and `gin_params` (`quiet`: and
    `train.progress = False`, no progress bar), then the runs' status table (`runs.md`, `runs.csv` in `root`) and each unfinished run
    named on stderr: what an experiment script does before its own tables. Returns
    `(results, stopped)` as `run_grid`."""
    args = argparse.Namespace(
        gin_file=[gin_file],
        gin_param=[*(["train.progress = False"] if quiet else []), *gin_params],
        root=root,
        parallel=parallel,
        strategy="cpu",
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
    return results, stopped


def exit_stopped(root):
    """Ends an experiment script that a Ctrl-C or SIGTERM stopped: one line, exit status 130
    (as a shell reports an interrupted command), no traceback."""
    print(
        f"Stopped: the running trainers checkpointed under {root}; re-run the same command to "
        "resume (finished runs are skipped).",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(130)


def run_grid(planned, args):
    """Runs `[(run_name, {binding: value text})]` as trainer subprocesses, `args.parallel` at
    a time, each in `args.root/run_name` with `args.gin_file` and `args.gin_param`; finished
    runs are skipped. Returns `([(run, bindings, status, final metrics)], stopped)`, `stopped`
    true when a Ctrl-C or SIGTERM stopped (and checkpointed) the runs."""
    runs = [_Run(name, bindings, args) for name, bindings in planned]
    os.makedirs(args.root, exist_ok=True)
    print(f"Sweep of {len(runs)} run(s) under {args.root}, {args.parallel} at a time.")
    pending = [r for r in runs if r.result is None]
    for run_ in runs:
        if run_.result is not None:
            print(f"  {run_.name}: {run_.result[2]}", flush=True)
    running = []
    with _Stop() as stop:
        while pending or running:
            while pending and len(running) < max(args.parallel, 1) and not stop.requested:
                run_ = pending.pop(0)
                run_.start(args)
                running.append(run_)
            if stop.requested and running and not getattr(stop, "forwarded", False):
                print("Stopping: SIGTERM to every running trainer (they checkpoint).", flush=True)
                for run_ in running:
                    run_.process.send_signal(signal.SIGTERM)
                stop.forwarded = True
            if stop.requested and not running:
                break
            for run_ in [r for r in running if r.poll()]:
                running.remove(run_)
                print(f"  {run_.name}: {run_.result[2]}", flush=True)
            time.sleep(0.1)
    for run_ in pending:
        run_.result = (run_.name, run_.bindings, "not started (sweep stopped)", {})
    results = [r.result for r in runs]
    write_hparams(results, args.root)
    return results, stop.requested


def write_experiment_record(root, **fields):
    """`root/experiment.json`: the running experiment's command and `fields`, which the
    reproduction report (`experiments.report`) reads."""
    os.makedirs(root, exist_ok=True)
    record = {"command": " ".join(shlex.quote(a) for a in _experiment_argv()), **fields}
    with open(os.path.join(root, "experiment.json"), "w") as f:
        json.dump(record, f, indent=1)


def _experiment_argv():
    """`python -m <module> args...` of the running experiment script (or this sweep)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return ["python", "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    return ["python", *sys.argv]


def write_hparams(results, root):
    """The grid on TensorBoard's HParams dashboard (`tensorboard --logdir ROOT/hparams`): one
    session per finished run with its bindings as hyper-parameters and its final metrics."""
    finished = [r for r in results if r[2].startswith(("finished", "skipped")) and r[3]]
    if not finished:
        return
    import tensorflow as tf
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
    parser.add_argument("--cpus_per_run", type=float, default=1, help="Ray resources per run")
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
    parser.add_argument("--strategy", default="cpu", help="passed to the trainer")
    parser.add_argument("--tpu", default=None, help="passed to the trainer (--strategy=tpu)")
    args = parser.parse_args(argv)
    if args.backend == "local" and args.scheduler != "none":
        parser.error("--scheduler=asha needs --backend=ray.")
    if args.search == "random" and args.num_samples < 1:
        parser.error("--num_samples must be at least 1.")
    try:
        plan_sweep(args)
    except ValueError as error:
        parser.error(str(error))
    try:
        rows = run_sweep(args)
    except KeyboardInterrupt:
        return 130
    return exit_code(rows)


# A run that ends in one of these did what was asked: an early stop by the scheduler is its
# verdict on the run, not a failure.
SUCCESS_STATUSES = ("finished", "skipped", "stopped early")


def exit_code(rows):
    """0 when every run finished, was skipped or was stopped early by the scheduler; 1 when
    any failed (or did not start)."""
    return 0 if all(status.startswith(SUCCESS_STATUSES) for _, _, status, _ in rows) else 1


def run():
    sys.exit(main())


if __name__ == "__main__":
    run()
