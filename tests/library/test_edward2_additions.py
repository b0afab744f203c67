"""edward2's heteroscedastic sigmoid layers and Bayesian linear model: the exact predictive
against Monte Carlo, the MC one against its own expectation, and the linear model's posterior
against the closed form."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import blayers
from blayers import layers as L


def _set(layer, x):
    layer(x)
    rng = np.random.RandomState(0)
    for w in layer.weights:
        w.assign(rng.normal(0, 0.7, w.shape).astype("float32"))


@pytest.mark.parametrize("noise", ["normal", "logistic"])
def test_exact_sigmoid_is_the_probability_that_the_noisy_logit_is_positive(noise):
    x = np.random.RandomState(1).randn(6, 3).astype("float32")
    layer = L.ExactSigmoidDense(2, logit_noise=noise)
    _set(layer, x)
    logits = layer(x).numpy()
    loc = layer.loc_layer(x).numpy()
    scale = layer.diag_layer(x).numpy() + layer.min_scale
    law = stats.norm if noise == "normal" else stats.logistic
    draws = law.rvs(loc=loc, scale=scale, size=(200_000, *loc.shape), random_state=2)
    frequency = (draws > 0).mean(0)
    se = np.sqrt(frequency * (1 - frequency) / 200_000) + 1e-4
    np.testing.assert_array_less(np.abs(1 / (1 + np.exp(-logits)) - frequency), 5 * se)


def test_mc_sigmoid_is_the_mean_sigmoid_of_its_noisy_logits():
    x = np.random.RandomState(3).randn(4, 3).astype("float32")
    layer = L.MCSigmoidDenseFA(3, num_factors=2, num_mc_samples=20_000, seed=0, temperature=0.7)
    _set(layer, x)
    p = tf.sigmoid(layer(x)).numpy()
    loc, factors, diag = (t.numpy() for t in layer.noise_distribution(x))
    rng = np.random.RandomState(4)
    n = 100_000
    eps_k = rng.randn(n, 4, 2)
    eps_c = rng.randn(n, 4, 3)
    u = loc + np.einsum("bck,nbk->nbc", factors, eps_k) + diag * eps_c
    s = 1 / (1 + np.exp(-u / 0.7))
    se = s.std(0) / np.sqrt(n) + s.std(0) / np.sqrt(20_000)
    np.testing.assert_array_less(np.abs(p - s.mean(0)), 5 * se)
    with pytest.raises(ValueError, match="num_classes"):
        L.MCSoftmaxDenseFA(1)


def test_bayesian_linear_model_posterior_is_the_closed_form(tmp_path):
    rng = np.random.RandomState(0)
    x = rng.randn(40, 3).astype("float32")
    y = (x @ np.array([1.0, -0.5, 2.0]) + 0.3 * rng.randn(40)).astype("float32")
    model = L.BayesianLinearModel(noise_variance=0.09)
    x_new = rng.randn(5, 3).astype("float32")
    prior = model(x_new).distribution
    np.testing.assert_allclose(prior.mean(), 0.0)
    np.testing.assert_allclose(prior.variance(), (x_new**2).sum(1), rtol=1e-5)
    model.fit(x, y)
    cov = np.linalg.inv(x.T.astype(np.float64) @ x / 0.09 + np.eye(3))
    mean = cov @ x.T @ y / 0.09
    d = model(x_new).distribution
    np.testing.assert_allclose(d.mean(), x_new @ mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d.variance(), np.einsum("nd,de,ne->n", x_new, cov, x_new), rtol=1e-3)
    wrapped = keras.Sequential([keras.Input((3,)), model])
    wrapped.save(tmp_path / "blm.keras")
    again = keras.models.load_model(tmp_path / "blm.keras")
    np.testing.assert_allclose(again(x_new).distribution.mean(), d.mean(), rtol=1e-6)
    assert isinstance(model(x_new), blayers.RandomVariable)


def test_ensemble_sync_batch_norm_is_each_members_batch_norm():
    """Training: each member's rows normalized with their own statistics and scaled by their own
    gamma and beta (a Keras BatchNormalization per member, same momentum); inference: the
    per-member moving statistics."""
    x = np.random.RandomState(0).randn(3 * 4, 5, 5, 6).astype("float32") * 2 + 1
    layer = L.EnsembleSyncBatchNorm(ensemble_size=3, momentum=0.9)
    layer(x)
    rng = np.random.RandomState(1)
    layer.gamma.assign(rng.uniform(0.5, 2, (3, 6)).astype("float32"))
    layer.beta.assign(rng.randn(3, 6).astype("float32"))
    out = layer(x, training=True).numpy()
    for m in range(3):
        twin = keras.layers.BatchNormalization(momentum=0.9, epsilon=layer.epsilon)
        rows = x[m * 4 : (m + 1) * 4]
        twin(rows)
        twin.gamma.assign(layer.gamma.numpy()[m])
        twin.beta.assign(layer.beta.numpy()[m])
        np.testing.assert_allclose(out[m * 4 : (m + 1) * 4], twin(rows, training=True), atol=1e-4)
        np.testing.assert_allclose(layer.moving_mean.numpy()[m], twin.moving_mean, atol=1e-5)
        np.testing.assert_allclose(
            layer.moving_variance.numpy()[m], twin.moving_variance, rtol=1e-4
        )
        np.testing.assert_allclose(
            layer(x, training=False).numpy()[m * 4 : (m + 1) * 4],
            twin(rows, training=False),
            atol=1e-4,
        )


def test_multi_head_mc_softmax_is_each_heads_mean_softmax_of_one_shared_noise():
    x = np.random.RandomState(5).randn(4, 3).astype("float32")
    layer = L.MultiHeadMCSoftmaxDenseFA(
        3, num_factors=2, ensemble_size=2, num_mc_samples=20_000, seed=0
    )
    _set(layer, x)
    probs = np.exp(layer(x).numpy())  # [B, E, C]
    assert probs.shape == (4, 2, 3)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    loc, factors, diag = (t.numpy() for t in layer.noise_distribution(x))
    rng = np.random.RandomState(6)
    n = 50_000
    u = loc + np.einsum("bck,nbk->nbc", factors, rng.randn(n, 4, 2)) + diag * rng.randn(n, 4, 6)
    u = u.reshape(n, 4, 2, 3)
    s = np.exp(u - u.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    se = s.std(0) / np.sqrt(n) + s.std(0) / np.sqrt(20_000)
    np.testing.assert_array_less(np.abs(probs - s.mean(0)), 5 * se)
    rows = L.MultiHeadMCSoftmaxDenseFA(3, 2, ensemble_size=2, member_major=True, seed=0)(x)
    assert rows.shape == (8, 3)


def test_heteroscedastic_ensemble_mixes_the_members_probabilities(tmp_path):
    x = np.random.RandomState(7).randn(5, 3).astype("float32")
    normal = L.ExactSigmoidDense(1, logit_noise="normal")
    logistic = L.ExactSigmoidDense(1, logit_noise="logistic")
    ensemble = L.EnsembleHeteroscedasticOutputs(2, [normal, logistic], (0.3, 0.7))
    p = tf.sigmoid(ensemble(x)).numpy()
    expected = 0.3 * tf.sigmoid(normal(x)).numpy() + 0.7 * tf.sigmoid(logistic(x)).numpy()
    np.testing.assert_allclose(p, expected, rtol=1e-5)
    gibbs = L.EnsembleHeteroscedasticOutputs(2, [normal, logistic], (0.3, 0.7), "gibbs_cross_ent")
    np.testing.assert_allclose(
        gibbs(x, training=True), 0.3 * normal(x) + 0.7 * logistic(x), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(tf.sigmoid(gibbs(x)), expected, rtol=1e-5)
    model = keras.Sequential([keras.Input((3,)), ensemble])
    model.save(tmp_path / "ens.keras")
    np.testing.assert_allclose(
        keras.models.load_model(tmp_path / "ens.keras")(x), model(x), rtol=1e-6
    )
    with pytest.raises(ValueError, match="probability distribution"):
        L.EnsembleHeteroscedasticOutputs(2, [normal, logistic], (0.5, 0.6))


def test_heteroscedastic_sngp_adds_the_gp_variance_at_prediction():
    """Training: the noise's diagonal is the heteroscedastic one; prediction: sqrt(het d^2 +
    sngp Var_GP), the GP's variance from the SNGP head's covariance; the location is the head's
    logits; it learns."""
    rng = np.random.RandomState(0)
    x = rng.randn(64, 4).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")
    layer = L.HeteroscedasticSNGPLayer(
        3, num_factors=2, num_mc_samples=50, num_inducing=64, sngp_var_weight=2.0, seed=0
    )
    layer(x, training=True)
    layer.begin_epoch()
    layer(x, training=True)  # the exact precision over this "epoch"
    loc, _, diag = layer.noise_distribution(x[:5], training=False)
    gp_loc, covariance = layer.sngp_layer(x[:5], training=False)
    het = layer.diag_layer(x[:5]).numpy() + 1e-6
    expected = np.sqrt(het**2 + 2.0 * np.diag(covariance.numpy())[:, None])
    np.testing.assert_allclose(diag, expected, rtol=1e-5)
    np.testing.assert_allclose(loc, gp_loc, rtol=1e-6)
    _, _, train_diag = layer.noise_distribution(x[:5], training=True)
    np.testing.assert_allclose(train_diag, het, rtol=1e-6)
    model = keras.Sequential([keras.Input((4,)), L.HeteroscedasticSNGPLayer(3, 2, num_inducing=64)])
    model.compile(
        keras.optimizers.Adam(0.02), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(x, y, epochs=60, batch_size=64, verbose=0)
    assert np.mean(np.argmax(model(x, training=False), -1) == y) > 0.85
