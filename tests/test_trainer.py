"""The trainer in-process: outputs, ELBO bookkeeping, the non-finite guard, resume."""

import json
import os
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import data as data_lib
from blayers import models, trainer
from blayers.layers import DenseFlipout


def _small_digits():
    return data_lib.digits(ood="uniform_noise")


def _mlp(input_shape, num_outputs):
    return models.mlp(input_shape, num_outputs, hidden_units=(16,), dense_layer="DenseFlipout")


def test_outputs_metrics_and_plots(tmp_path):
    model_dir = str(tmp_path / "run")
    metrics = trainer.train(
        model_dir,
        data=_small_digits(),
        model=_mlp,
        train_steps=12,
        batch_size=64,
        log_every=4,
        eval_every=6,
        num_eval_samples=2,
        progress=False,
    )
    for key in (
        "accuracy",
        "nll",
        "ece",
        "brier",
        "entropy",
        "mutual_information",
        "ood_auroc_entropy",
    ):
        assert key in metrics and np.isfinite(metrics[key])
    names = set(os.listdir(model_dir))
    assert {
        "checkpoints",
        "tensorboard",
        "operative_config.gin",
        "metrics.json",
        "history.jsonl",
        "training_curves.png",
        "reliability.png",
    } <= names
    assert os.listdir(os.path.join(model_dir, "tensorboard"))
    summary = json.loads(pathlib.Path(model_dir, "metrics.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 12
    records = [
        json.loads(line)
        for line in pathlib.Path(model_dir, "history.jsonl").read_text().splitlines()
    ]
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train_records] == [4, 8, 12]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [6, 12]
    for r in train_records:  # loss = nll + beta * KL / N, with beta = 1 by default
        assert r["loss"] == pytest.approx(r["nll"] + r["kl_per_example"], rel=1e-5)
        assert r["elbo"] == pytest.approx(-r["loss"], rel=1e-5)


def test_regression_writes_1d_plot_and_metrics(tmp_path):
    toy = data_lib.heteroscedastic_1d(num_train=64, num_test=32)
    metrics = trainer.train(
        str(tmp_path),
        data=toy,
        model=_mlp,
        train_steps=4,
        batch_size=32,
        num_eval_samples=2,
        progress=False,
    )
    assert {"rmse", "nlpd", "test_log_likelihood", "coverage_95"} <= set(metrics)
    assert os.path.exists(tmp_path / "regression_1d.png")


def test_kl_is_divided_by_dataset_size_and_annealed(tmp_path):
    toy = data_lib.heteroscedastic_1d(num_train=64, num_test=8)
    trainer.train(
        str(tmp_path),
        data=toy,
        model=_mlp,
        train_steps=4,
        batch_size=64,
        log_every=1,
        num_eval_samples=1,
        progress=False,
        kl_schedule=lambda step: tf.cast(step, tf.float32) * 0.25,
    )
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["kl_weight"] for r in train_records] == [0.0, 0.25, 0.5, 0.75]
    for r in train_records:
        assert r["loss"] == pytest.approx(r["nll"] + r["kl_weight"] * r["kl_per_example"], rel=1e-5)


class BlowUpAfter(keras.layers.Layer):
    """Returns +inf from its `after`-th call on (a stand-in for a diverging layer)."""

    def __init__(self, after, **kwargs):
        super().__init__(**kwargs)
        self.after = after

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

    def call(self, x):
        self.calls.assign_add(1.0)
        return tf.where(self.calls >= self.after, np.inf, 1.0) * x


def test_non_finite_loss_names_step_and_layer_and_keeps_checkpoint(tmp_path):
    def model_fn(input_shape, num_outputs):
        return keras.Sequential(
            [
                keras.Input(input_shape),
                DenseFlipout(8, name="hidden"),
                BlowUpAfter(6, name="blow_up"),
                DenseFlipout(num_outputs),
            ]
        )

    with pytest.raises(trainer.NonFiniteLossError) as error:
        trainer.train(
            str(tmp_path),
            data=_small_digits(),
            model=model_fn,
            train_steps=20,
            batch_size=32,
            checkpoint_every=2,
            progress=False,
        )
    message = str(error.value)
    assert "step 6" in message and "'blow_up' (output)" in message and "ckpt-4" in message
    checkpoints = tf.train.get_checkpoint_state(str(tmp_path / "checkpoints"))
    assert checkpoints.model_checkpoint_path.endswith("ckpt-4")
    assert not os.path.exists(tmp_path / "metrics.json")


def test_first_non_finite_layer_checks_kl_too():
    layer = DenseFlipout(3, name="bad_kl")
    model = keras.Sequential([keras.Input((4,)), DenseFlipout(4, name="fine"), layer])
    model(np.ones((2, 4), "float32"))
    # softplus(-200) underflows to 0: a finite parameter, an infinite KL.
    layer.kernel_initializer.stddev.assign(tf.fill([4, 3], -200.0))
    assert trainer.first_non_finite_layer(model, np.ones((2, 4), "float32")) == (
        "bad_kl",
        "KL / regularization loss",
    )


def _jitter(features, target, seed):
    return features + 0.3 * tf.random.stateless_normal(tf.shape(features), seed), target


@pytest.mark.parametrize("augment", [None, _jitter], ids=["plain", "augmented"])
def test_resume_continues_from_the_checkpoint(tmp_path, augment):
    digits = _small_digits()
    digits.augment = augment  # per-example noise: a resumed run must replay its draws
    kwargs = {
        "data": digits,
        "model": _mlp,
        "batch_size": 64,
        "log_every": 5,
        "checkpoint_every": 5,
        "num_eval_samples": 1,
        "progress": False,
        "seed": 3,
    }
    trainer.train(str(tmp_path / "a"), train_steps=10, **kwargs)
    trainer.train(str(tmp_path / "a"), train_steps=20, **kwargs)  # resumes at 10
    trainer.train(str(tmp_path / "b"), train_steps=20, **kwargs)  # uninterrupted twin
    summary = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert summary["resumed_from_step"] == 10 and summary["step"] == 20

    def train_losses(run):
        return [
            r["nll"]
            for r in map(json.loads, (tmp_path / run / "history.jsonl").read_text().splitlines())
            if r["kind"] == "train"
        ]

    # Same seed, same data order and optimizer state: the resumed run retraces the twin.
    np.testing.assert_allclose(train_losses("a"), train_losses("b"), rtol=1e-4)


def test_optimizer_errors():
    with pytest.raises(ValueError, match="Unknown optimizer 'adamm'"):
        trainer.make_optimizer("adamm")
    assert isinstance(trainer.make_optimizer("sgd", 0.1), keras.optimizers.SGD)


def test_trains_on_mocked_tfds(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=64):
        mnist = data_lib.tfds_dataset("mnist", flatten=True)
        metrics = trainer.train(
            str(tmp_path),
            data=mnist,
            model=_mlp,
            train_steps=3,
            batch_size=32,
            num_eval_samples=1,
            progress=False,
        )
    assert 0.0 <= metrics["accuracy"] <= 1.0
