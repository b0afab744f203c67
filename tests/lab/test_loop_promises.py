"""The Loop's promises, the same for every learner (supervised ELBO, variational program, Mesh
TensorFlow Transformer, PlaNet), each on a tiny run of its smoke config:

* a second process on the same folder refuses (a live holder's LOCK);
* SIGTERM checkpoints at the step it arrived (not at the last periodic checkpoint) and releases
  the lock;
* a resume with a changed model binding refuses, naming it, and touches nothing;
* after a crash between checkpoints, left as `kill -9` leaves a folder (a dead holder's LOCK, a
  torn last history line), a re-run takes the lock over, drops the torn line, continues from
  the newest checkpoint and ends exactly where the uninterrupted run ends (PlaNet: the episode
  collected after that checkpoint is set aside and collected again);
* a moved run folder restores its own checkpoints; a truncated newest checkpoint falls back to
  the newest intact one, naming both, and the run again ends exactly as the uninterrupted one;
  no more than `keep_checkpoints` are kept.
"""

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import gin
import numpy as np
import pytest

from blayers.lab import config, loop, runs
from blayers.lab import learners as learners_lib

SCHEDULE = [
    "train.train_steps = 6",
    "train.checkpoint_every = 3",
    "train.log_every = 1",
    "train.keep_checkpoints = 3",
    "train.eval_every = None",
    "train.progress = False",
    "train.plots = False",
]

LEARNERS = {
    "supervised": (
        "SupervisedLearner",
        ["digits_mlp_smoke"],
        ["mlp.hidden_units = (8,)", "SupervisedLearner.num_eval_samples = 1"],
        "mlp.hidden_units = (16,)",
    ),
    "variational_program": (
        "VariationalProgramLearner",
        ["cox_process_smoke"],
        [
            "cox_process.num_inducing = 8",
            "cox_process.num_quadrature_points = 16",
            "VariationalProgramLearner.num_eval_samples = 4",
        ],
        "cox_process.num_inducing = 4",
    ),
    "mesh": (
        "MeshLearner",
        ["bayesian_transformer_mesh_smoke"],
        [
            "MeshLearner.num_eval_samples = 1",
            "synthetic_translation.num_train = 128",
            "synthetic_translation.num_test = 8",
            "SequenceToSequence.num_decode = 2",
            "SequenceToSequence.decode_samples = 1",
        ],
        "TransformerHParams.d_ff = 32",
    ),
    "planet": (
        "PlanetLearner",
        ["bayesian_planet_smoke"],
        [
            "control_env.episode_steps = 12",
            "PlanetLearner.seed_episodes = 1",
            "PlanetLearner.collect_interval = 3",
            "PlanetLearner.batch_size = 4",
            "PlanetLearner.chunk_length = 6",
            "PlanetLearner.open_loop_context = 2",
            "PlanetLearner.open_loop_steps = 4",
            "cem.horizon = 3",
            "cem.candidates = 16",
            "cem.top_k = 4",
            "cem.iterations = 1",
        ],
        "WorldModel.hidden_units = 16",
    ),
}


class _Crash(Exception):
    pass


def _run(kind, model_dir, *params, at_step=None, action=None):
    """A run of the `kind` learner in `model_dir`; `action()` runs inside the call of training
    steps that reaches `at_step` (a signal, a crash), as if it came during that step."""
    name, gin_files, bindings, _ = LEARNERS[kind]
    gin.clear_config()
    config.parse(gin_files, [*SCHEDULE, *bindings, *params])
    learner = getattr(learners_lib, name)()
    if action is not None:
        steps_fn = learner.train_steps

        def train_steps(n):
            before = learner.step
            steps = steps_fn(n)
            if before < at_step <= learner.step:
                action()
            return steps

        learner.train_steps = train_steps
    return loop.train(str(model_dir), learner=learner)


def _snapshot(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(pathlib.Path(folder).rglob("*"))
        if p.is_file()
    }


def _losses(model_dir):
    return [(r["step"], r["loss"]) for r in runs.RunDir(model_dir).records("train")]


def _assert_same_run(model_dir, straight):
    """The run in `model_dir` logged and ended as the uninterrupted `straight` one."""
    ours, theirs = _losses(model_dir), _losses(straight)
    assert [s for s, _ in ours] == [s for s, _ in theirs] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([v for _, v in ours], [v for _, v in theirs], rtol=1e-5)
    final, expected = runs.RunDir(model_dir).final(), runs.RunDir(straight).final()
    assert final.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_allclose(final[key], value, rtol=1e-5, atol=1e-7, err_msg=key)


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _write_lock(model_dir, pid):
    (pathlib.Path(model_dir) / "LOCK").write_text(
        json.dumps({"pid": pid, "host": os.uname().nodename, "started": 0.0})
    )


