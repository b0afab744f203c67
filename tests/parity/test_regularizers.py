"""edward2's `edward2/tensorflow/regularizers_test.py`, translated (`ed.regularizers` is
`blayers.regularizers`, `ed.Normal` is `blayers.Normal`). edward2's commented-out
`tf.function` test is left out."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers as ed


def test_cauchy_kl_divergence():
    shape = (3,)
    regularizer = ed.regularizers.get("cauchy_kl_divergence")
    variational_posterior = ed.Independent(
        ed.Normal(loc=tf.zeros(shape), scale=1.0).distribution, reinterpreted_batch_ndims=1
    )
    kl = regularizer(variational_posterior)
    # KL uses a single-sample estimate, which is not necessarily >0. We only check shape.
    assert kl.shape == ()


def test_half_cauchy_kl_divergence():
    shape = (3,)
    regularizer = ed.regularizers.get("half_cauchy_kl_divergence")
    variational_posterior = ed.Independent(
        ed.LogNormal(loc=tf.zeros(shape), scale=1.0).distribution, reinterpreted_batch_ndims=1
    )
    kl = regularizer(variational_posterior)
    assert kl.shape == ()


def test_log_normal_kl_divergence():
    shape = (3,)
    regularizer = ed.regularizers.get("log_normal_kl_divergence")
    variational_posterior = ed.Independent(
        ed.LogNormal(loc=tf.zeros(shape), scale=1.0).distribution, reinterpreted_batch_ndims=1
    )
    kl = regularizer(variational_posterior)
    assert float(kl) >= 0.0
    dataset_size = 100
    scale_factor = 1.0 / dataset_size
    regularizer = ed.regularizers.LogNormalKLDivergence(scale_factor=scale_factor)
    scaled_kl = regularizer(variational_posterior)
    assert float(scale_factor * kl) == float(scaled_kl)


def test_normal_kl_divergence():
    shape = (3,)
    regularizer = ed.regularizers.get("normal_kl_divergence")
    variational_posterior = ed.Independent(
        ed.Normal(loc=tf.zeros(shape), scale=1.0).distribution, reinterpreted_batch_ndims=1
    )
    kl = regularizer(variational_posterior)
    assert float(kl) >= 0.0
    dataset_size = 100
    scale_factor = 1.0 / dataset_size
    regularizer = ed.regularizers.NormalKLDivergence(scale_factor=scale_factor)
    scaled_kl = regularizer(variational_posterior)
    assert float(scale_factor * kl) == float(scaled_kl)


@pytest.mark.parametrize(
    "gen_stddev, eb_prior_stddev", list(itertools.product([0.1, 1.0, 2.0], [0.1, 1.0, 2.0]))
)
def test_normal_empirical_bayes_kl_divergence(gen_stddev, eb_prior_stddev):
    """The EB KL estimate is smaller than, but close to, the generating Normal-InverseGamma
    KL, being explicitly optimized."""
    tf.random.set_seed(89323)
    shape = (99, 101)
    gen_mean = 0.0
    eb_prior_mean = eb_prior_stddev**2
    cvar = (eb_prior_mean / eb_prior_stddev) ** 2
    variance_concentration = cvar + 2.0
    variance_scale = eb_prior_mean * (cvar + 1.0)
    weight = ed.Independent(
        ed.Normal(gen_mean + tf.zeros(shape), gen_stddev).distribution,
        reinterpreted_batch_ndims=len(shape),
    )
    # KL(q(w)|| N(w|gen_stddev)) - log IG(gen_stddev**2) under a fixed prior stddev.
    normal_regularizer = ed.regularizers.NormalKLDivergence(mean=gen_mean, stddev=gen_stddev)
    kl = normal_regularizer(weight)
    kl -= tf.reduce_sum(
        ed.InverseGamma(variance_concentration, variance_scale).distribution.log_prob(gen_stddev**2)
    )
    eb_regularizer = ed.regularizers.NormalEmpiricalBayesKLDivergence(
        mean=gen_mean, variance_concentration=variance_concentration, variance_scale=variance_scale
    )
    eb_kl = eb_regularizer(weight)
    # Normalize comparison by total number of weights (this also scales the IG log prob).
    kl /= float(np.prod(shape))
    eb_kl /= float(np.prod(shape))
    assert float(kl) >= float(eb_kl)
    assert float(kl) == pytest.approx(float(eb_kl), abs=0.05)


def test_trainable_normal_kl_divergence_stddev():
    tf.random.set_seed(83271)
    shape = (3,)
    regularizer = ed.regularizers.TrainableNormalKLDivergenceStdDev(
        stddev_initializer=keras.initializers.TruncatedNormal(
            mean=0.5413248, stddev=1e-5
        ),  # mean = softplus_inverse(1)
    )
    variational_posterior = ed.Independent(
        ed.Normal(loc=tf.zeros(shape), scale=1.0).distribution, reinterpreted_batch_ndims=1
    )
    kl = regularizer(variational_posterior)
    assert float(kl) >= 0.0
    prior_stddev = regularizer.stddev_constraint(regularizer.stddev)
    np.testing.assert_allclose(prior_stddev, np.ones(prior_stddev.shape), atol=0.1)


def test_uniform_kl_divergence():
    shape = (3,)
    regularizer = ed.regularizers.get("uniform_kl_divergence")
    variational_posterior = ed.Independent(
        ed.Normal(loc=tf.zeros(shape), scale=1.0).distribution, reinterpreted_batch_ndims=1
    )
    kl = regularizer(variational_posterior)
    assert float(kl) != 0.0
    dataset_size = 100
    scale_factor = 1.0 / dataset_size
    regularizer = ed.regularizers.UniformKLDivergence(scale_factor=scale_factor)
    scaled_kl = regularizer(variational_posterior)
    assert float(scale_factor * kl) == pytest.approx(float(scaled_kl), abs=1e-7)


def test_regularizers_get():
    assert isinstance(
        ed.regularizers.get("normal_kl_divergence"), ed.regularizers.NormalKLDivergence
    )
    assert isinstance(ed.regularizers.get("l2"), keras.regularizers.L2)
    assert ed.regularizers.get("") is None
