"""Bayesian dense layers: estimator maths against closed forms, then Keras integration."""

import math

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import epochs_of

import blayers
from blayers import constraints
from blayers.lab import configurables  # noqa: F401 - gin names of the library
from blayers.layers import (
    DenseDVI,
    DenseFlipout,
    DenseLocalReparameterization,
    DenseReparameterization,
    MCDropout,
)
from blayers.layers.dense import bivariate_normal_cdf

ESTIMATORS = [DenseReparameterization, DenseFlipout, DenseLocalReparameterization]
RNG = np.random.RandomState(0)
X = RNG.randn(3, 4).astype("float32")
MU = (0.5 * RNG.randn(4, 2)).astype("float32")
SIGMA = RNG.uniform(0.1, 0.6, size=(4, 2)).astype("float32")


def _with_posterior(layer, mu=MU, sigma=SIGMA, input_dim=4):
    layer.build((None, input_dim))
    layer.kernel_initializer.mean.assign(mu)
    layer.kernel_initializer.stddev.assign(constraints.Softplus().inverse(sigma))
    return layer


def _graph_draws(layer, x, num_draws):
    """`num_draws` calls of `layer` on `x` in one traced graph loop (tracing one call, not
    one call per draw)."""

    @tf.function
    def call(n):
        draws = tf.TensorArray(tf.float32, size=n)
        for i in tf.range(n):
            draws = draws.write(i, layer(x))
        return draws.stack()

    return call(num_draws).numpy()


def _draws(layer, x, num_draws):
    """`num_draws` outputs of `layer` at each row of `x`, as [num_draws, rows, units]."""
    if not isinstance(layer, DenseLocalReparameterization):
        # Reparameterization: rows share one weight draw per call. Flipout: rows share the
        # perturbation and are only uncorrelated, not independent. Independent draws need
        # separate calls.
        return _graph_draws(layer, x, num_draws)
    # Local reparameterization samples each example independently: one big batch.
    tiled = np.tile(x, (num_draws, 1))
    return layer(tiled).numpy().reshape(num_draws, *x.shape[:-1], layer.units)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_output_mean_and_variance_match_closed_form(cls):
    """Each output is N(x @ mu, x^2 @ sigma^2) for a fixed mean-field posterior (bias 0)."""
    layer = _with_posterior(cls(2))
    n = 20_000
    draws = _draws(layer, X, n).astype(np.float64)
    mean, var = X @ MU, np.square(X) @ np.square(SIGMA)
    se_mean = np.sqrt(var / n)
    se_var = var * math.sqrt(2.0 / (n - 1))  # outputs are exactly Gaussian
    assert np.all(np.abs(draws.mean(0) - mean) < 5 * se_mean)
    assert np.all(np.abs(draws.var(0, ddof=1) - var) < 5 * se_var)


@pytest.mark.parametrize(
    "cls,correlated",
    [(DenseReparameterization, True), (DenseFlipout, False), (DenseLocalReparameterization, False)],
)
def test_examples_share_or_decorrelate_perturbations(cls, correlated):
    """Two identical rows in one batch: one weight draw (Reparameterization) gives identical
    outputs; Flipout's sign flips and local reparameterization make them uncorrelated."""
    layer = _with_posterior(cls(2))
    x = np.stack([X[0], X[0]])
    draws = _graph_draws(layer, x, 4000)[..., 0]  # [4000, 2]
    corr = np.corrcoef(draws[:, 0], draws[:, 1])[0, 1]
    if correlated:
        assert corr == pytest.approx(1.0, abs=1e-6)
    else:
        assert abs(corr) < 5 / math.sqrt(len(draws))


