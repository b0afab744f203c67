"""Probabilistic programs: log joints against closed forms, composition with
`condition` and `tape`, variables made inside layers, and variational inference over a model
program and a posterior program against exact posteriors (reparameterized and score-function)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import graph_draws
from scipy import stats

import blayers
from blayers import programs
from blayers.layers import DenseReparameterization, GaussianProcess, SparseGaussianProcess

X = np.array([0.8, 1.3, 0.2, 1.9, 1.1, 0.7], "float32")
NOISE = 0.5


def normal_normal():
    z = blayers.Normal(0.0, 1.0, name="z")
    return blayers.Normal(tf.fill([len(X)], tf.convert_to_tensor(z)), NOISE, name="x")


def exact_posterior():
    precision = 1.0 + len(X) / NOISE**2
    return (X.sum() / NOISE**2) / precision, precision**-0.5


def test_log_joint_of_normal_normal_is_the_closed_form():
    log_joint = blayers.make_log_joint(normal_normal)
    for z in (-1.0, 0.3, 2.0):
        expected = stats.norm.logpdf(z) + stats.norm.logpdf(X, z, NOISE).sum()
        np.testing.assert_allclose(log_joint(z=z, x=X), expected, rtol=1e-5)


def test_log_joint_composes_with_condition_and_tape():
    log_joint = blayers.make_log_joint(normal_normal)
    with blayers.tape() as recorded, blayers.trace(blayers.condition(z=0.4)):
        value = log_joint(x=X)
    assert list(recorded) == ["z", "x"]
    np.testing.assert_allclose(recorded["z"].value, 0.4)
    expected = stats.norm.logpdf(0.4) + stats.norm.logpdf(X, 0.4, NOISE).sum()
    np.testing.assert_allclose(value, expected, rtol=1e-5)


def test_log_joint_names_a_value_the_program_lacks():
    with pytest.raises(ValueError, match=r"no random variable named \['w'\].*\['z', 'x'\]"):
        blayers.make_log_joint(normal_normal)(w=1.0, x=X)


def test_log_joint_sees_variables_made_inside_layers():
    x = np.linspace(0, 1, 5, dtype="float32")[:, None]
    gp = GaussianProcess(1, output_name="f", cholesky_dtype="float64")
    likelihood = blayers.layers.GaussianLikelihood(0.1, name="y")
    f0 = np.sin(3 * x).astype("float32")
    y0 = f0 + 0.1

    def program():
        return likelihood(gp(x))

    log_joint = blayers.make_log_joint(program)
    value = log_joint(f=f0, y=y0)
    cov = gp.kernel("float64").matrix(x.astype("float64"), x.astype("float64")).numpy()
    cov += 1e-6 * np.mean(np.diag(cov)) * np.eye(5)
    prior = stats.multivariate_normal(np.zeros(5), cov).logpdf(f0[:, 0])
    noise = float(likelihood.noise_variance)
    expected = prior + stats.norm.logpdf(y0, f0, np.sqrt(noise)).sum()
    np.testing.assert_allclose(value, expected, rtol=1e-4)


def test_function_prior_from_a_bayesian_layer():
    """Paper Sec. 2.5, footnote 6: an initializer that returns the prior and no regularizer."""
    layer = DenseReparameterization(
        3,
        kernel_initializer=blayers.initializers.NormalPrior(stddev=0.5),
        kernel_regularizer=None,
        use_bias=False,
        name="prior_net",
    )
    x = tf.constant([[1.0, -2.0, 0.5, 1.0]])
    layer(x)
    assert layer.losses == [] and layer.trainable_weights == []
    draws = graph_draws(lambda: layer(x)[0], 2000)  # a new draw each
    variance = 0.25 * float(tf.reduce_sum(x**2))  # Var[x w] = |x|^2 stddev^2
    se = variance * np.sqrt(2 / len(draws))
    np.testing.assert_allclose(draws.var(0), variance, atol=5 * se)
    w0 = np.full((4, 3), 0.2, "float32")
    log_joint = blayers.make_log_joint(lambda: layer(x))
    np.testing.assert_allclose(
        log_joint(**{"prior_net/kernel": w0}), stats.norm.logpdf(w0, 0, 0.5).sum(), rtol=1e-5
    )
    with blayers.trace(blayers.condition(**{"prior_net/kernel": w0})):
        np.testing.assert_allclose(layer(x), x.numpy() @ w0, rtol=1e-6)


def test_elbo_estimate_is_unbiased():
    loc, scale = 0.7, 0.3

    def posterior():
        return blayers.Normal(loc, scale, name="z")

    # One graph loop: each estimate draws anew.
    estimate = lambda: programs.elbo(normal_normal, posterior, observed={"x": X}).elbo
    estimates = graph_draws(estimate, 1000).tolist()
    assert len(set(estimates)) > 0.99 * len(estimates)  # float32 values may coincide
    # E_q[log p(x | z)] + E_q[log p(z)] + H[q], each in closed form.
    second = scale**2 + loc**2
    expected = (
        np.sum(-0.5 * np.log(2 * np.pi * NOISE**2) - (X**2 - 2 * X * loc + second) / (2 * NOISE**2))
        - 0.5 * np.log(2 * np.pi)
        - second / 2
        + 0.5 * np.log(2 * np.pi * np.e * scale**2)
    )
    se = np.std(estimates) / np.sqrt(len(estimates))
    assert abs(np.mean(estimates) - expected) < 5 * se


def _fit(model, posterior, observed, variables, steps, num_samples, learning_rate):
    """`steps` Adam steps on the ELBO's surrogate, all in one graph call (a call a step spent
    most of the test's time on dispatching a small graph)."""
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(variables)

    def step(i):
        with tf.GradientTape() as tape:
            loss = -programs.elbo(model, posterior, observed, num_samples=num_samples).surrogate
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return i + 1

    tf.function(lambda: tf.while_loop(lambda i: i < steps, step, [0]), autograph=False)()


