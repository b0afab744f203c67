"""A run folder's promises when it is reused: a run of another model is refused before anything
in the folder changes, a refused command line leaves `command.json` alone, and the Mesh
TensorFlow loop keeps the Keras loop's promises (changed bindings refused, the newest intact
checkpoint, a copied folder restores its own, a checkpoint on SIGTERM)."""

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import gin
import numpy as np
import pytest

from blayers.lab import config, run_files, trainer
from blayers.lab import models as models_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
        ["train.progress = False", "train.train_steps = 4", "train.checkpoint_every = 2", *params],
    )


def test_a_changed_model_binding_is_refused_before_anything_changes(tmp_path):
    _digits()
    trainer.train(str(tmp_path))
    before = _snapshot(tmp_path)
    _digits("mlp.hidden_units = (64,)")  # another model in the same folder
    with pytest.raises(run_files.ChangedBindingsError, match=r"mlp.hidden_units: \(32,\) -> "):
        trainer.train(str(tmp_path))
    assert _snapshot(tmp_path) == before  # no .damaged files, history and metrics intact
    _digits()  # re-running the finished run evaluates again, replacing its record
    trainer.train(str(tmp_path))
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").open()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [4]
    _digits("train.train_steps = 6")  # the same model resumes
    trainer.train(str(tmp_path))
    assert json.loads((tmp_path / "metrics.json").read_text())["resumed_from_step"] == 4


def test_a_checkpoint_of_another_model_is_refused_not_taken_for_damage(tmp_path):
    """Without gin (the Python API), the restore itself tells another model from damage."""
    from blayers.lab import data as data_lib

    digits = data_lib.digits()
    quick = {"train_steps": 2, "checkpoint_every": 2, "progress": False, "num_eval_samples": 1}

    def mlp(units):
        return lambda shape, n: models_lib.mlp(shape, n, hidden_units=(units,))

    trainer.train(str(tmp_path), data=digits, model=mlp(8), **quick)
    before = _snapshot(tmp_path)
    with pytest.raises(run_files.CheckpointMismatchError, match=r"ckpt-2 does not fit"):
        trainer.train(str(tmp_path), data=digits, model=mlp(16), **dict(quick, train_steps=4))
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
            *(f"--gin_param={p}" for p in params),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_refused_invocation_leaves_the_command_record(tmp_path):
    """The run is made in-process (its command record set as the CLI sets it); the two
    invocations that must change nothing go through the command line."""
    _digits()
    run_files.set_command({"command": "python -m blayers.train (the first run)"})
    try:
        trainer.train(str(tmp_path))
    finally:
        run_files.set_command({})
    command = (tmp_path / "command.json").read_text()
    assert "the first run" in command
    refused = _cli(tmp_path, "train.train_steps = 2", "make_optimizer.learning_rate = 0.5")
    assert refused.returncode == 4 and "make_optimizer.learning_rate" in refused.stderr
    bad = _cli(tmp_path, "train.train_stepz = 3")
    assert bad.returncode == 2
    assert (tmp_path / "command.json").read_text() == command


# -- the Mesh TensorFlow loop --------------------------------------------------------------------


def _mesh(model_dir, *params):
    from blayers.lab.mesh import trainer as mesh_trainer

    gin.clear_config()
    config.parse(
        ["bayesian_transformer_mesh_smoke"],
        [
            "train_mesh.train_steps = 6",
            "train_mesh.checkpoint_every = 2",
            "train_mesh.log_every = 2",
            "train_mesh.num_eval_samples = 1",
            "synthetic_translation.num_train = 128",
            "synthetic_translation.num_test = 8",
            "SequenceToSequence.num_decode = 2",
            "SequenceToSequence.decode_samples = 1",
            *params,
        ],
    )
    return mesh_trainer.train_mesh(str(model_dir))


def _train_losses(model_dir):
    lines = (pathlib.Path(model_dir) / "history.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines) if r["kind"] == "train"]


def test_mesh_run_folder_promises(tmp_path):
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    _mesh(straight)
    _mesh(cut, "train_mesh.train_steps = 4")
    # A changed binding that cannot apply is refused, naming it; nothing changes.
    before = _snapshot(cut)
    with pytest.raises(run_files.ChangedBindingsError, match="train_mesh.learning_rate"):
        _mesh(cut, "train_mesh.learning_rate = 0.05")
    assert _snapshot(cut) == before
    # A copied folder restores its own checkpoint (relative paths), even with the original gone;
    # the newest checkpoint truncated, it falls back to the newest intact one, naming it.
    moved = tmp_path / "moved"
    shutil.copytree(cut, moved)
    shutil.rmtree(cut)
    data_file = next((moved / "checkpoints").glob("model.ckpt-4.data-*"))
    data_file.write_bytes(data_file.read_bytes()[:50])
    _mesh(moved)
    summary = json.loads((moved / "metrics.json").read_text())
    assert summary["step"] == 6 and summary["resumed_from_step"] == 2
    assert list((moved / "checkpoints").glob("model.ckpt-4.*.damaged"))
    # ... and continues exactly where the uninterrupted run is at that step.
    np.testing.assert_allclose(_train_losses(moved), _train_losses(straight), rtol=1e-5)
    # keep-N counts the checkpoints already on disk after a resume
    kept = sorted((moved / "checkpoints").glob("model.ckpt-*.index"))
    assert len(kept) <= 3


def test_the_seed_macro_reaches_every_learner():
    """`--sweep seed=[0,1]` varies every kind of run: each config's entry point reads `%seed`."""
    entries = {
        "digits_mlp_smoke": "train.seed",
        "bayesian_transformer_mesh_smoke": "train_mesh.seed",
        "bayesian_transformer_lm_mesh_smoke": "train_mesh.seed",
        "bayesian_planet_smoke": "train_planet.seed",
        "cox_process_smoke": "train.seed",
    }
    for gin_file, entry in entries.items():
        gin.clear_config()
        config.parse([gin_file], ["seed = 7"])
        value = gin.query_parameter(entry)
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
        "--gin_param=train_mesh.train_steps = 100000",
        "--gin_param=train_mesh.checkpoint_every = 100000",
        "--gin_param=train_mesh.log_every = 5",
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
    prefixes = run_files.checkpoint_prefixes(str(tmp_path / "checkpoints"))
    step = int(prefixes[0].rsplit("-", 1)[1])
    assert step >= 10  # the step it stopped at, not the last periodic checkpoint (none)
    assert os.path.exists(tmp_path / "command.json")
