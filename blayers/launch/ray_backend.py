"""The Ray backend of `blayers.launch.sweep`: each run a Ray Tune trial that runs the trainer (the
`run_grid` contract is `launch.local`'s).

    python -m blayers.launch.sweep --gin_file=digits_mlp --sweep 'seed=[0,1,2,3]' --root=/shared/runs \
        --backend=ray --address=auto --cpus_per_run=4 --gpus_per_run=1 --strategy=gpu

A trial is one `python -m blayers.train` subprocess in its own `model_dir` under `--root`, as
with the local backend, so the guarantees are the same: a failing run does not stop the others
(its trial errors, the sweep goes on), the results table is the same, re-running skips
finished runs (their trials return the saved metrics at once) and resumes interrupted ones from
their checkpoints. Each trainer's TensorFlow thread pools have `--cpus_per_run` threads (unless
`TF_NUM_INTRAOP_THREADS` / `TF_NUM_INTEROP_THREADS` are set), so trials packed on a node do
not contend for its cores. While it trains, the trial follows the run's `history.jsonl` and reports
each record to Tune as `kind/key` (`eval/nll`, `train/loss`), which is what ASHA
(`--scheduler=asha --metric=eval/nll --mode=min`) stops trials on.

Nothing outlives the sweep. Ctrl-C or SIGTERM of the sweep writes `--root/STOP`: every trial
sees it, sends its trainer SIGTERM and waits while it checkpoints; the table marks those runs
stopped, and a re-run resumes them. A trainer also gets SIGTERM when its trial's worker process
dies (the parent-death signal, as with the local backend): Ray kills a dead driver's workers,
and a local Ray instance started here dies with its driver, even on `kill -9`. Trainers run in
a process group of their own, so the group-wide SIGKILL with which Ray reaps that instance
does not reach them; they usually checkpoint on the way out, but after `kill -9` that is not
guaranteed (under load Ray's teardown can win), and a re-run resumes from the last periodic
checkpoint. (A local
instance leaves a dying worker's trainer the seconds it needs to checkpoint; a cluster started
with `ray start` kills it at once unless `RAY_kill_child_processes_on_worker_exit=0`, so
there a killed trial resumes from its last periodic checkpoint.)

On a cluster, every node needs blayers installed and `--root` on storage every node sees at
the same path (NFS, a mounted bucket): a trial's run folder is where its node writes, and a
re-run resumes from it on whichever node Tune picks.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from blayers.lab.runs import RunDir
from blayers.launch import local, results

__all__ = ["require_ray", "run_grid"]

EXTRA = "pip install -e '.[ray]'  (or: pip install 'ray[tune]')"
POLL_SECONDS = 0.5
STOP_FILE = "STOP"  # in --root: the sweep asks its trials to stop their trainers


def require_ray():
    """Imports `ray` and `ray.tune`, or fails naming the extra that provides them."""
    try:
        import ray
        from ray import tune
    except ImportError as error:
        raise SystemExit(
            f"--backend=ray needs Ray Tune, which is not installed ({error}). Install the extra: "
            f"{EXTRA}"
        ) from None
    return ray, tune


def _records(path, offset):
    """New complete JSON lines of `path` from byte `offset`: `(records, new offset)`."""
    if not os.path.exists(path):
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1  # a line being written waits for its newline
    records = []
    for line in data[:end].splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records, offset + end


def flatten_record(record):
    """A history record as Tune metrics: `{'eval/nll': ..., 'step': ...}` (numbers only)."""
    kind = record.get("kind", "train")
    metrics = {"step": record["step"]} if "step" in record else {}
    for key, value in record.items():
        if key not in ("kind", "step") and isinstance(value, (int, float)):
            metrics[f"{kind}/{key}"] = value
    return metrics


def _trial(config):
    """One run as a Tune trial: the trainer subprocess, its records reported as it goes."""
    from ray import tune

    spec = config["run"]
    name, model_dir = spec["name"], spec["model_dir"]
    metric = spec["metric"]  # with a scheduler, report only records that carry its metric
    done = results.finished(model_dir, spec["command"])
    if done:  # re-running a sweep skips finished runs (of the same setting)
        tune.report({**_final(done["final"]), "status": "skipped (finished)"})
        return
    os.makedirs(model_dir, exist_ok=True)
    command = spec["command"]
    log = open(os.path.join(model_dir, "log.txt"), "a")  # noqa: SIM115 - the child holds it
    log.write(" ".join(command) + "\n")
    log.flush()
    cwd = spec["cwd"] if os.path.isdir(spec["cwd"]) else None
    trainer = _Trainer(command, log, cwd, local.thread_env(spec.get("threads")))
    log.close()
    history = RunDir(model_dir).file(RunDir.HISTORY)
    # A resumed run's earlier records were reported by its earlier trial: start after its last
    # complete line (the trainer drops a torn one when it resumes).
    _, offset = _records(history, 0)
    # The sweep's stop request is watched apart from this thread, which can block in
    # `tune.report` once the driver stops consuming results.
    stop_file = os.path.join(spec["root"], STOP_FILE)
    threading.Thread(target=trainer.stop_on, args=(stop_file,), daemon=True).start()
    try:
        while True:
            code = trainer.process.poll()
            if trainer.stopping:
                return  # stopped by the sweep; the finally clause waits for its checkpoint
            records, offset = _records(history, offset)
            for record in records:
                metrics = flatten_record(record)
                if metric is None or metric in metrics:
                    tune.report({**metrics, "status": "running"})
            if code is not None:
                break
            time.sleep(POLL_SECONDS)
        done = results.finished(model_dir)
        if code != 0 or not done:
            raise RuntimeError(f"{name}: trainer exit {code}, see {model_dir}/log.txt")
        final = _final(done["final"])
        if metric is not None and metric not in final:
            raise RuntimeError(
                f"--metric={metric!r}: {name}'s records have no such value; its final metrics "
                f"are {sorted(k for k in final if '/' in k)}."
            )
        tune.report({**final, "status": "finished"})
    finally:
        trainer.stop()  # stopped by the scheduler or the sweep: checkpoint and go


class _Trainer:
    """The trial's trainer subprocess; `stop()` sends SIGTERM once (a second would kill it
    before its checkpoint) and waits while it checkpoints."""

    def __init__(self, command, log, cwd, env=None):
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            preexec_fn=_own_group_dying_with_parent,  # noqa: PLW1509 - the trial's thread waits
        )
        self.stopping = False
        self._lock = threading.Lock()

    def stop(self, timeout=300):
        with self._lock:
            if self.process.poll() is None and not self.stopping:
                self.stopping = True
                self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def stop_on(self, stop_file):
        """Stops the trainer when `stop_file` appears (until the trainer exits)."""
        while self.process.poll() is None:
            if os.path.exists(stop_file):
                self.stop()
                return
            time.sleep(POLL_SECONDS)


def _own_group_dying_with_parent():
    """In the trainer, before exec: its own process group, out of reach of the group-wide
    SIGKILL with which Ray reaps a local instance one second after its driver dies, and
    SIGTERM when its trial's worker dies, so that it checkpoints and exits in its own time."""
    os.setpgrp()

    local.die_with_parent()


