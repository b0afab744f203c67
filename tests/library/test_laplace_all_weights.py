"""Laplace over all the weights against exact references built by autodiff: the GGN
`sum_n J_n^T Lambda_n J_n` from per-example Jacobians (its diagonal exactly, its KFAC blocks
exactly for one example), the Hessian of the NLL (equal to the GGN's blocks for a deep linear
network), the linearized predictive `J P^-1 J^T` and the evidence from the explicit precision,
and the last-layer Laplace where the two coincide."""

import itertools
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy.special import softmax

from blayers.posthoc import AllWeightsLaplace, AllWeightsLaplacePredictive, Laplace


def _mlp(activation="tanh", seed=0, d=4, k=3):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((d,)),
            keras.layers.Dense(5, activation=activation),
            keras.layers.Dense(3, activation=activation, use_bias=False),
            keras.layers.Dense(k),
        ]
    )


def _conv2d(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6, 5, 2)),
            keras.layers.Conv2D(3, 3, padding="same", activation="tanh"),
            keras.layers.Conv2D(2, (2, 3), strides=2, padding="valid", activation="tanh"),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )


def _conv1d(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((7, 2)),
            keras.layers.Conv1D(3, 3, dilation_rate=2, padding="same", activation="tanh"),
            keras.layers.Dense(2, activation="tanh"),  # a dense layer over 7 locations
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )


class _SharedDense(keras.Model):
    """A subclassed model calling one dense layer twice (tied weights)."""

    def __init__(self):
        super().__init__()
        self.inner = keras.layers.Dense(4, activation="tanh")
        self.head = keras.layers.Dense(3)

    def call(self, x):
        return self.head(self.inner(x[:, :4]) + self.inner(x[:, 4:]))


def _shared(seed=0):
    keras.utils.set_random_seed(seed)
    model = _SharedDense()
    model(np.zeros((1, 8), "float32"))
    return model


_MODELS = {"mlp": (_mlp, (4,)), "conv2d": (_conv2d, (6, 5, 2)), "conv1d": (_conv1d, (7, 2))}
_MODELS["shared"] = (_shared, (8,))


def _data(shape, n, k=3, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, *shape)).astype("float32"), rng.integers(0, k, size=n)


def _blocks(laplace):
    """Each block's variables in the layout `AllWeightsLaplace` uses: `[kernel; bias]`."""
    return [
        [block.layer.kernel] + ([block.layer.bias] if block.has_bias else [])
        for block in laplace.blocks
    ]


def _jacobians(laplace, x):
    """Per-example Jacobians of the logits in every block's `vec([W; b])`, `[n, K, P_total]`:
    one tape over the batch, as each example's logits depend on its own input only."""
    variables = [v for block in _blocks(laplace) for v in block]
    with tf.GradientTape() as tape:
        f = laplace.model(x, training=False)
    jacs = iter(tape.jacobian(f, variables))
    n, k = f.shape
    parts = []
    for block in _blocks(laplace):
        channels = block[0].shape[-1]
        matrix = [tf.reshape(next(jacs), [n, k, -1, channels]) for _ in block]
        parts.append(tf.reshape(tf.concat(matrix, 2), [n, k, -1]).numpy())
    return np.concatenate(parts, 2).astype(np.float64)


def _exact_ggn(laplace, x):
    jac = _jacobians(laplace, x)
    logits = np.asarray(laplace.model(x, training=False), np.float64)
    lam = laplace._output_curvature(logits)
    return np.einsum("nkp,nkl,nlq->pq", jac, lam, jac), jac


def _block_slices(laplace):
    sizes = [theta.size for theta in laplace.thetas]
    edges = np.cumsum([0, *sizes])
    return [slice(a, b) for a, b in itertools.pairwise(edges)]


def _explicit_precision_blocks(laplace):
    """`P_l = scale H_l + delta I`, built from the fitted factors as dense matrices."""
    scale = laplace._curvature_scale(laplace.sigma_noise)
    blocks = []
    for state in laplace._states:
        if laplace.structure == "kron":
            s_a, u_a = state["values_a"], state["vectors_a"]
            s_g, u_g = state["values_g"], state["vectors_g"]
            h = np.kron((u_a * s_a) @ u_a.T, (u_g * s_g) @ u_g.T)
        else:
            h = np.diag(state["diag_h"])
        blocks.append(scale * h + laplace.prior_precision * np.eye(len(h)))
    return blocks


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_diagonal_is_the_exact_ggn_diagonal(name):
    """Dense, strided and dilated convolutions, a dense layer over locations, a shared layer."""
    make, shape = _MODELS[name]
    x, y = _data(shape, 6)
    laplace = AllWeightsLaplace(make(), "classification", "diag").fit((x, y), batch_size=4)
    ggn, _ = _exact_ggn(laplace, x)
    fitted = np.concatenate([state["diag_h"] for state in laplace._states])
    np.testing.assert_allclose(fitted, np.diag(ggn), rtol=1e-4, atol=1e-7)


