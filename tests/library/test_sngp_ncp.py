"""Spectral normalization, SNGP's random-feature GP head, the heteroscedastic output layer and
noise contrastive priors: maths against closed forms, then Keras integration."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from conftest import check_moments

import blayers
from blayers.layers import (
    MCSoftmaxDenseFA,
    NCPCategoricalPerturb,
    NCPNormalOutput,
    NCPNormalPerturb,
    RandomFeatureGaussianProcess,
    SpectralNormalization,
    SpectralNormalizationConv2D,
)
from blayers.layers.gp import mean_field_logits

tfd = tfp.distributions
RNG = np.random.RandomState(0)


def test_spectral_normalization_bounds_the_dense_kernel_norm():
    layer = SpectralNormalization(keras.layers.Dense(6), norm_multiplier=0.9)
    x = RNG.randn(3, 5).astype("float32")
    layer(x)
    layer.layer.kernel.assign(layer.layer.kernel * 10.0)
    for _ in range(30):
        layer(x, training=True)
    kernel, sigma = layer.normalized_kernel()
    top = np.linalg.svd(np.asarray(layer.layer.kernel), compute_uv=False)[0]
    np.testing.assert_allclose(float(sigma), top, rtol=1e-3)
    np.testing.assert_allclose(np.linalg.svd(kernel.numpy(), compute_uv=False)[0], 0.9, rtol=1e-3)
    np.testing.assert_allclose(
        layer(x), x @ kernel.numpy() + np.asarray(layer.layer.bias), rtol=1e-5, atol=1e-5
    )
    small = SpectralNormalization(keras.layers.Dense(6, kernel_initializer="zeros"))
    small(x, training=True)  # norms below the bound are left alone
    np.testing.assert_array_equal(small.normalized_kernel()[0], 0.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x, training=True) ** 2)
    assert all(g is not None for g in tape.gradient(loss, layer.trainable_weights))


@pytest.mark.parametrize("strides,padding", [(1, "same"), (2, "same"), (1, "valid")])
def test_conv_spectral_norm_is_the_operator_norm(strides, padding):
    layer = SpectralNormalizationConv2D(
        keras.layers.Conv2D(3, 3, strides=strides, padding=padding), norm_multiplier=0.5
    )
    x = RNG.randn(2, 6, 6, 2).astype("float32")
    layer(x)
    for _ in range(60):
        layer(x, training=True)
    _, sigma = layer.normalized_kernel()
    kernel = np.asarray(layer.layer.kernel)
    basis = np.eye(72, dtype="float32").reshape(72, 6, 6, 2)
    matrix = tf.reshape(tf.nn.conv2d(basis, kernel, strides, padding.upper()), [72, -1]).numpy()
    np.testing.assert_allclose(float(sigma), np.linalg.svd(matrix, compute_uv=False)[0], rtol=2e-2)


def test_rff_features_approximate_the_rbf_kernel():
    layer = RandomFeatureGaussianProcess(1, num_inducing=8192, gp_kernel_scale=2.0, seed=3)
    x = RNG.randn(5, 3).astype("float32")
    layer.build((None, 3))  # the features alone (no 8192 x 8192 covariance solve)
    phi = layer.features(x).numpy()
    sq = ((x[:, None] - x[None]) ** 2).sum(-1)
    # k(x, y) = exp(-|x - y|^2 / (2 l)); the features' error is O(1 / sqrt(D)).
    np.testing.assert_allclose(phi @ phi.T, np.exp(-sq / 4.0), atol=5 / math.sqrt(8192))


def test_sngp_posterior_is_bayesian_linear_regression():
    """With the exact sum (momentum <= 0) and ridge 1, the covariance is the posterior of
    `beta ~ N(0, I)` under unit-noise regression on the features."""
    layer = RandomFeatureGaussianProcess(
        3, num_inducing=32, gp_cov_momentum=-1.0, return_covariance=True, seed=0
    )
    x1, x2, xt = (RNG.randn(8, 4).astype("float32") for _ in range(3))
    layer(x1, training=True)
    layer(x2, training=True)
    phi = np.concatenate([layer.features(x1), layer.features(x2)])
    np.testing.assert_allclose(layer.precision, phi.T @ phi, rtol=1e-4, atol=1e-5)
    logits, covariance = layer(xt)
    phit = layer.features(xt).numpy()
    expected = phit @ np.linalg.inv(np.eye(32) + phi.T @ phi) @ phit.T
    np.testing.assert_allclose(covariance, expected, rtol=1e-3, atol=1e-5)
    plain = RandomFeatureGaussianProcess.from_config(
        {**layer.get_config(), "return_covariance": False}
    )
    plain(xt)
    plain.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        plain(xt), mean_field_logits(logits, np.diag(expected)), rtol=1e-4, atol=1e-5
    )
    layer.begin_epoch()  # the trainer's epoch start restarts the exact sum
    np.testing.assert_array_equal(layer.precision, 0.0)


def test_sngp_moving_average_precision():
    layer = RandomFeatureGaussianProcess(2, num_inducing=16, gp_cov_momentum=0.9, seed=0)
    x = RNG.randn(6, 3).astype("float32")
    layer(x, training=True)
    phi = layer.features(x).numpy()
    np.testing.assert_allclose(layer.precision, 0.1 * phi.T @ phi / 6, rtol=1e-4, atol=1e-6)
    layer.begin_epoch()  # a moving average is not reset
    assert np.abs(np.asarray(layer.precision)).sum() > 0


def test_heteroscedastic_softmax_is_the_monte_carlo_predictive():
    layer = MCSoftmaxDenseFA(3, num_factors=2, temperature=0.5, num_mc_samples=20000, seed=0)
    x = RNG.randn(2, 4).astype("float32")
    log_probs = layer(x).numpy()
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, rtol=1e-5)
    loc, factors, diag = (t.numpy() for t in layer.noise_distribution(x))
    cov = factors @ factors.transpose(0, 2, 1) + np.stack([np.diag(d**2) for d in diag])
    rng = np.random.default_rng(1)
    for i in range(2):
        u = rng.multivariate_normal(loc[i], cov[i], size=20000) / 0.5
        p = np.exp(u - u.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        se = p.std(0) / math.sqrt(20000)
        np.testing.assert_array_less(np.abs(np.exp(log_probs[i]) - p.mean(0)), 5 * 2 * se + 1e-4)


def test_ncp_normal_output_kl_is_the_closed_form():
    mean = RNG.randn(4, 1).astype("float32")
    targets = RNG.randn(2, 1).astype("float32")
    layer = NCPNormalOutput(stddev=2.0)
    out = layer(blayers.Normal(mean, 0.5), targets, training=True)
    assert out.shape == (2, 1)
    np.testing.assert_allclose(out.distribution.mean(), mean[:2])
    expected = tfd.Normal(targets, 2.0).kl_divergence(tfd.Normal(mean[2:], 0.5))
    np.testing.assert_allclose(
        float(layer.losses[0]), float(tf.reduce_sum(expected)) / 2, rtol=1e-5
    )
    np.testing.assert_array_equal(layer(mean, training=False), mean)  # prediction: unchanged


def test_ncp_perturbations():
    x = np.zeros((2000, 2), "float32")
    doubled = NCPNormalPerturb(mean=0.5, stddev=0.3)(x, training=True).numpy()
    np.testing.assert_array_equal(doubled[:2000], x)
    check_moments(doubled[2000:].reshape(-1, 1), 0.5, 0.09)
    assert NCPNormalPerturb()(x).shape == (2000, 2)
    ints = np.zeros((5000, 1), "int32")
    flipped = NCPCategoricalPerturb(4, probs=0.4)(ints, training=True).numpy()[5000:]
    changed = (flipped != 0).mean()  # flipped with 0.4, to another category with 3/4
    assert abs(changed - 0.3) < 5 * math.sqrt(0.3 * 0.7 / 5000)
    assert flipped.max() < 4 and flipped.min() >= 0


def test_ncp_regression_model_trains():
    inputs = keras.Input((1,))
    targets = keras.Input((1,))
    h = NCPNormalPerturb(stddev=0.5)(inputs)
    h = keras.layers.Dense(16, activation="relu")(h)
    mean = blayers.layers.DenseVariationalDropout(1)(h)
    mean = NCPNormalOutput(stddev=1.0)(mean, targets)
    model = keras.Model([inputs, targets], mean)
    x = RNG.uniform(-1, 1, (64, 1)).astype("float32")
    y = 2 * x
    optimizer = keras.optimizers.Adam(0.03)

    @tf.function  # the layers in a compiled step, as a training loop runs them
    def step():
        with tf.GradientTape() as tape:
            pred = model([x, y], training=True)
            loss = tf.reduce_mean((pred - y) ** 2) + tf.add_n(model.losses) / 64.0
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    for _ in range(150):
        step()
    assert float(tf.reduce_mean((model([x, y]) - y) ** 2)) < 0.05
