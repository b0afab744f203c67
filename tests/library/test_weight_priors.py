"""Variational dropout, hierarchical priors, the new initializers and regularizers: maths
against closed forms and quadrature, then Keras integration."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from conftest import check_moments, graph_draws
from scipy import integrate

import blayers
from blayers import constraints, initializers, regularizers
from blayers.layers import (
    Conv2DHierarchical,
    Conv2DVariationalDropout,
    DenseFlipout,
    DenseHierarchical,
    DenseReparameterization,
    DenseVariationalDropout,
)

tfd = tfp.distributions
RNG = np.random.RandomState(0)


def _set_posterior(layer, mean, stddev):
    layer.kernel_initializer.mean.assign(mean)
    layer.kernel_initializer.stddev.assign(constraints.Softplus().inverse(stddev))


def test_variational_dropout_training_moments_and_sparse_prediction():
    x = RNG.randn(1, 3).astype("float32")
    layer = DenseVariationalDropout(2, use_bias=False)
    layer.build((None, 3))
    mean = np.array([[1.0, -0.5], [0.3, 2.0], [0.01, 0.8]], "float32")
    stddev = np.array([[0.5, 0.1], [0.3, 0.2], [1.0, 0.1]], "float32")  # weight [2, 0]: alpha 1e4
    _set_posterior(layer, mean, stddev)
    log_alpha = np.clip(2 * np.log(stddev) - np.log(mean**2 + 1e-8), -8, 8)
    variance = np.exp(log_alpha) * mean**2
    draws = graph_draws(lambda: layer(x, training=True)[0], 3000)  # new noise each
    check_moments(draws, (x @ mean)[0], (x**2 @ variance)[0])
    kept = (log_alpha < 3.0).astype("float32")
    np.testing.assert_allclose(layer(x, training=False), x @ (mean * kept), rtol=1e-5)
    assert layer.sparsity() == pytest.approx(1 / 6)


def test_log_uniform_kl_matches_molchanov_within_their_error():
    """-KL(alpha) = 0.5 log alpha - E log|1 + sqrt(alpha) eps| + E log|eps| (the constant makes
    it vanish as alpha -> inf); Molchanov et al.'s fit is within about 0.01 of it."""

    def expected_log_abs(scale):
        f = lambda e: np.log(np.abs(1 + scale * e)) * np.exp(-e * e / 2) / math.sqrt(2 * math.pi)
        points = [-1 / scale] if scale > 1e-3 else []
        return integrate.quad(f, -40, 40, points=points, limit=400)[0]

    const = -(np.euler_gamma + math.log(2)) / 2  # E log|eps|
    for alpha in (0.01, 0.1, 1.0, 10.0, 100.0):
        exact = -(0.5 * math.log(alpha) - expected_log_abs(math.sqrt(alpha)) + const)
        rv = blayers.Normal(tf.constant([1.0]), tf.constant([math.sqrt(alpha)]))
        approx = float(regularizers.LogUniformKLDivergence()(rv))
        assert abs(approx - exact) < 0.015, (alpha, approx, exact)


def test_conv_variational_dropout_prunes_at_prediction():
    layer = Conv2DVariationalDropout(2, 3, padding="same")
    x = tf.ones([1, 4, 4, 2])
    layer(x, training=True)
    mean, _ = layer.kernel_initializer.parameters().values()
    expected = tf.nn.conv2d(x, mean * tf.cast(layer.log_alpha() < 3.0, tf.float32), 1, "SAME")
    np.testing.assert_allclose(layer(x), expected + np.asarray(layer.bias), rtol=1e-5, atol=1e-6)
    assert len(layer.losses) == 1


@pytest.mark.parametrize(
    "cls,x",
    [
        (DenseHierarchical, RNG.randn(3, 4).astype("float32")),
        (Conv2DHierarchical, RNG.randn(2, 5, 5, 4).astype("float32")),
    ],
)
def test_hierarchical_kernel_is_scaled_per_input_unit(cls, x):
    layer = cls(3) if cls is DenseHierarchical else cls(3, 3)
    layer(x)
    assert len(layer.losses) == 3  # kernel, local and global scales
    with blayers.posterior_mean():
        y = layer(x).numpy()
    mean = layer.kernel_initializer.parameters()["mean"].numpy()
    local = tfd.LogNormal(**layer.local_scale_initializer.parameters()).mean().numpy()
    glob = tfd.LogNormal(**layer.global_scale_initializer.parameters()).mean().numpy()
    kernel = mean * (local * glob)[:, None]  # input units are the kernel's second-last axis
    if cls is DenseHierarchical:
        expected = x @ kernel
    else:
        expected = tf.nn.conv2d(x, kernel, 1, "VALID").numpy()
    np.testing.assert_allclose(y, expected + np.asarray(layer.bias), rtol=1e-4, atol=1e-5)


