"""Gaussian-process layers against closed forms: the exact posterior, SVGP recovering it with
optimal q(u) and bounding the log marginal likelihood, random-feature error ~ 1/sqrt(D), and a
three-layer deep GP trained by the framework's trainer."""

import itertools
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import blayers
from blayers.lab import data as data_lib
from blayers.lab import loop
from blayers.layers import (
    GaussianLikelihood,
    GaussianProcess,
    RandomFourierFeatures,
    SparseGaussianProcess,
)
from blayers.layers.gp import jittered_cholesky

RNG = np.random.RandomState(0)
X = RNG.uniform(-2, 2, (12, 2))
Y = np.sin(X[:, :1] * 2) + 0.1 * RNG.randn(12, 1)
X_TEST = RNG.uniform(-2, 2, (5, 2))
NOISE = 0.05


def _rbf(a, b, amplitude=1.0, length_scale=1.0):
    sq = np.sum((a[:, None] - b[None]) ** 2, -1) / length_scale**2
    return amplitude**2 * np.exp(-0.5 * sq)


def _exact_posterior(x_train, y, x_test, noise=NOISE):
    k = _rbf(x_train, x_train) + noise * np.eye(len(x_train))
    k_star = _rbf(x_test, x_train)
    mean = k_star @ np.linalg.solve(k, y)
    cov = _rbf(x_test, x_test) - k_star @ np.linalg.solve(k, k_star.T)
    return mean, cov


def _log_marginal_likelihood(x_train, y, noise=NOISE):
    k = _rbf(x_train, x_train) + noise * np.eye(len(x_train))
    _, logdet = np.linalg.slogdet(k)
    return float(
        -0.5 * y[:, 0] @ np.linalg.solve(k, y[:, 0])
        - 0.5 * logdet
        - 0.5 * len(y) * math.log(2 * math.pi)
    )


def test_exact_gp_posterior_matches_closed_form():
    layer = GaussianProcess(
        1,
        conditional_inputs=X,
        conditional_outputs=Y,
        observation_noise_variance=NOISE,
        cholesky_dtype="float64",
        jitter=1e-12,
    )
    rv = layer(X_TEST.astype("float32"))
    assert isinstance(rv, blayers.RandomVariable) and rv.shape == (5, 1)
    mean, cov = _exact_posterior(X, Y, X_TEST)
    np.testing.assert_allclose(rv.distribution.mean().numpy(), mean, atol=1e-4)
    scale_row = rv.distribution.scale_row.to_dense().numpy()
    np.testing.assert_allclose(scale_row @ scale_row.T, cov, atol=1e-4)
    prior = GaussianProcess(2)(X_TEST.astype("float32"))  # the prior: zero mean, K
    assert prior.shape == (5, 2)
    np.testing.assert_allclose(prior.distribution.mean().numpy(), 0.0)


def _set_optimal_q(layer, z, x_train, y, noise=NOISE):
    """Titsias' optimal q(u) for inducing inputs z, written into a whitened layer."""
    k_zz = _rbf(z, z) + 1e-10 * np.eye(len(z))
    k_zx = _rbf(z, x_train)
    sigma = k_zz + k_zx @ k_zx.T / noise
    m_u = k_zz @ np.linalg.solve(sigma, k_zx @ y[:, 0]) / noise
    s_u = k_zz @ np.linalg.solve(sigma, k_zz)
    l_z = np.linalg.cholesky(k_zz)
    m_v = np.linalg.solve(l_z, m_u)
    s_v = np.linalg.solve(l_z, np.linalg.solve(l_z, s_u).T)
    l_v = np.linalg.cholesky(0.5 * (s_v + s_v.T) + 1e-10 * np.eye(len(z)))
    layer.inducing_inputs.assign(z)
    layer.variational_mean.assign(m_v[None])
    raw = np.tril(l_v)
    raw[np.diag_indices(len(z))] = np.log(np.expm1(np.diag(l_v)))
    layer.variational_scale.assign(raw[None])


def _svgp(num_inducing):
    layer = SparseGaussianProcess(
        1, num_inducing=num_inducing, cholesky_dtype="float64", jitter=1e-10, dtype="float64"
    )
    layer.build((None, 2))
    return layer