def test_flipout_signs_are_exactly_plus_minus_one():
    layer = _with_posterior(
        DenseFlipout(2), mu=np.zeros((4, 2), "float32"), sigma=np.full((4, 2), 0.3, "float32")
    )
    # With a one-hot input and one output unit per column, output = s * dW[i, j] * r: the
    # magnitude is |dW[i, j]| whatever the signs, so all rows agree up to sign exactly.
    x = np.tile(np.eye(4, dtype="float32")[:1], (512, 1))
    tf.random.set_seed(0)
    out = layer(x).numpy()
    magnitudes = np.abs(out)
    np.testing.assert_allclose(magnitudes, np.broadcast_to(magnitudes[:1], out.shape), rtol=1e-6)
    signs = np.sign(out / out[:1])
    assert set(np.unique(signs)) == {-1.0, 1.0}
    assert abs(signs.mean()) < 5 / math.sqrt(signs.size)


def test_dvi_linear_moments_match_monte_carlo():
    layer = _with_posterior(DenseDVI(2, use_bias=False))
    out = layer(X)
    assert isinstance(out, blayers.RandomVariable)
    mean = out.distribution.mean().numpy()
    cov = out.distribution.covariance().numpy()
    np.testing.assert_allclose(mean, X @ MU, rtol=1e-5, atol=1e-6)
    expected_cov = np.stack([np.diag(np.square(x) @ np.square(SIGMA)) for x in X])
    np.testing.assert_allclose(cov, expected_cov, rtol=1e-4, atol=1e-5)


def test_dvi_relu_two_layers_match_monte_carlo():
    """Moments of DVI(relu) -> DVI(linear) against weight-sampled Monte Carlo."""
    first = _with_posterior(
        DenseDVI(3, activation="relu", use_bias=False),
        mu=(0.5 * RNG.randn(4, 3)).astype("float32"),
        sigma=RNG.uniform(0.2, 0.5, (4, 3)).astype("float32"),
    )
    second = _with_posterior(
        DenseDVI(2, use_bias=False),
        mu=(0.5 * RNG.randn(3, 2)).astype("float32"),
        sigma=RNG.uniform(0.2, 0.5, (3, 2)).astype("float32"),
        input_dim=3,
    )
    hidden = first(X[:1])
    out = second(hidden)
    # Monte Carlo with independent weights per draw (local reparameterization is exact per
    # layer given its input, and draws weights independently per example).
    mc1 = DenseLocalReparameterization(3, activation="relu", use_bias=False)
    mc2 = DenseLocalReparameterization(2, use_bias=False)
    mc1.build((None, 4))
    mc2.build((None, 3))
    for src, dst in ((first, mc1), (second, mc2)):
        for a, b in zip(src.kernel_initializer.weights, dst.kernel_initializer.weights):
            b.assign(a)
    n = 400_000
    h = mc1(np.tile(X[:1], (n, 1)))
    y = mc2(h).numpy().astype(np.float64)
    hn = h.numpy().astype(np.float64)
    for dvi, samples in ((hidden, hn), (out, y)):
        mean = dvi.distribution.mean().numpy()[0]
        cov = dvi.distribution.covariance().numpy()[0]
        mc_cov = np.cov(samples.T)
        sd = np.sqrt(np.diag(mc_cov))
        assert np.all(np.abs(samples.mean(0) - mean) < 5 * sd / math.sqrt(n))
        # Standard error of a sample covariance: sqrt((s_ii s_jj + s_ij^2) / n) (Gaussian);
        # rectified outputs have heavier tails, hence the looser 6 standard errors.
        se_cov = np.sqrt((np.outer(sd, sd) ** 2 + mc_cov**2) / n)
        assert np.all(np.abs(mc_cov - cov) < 6 * se_cov + 1e-5)


def test_bivariate_normal_cdf_against_monte_carlo():
    z = np.random.RandomState(1).multivariate_normal([0, 0], [[1, 0.7], [0.7, 1]], 1_000_000)
    for a, b in [(0.0, 0.0), (1.0, -0.5), (-1.5, 2.0)]:
        p = float(bivariate_normal_cdf(tf.constant(a), tf.constant(b), tf.constant(0.7)))
        mc = np.mean((z[:, 0] <= a) & (z[:, 1] <= b))
        assert abs(p - mc) < 5 * math.sqrt(mc * (1 - mc) / len(z))
    # rho = 0.7, a = b = 0 has the closed form 1/4 + asin(rho) / (2 pi).
    p0 = float(bivariate_normal_cdf(tf.constant(0.0), tf.constant(0.0), tf.constant(0.7)))
    assert p0 == pytest.approx(0.25 + math.asin(0.7) / (2 * math.pi), abs=1e-6)


