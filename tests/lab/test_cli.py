"""The command line: `python -m blayers.train` and `python -m launch.sweep` as a user runs them
(subprocesses): bad gin, interrupt and resume, a mirrored strategy, sweeps."""

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import run_module_noting_tensorflow

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOKE = ["--gin_file=digits_mlp_smoke", "--gin_param=train.progress = False"]


def _run(args, timeout=300, **kwargs):
    return subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def test_unknown_names_fail_before_training_with_file_and_line(tmp_path):
    """A misspelt configurable or parameter, in a file (its file and line) or in a
    `--gin_param`: the `ValueError` of the config parser, which the command line prints with
    exit 2 before anything is built (tests/lab/test_run_folder.py runs that through it)."""
    import gin

    from blayers.lab import config

    bad = tmp_path / "typo.gin"
    bad.write_text("include 'digits_mlp_smoke.gin'\n\nDenseFlipout.unitz = 3\n")
    unknown = tmp_path / "bad.gin"
    unknown.write_text("include 'digits_mlp_smoke.gin'\nDenseFlipot.units = 3\n")
    for files, params, named in (
        (
            [str(unknown)],
            [],
            ["No configurable matching 'DenseFlipot'", f'In file "{unknown}", line 2'],
        ),
        ([str(bad)], [], ["Unknown parameter 'unitz' of DenseFlipout", f'In file "{bad}", line 3']),
        (["digits_mlp_smoke"], ["mlp.hiden_units = (3,)"], ["hiden_units"]),
    ):
        gin.clear_config()
        with pytest.raises(ValueError) as info:
            config.parse(files, params)
        assert all(text in str(info.value) for text in named), str(info.value)
    gin.clear_config()


def _console_script():
    """The `blayers-train` installed with the interpreter under test, not whichever is first on
    PATH."""
    import os

    script = os.path.join(os.path.dirname(sys.executable), "blayers-train")
    return script if os.path.exists(script) else "blayers-train"


def _user_env():
    """The environment as a user has it: none of the test suite's own TensorFlow settings."""
    import os

    hidden = ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES")
    return {k: v for k, v in os.environ.items() if k not in hidden}


def _check_quiet_and_recorded(output, model_dir, steps):
    """The CLI quiets TensorFlow's start-up chatter and the CPU-only cuInit error, and every
    function of the step converts (AutoGraph's warning asks the user to file a TF bug); the run
    folder holds the operative config and the command that made it (for the report)."""
    for noise in ("cuInit", "oneDNN", "absl::InitializeLog", "AutoGraph could not transform"):
        assert noise not in output, output[-2000:]
    operative = (model_dir / "operative_config.gin").read_text()
    assert f"train.train_steps = {steps}" in operative
    assert "mlp.dense_layer = 'DenseFlipout'" in operative
    record = json.loads((model_dir / "command.json").read_text())
    assert record["gin_file"] == ["digits_mlp_smoke"]
    assert "--gin_file=digits_mlp_smoke" in record["command"]


