"""Bad input is refused before anything runs, naming the culprit: a gin file that does not
parse, a layout rule that matches no dimension, a non-positive learning rate, a loop that does
not fit the config; a batch larger than the data is said, not silently clamped."""

import pathlib
import subprocess
import sys

import gin
import pytest

from blayers.lab import config, trainer
from blayers.lab import data as data_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_an_unclosed_bracket_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text(
        "include 'digits_mlp_smoke.gin'\ntrain.train_steps = 3\nmlp.hidden_units = (32,\n"
    )
    with pytest.raises(ValueError, match=r"bad.gin, line 3: 'mlp.hidden_units = \(32,'"):
        config.parse([str(bad)])


def test_a_non_positive_learning_rate_is_refused():
    for rate in (-1.0, 0.0):
        with pytest.raises(ValueError, match="learning_rate must be positive"):
            trainer.make_optimizer(learning_rate=rate)


def test_a_layout_rule_matching_no_dimension_is_refused():
    from blayers.lab.mesh import trainer as mesh_trainer
    from blayers.lab.mesh.random import mtf
    from blayers.lab.mesh.transformer import TransformerHParams

    hparams = TransformerHParams(vocab_size=16, d_model=32, d_ff=64, num_heads=4)
    mesh = mtf.convert_to_shape("model:2")
    mesh_trainer._check_layout(hparams, 32, mesh, "heads:model;d_ff:model")
    with pytest.raises(ValueError, match=r"haeds:model names no dimension.*heads"):
        mesh_trainer._check_layout(hparams, 32, mesh, "haeds:model")


def test_a_batch_larger_than_the_data_is_said(caplog):
    digits = data_lib.digits()
    with caplog.at_level("WARNING"):
        run = trainer.Trainer("unused", digits, model=None, batch_size=100_000)
    assert run.batch_size == digits.num_train
    assert any("batch_size=100000" in r.getMessage() for r in caplog.records)


def test_the_loop_must_fit_the_config(tmp_path):
    """`--strategy=mesh` with a Keras config, or a mesh config without it, fails at once."""
    for strategy, gin_file in (
        ("mesh", "digits_mlp_smoke"),
        ("cpu", "bayesian_transformer_mesh_smoke"),
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "blayers.train",
                f"--strategy={strategy}",
                f"--gin_file={gin_file}",
                f"--model_dir={tmp_path / strategy}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2, done.stderr[-2000:]
        assert "--strategy=mesh runs the Mesh TensorFlow loop" in done.stderr
        assert not (tmp_path / strategy / "command.json").exists()
    gin.clear_config()