def _final(final):
    """A finished run's final metrics, also under the `eval/` names its records use."""
    numbers = {k: v for k, v in final.items() if isinstance(v, (int, float))}
    return {**numbers, **{f"eval/{k}": v for k, v in numbers.items()}}


def _scheduler(args, tune):
    if args.scheduler in (None, "", "none", "fifo"):
        return None
    if args.scheduler != "asha":
        raise SystemExit(f"--scheduler={args.scheduler!r}: use 'asha' or 'none'.")
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(
        time_attr="training_iteration",
        max_t=args.max_t,
        grace_period=args.grace_period,
        reduction_factor=args.reduction_factor,
    )


def trial_specs(planned, args, root, metric):
    """Each run's trial: its name, bindings, folder and trainer command, and `threads`, the
    trainer's TensorFlow pools (`--cpus_per_run`, not every core of the node)."""
    specs = []
    for name, bindings in planned:
        model_dir = local.run_folder(root, name)
        specs.append(
            {
                "name": name,
                "bindings": bindings,
                "model_dir": model_dir,
                "command": local.trainer_command(model_dir, bindings, args),
                "threads": max(1, int(args.cpus_per_run)),
                "cwd": os.getcwd(),
                "root": root,
                "metric": metric,
            }
        )
    return specs


def run_grid(planned, args):
    """Runs `[(run_name, {binding: value text})]` as Tune trials; returns the local backend's
    `([(run, bindings, status, final metrics)], stopped)`."""
    ray, tune = require_ray()

    root = os.path.abspath(args.root)
    os.makedirs(root, exist_ok=True)
    scheduler = _scheduler(args, tune)
    specs = trial_specs(planned, args, root, args.metric if scheduler else None)
    print(f"Sweep of {len(specs)} run(s) under {root} on Ray ({args.address or 'local'}).")
    stop_file = os.path.join(root, STOP_FILE)
    if os.path.exists(stop_file):
        os.remove(stop_file)  # a previous sweep's request
    local_ray = None
    if not ray.is_initialized():
        if args.address:
            init = {"address": args.address}
        else:  # a dying worker's trainer gets the seconds it needs to checkpoint
            # A session folder of its own, removed with Ray's processes when the sweep ends.
            local_ray = tempfile.mkdtemp(prefix="blayers-ray-", dir="/tmp")
            init = {
                "num_cpus": args.ray_num_cpus,
                "_system_config": {"kill_child_processes_on_worker_exit": False},
                "_temp_dir": local_ray,
            }
        ray.init(**init, include_dashboard=False, log_to_driver=False)
        if local_ray is not None:
            print(f"Local Ray instance in {local_ray} (removed when the sweep ends).", flush=True)
    resources = {"cpu": args.cpus_per_run, "gpu": args.gpus_per_run}
    tune_config = tune.TuneConfig(
        scheduler=scheduler,
        metric=args.metric if scheduler else None,
        mode=args.mode if scheduler else None,
        max_concurrent_trials=args.parallel if args.parallel and args.parallel > 0 else None,
        trial_dirname_creator=lambda trial: trial.config["run"]["name"].replace("/", "_"),
    )
    tuner = tune.Tuner(
        tune.with_resources(_trial, resources),
        param_space={"run": tune.grid_search(specs)},
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name="tune",
            storage_path=os.path.join(root, "ray_results"),
            failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            verbose=0,
        ),
    )
    stopped, grid = None, None
    _RECEIVED.clear()
    # Ctrl-C and SIGTERM interrupt `fit` here (not Tune's own Ctrl-C handling, which leaves
    # the trainers to be killed), and the trials checkpoint their trainers.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        grid = tuner.fit()
    except KeyboardInterrupt as error:  # Ctrl-C (SIGINT), or SIGTERM through `_interrupt`
        stopped = getattr(error, "signal", None) or (_RECEIVED[-1] if _RECEIVED else signal.SIGINT)
        _stop_trials(stop_file, specs)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if local_ray is not None:
            _end_local_ray(ray, local_ray)
    by_name = {}
    if grid is not None:
        for result in grid:
            name = result.config["run"]["name"]
            by_name[name] = result
    rows = []
    for spec in specs:
        name, bindings = spec["name"], spec["bindings"]
        done = results.finished(spec["model_dir"])
        result = by_name.get(name)
        last = (result.metrics or {}) if result is not None else {}
        if result is not None and result.error is not None:
            status = f"failed ({_first_line(result.error)}, see {spec['model_dir']}/log.txt)"
            rows.append((name, bindings, status, {}))
        elif done and last.get("status") == "skipped (finished)":
            rows.append((name, bindings, "skipped (finished)", done["final"]))
        elif done:
            rows.append((name, bindings, "finished", done["final"]))
        elif result is not None and scheduler is not None and not stopped:
            step = last.get("step")
            where = f" at step {step}" if step is not None else ""
            status = f"stopped early ({args.scheduler}, last report{where}; checkpointed)"
            rows.append((name, bindings, status, {}))
        else:
            rows.append((name, bindings, results.stopped_status(spec["model_dir"]), {}))
    results.write_hparams(rows, root)
    return rows, stopped


