"""Gal & Ghahramani's MC dropout regression network and many-draw predictive sampling."""

import numpy as np
import pytest
import tensorflow as tf

from blayers import layers
from blayers.lab import models
from blayers.lab.data.base import from_arrays
from blayers.lab.tasks import Regression


def test_mc_dropout_regressor_follows_gal_and_ghahramani():
    p, tau, s, lengthscale = 0.05, 0.5, 3.0, 1e-2
    model = models.mc_dropout_regressor((4,), 2, dropout_rate=p, tau=tau, target_scale=s)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == ["MCDropout", "Dense", "MCDropout", "Dense", "GaussianLikelihood"]
    assert model.layers[1].units == 50 and model.layers[3].units == 1
    decay = lengthscale**2 * (1 - p) * s**2 / 4
    for dense in (model.layers[1], model.layers[3]):
        np.testing.assert_allclose(dense.kernel_regularizer.l2, decay, rtol=1e-6)
        assert dense.bias_regularizer is None  # their code decays kernels only
    likelihood = model.layers[-1]
    np.testing.assert_allclose(float(likelihood.noise_variance), 1 / (tau * s**2), rtol=1e-5)
    assert not likelihood.trainable_weights  # tau is fixed, not learned


def test_mc_dropout_objective_is_theirs_up_to_scale():
    """The trainer's `mean NLL + sum(losses) / N` has the gradient of their Keras objective
    `MSE + l^2 (1 - p) / (2 N tau) ||W||^2` times `1 / (2 sigma^2)` on every weight, so Adam
    (invariant to the loss's scale) takes their steps."""
    p, tau, s, n = 0.1, 0.25, 2.0, 40
    model = models.mc_dropout_regressor((3,), 2, dropout_rate=p, tau=tau, target_scale=s)
    x = tf.random.stateless_normal([n, 3], seed=[1, 2])
    y = tf.random.stateless_normal([n, 1], seed=[3, 4])
    model(x)
    with tf.GradientTape(persistent=True) as tape:
        outputs = model(x, training=True)
        f = outputs.distribution.mean()
        ours = tf.reduce_mean(Regression().negative_log_likelihood(outputs, y))
        ours += tf.add_n(model.losses) / n
        kernels = [w for w in model.trainable_weights if "kernel" in w.path]
        reg = 1e-4 * (1 - p) / (2 * n * tau)
        theirs = tf.reduce_mean(tf.square(y - f)) + reg * tf.add_n(
            [tf.reduce_sum(tf.square(k)) for k in kernels]
        )
    sigma2 = 1 / (tau * s**2)
    for w in model.trainable_weights:
        np.testing.assert_allclose(
            tape.gradient(ours, w).numpy(),
            tape.gradient(theirs, w).numpy() / (2 * sigma2),
            rtol=1e-4,
            atol=1e-7,
        )


def test_predictive_samples_draws_thousands_in_graph_loops():
    """70 draws in chunks of 32: every draw is a fresh dropout mask (no chunk repeats one),
    and their mean is the deterministic network's output within 5 standard errors."""
    x = np.random.default_rng(0).normal(size=(20, 3)).astype("float32")
    data = from_arrays("toy", "regression", x, x[:, :1], x, x[:, :1])
    model = models.mlp(
        (3,),
        2,
        hidden_units=(),
        dense_layer="Dense",
        dropout_rate=0.3,
        input_dropout=True,
        noise_variance=0.1,
    )
    model(x)
    means, stddevs = Regression().predictive_samples(model, data.test, 70, draws_per_call=32)
    assert means.shape == (70, 20, 1) and stddevs.shape == (70, 20, 1)
    assert len({m.tobytes() for m in means}) == 70
    # Inverted dropout is unbiased: E[f] is the network without dropout.
    dense = model.layers[1]
    exact = x @ dense.kernel.numpy() + dense.bias.numpy()
    se = means.std(0, ddof=1) / np.sqrt(70)
    assert np.all(np.abs(means.mean(0) - exact) < 5 * se + 1e-6)
    assert isinstance(model.layers[-1], layers.GaussianLikelihood)


@pytest.mark.parametrize("dense_layer", ["DenseFlipout", "DenseReparameterization"])
def test_predictive_samples_of_random_weights_are_each_a_new_draw(dense_layer):
    """The evaluation's draw function is traced once and called for every draw: each call
    draws new weights (40 draws in chunks of 16, all different)."""
    x = np.random.default_rng(0).normal(size=(20, 3)).astype("float32")
    data = from_arrays("toy", "regression", x, x[:, :1], x, x[:, :1])
    model = models.mlp((3,), 2, hidden_units=(8,), dense_layer=dense_layer, noise_variance=0.1)
    model(x)
    means, _ = Regression().predictive_samples(model, data.test, 40, draws_per_call=16)
    assert len({m.tobytes() for m in means}) == 40


def test_an_evaluation_traces_the_network_once_for_every_data_set_and_batch():
    """The draws of the test set (batches of 8, 8 and 4), of a set of another size and the
    penultimate features of a third share one trace of the network each: a trace of a large
    network costs seconds, and every evaluation asks for several sets."""
    from blayers.posthoc.feature_density import penultimate_features

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3)).astype("float32")
    other = rng.normal(size=(13, 3)).astype("float32")
    model = models.mlp((3,), 2, hidden_units=(8,), dense_layer="DenseFlipout", noise_variance=0.1)
    model(x)
    hidden, calls = model.layers[1], []
    call = hidden.call
    hidden.call = lambda *args, **kwargs: calls.append(1) or call(*args, **kwargs)
    task = Regression()
    for inputs in (x, other):
        dataset = from_arrays("toy", "regression", x, x[:, :1], inputs, inputs[:, :1]).test
        means, _ = task.predictive_samples(model, dataset, 5, batch_size=8, draws_per_call=2)
        assert means.shape == (5, len(inputs), 1)
    assert len(calls) == 1  # every draw, batch and set ran the first trace
    for inputs in (x, other, x[:5]):
        features = penultimate_features(model, inputs, batch_size=8)
        assert len(features) == len(inputs)
    assert len(calls) == 2