def test_log_normal_and_uniform_kl_closed_forms():
    q = blayers.LogNormal(tf.constant([0.2, -0.1]), tf.constant([0.5, 0.3]))
    kl = float(regularizers.LogNormalKLDivergence(loc=0.1, scale=0.7)(q))
    expected = tf.reduce_sum(
        tfd.Normal([0.2, -0.1], [0.5, 0.3]).kl_divergence(tfd.Normal(0.1, 0.7))
    )
    np.testing.assert_allclose(kl, expected, rtol=1e-5)
    u = blayers.Beta(tf.constant([2.0, 3.0]), tf.constant([2.0, 1.5]))
    value = float(regularizers.UniformKLDivergence()(u))
    np.testing.assert_allclose(value, -float(tf.reduce_sum(u.distribution.entropy())), rtol=1e-5)


def test_cauchy_kl_monte_carlo_is_unbiased():
    loc, scale = np.float32(0.3), np.float32(0.5)
    regularizer = regularizers.CauchyKLDivergence(scale=2.0)

    def kl(i):  # seed (i, 1) for draw i
        return regularizer(blayers.Normal(tf.fill([1], loc), tf.fill([1], scale), seed=[i, 1]))

    draws = graph_draws(kl, 4000, indexed=True)
    q = tfd.Normal(loc, scale)
    z = q.sample(200_000, seed=7)
    exact = float(tf.reduce_mean(q.log_prob(z) - tfd.Cauchy(0.0, 2.0).log_prob(z)))
    assert abs(np.mean(draws) - exact) < 5 * np.std(draws) / math.sqrt(len(draws)) + 0.01


def test_empirical_bayes_variance_is_the_minimizer():
    mean = RNG.randn(5, 3).astype("float32")
    stddev = RNG.uniform(0.1, 0.5, (5, 3)).astype("float32")
    rv = blayers.Independent(tfd.Normal(mean, stddev), reinterpreted_batch_ndims=2)
    reg = regularizers.NormalEmpiricalBayesKLDivergence()
    v = float(reg.optimal_variance(rv))

    def objective(variance):
        prior = tfd.Normal(0.0, math.sqrt(variance))
        kl = tf.reduce_sum(tfd.Normal(mean, stddev).kl_divergence(prior))
        return float(kl - tfd.InverseGamma(2.01, 0.101).log_prob(variance))

    np.testing.assert_allclose(float(reg(rv)), objective(v), rtol=1e-5)
    assert objective(v) < objective(v * 1.05) and objective(v) < objective(v * 0.95)


def test_trainable_prior_stddev_trains_and_round_trips(tmp_path):
    model = keras.Sequential(
        [
            keras.Input((3,)),
            DenseFlipout(2, kernel_regularizer="trainable_normal_kl_divergence_stddev"),
        ]
    )
    layer = model.layers[0]
    reg = layer.kernel_regularizer
    with tf.GradientTape() as tape:
        model(tf.ones([1, 3]))
        loss = tf.add_n(model.losses)
    params = layer.kernel_initializer.parameters()
    expected = tf.reduce_sum(
        tfd.Normal(params["mean"], params["stddev"]).kl_divergence(
            tfd.Normal(0.0, reg.prior_stddev())
        )
    )
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
    assert tape.gradient(loss, reg.stddev) is not None
    assert any("prior_stddev" in w.path for w in model.trainable_weights)
    reg.stddev.assign(0.3)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert float(loaded.layers[0].kernel_regularizer.stddev) == pytest.approx(0.3)


def test_mixture_of_deltas_draws_its_locations_at_their_weights():
    init = initializers.TrainableMixtureOfDeltas(num_components=3, seed=1)
    layer = DenseReparameterization(
        1, use_bias=False, kernel_initializer=init, kernel_regularizer=None
    )
    layer.build((None, 1))
    init.logits.assign(np.log([[[0.2, 0.3, 0.5]]]))
    locations = np.asarray(init.loc)[0, 0]
    values = graph_draws(lambda: init((1, 1)).value[0, 0], 3000)  # a new draw each
    assert np.all(np.min(np.abs(values[:, None] - locations[None, :]), axis=1) < 1e-6)
    for k, p in enumerate([0.2, 0.3, 0.5]):
        freq = np.mean(np.isclose(values, locations[k]))
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / 3000)


def test_orthogonal_random_features_are_blockwise_orthogonal_and_marginally_normal():
    d = 8
    w = initializers.OrthogonalRandomFeatures(stddev=2.0, seed=0)((d, 3 * d)).numpy()
    block = w[:, :d]
    gram = block.T @ block
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-4)
    many = np.concatenate(
        [
            initializers.OrthogonalRandomFeatures(stddev=2.0, seed=s)((d, d)).numpy().ravel()
            for s in range(200)
        ]
    )
    assert abs(many.var() - 4.0) < 5 * 4.0 * math.sqrt(2 / len(many)) + 0.1


def test_random_sign():
    values = initializers.get("random_sign")((100, 100)).numpy()
    assert set(np.unique(values)) == {-1.0, 1.0}
    assert abs((values > 0).mean() - 0.5) < 5 * 0.5 / 100
