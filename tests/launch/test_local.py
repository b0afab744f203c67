"""The local backend's trainers share the machine's cores: `--parallel=N` gives each TensorFlow
pools of `cores // N` threads (the variables TensorFlow reads at start-up), and a lone run, or
a variable the user set, is left alone."""

import argparse
import pathlib
import sys

import pytest

from launch import local

CHILD = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get(sys.argv[2], 'unset'))"


@pytest.mark.parametrize(
    "parallel,cpus,expected",
    [(1, 2, None), (2, 2, "1"), (2, 16, "8"), (3, 8, "2"), (4, 2, "1"), (0, 2, None)],
)
def test_trainer_env_gives_each_run_its_share_of_the_cores(parallel, cpus, expected):
    env = local.trainer_env(parallel, cpus=cpus, environ={"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    for name in local.THREAD_VARIABLES:
        assert env.get(name) == expected


def test_trainer_env_keeps_the_user_s_thread_settings():
    env = local.trainer_env(2, cpus=8, environ={"TF_NUM_INTRAOP_THREADS": "3"})
    assert env["TF_NUM_INTRAOP_THREADS"] == "3" and env["TF_NUM_INTEROP_THREADS"] == "4"


@pytest.mark.parametrize("runs,parallel,share", [(2, 2, True), (1, 2, False), (2, 1, False)])
def test_trainers_of_a_sweep_start_with_the_share(tmp_path, monkeypatch, runs, parallel, share):
    """Each trainer (here a child that writes what it was given) sees the variable when runs
    share the machine; a lone run, or one at a time, keeps TensorFlow's default."""
    for name in local.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(local, "available_cpus", lambda: 4)

    def command(model_dir, bindings, args):
        return [sys.executable, "-c", CHILD, f"{model_dir}/seen", local.THREAD_VARIABLES[0]]

    monkeypatch.setattr(local, "trainer_command", command)
    planned = [(f"run{i}", {"seed": str(i)}) for i in range(runs)]
    args = argparse.Namespace(root=str(tmp_path), parallel=parallel)
    rows, stopped = local.run_grid(planned, args)
    assert not stopped and len(rows) == runs
    for name, _ in planned:
        seen = (tmp_path / name / "seen").read_text()
        assert seen == ("2" if share else "unset")


def test_a_finished_run_counts_as_finished_only_for_the_setting_it_ran(tmp_path):
    """A sweep skips a finished run only when it would start it with the same gin files and
    bindings (its `command.json`); at another setting the trainer starts, so that no table
    reports a run of one setting as another's."""
    import json

    from launch.results import finished

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"status": "finished", "final": {"nll": 1.0}}))
    args = argparse.Namespace(
        gin_file=["digits_mlp"], gin_param=["train.train_steps = 3"], strategy=None, tpu=None
    )
    command = local.trainer_command(str(run), {"seed": "0"}, args)
    assert finished(str(run), command)["final"] == {"nll": 1.0}  # no record: as before
    record = {"gin_file": ["digits_mlp"], "gin_param": ["train.train_steps = 3", "seed = 0"]}
    (run / "command.json").write_text(json.dumps(record))
    assert finished(str(run), command) is not None and finished(str(run)) is not None
    for changed in (
        local.trainer_command(str(run), {"seed": "1"}, args),
        local.trainer_command(
            str(run), {"seed": "0"}, argparse.Namespace(**{**vars(args), "gin_file": ["other"]})
        ),
    ):
        assert finished(str(run), changed) is None
    (run / "metrics.json").write_text(json.dumps({"status": "running"}))
    assert finished(str(run), command) is None


