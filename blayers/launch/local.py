"""The local backend: each run a `python -m blayers.train` subprocess on this machine,
`--parallel` at a time.

A backend is a function `run_grid(planned, args) -> (rows, stopped)`: `planned` is
`[(run_name, {binding: value text})]` (`launch.plan`), `args` the sweep's options (`root`,
`gin_file`, `gin_param`, `parallel`, `strategy`, `tpu`, ...); `rows` is `[(run, bindings,
status, final metrics)]` and `stopped` is true when a Ctrl-C or SIGTERM stopped (and
checkpointed) the runs. `launch.ray_backend.run_grid` is the other one.

Nothing outlives the sweep: each trainer gets the parent-death signal SIGTERM (Linux
`prctl(PR_SET_PDEATHSIG)`), so `kill -9` of the sweep stops its trainers, which checkpoint on
SIGTERM; Ctrl-C or SIGTERM of the sweep forwards SIGTERM to every running trainer and waits
for their checkpoints.

Trainers that share the machine share its cores: with `--parallel=N` each gets TensorFlow
thread pools of `cores // N` threads (at least one; `TF_NUM_INTRAOP_THREADS` and
`TF_NUM_INTEROP_THREADS`, unless you set them), not pools the size of the machine each, whose
threads would contend for the same cores (`benchmarks/sweep_threads.py`).
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

from blayers.launch.results import elsewhere_status, finished, stopped_status, write_hparams

__all__ = [
    "THREAD_VARIABLES",
    "die_with_parent",
    "run_grid",
    "thread_env",
    "trainer_command",
    "trainer_env",
]

THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def die_with_parent():
    """In the child, before exec: SIGTERM when the sweep dies, however it dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: Ctrl-C and SIGTERM of the sweep still stop the children
        pass


def available_cpus():
    """The cores this process may run on (its affinity where the platform reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def thread_env(threads, environ=None):
    """`environ` (default `os.environ`) with TensorFlow's intra- and inter-op pools of
    `threads` threads, unless it sets them; `threads=None` leaves TensorFlow's defaults (every
    core)."""
    env = dict(os.environ if environ is None else environ)
    if threads is not None:
        for name in THREAD_VARIABLES:
            env.setdefault(name, str(max(1, int(threads))))
    return env


def trainer_env(parallel, cpus=None, environ=None):
    """A trainer's environment when `parallel` run at a time on `cpus` cores (default: this
    process's): `thread_env` of `cpus // parallel` threads (at least one). One run at a time
    keeps TensorFlow's defaults."""
    if parallel is None or parallel < 2:
        return thread_env(None, environ)
    return thread_env((cpus or available_cpus()) // parallel, environ)


def trainer_command(model_dir, bindings, args):
    command = [
        sys.executable,
        "-m",
        "blayers.train",
        f"--model_dir={model_dir}",
    ]
    if args.strategy:  # else the learner's own (one device, or MeshLearner's mesh)
        command.append(f"--strategy={args.strategy}")
    if args.tpu:
        command.append(f"--tpu={args.tpu}")
    if getattr(args, "refuse_gin_imports", False):
        command.append("--refuse_gin_imports")
    command += [f"--gin_file={f}" for f in args.gin_file]
    command += [f"--gin_param={p}" for p in args.gin_param]
    command += [f"--gin_param={name} = {value}" for name, value in bindings.items()]
    return command


def run_folder(root, run_name):
    """`root/run_name`, refused (ValueError) when the name leaves `root` (`../x`, `/abs`): a
    sweep writes nothing outside its root."""
    folder = os.path.join(root, run_name)
    inside = os.path.normpath(os.path.abspath(root))
    if os.path.commonpath([inside, os.path.normpath(os.path.abspath(folder))]) != inside or (
        os.path.normpath(os.path.abspath(folder)) == inside
    ):
        raise ValueError(
            f"The run name {run_name!r} leaves the root {root!r} ({folder}); a run's folder "
            "must be inside it."
        )
    return folder


class _Run:
    """One trainer subprocess of the grid, its log in `model_dir/log.txt`."""

    def __init__(self, run_name, bindings, args):
        self.name, self.bindings = run_name, bindings
        self.model_dir = run_folder(args.root, run_name)
        self.process, self.result = None, None
        done = finished(self.model_dir, trainer_command(self.model_dir, bindings, args))
        if done:
            self.result = (run_name, bindings, "skipped (finished)", done["final"])

    def held_elsewhere(self):
        """The holder of the run's LOCK when another live process trains it, else None."""
        from blayers.lab.runs import RunDir

        return RunDir(self.model_dir).held_elsewhere()

    def settle(self):
        """A run left to another process: its result once that one finished it."""
        if self.result and self.result[2].startswith("running elsewhere"):
            done = finished(self.model_dir)
            if done:
                self.result = (self.name, self.bindings, "finished (elsewhere)", done["final"])

    def start(self, args, env=None):
        holder = self.held_elsewhere()
        if holder:  # another sweep on this root trains it: not ours to start, nor a failure
            self.result = (self.name, self.bindings, elsewhere_status(holder), {})
            return False
        os.makedirs(self.model_dir, exist_ok=True)
        command = trainer_command(self.model_dir, self.bindings, args)
        log = open(os.path.join(self.model_dir, "log.txt"), "a")  # noqa: SIM115 - child holds it
        log.write(" ".join(command) + "\n")
        log.flush()
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - the sweep starts no threads
        )
        log.close()
        return True

    def poll(self):
        code = self.process.poll()
        if code is None:
            return False
        done = finished(self.model_dir)
        if code == 0 and done:
            self.result = (self.name, self.bindings, "finished", done["final"])
        elif code in (-signal.SIGTERM, 130, 143, -signal.SIGINT):
            status = stopped_status(self.model_dir)
            self.result = (self.name, self.bindings, status, {})
        elif code == 4 and self.held_elsewhere():  # it lost the lock to another sweep's
            self.result = (self.name, self.bindings, elsewhere_status(self.held_elsewhere()), {})
        else:
            status = f"failed (exit {code}, see {self.model_dir}/log.txt)"
            self.result = (self.name, self.bindings, status, {})
        return True