@pytest.mark.parametrize(
    "kind",
    # The mesh learner's graph build and PlaNet's episodes make theirs the suite's longest
    # cases (about 50 s and 40 s): slow. Their smoke configs train in the fast suite. The
    # variational program's six runs take 45 s on a slow machine: the fast suite keeps its
    # resume after a crash (below); the promises of the folder are the Loop's, the same here.
    [pytest.param(k, marks=pytest.mark.slow) if k != "supervised" else k for k in LEARNERS],
)
def test_every_learner_keeps_the_run_folder_promises(kind, tmp_path, caplog, capsys):
    if kind == "planet":
        pytest.importorskip("dm_control")
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    _run(kind, straight)

    # SIGTERM: a checkpoint at the step it arrived (the periodic ones are at 3 and 6).
    with pytest.raises(KeyboardInterrupt):
        _run(kind, cut, at_step=2, action=lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert [os.path.basename(p) for p in runs.checkpoint_prefixes(str(cut / "checkpoints"))] == [
        "ckpt-2"
    ]
    assert not (cut / "LOCK").exists()

    # A second process on the folder refuses; a changed model binding refuses; nothing changes.
    before = _snapshot(cut)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(cut, holder.pid)
        with pytest.raises(runs.RunLockedError, match=f"PID {holder.pid}"):
            _run(kind, cut)
    finally:
        holder.kill()
        holder.wait()
    (cut / "LOCK").unlink()
    changed = LEARNERS[kind][3]
    with pytest.raises(runs.ChangedBindingsError, match=changed.split(" = ")[0]):
        _run(kind, cut, changed)
    assert _snapshot(cut) == before

    # A crash after step 5 (checkpoint at 3), the folder as kill -9 leaves it.
    with pytest.raises(_Crash):
        _run(kind, cut, at_step=5, action=lambda: (_ for _ in ()).throw(_Crash()))
    assert [s for s, _ in _losses(cut)] == [1, 2, 3, 4]
    _write_lock(cut, _dead_pid())
    with open(cut / "history.jsonl", "a") as f:
        f.write('{"kind": "train", "st')
    caplog.clear()
    _run(kind, cut)
    log = caplog.text
    assert "Taking over the lock of a dead trainer" in log and "Dropping a torn line" in log
    assert f"Resumed from {cut / 'checkpoints' / 'ckpt-3'} at step 3." in capsys.readouterr().out
    _assert_same_run(cut, straight)
    assert not (cut / "LOCK").exists()

    # The folder moved (it restores its own checkpoints, not the original path's), its newest
    # checkpoint truncated: the newest intact one, both named; the same end; keep-N holds.
    moved = tmp_path / "moved"
    shutil.copytree(cut, moved)
    shutil.rmtree(cut)
    data_file = next((moved / "checkpoints").glob("ckpt-6.data-*"))
    data_file.write_bytes(data_file.read_bytes()[:40])
    caplog.clear()
    _run(kind, moved)
    assert "ckpt-6 is damaged" in caplog.text
    out = capsys.readouterr().out
    assert f"Resumed from {moved / 'checkpoints' / 'ckpt-3'} at step 3." in out
    assert list((moved / "checkpoints").glob("ckpt-6.*.damaged"))
    _assert_same_run(moved, straight)
    assert len(list((moved / "checkpoints").glob("ckpt-*.index"))) <= 3


def test_the_variational_program_learner_resumes_exactly_after_a_crash(tmp_path, capsys):
    """A crash after step 5 (checkpoint at 3): the re-run continues from step 3 and ends
    exactly where the uninterrupted run ends, its ELBO's draws and evaluation included."""
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    _run("variational_program", straight)
    with pytest.raises(_Crash):
        _run("variational_program", cut, at_step=5, action=lambda: (_ for _ in ()).throw(_Crash()))
    assert [s for s, _ in _losses(cut)] == [1, 2, 3, 4]
    _run("variational_program", cut)
    assert f"Resumed from {cut / 'checkpoints' / 'ckpt-3'} at step 3." in capsys.readouterr().out
    _assert_same_run(cut, straight)


@pytest.mark.parametrize(
    "kind",
    [
        "supervised",
        # PlaNet's batches drawn ahead and stacked, several steps a graph call (a minute)
        pytest.param("planet", marks=pytest.mark.slow),
    ],
)
def test_a_stop_inside_a_call_of_several_steps_resumes_exactly(kind, tmp_path):
    """Steps run several to a call (here 3: calls end at the log cadence, and an epoch of the
    smoke config, or PlaNet's collection interval, is no shorter). A SIGTERM during the call's
    second step stops at the call's end with a checkpoint there; the resumed run ends as the
    uninterrupted one, and the records are the same whatever the steps a call."""
    calls = ["train.log_every = 3", "train.checkpoint_every = 6"]
    straight, cut, single = tmp_path / "straight", tmp_path / "cut", tmp_path / "single"
    _run(kind, straight, *calls)
    _run(kind, single, *calls, "train.steps_per_execution = 1")
    with pytest.raises(KeyboardInterrupt):
        _run(kind, cut, *calls, at_step=2, action=lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert [os.path.basename(p) for p in runs.checkpoint_prefixes(str(cut / "checkpoints"))] == [
        "ckpt-3"
    ]
    _run(kind, cut, *calls)
    for other in (cut, single):
        ours, theirs = _losses(other), _losses(straight)
        assert [s for s, _ in ours] == [s for s, _ in theirs] == [3, 6]
        np.testing.assert_allclose([v for _, v in ours], [v for _, v in theirs], rtol=1e-6)
        final, expected = runs.RunDir(other).final(), runs.RunDir(straight).final()
        for key, value in expected.items():
            np.testing.assert_allclose(final[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
