"""Priors given as distributions: the KL of a mean-field weight against a scalar prior (TFP
registers none), `DistributionPrior`'s analytic and Monte Carlo divergences against closed forms,
trainable priors made by `prior_fn` (they train, save and load), and the full-covariance weight
posterior."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import blayers
from blayers import regularizers
from blayers.random_variable import RandomVariable

tfd = tfp.distributions


def _normal_rv(loc, scale, seed=(1, 2)):
    loc, scale = tf.constant(loc, tf.float32), tf.constant(scale, tf.float32)
    return RandomVariable(
        tfd.Independent(tfd.Normal(loc, scale), len(loc.shape)), seed=tf.convert_to_tensor(seed)
    )


def _closed_form_normal_kl(m, s, m_p, s_p):
    return np.sum(np.log(s_p / s) + (s**2 + (m - m_p) ** 2) / (2 * s_p**2) - 0.5)


def test_kl_of_an_independent_weight_to_a_scalar_prior_is_the_sum_over_entries():
    rng = np.random.default_rng(0)
    m, s = rng.normal(size=(3, 4)), rng.uniform(0.2, 1.0, size=(3, 4))
    q = tfd.Independent(tfd.Normal(m.astype("float32"), s.astype("float32")), 2)
    kl = tfd.kl_divergence(q, tfd.Normal(0.5, 2.0))
    assert kl.shape == ()
    assert float(kl) == pytest.approx(_closed_form_normal_kl(m, s, 0.5, 2.0), rel=1e-5)
    # One reinterpreted dimension keeps the other as a batch dimension.
    q1 = tfd.Independent(tfd.Normal(m.astype("float32"), s.astype("float32")), 1)
    per_row = tfd.kl_divergence(q1, tfd.Normal(0.5, 2.0)).numpy()
    np.testing.assert_allclose(
        per_row, [_closed_form_normal_kl(m[i], s[i], 0.5, 2.0) for i in range(3)], rtol=1e-5
    )
    with pytest.raises(NotImplementedError, match="scalar prior"):
        tfd.kl_divergence(q1, tfd.MultivariateNormalDiag(tf.zeros(4)))


def test_distribution_prior_forms_agree_with_closed_forms():
    rng = np.random.default_rng(1)
    m, s = rng.normal(size=(3, 2)), rng.uniform(0.2, 1.0, size=(3, 2))
    rv = _normal_rv(m, s)
    exact = _closed_form_normal_kl(m, s, 0.0, 1.5)
    scalar = regularizers.get(tfd.Normal(0.0, 1.5))
    assert isinstance(scalar, regularizers.DistributionPrior)
    assert float(scalar(rv)) == pytest.approx(exact, rel=1e-5)
    batch = regularizers.DistributionPrior(tfd.Normal(tf.zeros((3, 2)), 1.5))
    assert float(batch(rv)) == pytest.approx(exact, rel=1e-5)
    event = regularizers.DistributionPrior(tfd.Independent(tfd.Normal(tf.zeros((3, 2)), 1.5), 2))
    assert float(event(rv)) == pytest.approx(exact, rel=1e-5)
    flat = regularizers.DistributionPrior(tfd.MultivariateNormalDiag(tf.zeros(6), 1.5 * tf.ones(6)))
    assert float(flat(rv)) == pytest.approx(exact, rel=1e-5)
    with pytest.raises(ValueError, match="does not fit a weight of shape"):
        regularizers.DistributionPrior(tfd.MultivariateNormalDiag(tf.zeros(5)))(rv)


def test_monte_carlo_divergence_is_unbiased():
    """Against a Laplace prior (no analytic KL from a Normal): the mean of `log q(w) - log p(w)`
    over draws is the KL computed by quadrature, within 5 standard errors."""
    m, s = np.array([0.3, -1.0]), np.array([0.5, 0.2])
    prior = regularizers.DistributionPrior(tfd.Laplace(0.0, 1.0))
    divergence = tf.function(lambda seed: prior(_normal_rv(m, s, seed=seed)))
    values = np.array([float(divergence(tf.constant([i, 7]))) for i in range(2000)])
    grid = np.linspace(-8, 8, 200_001)
    exact = 0.0
    for mi, si in zip(m, s, strict=True):
        q = np.exp(-0.5 * ((grid - mi) / si) ** 2) / (si * math.sqrt(2 * math.pi))
        log_p = -np.abs(grid) - math.log(2.0)
        exact += np.trapezoid(q * (np.log(np.maximum(q, 1e-300)) - log_p), grid)
    se = values.std() / math.sqrt(len(values))
    assert abs(values.mean() - exact) < 5 * se


@keras.saving.register_keras_serializable("blayers_tests")
def learned_scale_prior(shape, dtype):
    return tfd.Normal(
        loc=tf.zeros(shape, dtype),
        scale=tfp.util.TransformedVariable(
            tf.ones([], dtype), tfp.bijectors.Softplus(), name="prior_scale"
        ),
    )


def test_a_trainable_prior_learns_saves_and_loads(tmp_path):
    """Empirical Bayes: the prior's scale is a Keras weight of the layer; with a fixed posterior
    of scale `s` and mean `m`, minimizing `KL[q || N(0, sigma^2)]` over `sigma` gives
    `sigma^2 = mean(s^2 + m^2)`."""
    keras.utils.set_random_seed(0)
    layer = blayers.layers.DenseReparameterization(
        3,
        kernel_initializer=blayers.initializers.TrainableNormal(
            mean_initializer=keras.initializers.Constant(0.8),
            stddev_initializer=keras.initializers.Constant(-1.0),
        ),
        kernel_regularizer=regularizers.DistributionPrior(prior_fn=learned_scale_prior),
    )
    model = keras.Sequential([keras.Input((2,)), layer])
    prior = layer.kernel_regularizer
    assert [w.path.split("/")[-1] for w in prior.trainable_weights] == ["prior_scale"]
    assert any(w is prior.trainable_weights[0] for w in model.trainable_weights)
    optimizer = keras.optimizers.Adam(0.05)
    variable = prior.trainable_weights[0]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            model(tf.zeros((1, 2)))
            loss = tf.add_n(model.losses)
        optimizer.apply_gradients(zip(tape.gradient(loss, [variable]), [variable], strict=True))

    for _ in range(300):
        step()
    s = float(tf.nn.softplus(-1.0))
    learned = float(tf.convert_to_tensor(prior.prior.scale))
    assert learned == pytest.approx(math.sqrt(s**2 + 0.8**2), rel=1e-2)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_scale = loaded.layers[-1].kernel_regularizer.prior.scale
    assert float(tf.convert_to_tensor(loaded_scale)) == pytest.approx(learned)


def test_a_fixed_prior_saves_by_its_parameters_and_variables_are_refused(tmp_path):
    model = keras.Sequential(
        [
            keras.Input((2,)),
            blayers.layers.DenseFlipout(
                2, kernel_regularizer=tfd.StudentT(df=3.0, loc=0.0, scale=0.5)
            ),
        ]
    )
    path = str(tmp_path / "model.keras")
    model.save(path)
    prior = keras.models.load_model(path).layers[-1].kernel_regularizer.prior
    assert isinstance(prior, tfd.StudentT)
    assert (float(prior.df), float(prior.scale)) == (3.0, 0.5)
    with pytest.raises(ValueError, match="prior_fn"):
        regularizers.DistributionPrior(tfd.Normal(tf.Variable(0.0), 1.0))
    with pytest.raises(ValueError, match="one of distribution and prior_fn"):
        regularizers.DistributionPrior()


def test_full_covariance_posterior_draws_kl_and_estimators(tmp_path):
    keras.utils.set_random_seed(0)
    init = blayers.initializers.get("trainable_multivariate_normal")
    init.build((2, 3))
    rng = np.random.default_rng(0)
    init.off_diagonal.assign(0.3 * rng.normal(size=(6, 6)).astype("float32"))
    init.mean.assign(rng.normal(size=(2, 3)).astype("float32"))
    init.stddev.assign(rng.uniform(-0.5, 0.5, size=6).astype("float32"))
    rv = init((2, 3))
    params = init.parameters()
    diagonal = params["stddev"].numpy().astype(np.float64)
    tril = np.tril(params["off_diagonal"].numpy().astype(np.float64), -1) + np.diag(diagonal)
    covariance = tril @ tril.T
    draws = rv.distribution.sample(4000, seed=tf.constant([3, 4])).numpy().reshape(4000, -1)
    se = np.sqrt(np.diag(covariance) / 4000)
    assert np.all(np.abs(draws.mean(0) - init.mean.numpy().reshape(-1)) < 5 * se)
    np.testing.assert_allclose(np.cov(draws.T), covariance, atol=0.1 * np.abs(covariance).max())
    # The analytic KL to N(0, 2^2 I) against its closed form.
    mean = init.mean.numpy().reshape(-1).astype(np.float64)
    exact = 0.5 * (
        np.trace(covariance) / 4
        + mean @ mean / 4
        - 6
        + 6 * math.log(4)
        - 2 * np.sum(np.log(diagonal))
    )
    kl = regularizers.NormalKLDivergence(stddev=2.0)(rv)
    assert float(kl) == pytest.approx(exact, rel=1e-4)

    with pytest.raises(ValueError, match="max_entries"):
        blayers.initializers.TrainableMultivariateNormal(max_entries=10).build((4, 3))
    local = blayers.layers.DenseLocalReparameterization(
        2, kernel_initializer="trainable_multivariate_normal"
    )
    with pytest.raises(ValueError, match="full covariance"):
        local(np.zeros((1, 3), "float32"))

    model = keras.Sequential(
        [
            keras.Input((3,)),
            blayers.layers.DenseFlipout(2, kernel_initializer="trainable_multivariate_normal"),
        ]
    )
    x = np.ones((5, 3), "float32")
    model(x)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    with blayers.posterior_mean():
        np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)
