"""The last-layer Laplace approximation against closed forms: Bayesian linear regression's exact
posterior and evidence, the exact Hessian of the softmax NLL (autodiff), KFAC's exactness where
it holds, and the evidence's optimum."""

import math

import keras
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from conftest import epochs_of
from scipy.special import softmax

from blayers.posthoc import Laplace


def _linear_model(d, k, weights=None, activation=None):
    model = keras.Sequential([keras.Input((d,)), keras.layers.Dense(k, activation=activation)])
    if weights is not None:
        model.layers[-1].set_weights(weights)
    return model


def _regression_data(n=60, d=3, sigma=0.5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    y = x @ rng.normal(size=(d, 1)) + 0.3 + sigma * rng.normal(size=(n, 1))
    return x, y.astype("float32")


@pytest.mark.parametrize("structure", ["full", "kron", "diag"])
def test_linear_gaussian_posterior_and_evidence_are_exact(structure):
    """For a linear model with Gaussian noise the Laplace posterior around the posterior mean is
    the exact posterior, and its evidence the exact evidence (diag: the diagonal of the exact
    precision, so only where the features are orthogonal; checked on the variance it gives)."""
    sigma, delta = 0.5, 2.0
    x, y = _regression_data(sigma=sigma)
    phi = np.c_[x, np.ones(len(x))].astype(np.float64)
    precision = phi.T @ phi / sigma**2 + delta * np.eye(4)
    mean = np.linalg.solve(precision, phi.T @ y / sigma**2)
    model = _linear_model(3, 1, [mean[:3].astype("float32"), mean[3].astype("float32")])
    laplace = Laplace(model, "regression", structure, prior_precision=delta, sigma_noise=sigma)
    laplace.fit((x, y), batch_size=16)
    x_new = np.random.default_rng(1).normal(size=(5, 3)).astype("float32")
    phi_new = np.c_[x_new, np.ones(5)]
    f, cov = laplace.functional_variance(x_new)
    np.testing.assert_allclose(f[:, 0], phi_new @ mean[:, 0], rtol=1e-5)
    exact_precision = precision if structure != "diag" else np.diag(np.diag(precision))
    exact_var = np.einsum("nd,de,ne->n", phi_new, np.linalg.inv(exact_precision), phi_new)
    np.testing.assert_allclose(cov[:, 0, 0], exact_var, rtol=1e-5)
    if structure != "diag":
        evidence = scipy.stats.multivariate_normal(
            np.zeros(len(y)), sigma**2 * np.eye(len(y)) + phi @ phi.T / delta
        ).logpdf(y[:, 0])
        assert laplace.log_marginal_likelihood() == pytest.approx(evidence, rel=1e-5)
        # Sampled weights have the posterior's moments (5 standard errors).
        draws = laplace.sample(20_000).reshape(20_000, 4)
        se = np.sqrt(np.diag(np.linalg.inv(precision)) / 20_000)
        assert np.all(np.abs(draws.mean(0) - mean[:, 0]) < 5 * se)
        np.testing.assert_allclose(
            np.cov(draws.T),
            np.linalg.inv(precision),
            atol=0.05 * np.max(np.abs(np.linalg.inv(precision))),
        )


def _classification(n=40, d=4, k=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    weights = [rng.normal(size=(d, k)).astype("float32"), rng.normal(size=k).astype("float32")]
    labels = rng.integers(0, k, size=n)
    return x, labels, _linear_model(d, k, weights)


def _autodiff_hessian(model, x, labels):
    """The exact Hessian of the summed softmax NLL in the last layer's `vec([W; b])`."""
    kernel, bias = (v.numpy().astype(np.float64) for v in model.layers[-1].weights)
    theta = tf.Variable(np.concatenate([kernel, bias[None]], 0))
    phi = tf.constant(np.c_[x, np.ones(len(x))], tf.float64)
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            logits = phi @ theta
            nll = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        grad = tf.reshape(inner.gradient(nll, theta), [-1])
    size = int(np.prod(theta.shape))
    return tf.reshape(outer.jacobian(grad, theta), [size, size]).numpy()


def test_full_ggn_is_the_exact_hessian_and_kfac_and_diag_agree_where_they_must():
    x, labels, model = _classification()
    exact = _autodiff_hessian(model, x, labels)
    full = Laplace(model, hessian_structure="full").fit((x, labels))
    s, u = full._eig_h
    np.testing.assert_allclose((u * s) @ u.T, exact, atol=1e-6)
    diag = Laplace(model, hessian_structure="diag").fit((x, labels))
    np.testing.assert_allclose(diag._diag_h, np.diag(exact), atol=1e-6)
    # KFAC is exact on one example.
    one = Laplace(model, hessian_structure="kron").fit((x[:1], labels[:1]))
    (s_a, u_a), (s_g, u_g) = one._eig_a, one._eig_g
    kron = np.kron((u_a * s_a) @ u_a.T, (u_g * s_g) @ u_g.T)
    np.testing.assert_allclose(kron, _autodiff_hessian(model, x[:1], labels[:1]), atol=1e-6)
    # On many examples it keeps the trace of A (x) mean Lambda; the predictive stays close.
    kfac = Laplace(model, hessian_structure="kron").fit((x, labels))
    assert kfac.predict(x[:5]) == pytest.approx(full.predict(x[:5]), abs=0.05)


def test_predictives_probit_and_monte_carlo_agree():
    x, labels, model = _classification(n=2000, seed=3)
    # The probit approximation ignores the correlation between logits (as laplace-torch's), so
    # it is compared where the output variance is moderate: a strong prior, which also bounds
    # the variance along the softmax's shift-invariant direction.
    laplace = Laplace(model, hessian_structure="full", prior_precision=100.0).fit((x, labels))
    probit = laplace.predict(x[:20])
    mc = laplace.predict(x[:20], link_approx="mc", num_samples=20_000)
    np.testing.assert_allclose(probit, mc, atol=0.03)
    # The output-space draws agree with pushing weight draws through the last layer.
    weights = laplace.sample(20_000)
    phi = np.c_[x[:20], np.ones(20)]
    by_weights = softmax(np.einsum("nd,sdk->snk", phi, weights), -1).mean(0)
    np.testing.assert_allclose(by_weights, mc, atol=0.01)
    np.testing.assert_allclose(probit.sum(-1), 1.0, rtol=1e-9)


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_prior_precision_by_the_evidence_maximizes_it(likelihood):
    if likelihood == "classification":
        x, labels, model = _classification(n=300, seed=4)
        data = (x, labels)
    else:
        x, y = _regression_data(n=300, seed=4)
        phi = np.c_[x, np.ones(len(x))]
        solution = np.linalg.lstsq(phi, y, rcond=None)[0].astype("float32")  # the trained MAP
        model = _linear_model(3, 1, [solution[:3], solution[3]])
        data = (x, y)
    laplace = Laplace(model, likelihood, "kron").fit(data)
    laplace.optimize_prior_precision()
    best = laplace.log_marginal_likelihood()
    for factor in (0.5, 2.0):
        assert best >= laplace.log_marginal_likelihood(laplace.prior_precision * factor) - 1e-9
    if likelihood == "regression":  # the noise found is the data's (0.5), within its SE
        assert laplace.sigma_noise == pytest.approx(0.5, abs=4 * 0.5 / math.sqrt(2 * 300))


def test_validation_nll_choice_and_errors():
    x, labels, model = _classification(n=300, seed=5)
    laplace = Laplace(model, hessian_structure="diag").fit((x[:200], labels[:200]))
    grid = np.logspace(-3, 3, 13)
    laplace.optimize_prior_precision("val_nll", val_data=(x[200:], labels[200:]), grid=grid)
    nll = laplace.nll(x[200:], labels[200:])
    for other in grid:
        laplace.prior_precision = other
        assert nll <= laplace.nll(x[200:], labels[200:]) + 1e-12
    with pytest.raises(ValueError, match="activation 'relu'"):
        Laplace(_linear_model(4, 3, activation="relu"))
    with pytest.raises(ValueError, match="hessian_structure"):
        Laplace(model, hessian_structure="block")
    with pytest.raises(ValueError, match="fit"):
        Laplace(model).predict(x)
    laplace.prior_precision = float(grid[0])
    assert (
        laplace.optimize_prior_precision("val_nll", val_data=(x[200:], labels[200:]), grid=grid)
        in grid
    )


@pytest.mark.parametrize(
    "likelihood,structure",
    [
        ("classification", "kron"),
        ("classification", "full"),
        ("classification", "diag"),
        ("regression", "kron"),
    ],
)
def test_fitted_posterior_round_trips_through_a_keras_file(tmp_path, likelihood, structure):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype("float32")
    k = 3 if likelihood == "classification" else 2
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(k)]
    )
    y = (
        rng.integers(0, k, size=200)
        if likelihood == "classification"
        else rng.normal(size=(200, k)).astype("float32")
    )
    laplace = Laplace(model, likelihood, structure, prior_precision=0.7, sigma_noise=0.4)
    laplace.fit((x, y), batch_size=64)
    predictive = laplace.to_model()
    path = tmp_path / "laplace.keras"
    predictive.save(path)
    loaded = keras.models.load_model(path)
    expected = laplace.predict(x[:20])
    got = loaded(x[:20])
    if likelihood == "regression":
        for e, g in zip(expected, got):
            np.testing.assert_allclose(np.asarray(g), e, rtol=1e-5)
    else:
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)
    restored = Laplace.from_model(loaded)
    assert restored.log_marginal_likelihood() == pytest.approx(
        laplace.log_marginal_likelihood(), rel=1e-10
    )
    # The restored posterior can still move its prior precision.
    np.testing.assert_allclose(
        restored.log_marginal_likelihood(3.0), laplace.log_marginal_likelihood(3.0), rtol=1e-10
    )
    _, cov = restored.functional_variance(x[:5])
    _, cov0 = laplace.functional_variance(x[:5])
    np.testing.assert_allclose(cov, cov0, rtol=1e-8)
    with pytest.raises(TypeError, match="LaplacePredictive"):
        Laplace.from_model(model)


