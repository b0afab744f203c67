"""A run folder's promises when it is reused: a run of another model is refused before anything
in the folder changes, and a refused command line leaves `command.json` alone. The promises
every learner keeps are tested in `tests/lab/test_loop_promises.py`; the mesh learner's SIGTERM
through the command line is a slow test here."""

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import gin
import pytest

from blayers.lab import config, loop, runs
from blayers.lab import models as models_lib
from tests.conftest import run_module_noting_tensorflow

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _snapshot(folder):
    """Every file under `folder` with the hash of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(pathlib.Path(folder).rglob("*"))
        if p.is_file()
    }


def _digits(*params):
    gin.clear_config()
    config.parse(
        ["digits_mlp_smoke"],
        [
            "train.progress = False",
            "train.plots = False",
            "train.train_steps = 4",
            "train.checkpoint_every = 2",
            *params,
        ],
    )


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """The finished 4-step digits run (`_digits()`); each test works on a copy of it."""
    run = tmp_path_factory.mktemp("four_steps") / "run"
    _digits()
    try:
        loop.fit(str(run))
    finally:
        gin.clear_config()
    return run


def _copy_of(run, tmp_path):
    import shutil

    shutil.copytree(run, tmp_path, dirs_exist_ok=True)  # a moved folder restores its own


def test_a_changed_model_binding_is_refused_before_anything_changes(tmp_path, four_steps):
    _copy_of(four_steps, tmp_path)
    before = _snapshot(tmp_path)
    _digits("mlp.hidden_units = (64,)")  # another model in the same folder
    with pytest.raises(runs.ChangedBindingsError, match=r"mlp.hidden_units: \(32,\) -> "):
        loop.fit(str(tmp_path))
    assert _snapshot(tmp_path) == before  # no .damaged files, history and metrics intact
    _digits()  # re-running the finished run evaluates again, replacing its record
    loop.fit(str(tmp_path))
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").open()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [4]
    _digits("train.train_steps = 6")  # the same model resumes
    loop.fit(str(tmp_path))
    assert json.loads((tmp_path / "metrics.json").read_text())["resumed_from_step"] == 4


@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_a_damaged_bindings_record_falls_back_to_the_operative_config(tmp_path, damage, four_steps):
    """A run whose `bindings.json` is unreadable (or gone) still refuses a changed learning
    rate: the operative config's record is checked instead; with neither, it is refused."""
    _copy_of(four_steps, tmp_path)
    bindings = tmp_path / "bindings.json"
    if damage == "garbage":
        bindings.write_bytes(b"\x00\x13{not json")
    else:
        bindings.unlink()
    before = _snapshot(tmp_path)
    _digits("make_optimizer.learning_rate = 0.05")
    with pytest.raises(runs.ChangedBindingsError, match=r"learning_rate: 0.005 -> 0.05"):
        loop.fit(str(tmp_path))
    assert _snapshot(tmp_path) == before
    operative = (tmp_path / "operative_config.gin").read_text()
    (tmp_path / "operative_config.gin").write_text("train.train_steps = (")
    with pytest.raises(runs.ChangedBindingsError, match=r"both missing or unreadable"):
        loop.fit(str(tmp_path))
    (tmp_path / "operative_config.gin").write_text(operative)
    _digits("train.train_steps = 6")  # the run's own bindings resume, and are recorded again
    loop.fit(str(tmp_path))
    assert json.loads(bindings.read_text())["train.train_steps"] == "6"


def test_a_shorter_rerun_scores_its_own_checkpoint_not_a_longer_runs(tmp_path):
    """A finished 4-step run, extended to 10 and stopped at 8, then the 4-step command again:
    its metrics are the 4-step model's (that checkpoint is still kept), the longer run's
    checkpoints and records stay, and a length with no checkpoint is refused."""
    _digits("train.keep_checkpoints = 5")
    first = loop.fit(str(tmp_path))
    _digits("train.keep_checkpoints = 5", "train.train_steps = 8")  # the extension, cut short
    loop.fit(str(tmp_path))
    again = None
    _digits("train.keep_checkpoints = 5")
    again = loop.fit(str(tmp_path))
    assert again == first  # the same model, scored the same (evaluation is seeded)
    assert json.loads((tmp_path / "metrics.json").read_text())["step"] == 4
    assert (tmp_path / "checkpoints" / "ckpt-8.index").exists()
    steps = [json.loads(line)["step"] for line in (tmp_path / "history.jsonl").open()]
    assert max(steps) == 8  # the longer run's records are kept for its resume
    before = _snapshot(tmp_path)
    _digits("train.keep_checkpoints = 5", "train.train_steps = 5")
    with pytest.raises(runs.LongerRunError, match=r"up to step 8\) and no checkpoint of step 5"):
        loop.fit(str(tmp_path))
    assert _snapshot(tmp_path) == before
    _digits("train.keep_checkpoints = 5", "train.train_steps = 10")  # the longer run resumes
    loop.fit(str(tmp_path))
    assert json.loads((tmp_path / "metrics.json").read_text())["resumed_from_step"] == 8