def _processes_under(folder):
    """PIDs of this user's processes whose command line names `folder` (Ray's raylet, GCS and
    agents of a session there)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if folder.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _end_local_ray(ray, folder, grace=10.0):
    """Shuts the local Ray instance down, ends the agents that outlive it (they are reparented
    and linger for tens of seconds otherwise: SIGTERM, then SIGKILL after `grace` seconds) and
    removes its session folder. The results are read from the run folders, not from Ray."""
    ray.shutdown()
    end = time.monotonic() + grace
    signum = signal.SIGTERM
    while pids := _processes_under(folder):
        for pid in pids:
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        if time.monotonic() > end:
            signum = signal.SIGKILL
        time.sleep(0.2)
        if time.monotonic() > end + grace:
            break
    shutil.rmtree(folder, ignore_errors=True)


_RECEIVED = []  # the signals `_interrupt` turned into a stop (Tune may re-raise its own)


def _interrupt(signum, frame):
    from blayers.launch.local import SweepStopped

    _RECEIVED.append(signum)
    raise SweepStopped(signum)


def _stop_trials(stop_file, specs, limit=300.0):
    """Asks every trial to stop its trainer and waits (bounded) until no run folder is locked
    by a trainer, that is, until they have checkpointed and exited."""
    print("Stopping: the trials send their trainers SIGTERM (they checkpoint).", flush=True)
    with open(stop_file, "w") as f:
        f.write("stop\n")
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not any(RunDir(s["model_dir"]).is_locked() for s in specs):
            break
        time.sleep(POLL_SECONDS)
    os.remove(stop_file)


def _first_line(error):
    text = str(error).strip().splitlines()
    return text[-1][:200] if text else type(error).__name__