def test_a_run_another_sweep_trains_is_running_elsewhere_not_failed(tmp_path, monkeypatch):
    """Two sweeps on one root: a run whose LOCK a live process holds is not started again
    (its trainer would exit 4) and is "running elsewhere", which fails nothing; once that
    process finished it, the table reads its result."""
    import json
    import socket
    import subprocess

    from launch.results import exit_code

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held = tmp_path / "run0"
        held.mkdir()
        lock = {"pid": other.pid, "host": socket.gethostname(), "started": 0.0}
        (held / "LOCK").write_text(json.dumps(lock))

        finish_both = (
            "import json, pathlib, sys; d = pathlib.Path(sys.argv[1]);"
            "json.dump({'status': 'finished', 'final': {'nll': 1.0}},"
            " (d.parent / 'run0' / 'metrics.json').open('w'));"
            "json.dump({'status': 'finished', 'final': {'nll': 2.0}},"
            " (d / 'metrics.json').open('w'))"
        )

        def command(model_dir, bindings, args):  # the "trainer" finishes the other run too
            return [sys.executable, "-c", finish_both, model_dir]

        monkeypatch.setattr(local, "trainer_command", command)
        args = argparse.Namespace(root=str(tmp_path), parallel=1)
        rows, stopped = local.run_grid([("run0", {}), ("run1", {})], args)
        assert not stopped and exit_code(rows) == 0
        statuses = {name: (status, final) for name, _, status, final in rows}
        assert statuses["run0"] == ("finished (elsewhere)", {"nll": 1.0})
        assert statuses["run1"] == ("finished", {"nll": 2.0})
        (held / "metrics.json").unlink()
        (tmp_path / "run1" / "metrics.json").unlink()
        rows, _ = local.run_grid([("run0", {})], args)
        assert rows[0][2].startswith("running elsewhere (PID") and exit_code(rows) == 0
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("name", ["../x", "../../x", "/tmp/abs", "a/../../x", "."])
def test_a_run_name_that_leaves_the_root_is_refused(tmp_path, name):
    args = argparse.Namespace(root=str(tmp_path / "root"), parallel=1)
    with pytest.raises(ValueError, match="leaves the root"):
        local.run_grid([("fine", {}), (name, {})], args)
    assert not (tmp_path / "root" / "fine").exists()
    assert local.run_folder(str(tmp_path), "validation/concrete").endswith("validation/concrete")


# A trainer that records its PID, then the signal that ends it.
_WAITING_TRAINER = (
    "import os, pathlib, signal, sys, time\n"
    "folder = pathlib.Path(sys.argv[1])\n"
    "def stop(signum, frame):\n"
    "    (folder / 'signal').write_text(signal.Signals(signum).name)\n"
    "    sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "(folder / 'pid').write_text(str(os.getpid()))\n"
    "time.sleep(120)\n"
)


def test_kill_9_of_the_sweep_sends_its_trainers_sigterm(tmp_path):
    """A sweep killed outright (`kill -9`: no handler runs) still stops its trainers with the
    parent-death signal, SIGTERM, on which a trainer checkpoints (`tests/lab/test_cli.py`, the
    interrupted run). The sweep here is `run_grid` in a process of its own; its trainer records
    the signal that ended it."""
    import os
    import signal
    import subprocess
    import time

    sweep = (
        "import argparse, sys\n"
        "from blayers.launch import local\n"
        f"trainer = {_WAITING_TRAINER!r}\n"
        "local.trainer_command = lambda model_dir, bindings, args: "
        "[sys.executable, '-c', trainer, model_dir]\n"
        "local.run_grid([('run0', {})], argparse.Namespace(root=sys.argv[1], parallel=1))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", sweep, str(tmp_path)])
    run = tmp_path / "run0"
    try:
        deadline = time.monotonic() + 60
        while not (run / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        trainer_pid = int((run / "pid").read_text())
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        while not (run / "signal").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            process.kill()
    assert (run / "signal").read_text() == "SIGTERM", "the trainer outlived its sweep"
    for _ in range(200):  # it exits (a zombie until init reaps it counts as gone)
        try:
            os.kill(trainer_pid, 0)
        except ProcessLookupError:
            break
        status = pathlib.Path(f"/proc/{trainer_pid}/status")
        if status.exists() and "\nState:\tZ" in status.read_text():
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the trainer is still running")