def test_a_checkpoint_of_another_model_is_refused_not_taken_for_damage(tmp_path):
    """Without gin (the Python API), the restore itself tells another model from damage."""
    from blayers.lab import data as data_lib

    digits = data_lib.digits()
    quick = {
        "train_steps": 2,
        "checkpoint_every": 2,
        "progress": False,
        "plots": False,
        "num_eval_samples": 1,
    }

    def mlp(units):
        return lambda shape, n: models_lib.mlp(shape, n, hidden_units=(units,))

    loop.fit(str(tmp_path), data=digits, model=mlp(8), **quick)
    before = _snapshot(tmp_path)
    with pytest.raises(runs.CheckpointMismatchError, match=r"ckpt-2 does not fit"):
        loop.fit(str(tmp_path), data=digits, model=mlp(16), **dict(quick, train_steps=4))
    assert _snapshot(tmp_path) == before


def _cli(model_dir, *params, gin_file="digits_mlp_smoke"):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "blayers.train",
            f"--gin_file={gin_file}",
            f"--model_dir={model_dir}",
            "--gin_param=train.progress = False",
            "--gin_param=train.plots = False",
            *(f"--gin_param={p}" for p in params),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def _recorded_run(model_dir, four_steps):
    """A copy of the finished 4-step run with the command record a first command line left
    (`command.json`); returns the record's text."""
    _copy_of(four_steps, model_dir)
    record = model_dir / "command.json"
    record.write_text(json.dumps({"command": "python -m blayers.train (the first run)"}))
    return record.read_text()


def test_a_refused_invocation_leaves_the_command_record(tmp_path, four_steps):
    """The invocation that must change nothing goes through the command line."""
    command = _recorded_run(tmp_path, four_steps)
    refused = _cli(tmp_path, "train.train_steps = 2", "make_optimizer.learning_rate = 0.5")
    assert refused.returncode == 4 and "make_optimizer.learning_rate" in refused.stderr
    assert (tmp_path / "command.json").read_text() == command


# The parser's message for a misspelt binding is checked in-process in the fast suite
# (tests/lab/test_cli.py); its path through the command line, one more trainer process, is slow.
@pytest.mark.slow
def test_a_misspelt_binding_on_a_run_is_one_error_exit_2_and_changes_nothing(tmp_path, four_steps):
    command = _recorded_run(tmp_path, four_steps)
    bad = _cli(tmp_path, "train.train_stepz = 3")
    assert bad.returncode == 2 and "train_stepz" in bad.stderr  # the parser's one error
    assert "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert (tmp_path / "command.json").read_text() == command


def test_the_seed_macro_reaches_every_learner():
    """`--sweep seed=[0,1]` varies every kind of run: the Loop's `train.seed` reads `%seed` in
    every config, whatever its learner."""
    for gin_file in (
        "digits_mlp_smoke",
        "bayesian_transformer_mesh_smoke",
        "bayesian_transformer_lm_mesh_smoke",
        "bayesian_planet_smoke",
        "cox_process_smoke",
    ):
        gin.clear_config()
        config.parse([gin_file], ["seed = 7"])
        value = gin.query_parameter("train.seed")
        assert repr(value) == "%seed", (gin_file, value)
        assert gin.query_parameter("%seed") == 7, gin_file


@pytest.mark.slow
def test_mesh_sigterm_checkpoints_and_the_rerun_finishes(tmp_path):
    command = [
        sys.executable,
        "-m",
        "blayers.train",
        "--strategy=mesh",
        "--gin_file=bayesian_transformer_mesh_smoke",
        "--gin_param=train.train_steps = 100000",
        "--gin_param=train.checkpoint_every = 100000",
        "--gin_param=train.log_every = 5",
        f"--model_dir={tmp_path}",
    ]
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    history = tmp_path / "history.jsonl"
    deadline = time.time() + 240
    while not (history.exists() and history.read_text().count("\n") >= 2):
        assert time.time() < deadline and process.poll() is None, "no progress"
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert "checkpoint saved" in stderr, stderr[-3000:]
    assert not (tmp_path / "LOCK").exists()
    prefixes = runs.checkpoint_prefixes(str(tmp_path / "checkpoints"))
    step = int(prefixes[0].rsplit("-", 1)[1])
    assert step >= 10  # the step it stopped at, not the last periodic checkpoint (none)
    assert os.path.exists(tmp_path / "command.json")