@pytest.mark.parametrize("structure", ["kron", "full", "diag"])
def test_the_joint_functional_covariance_is_j_sigma_j_transposed(structure):
    """Against the posterior covariance written out, `J Sigma J^T` with `J_n = phi~_n (x) I`:
    the fast KFAC path included; its diagonal blocks are the marginal covariances, and joint
    function draws have that covariance."""
    import keras

    from blayers.posthoc import Laplace

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=5, verbose=0)
    laplace = Laplace(model, "classification", hessian_structure=structure).fit((x, y))
    laplace.prior_precision = 0.7
    test = x[:5]
    f, cov = laplace.joint_functional_covariance(test)
    np.testing.assert_allclose(f, model.predict(test, verbose=0), rtol=1e-5, atol=1e-5)
    # The posterior covariance of the weights written out.
    if structure == "diag":
        weight_cov = np.diag(1.0 / laplace._precision_eigenvalues(0.7, 1.0))
    elif structure == "kron":
        basis = np.kron(laplace._eig_a[1], laplace._eig_g[1])
        weight_cov = (basis / laplace._precision_eigenvalues(0.7, 1.0)) @ basis.T
    else:
        u = laplace._eig_h[1]
        weight_cov = (u / laplace._precision_eigenvalues(0.7, 1.0)) @ u.T
    phi = laplace._cache(test)
    jacobian = np.einsum("nd,kl->nkdl", phi, np.eye(3)).reshape(5 * 3, -1)
    expected = (jacobian @ weight_cov @ jacobian.T).reshape(5, 3, 5, 3)
    np.testing.assert_allclose(cov, expected, rtol=1e-8, atol=1e-12)
    _, marginal = laplace.functional_variance(test)
    for n in range(5):
        np.testing.assert_allclose(cov[n, :, n, :], marginal[n], rtol=1e-8, atol=1e-12)
    functions = laplace.sample_functions(test, 40000, seed=2).reshape(40000, -1)
    sd = np.sqrt(np.diag(expected.reshape(15, 15)))
    # Sample covariances to sampling noise: sd_i sd_j sqrt(2 / S) at most, times 5.
    tolerance = 5 * np.outer(sd, sd) * np.sqrt(2 / 40000)
    assert np.all(np.abs(np.cov(functions, rowvar=False) - expected.reshape(15, 15)) < tolerance)