@pytest.mark.parametrize(
    ("signals", "status"),
    [
        pytest.param((signal.SIGINT,), 130, marks=pytest.mark.slow),  # the third case's path
        # The third case's second signal: its SIGTERM path runs in the fast suite too.
        pytest.param((signal.SIGTERM,), 143, marks=pytest.mark.slow),
        ((signal.SIGINT, signal.SIGTERM), 130),
    ],
    ids=["sigint", "sigterm", "ctrl_c_then_the_sweeps_sigterm"],
)
def test_interrupted_run_resumes_where_it_stopped(tmp_path, signals, status):
    """Ctrl-C exits 130 and SIGTERM 143, with one line and no traceback, the LOCK released
    and the checkpoint whole, also when the sweep's SIGTERM follows the terminal's Ctrl-C.
    The run is the installed console script's, in the user's environment; the rerun that
    resumes it is `python -m blayers.train` on a mirrored strategy over two CPU devices."""
    model_dir = tmp_path / "run"
    args = [
        *SMOKE,
        "--gin_param=train.train_steps = 100000",
        "--gin_param=train.checkpoint_every = 10",
        "--gin_param=train.eval_every = None",
        f"--model_dir={model_dir}",
    ]
    process = subprocess.Popen(
        [_console_script(), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_user_env(),
    )
    deadline = time.time() + 240
    while time.time() < deadline and not list(
        (model_dir / "checkpoints").glob("ckpt-*.index")
        if (model_dir / "checkpoints").exists()
        else []
    ):
        time.sleep(0.5)
    time.sleep(1.0)
    for signum in signals:
        process.send_signal(signum)
        time.sleep(0.05)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == status, output
    assert output.count("checkpoint saved") == 1, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert not (model_dir / "LOCK").exists()
    _check_quiet_and_recorded(output, model_dir, 100000)
    steps = sorted(
        int(p.name.split("-")[1].split(".")[0])
        for p in (model_dir / "checkpoints").glob("ckpt-*.index")
    )
    interrupted_at = steps[-1]
    assert interrupted_at > 0 and not (model_dir / "metrics.json").exists()
    if signals == (signal.SIGTERM,):
        return  # the same stop as Ctrl-C's, whose checkpoint the other cases resume from

    final_steps = interrupted_at + 8
    result = _run(
        [
            "blayers.train",
            *args[:-4],
            f"--gin_param=train.train_steps = {final_steps}",
            "--gin_param=train.plots = False",  # the fast suite draws them in-process
            "--strategy=mirrored",
            "--num_cpu_devices=2",
            f"--model_dir={model_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MirroredStrategy with 2 replica(s)" in result.stdout
    assert f"at step {interrupted_at}." in result.stdout
    summary = json.loads((model_dir / "metrics.json").read_text())
    assert summary["resumed_from_step"] == interrupted_at and summary["step"] == final_steps
    assert summary["final"]["accuracy"] > 0
    assert summary["parameters"]["trainable"] > 0 and summary["train_seconds"] > 0


# The fast suite runs the console script and the mirrored strategy in the interrupted run's
# test above (its run and its resumed rerun): these two runs of their own are slow.
@pytest.mark.slow
def test_mirrored_strategy_on_two_cpu_devices(tmp_path):
    result = _run(
        [
            "blayers.train",
            *SMOKE,
            "--strategy=mirrored",
            "--num_cpu_devices=2",
            "--gin_param=train.train_steps = 6",
            f"--model_dir={tmp_path}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MirroredStrategy with 2 replica(s)" in result.stdout
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["step"] == 6 and summary["final"]["accuracy"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["console_script", "module"])
def test_console_script_and_operative_config(tmp_path, entry):
    command = (
        [_console_script()]
        if entry == "console_script"
        else [sys.executable, "-m", "blayers.train"]
    )
    result = subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [*command, *SMOKE, "--gin_param=train.train_steps = 2", f"--model_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=_user_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _check_quiet_and_recorded(result.stderr, tmp_path, 2)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["parameters"]["trainable"] > 0 and metrics["train_seconds"] > 0


@pytest.mark.slow  # an end-to-end run
def test_sweep_runs_grid_tolerates_failures_and_skips_finished(tmp_path):
    root = tmp_path / "sweep"
    args = [
        "launch.sweep",
        "--gin_file=digits_mlp_smoke",
        "--gin_param=train.train_steps = 3",
        "--gin_param=train.progress = False",
        "--sweep",
        "mlp.dense_layer=['DenseFlipout', 'NoSuchLayer']",
        "--sweep",
        "seed=[0, 1]",
        "--parallel",
        "2",
        "--root",
        str(root),
    ]
    result = _run(args, timeout=600)
    assert result.returncode == 1  # two runs failed
    for chatter in ("cuInit", "oneDNN", "absl::InitializeLog"):  # TensorFlow's start-up log
        assert chatter not in result.stdout + result.stderr, chatter
    rows = (root / "results.csv").read_text().splitlines()
    assert rows[0].startswith("run,mlp.dense_layer,seed,status,accuracy,nll,ece")
    assert len(rows) == 5
    assert sum("finished" in r for r in rows) == 2 and sum("failed" in r for r in rows) == 2
    assert "| run | mlp.dense_layer | seed | status |" in (root / "results.md").read_text()
    assert (
        "Unknown layer 'NoSuchLayer'"
        in (root / "dense_layer-NoSuchLayer_seed-0" / "log.txt").read_text()
    )
    again = _run(args, timeout=600)
    assert again.stdout.count(": skipped (finished)") == 2
    # At another setting the finished runs are not skipped: they train on to the new length.
    longer = _run([a.replace("train_steps = 3", "train_steps = 5") for a in args], timeout=600)
    assert "skipped (finished)" not in longer.stdout
    metrics = json.loads((root / "dense_layer-DenseFlipout_seed-0" / "metrics.json").read_text())
    assert metrics["step"] == 5


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("a.b=[1, 2]", ("a.b", ["1", "2"])),
        ("x.layer=['Dense', 'DenseFlipout']", ("x.layer", ["'Dense'", "'DenseFlipout'"])),
        ("f.g=[@DenseFlipout, (1, 2)]", ("f.g", ["@DenseFlipout", "(1, 2)"])),
    ],
)
def test_parse_sweep(spec, expected):
    sys.path.insert(0, str(ROOT))
    from launch.sweep import parse_sweep

    assert parse_sweep(spec) == expected


def _wait_for(predicate, limit=120.0):
    """Polls `predicate` until true (bounded, so a broken run fails instead of hanging)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _alive(pid):
    try:
        import os

        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by init) counts as dead.
    status = pathlib.Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


# With real trainers: `kill -9` of a local sweep is slow. The fast suite checks its two halves:
# the parent-death signal reaches the trainer as SIGTERM (tests/launch/test_local.py) and a
# trainer checkpoints on SIGTERM (the interrupted run above).
@pytest.mark.parametrize("how", ["sigterm", pytest.param("kill9", marks=pytest.mark.slow)])
@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_stopping_a_sweep_stops_and_checkpoints_its_trainers(tmp_path, how, backend):
    """SIGTERM (or Ctrl-C) of a sweep stops its trainers, which checkpoint, and the table says
    so; `kill -9` of the sweep still takes its trainers down (the parent-death signal: the
    sweep's, or, with Ray, their dying workers' as the local Ray instance dies with the sweep),
    and they still checkpoint. Either way no trainer survives and a re-run resumes."""
    root = tmp_path / "sweep"
    args = [
        sys.executable,
        "-m",
        "launch.sweep",
        *SMOKE,
        "--gin_param=train.train_steps = 100000",
        "--gin_param=train.checkpoint_every = 100000",
        "--sweep",
        "seed=[0]",
        "--root",
        str(root),
    ]
    if backend == "ray":
        args += ["--backend=ray", "--ray_num_cpus=2"]
    if backend == "ray" and how == "kill9":
        # A Ray sweep killed outright: its trainers die with it, but a checkpoint at the kill is
        # not guaranteed (under load Ray's teardown can beat it), so a periodic one must exist.
        args += ["--gin_param=train.checkpoint_every = 20"]
    sweep = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run_dir = root / "seed-0"
    try:
        # training has logged (a local Ray instance takes a while to start)
        history = run_dir / "history.jsonl"
        assert _wait_for(lambda: history.exists() and history.stat().st_size > 0, limit=300)
        if backend == "ray" and how == "kill9":
            assert _wait_for(lambda: list((run_dir / "checkpoints").glob("ckpt-*.index")))
        trainer_pid = json.loads((run_dir / "LOCK").read_text())["pid"]
        sweep.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        sweep.wait(timeout=300)
        assert _wait_for(lambda: not _alive(trainer_pid)), "the trainer outlived its sweep"
    finally:
        if sweep.poll() is None:
            sweep.kill()
    # The trainer checkpointed on its way out and released its lock; a re-run resumes.
    assert list((run_dir / "checkpoints").glob("ckpt-*.index"))
    if not (backend == "ray" and how == "kill9"):  # there a dead trainer's lock may stay
        assert _wait_for(lambda: not (run_dir / "LOCK").exists(), limit=10)  # (taken over)
    if how == "sigterm":
        assert sweep.returncode == 143  # the shell's status for SIGTERM
        assert "stopped (checkpointed" in (root / "results.md").read_text()
        assert not (root / "STOP").exists()


def _free_ports(count):
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_two_workers_on_localhost_match_one_worker(tmp_path):
    """`--strategy=multi_worker` (TF_CONFIG, two processes on localhost ports): the same
    training losses as one worker on the same global batch (deterministic layers, so the
    losses must agree to float rounding); the chief writes the run, the other worker its own
    folder under `workers/`."""
    import os

    args = [
        "--gin_file=digits_mlp_smoke",
        "--gin_param=train.progress = False",
        "--gin_param=mlp.dense_layer = 'Dense'",
        "--gin_param=train.train_steps = 20",
        "--gin_param=train.log_every = 5",
        "--gin_param=SupervisedLearner.num_eval_samples = 2",
    ]
    cluster = [f"localhost:{port}" for port in _free_ports(2)]
    workers = []
    for index in range(2):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
        )
        command = [sys.executable, "-m", "blayers.train", "--strategy=multi_worker"]
        workers.append(
            subprocess.Popen(
                [*command, f"--model_dir={tmp_path / 'multi'}", *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    single = _run(["blayers.train", "--strategy=cpu", f"--model_dir={tmp_path / 'one'}", *args])
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert single.returncode == 0, single.stderr[-3000:]
    for worker, output in zip(workers, outputs):
        assert worker.returncode == 0, output[-3000:]
    assert "with 2 replica(s)" in outputs[0]  # MultiWorkerMirroredStrategy's class name varies

    def losses(directory):
        records = [json.loads(line) for line in (directory / "history.jsonl").open()]
        return [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]

    one, multi = losses(tmp_path / "one"), losses(tmp_path / "multi")
    assert [s for s, _ in multi] == [s for s, _ in one] == [5, 10, 15, 20]
    for (_, a), (_, b) in zip(one, multi):
        assert abs(a - b) < 1e-5 * max(1.0, abs(a))
    assert (tmp_path / "multi" / "metrics.json").exists()
    assert (tmp_path / "multi" / "workers" / "worker-1" / "checkpoints").is_dir()


_COMMON = ["--root", "--gin_param", "--parallel", "--refuse_gin_imports"]
_HELP = {
    "blayers.train": ["--gin_file", "--gin_param", "--model_dir", "--strategy", "--mesh_shape"],
    "blayers.posthoc": ["--model_dir", "--method", "--gin_param", "--refuse_gin_imports"],
    "launch.sweep": ["--gin_file", "--sweep", "--root", "--parallel", "--refuse_gin_imports"],
    "experiments.uci_regression": [*_COMMON, "--uci_dir", "--methods", "--splits"],
    "experiments.deep_gp_uci": _COMMON,
    "experiments.cox_process": [*_COMMON, "--gin_file"],
    "experiments.uncertainty_baselines": [*_COMMON, "--gin_file"],
    "experiments.bayesian_planet": [*_COMMON, "--gin_file"],
    "experiments.report": ["--runs", "--out", "--html"],
    "blayers.lab.uci_download": ["--root", "--datasets", "--url"],
}


@pytest.mark.parametrize("module", sorted(_HELP))
def test_help_lists_every_flag_of_the_command_and_exits_0(module):
    """`--help` lists the command's own flags with their defaults on stdout, not absl's
    (`--helpfull` has those), and exits 0, without loading TensorFlow (which takes seconds)."""
    done = run_module_noting_tensorflow(module, "--help", cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tensorflow loaded: False" in done.stdout, module
    for flag in _HELP[module]:
        assert flag in done.stdout or flag.replace("--", "--[no]") in done.stdout, (module, flag)
    assert "--only_check_args" not in done.stdout  # absl's own, left to --helpfull


def test_the_console_script_help_lists_the_trainer_flags():
    script = pathlib.Path(sys.executable).with_name("blayers-train")
    if not script.exists():
        pytest.skip("blayers-train is not installed beside this Python")
    done = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and "--model_dir" in done.stdout