def test_a_checkpoint_that_cannot_be_written_leaves_no_partial_files(tmp_path):
    """A full disk during a save: TensorFlow's `ckpt-N_temp/` and the partial files go, the
    error names the newest intact checkpoint, and that one still restores."""
    import errno

    import tensorflow as tf

    variable = tf.Variable(1.0)
    checkpointer = runs.Checkpointer(str(tmp_path), tf.train.Checkpoint(v=variable))
    checkpointer.save(10)

    class FullDisk:
        def write(self, prefix):
            os.makedirs(prefix + "_temp")
            pathlib.Path(prefix + "_temp", "part-00000-of-00001.data").write_bytes(b"\0" * 8)
            pathlib.Path(prefix + ".index").write_bytes(b"\0")
            raise OSError(errno.ENOSPC, "No space left on device")

    full = runs.Checkpointer(str(tmp_path), FullDisk())
    with pytest.raises(runs.CheckpointWriteError, match=r"ckpt-20 .*No space.*ckpt-10"):
        full.save(20)
    assert sorted(os.listdir(tmp_path)) == [
        "checkpoint",
        "ckpt-10.data-00000-of-00001",
        "ckpt-10.index",
    ]
    variable.assign(5.0)
    assert checkpointer.restore().endswith("ckpt-10") and float(variable) == 1.0


def test_a_copied_folder_is_not_locked_by_the_original_s_live_trainer(tmp_path):
    """The LOCK records its folder: a copy (made while the original trains) is this host's
    other folder, so its LOCK is taken over; the original stays locked."""
    import shutil

    original = runs.RunDir(str(tmp_path / "original"))
    with original.lock():
        shutil.copytree(tmp_path / "original", tmp_path / "copy")
        with runs.RunDir(str(tmp_path / "copy")).lock() as lock:
            assert lock.held
        with (
            pytest.raises(runs.RunLockedError, match="Another trainer|this process"),
            runs.RunDir(str(tmp_path / "original")).lock(),
        ):
            pass


def test_an_unwritable_model_dir_is_one_line_and_exit_1_before_tensorflow_loads(tmp_path):
    """A model_dir that cannot be made (under a file; a name longer than the OS allows; a
    folder the user cannot write) is said at once, before TensorFlow's seconds of loading; a
    failure the file system shows only later (the same OSError from the run's own writes) is
    the same line."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    done = run_module_noting_tensorflow(
        "blayers.train", "--gin_file=digits_mlp_smoke", f"--model_dir={blocker}/run", cwd=ROOT
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Could not write the run folder" in done.stderr and "is a file" in done.stderr
    assert "Traceback" not in done.stderr
    assert "tensorflow loaded: False" in done.stdout
    assert "is a file" in runs.unwritable(str(blocker / "run" / "deeper"))
    assert "too long" in runs.unwritable(str(tmp_path / ("x" * 300)))
    assert runs.unwritable(str(tmp_path / "new" / "run")) is None
    assert runs.unwritable(str(tmp_path)) is None
    _digits()  # the same OSError from the run's own writes, which the command line words alike
    with pytest.raises(OSError, match="File name too long"):
        loop.fit(str(tmp_path / ("x" * 300)))


def test_a_checkpoint_of_another_model_is_one_error_without_tensorflow_s_warnings(tmp_path, caplog):
    """TensorFlow warns, once per unused value, about a checkpoint read but not matched; the
    mismatch is already the error, so those warnings are silenced."""
    import gc

    import tensorflow as tf

    # The worker's older objects out of the collection (a full one walks a long-lived test
    # process's whole heap); the objects made below are still collected.
    gc.freeze()
    try:
        saved = tf.train.Checkpoint(**{f"v{i}": tf.Variable(tf.zeros(3)) for i in range(8)})
        runs.Checkpointer(str(tmp_path), saved).save(1)
        other = tf.train.Checkpoint(v0=tf.Variable(tf.zeros(4)))
        with caplog.at_level("WARNING"), pytest.raises(runs.CheckpointMismatchError):
            runs.Checkpointer(str(tmp_path), other).restore()
        del other
        gc.collect()
    finally:
        gc.unfreeze()
    unused = [r for r in caplog.records if "could not be found" in r.getMessage()]
    assert not unused, [r.getMessage() for r in unused][:3]