@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_per_output_noise_for_multi_output_regression(structure, tmp_path):
    """Two targets with noise 0.1 and 1.0: the evidence fits each output's noise (near its
    residuals' standard deviation), beats one shared noise, and the predictive's standard
    deviations follow; the saved predictive keeps them."""
    import keras

    from blayers.posthoc import Laplace

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (1500, 2)).astype("float32")
    clean = np.stack([np.sin(x[:, 0]), x[:, 0] * x[:, 1] / 2], -1)
    y = (clean + rng.normal(size=clean.shape) * np.array([0.1, 1.0])).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((2,)), keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(2)]
    )
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(epochs_of(x, y, 40, batch_size=100), verbose=0)
    per_output = Laplace(model, "regression", structure, sigma_noise=[1.0, 1.0]).fit((x, y))
    per_output.optimize_prior_precision()
    residual_sd = np.std(y - model.predict(x, verbose=0), axis=0)
    # The evidence's noise is the residuals' inflated by the fit's effective number of
    # parameters gamma in [0, P] (MacKay): sigma^2 = |r|^2 / (N - gamma).
    ratio = np.asarray(per_output.sigma_noise) / residual_sd
    n, p = len(x), model.count_params()
    assert np.all(ratio > 0.98) and np.all(ratio < 1.02 * np.sqrt(n / (n - p))), ratio
    shared = Laplace(model, "regression", structure).fit((x, y))
    shared.optimize_prior_precision()
    assert per_output.log_marginal_likelihood() > shared.log_marginal_likelihood() + 100
    _, stddev = per_output.predict(x[:50])
    assert np.all(stddev[:, 0] < 0.2) and np.all(stddev[:, 1] > 0.9)
    path = str(tmp_path / "laplace.keras")
    per_output.to_model().save(path)
    mean, sd = keras.models.load_model(path).predict(x[:50], verbose=0)
    np.testing.assert_allclose(sd, stddev, rtol=1e-5)
    np.testing.assert_allclose(mean, model.predict(x[:50], verbose=0), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="one noise an output is for regression"):
        Laplace(model, "regression", "full", sigma_noise=[1.0, 1.0])
    with pytest.raises(ValueError, match="3 noise scales for 2 outputs"):
        Laplace(model, "regression", structure, sigma_noise=[1.0, 1.0, 1.0]).fit((x, y))


