"""Distribution initializers, KL regularizers and constraints: the maths, then the plumbing."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import blayers
from blayers import constraints, initializers, regularizers

tfd = tfp.distributions

NAMES = [
    "trainable_normal",
    "trainable_he_normal",
    "trainable_glorot_normal",
    "trainable_normal_shared_stddev",
    "trainable_normal_fixed_stddev",
    "trainable_log_normal",
    "trainable_half_cauchy",
    "trainable_deterministic",
]


@pytest.mark.parametrize("name", NAMES)
def test_initializer_returns_fresh_random_variable_and_serializes(name):
    init = initializers.get(name)
    rv = init((4, 3))
    assert isinstance(rv, blayers.RandomVariable) and rv.shape == (4, 3)
    assert rv.distribution.event_shape == (4, 3)  # Independent over the whole weight
    assert init.trainable_weights, "parameters are trainable Keras variables"
    if name != "trainable_deterministic":
        assert not np.allclose(init((4, 3)).numpy(), rv.numpy())  # a new draw per call
    clone = initializers.deserialize(initializers.serialize(init))
    assert type(clone) is type(init) and clone.get_config() == init.get_config()
    assert type(initializers.get(type(init).__name__)) is type(init)  # CamelCase too


def test_trainable_normal_initial_stddev_range():
    init = initializers.TrainableNormal()
    init((200, 50))
    stddev = init.parameters()["stddev"].numpy()
    assert stddev.min() >= 1e-3 * 0.999 and stddev.max() <= 5e-2 * 1.001
    assert np.abs(init.mean.numpy()).max() < 1e-4
    he = initializers.TrainableHeNormal()
    he((400, 10))
    assert np.std(he.mean.numpy()) == pytest.approx(math.sqrt(2 / 400), rel=0.15)


def test_shared_and_fixed_stddev():
    shared = initializers.TrainableNormalSharedStddev()
    shared((5, 5))
    assert shared.stddev.shape == ()
    fixed = initializers.TrainableNormalFixedStddev(stddev=0.3)
    rv = fixed((2000,))
    assert len(fixed.trainable_weights) == 1
    assert np.std(rv.numpy() - fixed.mean.numpy()) == pytest.approx(0.3, rel=5 * 0.016)


def test_initializer_errors():
    with pytest.raises(ValueError, match="Unknown initializer 'trainabel_normal'"):
        initializers.get("trainabel_normal")
    init = initializers.get("trainable_normal")
    init((2, 2))
    with pytest.raises(ValueError, match="cannot serve shape"):
        init((3, 2))
    assert isinstance(initializers.get("glorot_uniform"), keras.initializers.Initializer)


def _normal_rv(loc, scale):
    loc, scale = tf.constant(loc, tf.float32), tf.constant(scale, tf.float32)
    return blayers.Independent(tfd.Normal(loc, scale), reinterpreted_batch_ndims=1)


def test_normal_kl_analytic_matches_monte_carlo_and_tfp():
    loc, scale = [0.3, -1.2, 2.0], [0.5, 0.1, 1.7]
    reg = regularizers.NormalKLDivergence(mean=0.2, stddev=1.5)
    analytic = float(reg(_normal_rv(loc, scale)))
    expected = float(tf.reduce_sum(tfd.kl_divergence(tfd.Normal(loc, scale), tfd.Normal(0.2, 1.5))))
    assert analytic == pytest.approx(expected, rel=1e-5)
    # Monte Carlo: mean of log q(w) - log p(w) over many draws, 5 standard errors.
    q = tfd.Normal(loc, scale)
    w = q.sample(200_000, seed=1)
    terms = tf.reduce_sum(q.log_prob(w) - tfd.Normal(0.2, 1.5).log_prob(w), -1).numpy()
    se = terms.std() / math.sqrt(terms.size)
    assert abs(terms.mean() - analytic) < 5 * se


def test_normal_kl_with_tied_mean_closed_form_and_monte_carlo():
    """`KL[q || N(m_q, s^2)]` depends on q's spread alone: TFP's closed form with the prior at
    q's mean, no gradient to the mean, and the Monte Carlo form for a non-Normal q agrees
    within 5 standard errors."""
    loc = tf.Variable([0.3, -1.2, 2.0])
    scale = tf.constant([0.5, 0.1, 1.7])
    reg = regularizers.get("normal_kl_divergence_with_tied_mean")
    reg.stddev = 2.0
    with tf.GradientTape() as tape:
        kl = reg(_normal_rv(loc, scale))
    expected = tf.reduce_sum(tfd.kl_divergence(tfd.Normal(loc, scale), tfd.Normal(loc, 2.0)))
    assert float(kl) == pytest.approx(float(expected), rel=1e-5)
    assert tape.gradient(kl, loc) is None  # the mean is not penalized
    n = 50_000  # one variable of n draws: its Monte Carlo KL sums n terms
    many = blayers.Independent(
        tfd.Logistic([0.3, -1.0], [0.2, 0.4]), 1, sample_shape=(n,), seed=[1, 2]
    )
    mc = float(reg(many)) / n
    terms = many.distribution.log_prob(many.value).numpy() - np.sum(
        tfd.Normal([0.3, -1.0], 2.0).log_prob(many.value).numpy(), -1
    )
    prior = tfd.Normal([0.3, -1.0], 2.0)
    exact = sum(
        _kl_by_quadrature(
            tfd.Logistic(m, s), lambda g, i=i: prior[i].log_prob(g).numpy(), m - 12, m + 12
        )
        for i, (m, s) in enumerate(zip([0.3, -1.0], [0.2, 0.4]))
    )
    assert abs(mc - exact) < 5 * np.std(terms) / math.sqrt(n)
    assert mc == pytest.approx(np.mean(terms), rel=1e-4)
    assert regularizers.get(regularizers.serialize(reg)).stddev == 2.0


def test_normal_kl_of_point_mass_is_negative_log_prior():
    rv = blayers.Independent(
        tfd.Deterministic(tf.constant([0.5, -1.0])), reinterpreted_batch_ndims=1
    )
    kl = float(regularizers.NormalKLDivergence()(rv))
    assert kl == pytest.approx(-float(tf.reduce_sum(tfd.Normal(0.0, 1.0).log_prob([0.5, -1.0]))))


@pytest.mark.parametrize(
    "name", ["normal_kl_divergence", "scale_mixture_kl_divergence", "log_uniform_kl_divergence"]
)
def test_scale_factor_scales_the_divergence(name):
    rv = _normal_rv([0.3, -0.4], [0.2, 0.3])
    rv.value  # noqa: B018 - fix the draw so both Monte Carlo estimates use it
    base = float(regularizers.get(name)(rv))
    scaled = regularizers.get(
        {
            "class_name": type(regularizers.get(name)).__name__,
            "module": "blayers.regularizers",
            "registered_name": f"blayers.regularizers>{type(regularizers.get(name)).__name__}",
            "config": {"scale_factor": 0.01},
        }
    )
    assert float(scaled(rv)) == pytest.approx(0.01 * base, rel=1e-5)


def _kl_by_quadrature(q, prior_log_prob, lo, hi, n=400_001):
    grid = np.linspace(lo, hi, n)
    log_q = q.log_prob(grid).numpy().astype(np.float64)
    integrand = np.exp(log_q) * (log_q - prior_log_prob(grid))
    return float(np.trapezoid(integrand, grid))


def test_scale_mixture_kl_is_unbiased():
    reg = regularizers.ScaleMixtureKLDivergence(pi=0.25, stddev1=1.0, stddev2=math.exp(-2))
    q = tfd.Normal(np.float64(0.1), np.float64(0.2))
    prior = reg.prior(tf.float64)
    exact = _kl_by_quadrature(q, lambda g: prior.log_prob(g).numpy(), -3.0, 3.0)
    rv = blayers.Normal(tf.fill([200_000], 0.1), 0.2)
    draws = (
        (rv.distribution.log_prob(rv.value) - reg.prior().log_prob(rv.value))
        .numpy()
        .astype(np.float64)
    )
    assert float(reg(rv)) == pytest.approx(draws.sum(), rel=1e-4)
    se = draws.std() / math.sqrt(draws.size)
    assert abs(draws.mean() - exact) < 5 * se


def test_half_cauchy_kl_is_unbiased():
    reg = regularizers.HalfCauchyKLDivergence(scale=0.5)
    q = tfd.LogNormal(np.float64(-1.0), np.float64(0.3))
    exact = _kl_by_quadrature(
        q, lambda g: tfd.HalfCauchy(np.float64(0), np.float64(0.5)).log_prob(g).numpy(), 1e-6, 4.0
    )
    rv = blayers.LogNormal(tf.fill([200_000], -1.0), 0.3)
    draws = (
        (rv.distribution.log_prob(rv.value) - tfd.HalfCauchy(0.0, 0.5).log_prob(rv.value))
        .numpy()
        .astype(np.float64)
    )
    assert float(reg(rv)) == pytest.approx(draws.sum(), rel=1e-4)
    assert abs(draws.mean() - exact) < 5 * draws.std() / math.sqrt(draws.size)


def test_log_uniform_kl_matches_molchanov_approximation():
    loc, scale = np.array([1.0, 0.1, 0.5]), np.array([0.1, 0.5, 0.5])
    log_alpha = np.log(scale**2 / loc**2)
    k1, k2, k3 = 0.63576, 1.87320, 1.48695
    neg_kl = k1 / (1 + np.exp(-(k2 + k3 * log_alpha))) - 0.5 * np.log1p(np.exp(-log_alpha)) - k1
    kl = float(regularizers.LogUniformKLDivergence()(_normal_rv(loc, scale)))
    assert kl == pytest.approx(-neg_kl.sum(), rel=1e-4)


def test_regularizer_get_and_errors():
    assert isinstance(regularizers.get("normal_kl_divergence"), regularizers.NormalKLDivergence)
    assert isinstance(regularizers.get("l2"), keras.regularizers.L2)
    with pytest.raises(ValueError, match="Unknown regularizer 'normal_kl'"):
        regularizers.get("normal_kl")
    with pytest.raises(TypeError, match="RandomVariable"):
        regularizers.NormalKLDivergence()(tf.ones([2]))


def test_constraints():
    x = tf.constant([-30.0, -2.0, 0.0, 3.0, 40.0])
    softplus = constraints.get("softplus")
    np.testing.assert_allclose(softplus(x).numpy(), tf.nn.softplus(x).numpy())
    np.testing.assert_allclose(
        softplus(softplus.inverse(tf.constant([1e-3, 0.05, 2.0, 30.0]))).numpy(),
        [1e-3, 0.05, 2.0, 30.0],
        rtol=1e-5,
    )
    assert float(tf.reduce_min(constraints.get("positive")(x))) > 0
    np.testing.assert_allclose(constraints.get("exp")(x[:3]).numpy(), np.exp(x[:3].numpy()))
    assert isinstance(constraints.get("non_neg"), keras.constraints.NonNeg)
    with pytest.raises(ValueError, match="Unknown constraint"):
        constraints.get("softpluss")