class SweepStopped(KeyboardInterrupt):
    """A Ctrl-C or SIGTERM stopped the sweep (its trainers checkpointed); `signal` is its
    number."""

    def __init__(self, signum):
        super().__init__(f"Stopped by signal {signum}.")
        self.signal = signum


class _Stop:
    """Ctrl-C or SIGTERM of the sweep: stop starting runs and SIGTERM the running ones."""

    def __init__(self):
        self.requested = False
        self.signal = None  # the first signal's number

    def __enter__(self):
        self._previous = {
            s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)
        }
        return self

    def _handle(self, signum, frame):
        self.requested = True
        self.signal = self.signal or signum

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False


def run_grid(planned, args):
    """Runs `[(run_name, {binding: value text})]` as trainer subprocesses, `args.parallel` at
    a time, each in `args.root/run_name` with `args.gin_file` and `args.gin_param`; finished
    runs are skipped. Returns `([(run, bindings, status, final metrics)], stopped)`, `stopped`
    the number of the signal (Ctrl-C's SIGINT or SIGTERM) that stopped (and checkpointed) the
    runs, else None."""
    for name, _ in planned:  # every name, before anything starts
        run_folder(args.root, name)
    runs = [_Run(name, bindings, args) for name, bindings in planned]
    os.makedirs(args.root, exist_ok=True)
    pending = [r for r in runs if r.result is None]
    at_once = min(max(args.parallel, 1), max(len(pending), 1))  # a lone run keeps every core
    env = trainer_env(at_once)
    share = f" ({env[THREAD_VARIABLES[0]]} TensorFlow thread(s) each)" if at_once > 1 else ""
    print(f"Sweep of {len(runs)} run(s) under {args.root}, {args.parallel} at a time{share}.")
    for run_ in runs:
        if run_.result is not None:
            print(f"  {run_.name}: {run_.result[2]}", flush=True)
    running = []
    with _Stop() as stop:
        while pending or running:
            while pending and len(running) < max(args.parallel, 1) and not stop.requested:
                run_ = pending.pop(0)
                if run_.start(args, env):
                    running.append(run_)
                else:
                    print(f"  {run_.name}: {run_.result[2]}", flush=True)
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
    for run_ in runs:
        run_.settle()
    results = [r.result for r in runs]
    write_hparams(results, args.root)
    return results, stop.signal if stop.requested else None