def test_heteroscedastic_regression_laplace():
    """A network of mean and raw scale: the curvature is the Gaussian's Fisher (the Monte Carlo
    mean of the NLL's Hessian in `(mu, rho)` over `y` from the model), the fit's likelihood is
    the network's, and the predictive follows the input-dependent noise."""
    import keras

    from blayers.posthoc import Laplace

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (2000, 1)).astype("float32")
    noise = 0.05 + 0.3 * np.abs(x[:, 0])
    y = (np.sin(2 * x[:, 0]) + noise * rng.normal(size=2000)).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((1,)), keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(2)]
    )

    def nll(t, out):
        scale = keras.ops.softplus(out[:, 1]) + 1e-3
        return 0.5 * keras.ops.square((t[:, 0] - out[:, 0]) / scale) + keras.ops.log(scale)

    model.compile(keras.optimizers.Adam(0.01), nll)
    model.fit(epochs_of(x, y[:, None], 60, batch_size=100), verbose=0)
    laplace = Laplace(model, "heteroscedastic", "kron").fit((x, y))
    # The Fisher against the expected Hessian of -log N(y; mu, softplus(rho)^2), by sampling y.
    f = np.array([[0.3, -0.4]])
    mu, rho = f[0]
    s, ds = np.logaddexp(0, rho) + 1e-3, 1 / (1 + np.exp(-rho))
    d2s = ds * (1 - ds)
    draws = mu + s * rng.normal(size=400000)
    r = draws - mu
    h_mumu = 1 / s**2
    h_rhorho = (3 * r**2 / s**4 - 1 / s**2) * ds**2 + (1 / s - r**2 / s**3) * d2s
    fisher = laplace._output_curvature(f)[0]
    assert fisher[0, 0] == pytest.approx(h_mumu)
    assert fisher[1, 1] == pytest.approx(np.mean(h_rhorho), rel=0.02)
    assert fisher[0, 1] == 0.0
    out = model.predict(x, verbose=0).astype(np.float64)
    scale = np.logaddexp(0, out[:, 1]) + 1e-3
    expected = np.sum(
        -0.5 * ((y - out[:, 0]) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi)
    )
    assert laplace.log_likelihood() == pytest.approx(expected, rel=1e-5)
    laplace.optimize_prior_precision()
    grid = np.array([[-1.8], [0.0], [1.8]], "float32")
    mean, stddev = laplace.predict(grid)
    assert mean.shape == stddev.shape == (3, 1)
    np.testing.assert_allclose(mean, model.predict(grid, verbose=0)[:, :1], atol=1e-5)
    assert stddev[1, 0] < 0.5 * stddev[0, 0] and stddev[1, 0] < 0.5 * stddev[2, 0]
    held_out = rng.uniform(-2, 2, (1000, 1)).astype("float32")
    truth = 0.05 + 0.3 * np.abs(held_out[:, 0])
    _, sd = laplace.predict(held_out)
    assert np.corrcoef(sd[:, 0], truth)[0, 1] > 0.9
    assert np.all(
        sd[:, 0] >= np.logaddexp(0, model.predict(held_out, verbose=0)[:, 1]) + 1e-3 - 1e-9
    )