def _elbo(layer, x_train, y, noise=NOISE):
    mean, var, kl = (t.numpy() for t in layer.predict_marginals(x_train))
    expected = (-0.5 * math.log(2 * math.pi * noise) - ((y - mean) ** 2 + var) / (2 * noise)).sum()
    return float(expected - kl)


def test_svgp_with_optimal_q_at_training_inputs_recovers_exact_posterior():
    layer = _svgp(len(X))
    _set_optimal_q(layer, X, X, Y)
    mean, var, _ = layer.predict_marginals(X_TEST)
    exact_mean, exact_cov = _exact_posterior(X, Y, X_TEST)
    np.testing.assert_allclose(mean.numpy(), exact_mean, atol=1e-5)
    np.testing.assert_allclose(var.numpy()[:, 0], np.diag(exact_cov), atol=1e-5)
    # With Z = X the bound is tight: ELBO = log p(y).
    assert _elbo(layer, X, Y) == pytest.approx(_log_marginal_likelihood(X, Y), abs=1e-4)


def test_svgp_elbo_bounds_log_marginal_likelihood_and_approaches_it():
    log_ml = _log_marginal_likelihood(X, Y)
    elbos = []
    for m in (2, 4, 8, 12):
        layer = _svgp(m)
        _set_optimal_q(layer, X[:m], X, Y)
        elbos.append(_elbo(layer, X, Y))
    assert all(e <= log_ml + 1e-6 for e in elbos)
    assert all(a <= b + 1e-6 for a, b in itertools.pairwise(elbos))  # nested Z: monotone
    assert elbos[0] < log_ml - 1.0 and elbos[-1] == pytest.approx(log_ml, abs=1e-4)


def test_svgp_kl_in_losses_and_unwhitened_mean_field_variant():
    x = RNG.randn(7, 2).astype("float32")
    for kwargs in ({}, {"whiten": False, "variational": "mean_field"}):
        layer = SparseGaussianProcess(3, num_inducing=4, **kwargs)
        out = layer(x)
        assert out.shape == (7, 3) and len(layer.losses) == 1
        assert float(layer.losses[0]) >= 0.0
        assert np.all(np.isfinite(out.numpy()))


def test_random_features_error_falls_as_inverse_sqrt_features():
    x = RNG.randn(40, 3).astype("float32")
    exact = _rbf(x.astype(np.float64), x.astype(np.float64))
    sizes = [64, 256, 1024, 4096]
    errors = []
    for d in sizes:
        trials = []
        for seed in range(5):
            layer = RandomFourierFeatures(1, num_features=d, seed=seed)
            layer.build(x.shape)
            phi = layer.feature_map(x).numpy().astype(np.float64)
            trials.append(np.sqrt(np.mean((phi @ phi.T - exact) ** 2)))
        errors.append(np.mean(trials))
    slope = np.polyfit(np.log(sizes), np.log(errors), 1)[0]
    assert -0.65 < slope < -0.35, (errors, slope)
    layer = RandomFourierFeatures(2, num_features=32)
    assert layer(x).shape == (40, 2) and len(layer.losses) == 1


def test_jittered_cholesky_retries_and_fails_clearly():
    singular = tf.constant([[1.0, 1.0], [1.0, 1.0]])
    chol = jittered_cholesky(singular, jitter=1e-12, max_tries=8)
    assert np.all(np.isfinite(chol.numpy()))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Cholesky factorization of the"):
        jittered_cholesky(tf.constant([[1.0, 2.0], [2.0, 1.0]]), jitter=1e-6, max_tries=2)
    graph = tf.function(lambda m: jittered_cholesky(m, jitter=1e-12, max_tries=8))
    assert np.all(np.isfinite(graph(singular).numpy()))


