"""The SG-MCMC learner on the main job: samples kept on schedule in the checkpoint, an exact
resume that keeps the same samples, the predictive averaged over them, and a clear refusal of
random weights."""

import functools

import numpy as np
import pytest
import tensorflow as tf

from blayers.lab import data as data_lib
from blayers.lab import loop, models
from blayers.lab.learners.sgmcmc import SGMCMCLearner

_SCHEDULE = {
    "log_every": 2,
    "eval_every": 8,
    "checkpoint_every": 4,
    "progress": False,
    "plots": False,
}


def _learner(**kwargs):
    model = functools.partial(
        models.mlp, hidden_units=(16,), dense_layer="Dense", prior_precision=0.1
    )
    settings = {
        "data": data_lib.digits(),
        "model": model,
        "learning_rate": 0.05,
        "cycle_length": 8,
        "exploration_fraction": 0.5,
        "thinning": 2,
        "burn_in": 0,
        "max_samples": 3,
        "batch_size": 64,
        "num_eval_samples": 1,
    }
    settings.update(kwargs)
    return SGMCMCLearner(**settings)


def _samples(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir / "checkpoints"))
    names = sorted(k for k in reader.get_variable_to_shape_map() if k.startswith("samples/buffers"))
    count = reader.get_tensor("samples/count/.ATTRIBUTES/VARIABLE_VALUE")
    return count, [reader.get_tensor(n) for n in names]


def test_keeps_samples_resumes_exactly_and_averages_them(tmp_path):
    """Cycles of 8 steps, sampling from position 4, every 2nd from the end: steps 6, 8, 14, 16
    are kept (the ring holds the last 3). A run cut at step 12 resumes to the same samples and
    metrics as the uninterrupted one."""
    twin = loop.train(str(tmp_path / "twin"), learner=_learner(), train_steps=16, **_SCHEDULE)
    loop.train(str(tmp_path / "cut"), learner=_learner(), train_steps=12, **_SCHEDULE)
    resumed = loop.train(str(tmp_path / "cut"), learner=_learner(), train_steps=16, **_SCHEDULE)
    count, samples = _samples(tmp_path / "twin")
    assert count == 4 and twin["kept_samples"] == 3
    count_cut, samples_cut = _samples(tmp_path / "cut")
    assert count_cut == 4
    for a, b in zip(samples, samples_cut):
        np.testing.assert_array_equal(a, b)
    assert resumed["nll"] == pytest.approx(twin["nll"], rel=1e-6)
    assert twin["mutual_information"] > 0  # the samples differ: the predictive averages them
    assert np.isfinite(twin["accuracy"])


def test_refuses_random_weights(tmp_path):
    model = functools.partial(models.mlp, hidden_units=(8,), dense_layer="DenseFlipout")
    with pytest.raises(ValueError, match="deterministic network.*kernel"):
        loop.train(str(tmp_path), learner=_learner(model=model), train_steps=1, **_SCHEDULE)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="max_samples"):
        _learner(max_samples=100)
    with pytest.raises(ValueError, match="sampler"):
        _learner(sampler="nuts")