def test_dvi_rejects_unsupported_activation():
    with pytest.raises(ValueError, match="DenseDVI supports"):
        DenseDVI(3, activation="tanh")


@pytest.mark.parametrize("cls", ESTIMATORS + [DenseDVI])
def test_kl_in_losses_fresh_weights_and_gradients_each_pass(cls):
    layer = cls(3, activation="relu" if cls is DenseDVI else None)
    x = tf.constant(RNG.randn(8, 5).astype("float32"))
    y1, y2 = tf.convert_to_tensor(layer(x)), tf.convert_to_tensor(layer(x))
    assert len(layer.losses) == 1 and float(layer.losses[0]) > 0
    if cls is not DenseDVI:
        assert not np.allclose(y1.numpy(), y2.numpy())  # weights redrawn every call
    assert isinstance(layer.kernel, blayers.RandomVariable)
    assert isinstance(
        layer.kernel.distribution.distribution, blayers.Normal(0.0, 1.0).distribution.__class__
    )
    for _ in range(2):  # a second tape sees a fresh graph of the KL too
        with tf.GradientTape() as tape:
            out = layer(x)
            loss = tf.reduce_sum(tf.square(tf.convert_to_tensor(out))) + sum(layer.losses)
        grads = tape.gradient(loss, layer.trainable_variables)
        assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)
        assert len(grads) == 3  # mean, stddev, bias


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_posterior_mean_gives_deterministic_dense(cls):
    layer = _with_posterior(cls(2))
    with blayers.posterior_mean():
        out = layer(X)
    np.testing.assert_allclose(out.numpy(), X @ MU, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_deterministic_initializer_is_ordinary_dense(cls):
    layer = cls(3, kernel_initializer="glorot_uniform", activation="tanh")
    dense = keras.layers.Dense(3, activation="tanh")
    x = RNG.randn(4, 5).astype("float32")
    layer.build((None, 5))
    dense.build((None, 5))
    dense.set_weights(layer.get_weights())
    np.testing.assert_allclose(layer(x).numpy(), dense(x).numpy(), rtol=1e-6)
    assert layer.losses == [] and layer.random_weight_names() == []


def test_predict_matches_closed_form_and_posterior_mean():
    layer = _with_posterior(DenseLocalReparameterization(2))
    model = keras.Sequential([keras.Input((4,)), layer])
    n = 4000
    pred = blayers.predict(model, X, num_samples=n, batch_size=2, return_samples=True)
    var = np.square(X) @ np.square(SIGMA)
    assert pred.samples.shape == (n, 3, 2)
    assert np.all(np.abs(pred.mean - X @ MU) < 5 * np.sqrt(var / n))
    assert np.all(np.abs(pred.stddev**2 - var) < 5 * var * math.sqrt(2 / n))
    at_mean = blayers.predict(model, X, posterior_mean=True)
    np.testing.assert_allclose(at_mean.mean, X @ MU, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(at_mean.stddev, 0.0)


def test_mc_dropout_active_at_prediction_and_unbiased():
    layer = MCDropout(0.3)
    x = np.ones((20_000, 1), "float32")
    out = layer(x, training=False).numpy()
    np.testing.assert_allclose(np.unique(out), [0.0, 1 / 0.7], rtol=1e-6)
    keep = (out > 0).mean()
    assert abs(keep - 0.7) < 5 * math.sqrt(0.21 / x.size)
    with blayers.posterior_mean():
        np.testing.assert_allclose(layer(x[:3]).numpy(), x[:3])
    with pytest.raises(ValueError, match="rate"):
        MCDropout(1.0)


# -- Keras integration --------------------------------------------------------------------


def _toy_regression(n=256):
    rng = np.random.RandomState(1)
    x = rng.uniform(-2, 2, (n, 1)).astype("float32")
    y = (np.sin(2 * x) + 0.1 * rng.randn(n, 1)).astype("float32")
    return x, y


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_drop_in_swap_sequential_functional_and_fit(cls):
    x, y = _toy_regression()

    def kl_scaled(layer_cls, units, **kwargs):
        return layer_cls(
            units,
            kernel_regularizer=blayers.regularizers.NormalKLDivergence(scale_factor=1 / len(x)),
            **kwargs,
        )

    sequential = keras.Sequential(
        [keras.Input((1,)), kl_scaled(cls, 32, activation="tanh"), kl_scaled(cls, 1)]
    )
    inputs = keras.Input((1,))
    functional = keras.Model(
        inputs, kl_scaled(cls, 1)(kl_scaled(cls, 32, activation="tanh")(inputs))
    )
    for model in (sequential, functional):
        # An epoch's 8 steps a call: the fit, not Keras' per-step dispatch, is under test.
        model.compile(keras.optimizers.Adam(0.02), loss="mse", steps_per_execution=8)
        first = model.evaluate(x, y, verbose=0)
        model.fit(epochs_of(x, y, 30, batch_size=32), verbose=0)
        assert model.evaluate(x, y, verbose=0) < 0.5 * first
        assert len(model.losses) == 2


@pytest.mark.parametrize("cls", ESTIMATORS + [DenseDVI])
def test_save_load_round_trip(cls, tmp_path):
    model = keras.Sequential(
        [
            keras.Input((4,)),
            cls(5, activation="relu", kernel_initializer="trainable_he_normal"),
            cls(2),
            MCDropout(0.1),
        ]
    )
    model(X)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    for a, b in zip(model.layers, loaded.layers):
        assert type(a) is type(b)
        for wa, wb in zip(a.trainable_weights, b.trainable_weights):
            np.testing.assert_array_equal(wa.numpy(), wb.numpy())
    assert len(loaded.trainable_weights) == len(model.trainable_weights) == 6
    with blayers.posterior_mean():
        np.testing.assert_allclose(
            tf.convert_to_tensor(loaded(X)).numpy(),
            tf.convert_to_tensor(model(X)).numpy(),
            rtol=1e-5,
        )


def test_gin_configures_the_exported_classes():
    gin.parse_config("""
        DenseFlipout.units = 7
        DenseFlipout.kernel_initializer = 'trainable_he_normal'
        DenseReparameterization.kernel_regularizer = @normal_kl_divergence()
        normal_kl_divergence.stddev = 0.1
        DenseLocalReparameterization.kernel_initializer = @trainable_normal_fixed_stddev()
        trainable_normal_fixed_stddev.stddev = 0.05
    """)
    layer = blayers.layers.DenseFlipout()
    assert layer.units == 7
    assert isinstance(layer.kernel_initializer, blayers.initializers.TrainableHeNormal)
    assert blayers.layers.DenseReparameterization(3).kernel_regularizer.stddev == 0.1
    lr = blayers.layers.DenseLocalReparameterization(3)
    assert lr.kernel_initializer.stddev == 0.05
    assert blayers.layers.DenseFlipout(units=2).units == 2  # explicit arguments win


def test_clear_errors():
    with pytest.raises(ValueError, match=r"DenseFlipout.*Unknown initializer 'trainable_nrmal'"):
        DenseFlipout(3, kernel_initializer="trainable_nrmal")
    with pytest.raises(ValueError, match="expected min_ndim=2, found ndim=1"):
        DenseFlipout(3)(tf.ones([4]))
    layer = DenseReparameterization(3)
    layer(tf.ones([2, 4]))
    with pytest.raises(ValueError, match="incompatible"):
        layer(tf.ones([2, 5]))
    with pytest.raises(ValueError, match="positive integer"):
        DenseFlipout(0)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_rank_three_inputs(cls):
    layer = cls(3)
    out = layer(tf.ones([2, 5, 4]))
    assert out.shape == (2, 5, 3)