def test_variational_inference_over_programs_recovers_the_conjugate_posterior():
    tf.random.set_seed(0)
    loc, raw_scale = tf.Variable(0.0), tf.Variable(0.0)
    seeds = tf.random.Generator.from_seed(1)

    def posterior():
        return blayers.Normal(
            loc,
            tf.nn.softplus(raw_scale),
            name="z",
            seed=tf.cast(seeds.make_seeds(1)[:, 0], tf.int32),
        )

    # Then small steps average the gradient noise (tracing 64 draws a step took seconds more
    # than 2,000 steps of 16).
    _fit(normal_normal, posterior, {"x": X}, [loc, raw_scale], 400, 16, 0.02)
    _fit(normal_normal, posterior, {"x": X}, [loc, raw_scale], 2000, 16, 0.001)
    mean, sd = exact_posterior()
    np.testing.assert_allclose(float(loc), mean, atol=0.05 * sd)
    np.testing.assert_allclose(float(tf.nn.softplus(raw_scale)), sd, rtol=0.05)


def test_score_function_gradient_fits_a_discrete_posterior():
    # k ~ Bernoulli(0.3), x ~ N(2k - 1, 1): the exact posterior of k given x.
    x_obs = 0.4

    def model():
        k = blayers.Bernoulli(probs=0.3, dtype=tf.float32, name="k")
        return blayers.Normal(2.0 * tf.convert_to_tensor(k) - 1.0, 1.0, name="x")

    logits = tf.Variable(0.0)
    seeds = tf.random.Generator.from_seed(2)

    def posterior():
        return blayers.Bernoulli(
            logits=logits,
            dtype=tf.float32,
            name="k",
            seed=tf.cast(seeds.make_seeds(1)[:, 0], tf.int32),
        )

    _fit(model, posterior, {"x": x_obs}, [logits], 1500, 8, 0.05)
    _fit(model, posterior, {"x": x_obs}, [logits], 500, 32, 0.005)
    on = 0.3 * stats.norm.pdf(x_obs, 1, 1)
    exact = on / (on + 0.7 * stats.norm.pdf(x_obs, -1, 1))
    np.testing.assert_allclose(float(tf.sigmoid(logits)), exact, atol=0.03)


def test_elbo_rejects_a_posterior_over_observed_variables():
    with pytest.raises(ValueError, match=r"observed variables \['x'\]"):
        programs.elbo(normal_normal, lambda: blayers.Normal(0.0, 1.0, name="x"), {"x": X})


def test_sparse_gp_joint_output_matches_its_marginals():
    layer = SparseGaussianProcess(
        2, num_inducing=4, full_covariance=True, add_kl_loss=False, cholesky_dtype="float64"
    )
    x = np.random.default_rng(0).normal(size=(6, 3)).astype("float32")
    rv = layer(x)
    assert rv.shape == (6, 2) and layer.losses == []
    mean, variance, _ = layer.predict_marginals(x)
    np.testing.assert_allclose(rv.distribution.mean(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.distribution.variance(), variance, rtol=1e-3, atol=1e-5)
    assert rv.distribution.name == layer.name


def test_output_layers_name_their_variables():
    with blayers.tape() as recorded:
        blayers.layers.Normal(name="obs")(tf.zeros([2, 3]))
        blayers.layers.Categorical(output_name="label")(tf.zeros([2, 3]))
    assert list(recorded) == ["obs", "label"]


def test_log_joint_needs_every_value():
    """A variable left without a value is named (`LookupError`), not drawn: a log joint at a
    random draw would change from call to call."""
    log_joint = blayers.make_log_joint(normal_normal)
    with pytest.raises(LookupError, match=r"no value for \['x'\]"):
        log_joint(z=0.3)
    with pytest.raises(KeyError):  # edward2's error for a name the program lacks
        log_joint(z=0.3, x=X, w=1.0)