def test_kfac_is_the_exact_ggn_block_for_one_example_and_the_hessian_for_a_linear_network():
    x, y = _data((4,), 1)
    laplace = AllWeightsLaplace(_mlp(), "classification", "kron").fit((x, y))
    ggn, _ = _exact_ggn(laplace, x)
    for sl, precision in zip(
        _block_slices(laplace), _explicit_precision_blocks(laplace), strict=True
    ):
        kfac = precision - laplace.prior_precision * np.eye(len(precision))
        np.testing.assert_allclose(kfac, ggn[sl, sl], rtol=1e-4, atol=1e-7)

    # A deep linear network is linear in each layer's weights, so each diagonal block of the
    # NLL's Hessian is the GGN's.
    model = _mlp(activation=None, seed=3)
    laplace = AllWeightsLaplace(model, "classification", "kron").fit((x, y))
    for block, precision in zip(laplace.blocks, _explicit_precision_blocks(laplace), strict=True):
        variables = [block.layer.kernel] + ([block.layer.bias] if block.has_bias else [])
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                nll = keras.losses.sparse_categorical_crossentropy(
                    y, model(x, training=False), from_logits=True
                )
            grads = inner.gradient(nll, variables)
            flat = tf.concat([tf.reshape(g, [-1, block.kernel_shape[-1]]) for g in grads], 0)
            flat = tf.reshape(flat, [-1])
        hessian = outer.jacobian(flat, variables)
        hessian = tf.concat(
            [tf.reshape(h, [flat.shape[0], -1, block.kernel_shape[-1]]) for h in hessian], 1
        )
        hessian = tf.reshape(hessian, [flat.shape[0], -1]).numpy()
        kfac = precision - laplace.prior_precision * np.eye(len(precision))
        np.testing.assert_allclose(kfac, hessian, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("structure", ["kron", "diag"])
@pytest.mark.parametrize("name", ["mlp", "conv2d", "shared"])
def test_linearized_predictive_and_evidence_from_the_explicit_precision(name, structure):
    make, shape = _MODELS[name]
    x, y = _data(shape, 12)
    laplace = AllWeightsLaplace(make(), "classification", structure, prior_precision=0.7)
    laplace.fit((x, y), batch_size=5)
    x_new, _ = _data(shape, 3, seed=7)
    _, jac = _exact_ggn(laplace, x_new)
    precisions = _explicit_precision_blocks(laplace)
    expected = sum(
        np.einsum("nkp,pq,nlq->nkl", jac[:, :, sl], np.linalg.inv(p), jac[:, :, sl])
        for sl, p in zip(_block_slices(laplace), precisions, strict=True)
    )
    f, cov = laplace.functional_variance(x_new)
    np.testing.assert_allclose(f, laplace.model(x_new), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cov, expected, rtol=1e-4, atol=1e-8)

    theta = laplace._map_vector()
    log_det = sum(np.linalg.slogdet(p)[1] for p in precisions)
    logits = np.asarray(laplace.model(x), np.float64)
    log_lik = np.sum(np.log(softmax(logits, -1)[np.arange(len(y)), y]))
    evidence = log_lik - 0.5 * 0.7 * theta @ theta - 0.5 * (log_det - theta.size * math.log(0.7))
    assert laplace.log_marginal_likelihood() == pytest.approx(evidence, rel=1e-6)


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_one_dense_layer_is_the_last_layer_laplace(likelihood):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    x, labels = _data((4,), 30)
    y = labels if likelihood == "classification" else np.random.default_rng(2).normal(size=(30, 3))
    kwargs = {"hessian_structure": "kron", "prior_precision": 2.0, "sigma_noise": 0.5}
    last = Laplace(model, likelihood, **kwargs).fit((x, y))
    every = Laplace(model, likelihood, subset_of_weights="all", **kwargs).fit((x, y), batch_size=7)
    assert isinstance(every, AllWeightsLaplace)
    assert every.log_marginal_likelihood() == pytest.approx(last.log_marginal_likelihood(), 1e-8)
    np.testing.assert_allclose(every.functional_variance(x)[1], last.functional_variance(x)[1])
    assert every.optimize_prior_precision() == pytest.approx(last.optimize_prior_precision(), 1e-4)


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_network_samples_match_the_linearized_predictive_of_a_linear_model(likelihood):
    """For a network linear in its weights, averaging the network over posterior draws is the
    linearized predictive: compared within 5 Monte Carlo standard errors."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    x, labels = _data((4,), 8)
    y = labels if likelihood == "classification" else np.random.default_rng(2).normal(size=(8, 3))
    laplace = AllWeightsLaplace(model, likelihood, "kron", prior_precision=0.5, sigma_noise=0.3)
    laplace.fit((x, y))
    n = 4000
    if likelihood == "regression":
        mean, stddev = laplace.predict(x[:4], pred_type="nn", num_samples=n, seed=3)
        glm_mean, glm_stddev = laplace.predict(x[:4])
        f_sd = np.sqrt(glm_stddev**2 - 0.3**2)
        assert np.all(np.abs(mean - glm_mean) < 5 * f_sd / math.sqrt(n))
        np.testing.assert_allclose(stddev, glm_stddev, rtol=5 * math.sqrt(2 / n) + 0.01)
        return
    draws = []
    for s in laplace.sample(n, seed=3)[0]:
        draws.append(softmax(np.c_[x[:4], np.ones(4)] @ s, -1))
    draws = np.asarray(draws)
    network = laplace.predict(x[:4], pred_type="nn", num_samples=n, seed=3)
    np.testing.assert_allclose(network, draws.mean(0), atol=1e-6)  # the same draws, run
    glm = laplace.predict(x[:4], link_approx="mc", num_samples=n, seed=4)
    se = draws.std(0) / math.sqrt(n)
    assert np.all(np.abs(glm - network) < 5 * math.sqrt(2) * se + 1e-9)


def test_kron_samples_have_the_posterior_covariance():
    x, y = _data((4,), 10)
    laplace = AllWeightsLaplace(_mlp(), "classification", "kron").fit((x, y))
    draws = laplace.sample(20_000, seed=0)
    for i, precision in enumerate(_explicit_precision_blocks(laplace)):
        flat = draws[i].reshape(20_000, -1)
        covariance = np.linalg.inv(precision)
        se = np.sqrt(np.diag(covariance) / 20_000)
        assert np.all(np.abs(flat.mean(0) - laplace.thetas[i].reshape(-1)) < 5 * se)
        np.testing.assert_allclose(
            np.cov(flat.T), covariance, atol=0.05 * np.max(np.abs(covariance))
        )


def test_float32_accumulation_save_load_and_the_points_kept_fixed(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(5, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(3),
        ]
    )
    x, y = _data((4,), 40)
    laplace = Laplace(model, subset_of_weights="all").fit((x, y), progress=True)
    assert sorted(p.split("/")[-1] for p in laplace.point_estimated) == ["beta", "gamma"]
    single = Laplace(model, subset_of_weights="all", dtype="float32").fit((x, y))
    np.testing.assert_allclose(
        single.log_marginal_likelihood(), laplace.log_marginal_likelihood(), rtol=1e-5
    )
    laplace.optimize_prior_precision()
    laplace.save(tmp_path / "posterior.npz")
    loaded = AllWeightsLaplace.load(tmp_path / "posterior.npz", model)
    assert loaded.prior_precision == laplace.prior_precision
    np.testing.assert_allclose(loaded.predict(x), laplace.predict(x))
    assert loaded.log_marginal_likelihood() == pytest.approx(laplace.log_marginal_likelihood())


@pytest.mark.parametrize(
    "name, structure, likelihood",
    [
        # Both structures and both likelihoods in the fast suite; each architecture's predictive
        # (the same per-layer Jacobians) is checked against the explicit precision above.
        pytest.param("mlp", "kron", "classification", marks=pytest.mark.slow),
        ("conv2d", "diag", "classification"),
        ("conv1d", "kron", "regression"),  # a dense layer over 7 locations: J = sum_t a_t (x) g_t
        # a layer called twice, in a subclassed model
        pytest.param("shared", "diag", "regression", marks=pytest.mark.slow),
    ],
)
def test_saved_model_is_the_linearized_predictive(tmp_path, name, structure, likelihood):
    make, shape = _MODELS[name]
    x, labels = _data(shape, 12)
    y = labels if likelihood == "classification" else np.random.default_rng(3).normal(size=(12, 3))
    laplace = AllWeightsLaplace(make(), likelihood, structure, prior_precision=0.7, sigma_noise=0.8)
    laplace.fit((x, y), batch_size=5)
    x_new, _ = _data(shape, 4, seed=7)
    # The GLM predictive from the explicit block precisions and autodiff Jacobians.
    jac = _jacobians(laplace, x_new)
    cov = sum(
        np.einsum("nkp,pq,nlq->nkl", jac[:, :, sl], np.linalg.inv(p), jac[:, :, sl])
        for sl, p in zip(_block_slices(laplace), _explicit_precision_blocks(laplace), strict=True)
    )
    f = np.asarray(laplace.model(x_new), np.float64)
    variance = np.diagonal(cov, axis1=1, axis2=2)
    if likelihood == "classification":
        expected = [softmax(f / np.sqrt(1 + math.pi / 8 * variance), -1)]
    else:
        expected = [f, np.sqrt(variance + 0.8**2)]

    def check(predictive):
        outputs = predictive.predict(x_new, verbose=0)
        outputs = [outputs] if likelihood == "classification" else outputs
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)

    predictive = laplace.to_model()
    assert isinstance(predictive, AllWeightsLaplacePredictive)
    check(predictive)
    laplace.model.trainable = False  # the Jacobians still reach frozen layers
    check(laplace.to_model())
    if name == "shared":
        return  # the subclassed model has no config to save
    path = str(tmp_path / "laplace.keras")
    predictive.save(path)
    restored = keras.models.load_model(path)
    check(restored)
    again = AllWeightsLaplace.from_model(restored)
    assert again.log_marginal_likelihood() == pytest.approx(laplace.log_marginal_likelihood())
    assert again.optimize_prior_precision() == pytest.approx(laplace.optimize_prior_precision())
    with pytest.raises(ValueError, match="link_approx='probit'"):
        laplace.to_model(link_approx="mc")
    with pytest.raises(TypeError, match="to_model"):
        AllWeightsLaplace.from_model(laplace.model)


def test_errors_name_the_layer():
    keras.utils.set_random_seed(0)
    grouped = keras.Sequential(
        [
            keras.Input((5, 5, 4)),
            keras.layers.Conv2D(4, 3, groups=2, name="grouped"),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    with pytest.raises(ValueError, match="'grouped'.*groups"):
        AllWeightsLaplace(grouped)
    with pytest.raises(ValueError, match="'full' is for the last layer"):
        Laplace(_mlp(), hessian_structure="full", subset_of_weights="all")
    with pytest.raises(ValueError, match="subset_of_weights"):
        Laplace(_mlp(), subset_of_weights="some")

    class Misordered(keras.Model):
        def __init__(self):
            super().__init__()
            self.head = keras.layers.Dense(3)
            self.body = keras.layers.Dense(4)

        def call(self, x):
            return self.head(self.body(x))

    model = Misordered()
    model(np.zeros((1, 4), "float32"))
    x, y = _data((4,), 4)
    with pytest.raises(ValueError, match="create the output layer last"):
        AllWeightsLaplace(model).fit((x, y))


def test_per_layer_prior_precisions():
    """One precision a layer: equal ones are the scalar posterior; the layerwise evidence
    optimum is at least the scalar optimum's evidence; they survive save/load and to_model."""
    import os
    import tempfile

    import keras

    from blayers.posthoc import AllWeightsLaplace

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=10, verbose=0)
    scalar = AllWeightsLaplace(model, prior_precision=2.0).fit((x, y))
    layered = AllWeightsLaplace(model, prior_precision=[2.0, 2.0]).fit((x, y))
    assert layered.log_marginal_likelihood() == pytest.approx(scalar.log_marginal_likelihood())
    np.testing.assert_allclose(layered.predict(x[:10]), scalar.predict(x[:10]), rtol=1e-10)
    best_scalar = scalar.optimize_prior_precision()
    deltas = layered.optimize_prior_precision(layerwise=True)
    assert deltas.shape == (2,) and not np.allclose(deltas[0], deltas[1], rtol=1e-2)
    assert layered.log_marginal_likelihood() >= scalar.log_marginal_likelihood(best_scalar) - 1e-6
    # A different precision on the hidden layer changes only its block's covariance.
    _, wide = (
        AllWeightsLaplace(model, prior_precision=[0.01, 2.0])
        .fit((x, y))
        .functional_variance(x[:10])
    )
    _, narrow = (
        AllWeightsLaplace(model, prior_precision=[100.0, 2.0])
        .fit((x, y))
        .functional_variance(x[:10])
    )
    assert np.all(np.trace(wide, axis1=1, axis2=2) > np.trace(narrow, axis1=1, axis2=2))
    path = os.path.join(tempfile.mkdtemp(), "posterior.npz")
    layered.save(path)
    loaded = AllWeightsLaplace.load(path, model)
    np.testing.assert_allclose(loaded.prior_precision, deltas)
    np.testing.assert_allclose(loaded.predict(x[:10]), layered.predict(x[:10]), rtol=1e-6)
    saved = os.path.join(tempfile.mkdtemp(), "laplace.keras")
    layered.to_model().save(saved)
    restored = keras.models.load_model(saved)
    np.testing.assert_allclose(
        restored.predict(x[:10], verbose=0), layered.predict(x[:10]), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ValueError, match="one positive number a covered layer"):
        AllWeightsLaplace(model, prior_precision=[1.0, 2.0, 3.0])