def _deep_gp(input_shape, num_outputs):
    return keras.Sequential(
        [
            keras.Input(input_shape),
            SparseGaussianProcess(3, num_inducing=16, mean_fn="linear"),
            SparseGaussianProcess(3, num_inducing=16, mean_fn="linear"),
            SparseGaussianProcess(num_outputs // 2, num_inducing=16),
            GaussianLikelihood(),
        ]
    )


# The deep GP smoke config trains through the Loop in the fast suite (tests/lab/test_configs.py).
@pytest.mark.slow
def test_three_layer_deep_gp_trains_with_the_trainer(tmp_path):
    toy = data_lib.heteroscedastic_1d(num_train=128, num_test=64)
    metrics = loop.fit(
        str(tmp_path),
        data=toy,
        model=_deep_gp,
        train_steps=30,
        batch_size=64,
        num_eval_samples=3,
        progress=False,
        optimizer=lambda: keras.optimizers.Adam(0.01),
    )
    assert np.isfinite(metrics["nlpd"]) and metrics["rmse"] < 10


def test_three_layer_deep_gp_has_a_kl_a_layer_and_saves(tmp_path):
    model = _deep_gp((1,), 2)
    model(np.zeros((4, 1), "float32"))
    assert len(model.losses) == 3  # one KL per GP layer
    path = tmp_path / "dgp.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    for a, b in zip(model.trainable_weights, loaded.trainable_weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# -- kernels as the paper says, arguments checked -----------------------------------------------


def test_softplus_inverse_is_stable_and_written_once():
    from blayers.constraints import softplus_inverse

    for y in (1e-8, 1e-3, 1.0, 50.0, 1e3, 1e6):
        x = softplus_inverse(y)
        assert np.isfinite(x)
        np.testing.assert_allclose(float(tf.nn.softplus(tf.constant(x, tf.float64))), y, rtol=1e-9)
    layer = SparseGaussianProcess(1, num_inducing=3, length_scale=1e3)
    layer(np.zeros((2, 2), "float32"))
    np.testing.assert_allclose(tf.nn.softplus(layer.raw_length_scale).numpy(), 1e3, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_inducing": 0}, "num_inducing must be a positive integer, got 0"),
        ({"num_inducing": -5}, "num_inducing must be a positive integer, got -5"),
        ({"length_scale": -1.0}, "length_scale must be positive"),
        ({"covariance_fn": "rbf"}, "unknown covariance_fn 'rbf'"),
    ],
)
def test_sparse_gp_names_layer_and_argument(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        SparseGaussianProcess(2, name="gp_layer", **kwargs)
    assert "SparseGaussianProcess (gp_layer)" in str(error.value)


def test_exact_gp_checks_conditioning_data_and_queries():
    x = np.random.randn(5, 3).astype("float32")
    with pytest.raises(ValueError, match="conditional_inputs have 5 rows"):
        GaussianProcess(1, conditional_inputs=x, conditional_outputs=np.ones(4))
    layer = GaussianProcess(1, conditional_inputs=x, conditional_outputs=np.ones(5), name="gp")
    layer(x)
    with pytest.raises(ValueError, match="built for 3 input features; inputs have 4"):
        layer(np.ones((2, 4), "float32"))
    with pytest.raises(ValueError, match="inputs have 2 features but conditional_inputs have 3"):
        GaussianProcess(1, conditional_inputs=x, conditional_outputs=np.ones(5))(
            np.ones((2, 2), "float32")
        )


def test_gp_layers_take_any_tfp_kernel():
    psd = tfp.math.psd_kernels
    x = np.random.RandomState(0).randn(6, 2).astype("float32")
    fixed = psd.MaternFiveHalves(amplitude=1.5, length_scale=0.7)
    prior = GaussianProcess(1, covariance_fn=fixed)(x)
    scale = prior.distribution.scale_row.to_dense().numpy()
    np.testing.assert_allclose(scale @ scale.T, fixed.matrix(x, x).numpy(), atol=1e-4)
    built = SparseGaussianProcess(
        1,
        num_inducing=3,
        covariance_fn=lambda a, l: psd.FeatureScaled(
            psd.RationalQuadratic(a, scale_mixture_rate=2.0), l
        ),
    )
    built(x)
    assert isinstance(built.kernel().kernel, psd.RationalQuadratic)
    # The kernel's hyperparameters are the layer's trainable variables: gradients reach them.
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(built.kernel().matrix(x, x))
    grads = tape.gradient(loss, [built.raw_amplitude, built.raw_length_scale])
    assert all(g is not None for g in grads)
    as_class = SparseGaussianProcess(1, num_inducing=3, covariance_fn=psd.MaternThreeHalves)
    as_class(x)
    assert isinstance(as_class.kernel().kernel, psd.MaternThreeHalves)


def test_a_fixed_kernel_instance_makes_no_kernel_weights():
    """A kernel instance keeps its own hyperparameters: the layer makes no amplitude or
    length-scale weights, and every weight it has is reached by a gradient."""
    psd = tfp.math.psd_kernels
    x = np.random.RandomState(0).randn(6, 2).astype("float32")
    fixed = psd.ExponentiatedQuadratic(amplitude=1.5, length_scale=0.7)
    exact = GaussianProcess(1, covariance_fn=fixed, mean_fn="constant")
    sparse = SparseGaussianProcess(1, num_inducing=3, covariance_fn=fixed)
    for layer in (exact, sparse):
        with tf.GradientTape() as tape:
            out = layer(x)
            loss = tf.reduce_sum(out.distribution.mean()) + sum(layer.losses)
        names = [w.path.split("/")[-1] for w in layer.trainable_weights]
        assert "amplitude" not in names and "length_scale" not in names, names
        grads = tape.gradient(loss, layer.trainable_weights)
        assert [n for n, g in zip(names, grads) if g is None] == []
        assert layer.kernel() is fixed
    assert len(exact.trainable_weights) == 1  # the constant mean alone


def test_a_float32_kernel_instance_under_float64_cholesky():
    """`cholesky_dtype='float64'` (the hint of the jitter error) works with a float32 kernel
    instance, sums included: the kernel is rebuilt in float64 and the posterior is the float32
    one to float32 precision."""
    psd = tfp.math.psd_kernels
    rng = np.random.RandomState(0)
    x, y = rng.randn(8, 2).astype("float32"), rng.randn(8, 1).astype("float32")
    test = rng.randn(5, 2).astype("float32")
    kernel = psd.ExponentiatedQuadratic(np.float32(1.5), np.float32(0.7)) + psd.MaternFiveHalves(
        np.float32(0.3), np.float32(1.0)
    )
    means = {}
    for dtype in (None, "float64"):
        layer = GaussianProcess(
            1,
            covariance_fn=kernel,
            conditional_inputs=x,
            conditional_outputs=y,
            cholesky_dtype=dtype,
        )
        means[dtype] = layer(test).distribution.mean().numpy()
        assert layer.kernel(tf.float64).dtype == tf.float64
    np.testing.assert_allclose(means["float64"], means[None], rtol=1e-4, atol=1e-5)


def test_kernel_instance_and_class_round_trip_through_keras(tmp_path):
    psd = tfp.math.psd_kernels
    for covariance_fn in (psd.MaternFiveHalves(amplitude=2.0, length_scale=0.5), psd.Linear):
        model = keras.Sequential(
            [
                keras.Input((2,)),
                SparseGaussianProcess(1, num_inducing=3, covariance_fn=covariance_fn),
            ]
        )
        model.save(tmp_path / "gp.keras")
        restored = keras.models.load_model(tmp_path / "gp.keras").layers[0].covariance_fn
        if isinstance(covariance_fn, type):
            assert restored is covariance_fn
        else:
            assert type(restored) is type(covariance_fn)
            np.testing.assert_allclose(float(restored.length_scale), 0.5)


@pytest.mark.parametrize("name, kernel", [("matern12", "exp"), ("matern32", "m32")])
def test_random_fourier_features_approximate_matern_kernels(name, kernel):
    """`phi(x)^T phi(y)` against the Matern kernel; the error is O(1/sqrt(D)) per entry."""
    x = np.random.RandomState(1).randn(8, 2).astype("float32")
    layer = RandomFourierFeatures(1, num_features=20_000, covariance_fn=name, seed=3)
    layer.build((None, 2))
    phi = layer.feature_map(x).numpy().astype(np.float64)
    r = np.linalg.norm(x[:, None] - x[None], axis=-1)
    exact = np.exp(-r) if kernel == "exp" else (1 + math.sqrt(3) * r) * np.exp(-math.sqrt(3) * r)
    # Each entry is a mean of D terms bounded by 2: sd <= sqrt(2 / D); 5 sigma.
    assert np.abs(phi @ phi.T - exact).max() < 5 * math.sqrt(2.0 / 20_000)
    squared = RandomFourierFeatures(1, num_features=20_000, seed=3)
    squared.build((None, 2))
    phi_se = squared.feature_map(x).numpy().astype(np.float64)
    assert np.abs(phi_se @ phi_se.T - np.exp(-0.5 * r**2)).max() < 5 * math.sqrt(2.0 / 20_000)


def test_kmeans_inducing_inputs_start_at_cluster_centres(tmp_path):
    """`inducing_inputs_initializer='kmeans'`: the first training call sets Z to k-means centres
    of the batch (well-separated clusters are found), later calls leave Z to the optimizer, and
    the flag survives saving."""
    import keras

    from blayers.layers import SparseGaussianProcess

    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    x = (centres[np.arange(400) % 4] + 0.1 * rng.normal(size=(400, 2))).astype("float32")
    layer = SparseGaussianProcess(1, num_inducing=4, inducing_inputs_initializer="kmeans")
    model = keras.Sequential([keras.Input((2,)), layer])
    model(x[:3])  # inference calls do not initialize
    assert float(layer.kmeans_done) == 0.0
    found = None
    for attempt in range(5):  # Lloyd's algorithm from random rows can merge two clusters
        layer.kmeans_done.assign(0.0)
        model(x, training=True)
        z = np.sort(layer.inducing_inputs.numpy().round(0), axis=0)
        if np.allclose(np.sort(centres, axis=0), z, atol=0.5):
            found = attempt
            break
    assert found is not None
    model(x * 0.0, training=True)  # done once: not re-run
    np.testing.assert_allclose(np.sort(layer.inducing_inputs.numpy().round(0), 0), z)
    model.save(tmp_path / "gp.keras")
    loaded = keras.models.load_model(tmp_path / "gp.keras")
    assert float(loaded.layers[0].kmeans_done) == 1.0
    assert loaded.layers[0].get_config()["inducing_inputs_initializer"] == "kmeans"
    # A deep GP: the inner layer's random-variable output is clustered by the next layer, also
    # inside a compiled step.
    from blayers.lab.models import deep_gp

    deep = deep_gp((2,), 1, depth=2, num_inducing=4, inducing_inputs_initializer="kmeans")
    tf.function(lambda v: deep(v, training=True).distribution.mean())(x)
    assert all(float(layer.kmeans_done) == 1.0 for layer in deep.layers[:2])


def test_explained_variances_and_their_gradient_are_autodiff_s_of_l_transpose_a():
    """`explained_variances` (its gradient written out) against autodiff of `||L^T a||^2`, for
    general `L` (not only triangular), in float64; and a mean-field layer's variances against a
    full one's with the same diagonal."""
    from blayers.layers.gp.sparse import explained_variances

    rng = np.random.default_rng(11)
    scale = tf.constant(rng.normal(size=(2, 3, 5, 5)))
    a = tf.constant(rng.normal(size=(2, 5, 7)))
    upstream = tf.constant(rng.normal(size=(2, 3, 7)))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([scale, a])
        mine = explained_variances(scale, a)
        projected = tf.matmul(scale, a[:, None], transpose_a=True)
        theirs = tf.reduce_sum(tf.square(projected), 2)
        objectives = tf.reduce_sum(mine * upstream), tf.reduce_sum(theirs * upstream)
    np.testing.assert_allclose(mine, theirs, rtol=1e-12)
    for mine_grad, their_grad in zip(
        tape.gradient(objectives[0], [scale, a]), tape.gradient(objectives[1], [scale, a])
    ):
        np.testing.assert_allclose(mine_grad, their_grad, rtol=1e-10, atol=1e-12)

    x = rng.normal(size=(6, 2)).astype("float32")
    full = SparseGaussianProcess(2, num_inducing=4, cholesky_dtype="float64")
    diagonal = SparseGaussianProcess(
        2, num_inducing=4, variational="mean_field", cholesky_dtype="float64"
    )
    full(x), diagonal(x)
    diagonal.inducing_inputs.assign(full.inducing_inputs)
    raw = rng.normal(size=(2, 4)).astype("float32")
    diagonal.variational_scale.assign(raw)
    full.variational_scale.assign(np.stack([np.diag(r) for r in raw]))
    np.testing.assert_allclose(
        diagonal.predict_marginals(x)[1], full.predict_marginals(x)[1], rtol=1e-6
    )
