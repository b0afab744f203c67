"""edward2's heteroscedastic sigmoid layers and Bayesian linear model: the exact predictive
against Monte Carlo, the MC one against its own expectation, and the linear model's posterior
against the closed form."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import epochs_of, graph_draws
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
    het = layer.diag_layer(x[:5]).numpy() + 1e-3
    expected = np.sqrt(het**2 + 2.0 * np.diag(covariance.numpy())[:, None])
    np.testing.assert_allclose(diag, expected, rtol=1e-5)
    np.testing.assert_allclose(loc, gp_loc, rtol=1e-6)
    _, _, train_diag = layer.noise_distribution(x[:5], training=True)
    np.testing.assert_allclose(train_diag, het, rtol=1e-6)
    model = keras.Sequential([keras.Input((4,)), L.HeteroscedasticSNGPLayer(3, 2, num_inducing=64)])
    model.compile(
        keras.optimizers.Adam(0.02), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(epochs_of(x, y, 60, batch_size=64), verbose=0)
    assert np.mean(np.argmax(model(x, training=False), -1) == y) > 0.85


@pytest.mark.parametrize("noise", ["logistic", "gumbel"])
def test_mc_softmax_dense_noise_families_are_their_monte_carlo_predictive(noise):
    """`MCSoftmaxDense`'s predictive with logistic or Gumbel noise against draws of that law
    (scipy's), within 5 standard errors of both estimates."""
    x = np.random.RandomState(8).randn(3, 4).astype("float32")
    layer = L.MCSoftmaxDense(4, logit_noise=noise, num_mc_samples=40_000, seed=0)
    _set(layer, x)
    p = np.exp(layer(x).numpy())
    loc, _, scale = (None if t is None else t.numpy() for t in layer.noise_distribution(x))
    law = stats.logistic if noise == "logistic" else stats.gumbel_r
    u = loc + scale * law.rvs(size=(100_000, *loc.shape), random_state=9)
    s = np.exp(u - u.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    se = s.std(0) / np.sqrt(100_000) + s.std(0) / np.sqrt(40_000)
    np.testing.assert_array_less(np.abs(p - s.mean(0)), 5 * se + 1e-6)
    binary = L.MCSoftmaxDense(2, seed=0)  # edward2: two classes are one sigmoid logit
    assert binary(x).shape == (3, 1)


def test_mc_output_tuple_is_its_draws_mean_variance_and_unaveraged_logits():
    """With a call's `seed`, the tuple's probabilities, variance and per-draw logits are exactly
    those of the draws `noisy_logits` makes with that seed."""
    x = np.random.RandomState(10).randn(5, 3).astype("float32")
    layer = L.MCSoftmaxDenseFA(
        4,
        num_factors=2,
        num_mc_samples=64,
        logits_only=False,
        compute_pred_variance=True,
        return_unaveraged_logits=True,
        seed=0,
    )
    logits, unaveraged, log_probs, probs, variance = layer(x, seed=7)
    u = layer.noisy_logits(x, seed=7).numpy()  # [S, B, C]
    s = np.exp(u - u.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, s.mean(0), rtol=1e-4)
    np.testing.assert_allclose(variance, s.var(0), rtol=1e-3, atol=1e-7)
    np.testing.assert_allclose(log_probs, np.log(s.mean(0)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logits, log_probs, rtol=1e-4, atol=1e-5)
    assert unaveraged.shape == (5, 64, 4)
    np.testing.assert_allclose(np.exp(unaveraged).sum(-1), 1.0, rtol=1e-5)
    assert not np.allclose(layer(x, seed=8)[3], variance)  # another seed, other draws


def test_parameter_efficient_factors_and_segmentation_covariance():
    """The parameter-efficient loadings are `diag(v(x)) V`; per pixel, the segmentation
    layer's noisy logits have covariance `V V^T + diag(d^2)` (Monte Carlo, 5 standard
    errors), and two pixels' noises are independent."""
    x = np.random.RandomState(11).randn(3, 4).astype("float32")
    pe = L.MCSoftmaxDenseFA(5, num_factors=2, parameter_efficient=True, seed=0)
    pe(x)
    _, factors, _ = pe.noise_distribution(x)
    v = pe.scale_layer_heteroscedastic(x).numpy()
    expected = v[:, :, None] * pe.scale_layer_homoscedastic.kernel.numpy().T[None]
    np.testing.assert_allclose(factors, expected, rtol=1e-6)
    image = np.random.RandomState(12).randn(1, 2, 1, 4).astype("float32")
    seg = L.MCSoftmaxDenseFASegmentation(3, 2, num_mc_samples=50_000, seed=0)
    _set(seg, image)
    loc, factors, diag = (t.numpy() for t in seg.noise_distribution(image))
    u = seg.noisy_logits(image).numpy()  # [S, 1, 2, 1, 3]
    assert u.shape == (50_000, 1, 2, 1, 3)
    for pixel in range(2):
        draws = u[:, 0, pixel, 0]
        f, d = factors[0, pixel, 0], diag[0, pixel, 0]
        cov = f @ f.T + np.diag(d**2)
        sample_cov = np.cov(draws, rowvar=False)
        se = np.sqrt((cov**2 + np.outer(np.diag(cov), np.diag(cov))) / 50_000)
        np.testing.assert_array_less(np.abs(sample_cov - cov), 5 * se)
        np.testing.assert_allclose(
            draws.mean(0), loc[0, pixel, 0], atol=5 * np.sqrt(np.diag(cov) / 50_000).max()
        )
    cross = np.corrcoef(u[:, 0, 0, 0, 0], u[:, 0, 1, 0, 0])[0, 1]
    assert abs(cross) < 5 / np.sqrt(50_000)
    with pytest.raises(ValueError, match="batch, height, width"):
        L.MCSoftmaxDenseFASegmentation(3, 2)(x)


def test_shared_samples_tuned_temperature_and_custom_layers():
    x = np.random.RandomState(13).randn(2, 3).astype("float32")
    twice = np.concatenate([x[:1], x[:1]])
    shared = L.MCSoftmaxDenseFA(4, 2, num_mc_samples=8, share_samples_across_batch=True, seed=0)
    u = shared.noisy_logits(twice).numpy()
    np.testing.assert_allclose(u[:, 0], u[:, 1], rtol=1e-6)  # one standard draw for the batch
    own = L.MCSoftmaxDenseFA(4, 2, num_mc_samples=8, seed=0)
    own(twice)
    own.set_weights(shared.get_weights())
    assert not np.allclose(own.noisy_logits(twice)[:, 0], own.noisy_logits(twice)[:, 1])
    tuned = L.MCSigmoidDenseFA(1, tune_temperature=True, temperature_lower_bound=0.5)
    tuned(x)
    assert float(tuned.current_temperature()) == pytest.approx((0.5 + 3.0) / 2)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tuned(x, training=True))
    assert tape.gradient(loss, tuned.pre_sigmoid_temperature) is not None
    # The user's layers in the FA layer: the same map as the built-in one with those weights.
    base = L.MCSoftmaxDenseFA(4, 2, num_mc_samples=16, seed=0)
    base(x)
    custom = L.MCSoftmaxDenseFACustomLayers(
        4,
        2,
        scale_layer=keras.layers.Dense(8),
        loc_layer=keras.layers.Dense(4),
        diag_layer=keras.layers.Dense(4, activation="softplus"),
        num_mc_samples=16,
    )
    custom(x)
    for mine, theirs in (
        (custom.scale_layer, base.factor_layer),
        (custom.loc_layer, base.loc_layer),
        (custom.diag_layer, base.diag_layer),
    ):
        mine.set_weights(theirs.get_weights())
    loc, factors, diag = base.noise_distribution(x)
    c_loc, c_factors, c_diag = custom.noise_distribution(x)
    np.testing.assert_allclose(c_loc, loc, rtol=1e-6)
    np.testing.assert_allclose(c_factors, factors, rtol=1e-6)
    np.testing.assert_allclose(c_diag, diag, rtol=1e-6)


def test_linear_kernel_sngp_is_bayesian_linear_regression():
    """`gp_kernel_type='linear'`: the features are the inputs, and the predictive covariance
    is the closed form `X* (X^T X / ridge + I)^-1 X*^T` with the exact precision."""
    from blayers.layers.gp.sngp import RandomFeatureGaussianProcess

    rng = np.random.RandomState(14)
    x, x_new = rng.randn(20, 3).astype("float32"), rng.randn(4, 3).astype("float32")
    layer = RandomFeatureGaussianProcess(
        1,
        gp_kernel_type="linear",
        scale_random_features=False,
        gp_cov_momentum=-1,
        gp_cov_ridge_penalty=2.0,
        return_gp_cov=True,
        return_random_features=True,
    )
    _, _, phi = layer(x, training=True)
    np.testing.assert_allclose(phi, x, rtol=1e-6)
    _, covariance, _ = layer(x_new, training=False)
    x64, new64 = x.astype(np.float64), x_new.astype(np.float64)
    expected = new64 @ np.linalg.inv(x64.T @ x64 / 2.0 + np.eye(3)) @ new64.T
    np.testing.assert_allclose(covariance, expected, rtol=1e-4, atol=1e-6)


def test_add_weight_makes_a_keras_layer_bayesian():
    """`utils.add_weight(keras.layers.Dense)` with a distribution initializer: each call a new
    draw of the kernel (the output's variance across calls is the mean-field one), the KL of
    the draw in `losses` (the closed form), gradients to the variational parameters, and it
    fits a regression; a deterministic Keras initializer stays a variable."""
    from blayers.layers import utils

    BayesDense = utils.add_weight(keras.layers.Dense)
    layer = BayesDense(
        1,
        kernel_initializer=blayers.initializers.get("trainable_normal"),
        kernel_regularizer=blayers.regularizers.get("normal_kl_divergence"),
        use_bias=False,
    )
    x = np.ones((1, 3), "float32")
    layer(x)
    draws = graph_draws(lambda: layer(x)[0, 0], 1500)  # a new kernel draw each
    init = layer.kernel_initializer
    params = init.parameters()
    mean, stddev = params["mean"].numpy().ravel(), params["stddev"].numpy().ravel()
    variance = float(np.sum(stddev**2))
    np.testing.assert_allclose(draws.mean(), mean.sum(), atol=5 * np.sqrt(variance / 1500))
    np.testing.assert_allclose(draws.var(), variance, rtol=5 * np.sqrt(2 / 1500))
    layer(x)
    (kl,) = layer.losses
    closed = np.sum(-np.log(stddev) + (stddev**2 + mean**2) / 2 - 0.5)
    np.testing.assert_allclose(kl, closed, rtol=1e-4)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x)) + tf.add_n(layer.losses)
    grads = tape.gradient(loss, layer.trainable_weights)
    assert len(grads) == 2 and all(g is not None for g in grads)
    rng = np.random.RandomState(0)
    features = rng.randn(256, 3).astype("float32")
    targets = features @ np.array([[1.0], [-2.0], [0.5]], "float32")
    model = keras.Sequential(
        [
            keras.Input((3,)),
            BayesDense(1, kernel_initializer=blayers.initializers.get("trainable_normal")),
        ]
    )
    model.compile(keras.optimizers.Adam(0.05), "mse")
    model.fit(epochs_of(features, targets, 60, batch_size=64), verbose=0)
    learned = model.layers[0].kernel_initializer.parameters()["mean"].numpy().ravel()
    np.testing.assert_allclose(learned, [1.0, -2.0, 0.5], atol=0.15)
    plain = BayesDense(2)
    plain(x)
    assert isinstance(plain.kernel, keras.Variable)


def test_mean_field_logits_reads_variances_or_a_covariance():
    from blayers.layers.gp.sngp import mean_field_logits

    logits = np.random.RandomState(0).randn(3, 4).astype("float32")
    variances = np.array([0.5, 1.0, 2.0], "float32")
    expected = logits / np.sqrt(1 + 0.7 * variances)[:, None]
    for given in (variances, variances[:, None], np.diag(variances)):
        np.testing.assert_allclose(mean_field_logits(logits, given, 0.7), expected, rtol=1e-6)
    np.testing.assert_allclose(
        mean_field_logits(logits, variances, 0.7, likelihood="poisson"),
        logits * np.exp(0.7 * variances / 2)[:, None],
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="likelihood"):
        mean_field_logits(logits, variances, likelihood="probit")
