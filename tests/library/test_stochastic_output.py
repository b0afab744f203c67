"""Stochastic output layers: shapes, distributions, use as model outputs with their log_prob as
the loss (also in fit), composability, and Discretize's bin probabilities."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from conftest import epochs_of

import blayers
from blayers.layers import stochastic_output as so
from blayers.objectives import NegativeLogLikelihood

tfd = tfp.distributions
RNG = np.random.RandomState(0)
X = RNG.randn(8, 6).astype("float32")


@pytest.mark.parametrize(
    "layer,shape,family",
    [
        (so.Normal(), (8, 6), tfd.Normal),
        (so.Normal(3), (8, 3), tfd.Normal),
        (so.Bernoulli(), (8, 6), tfd.Bernoulli),
        (so.Poisson(2), (8, 2), tfd.Poisson),
        (so.Categorical(), (8,), tfd.Categorical),
        (so.Categorical(4), (8,), tfd.Categorical),
        (so.MixtureLogistic(num_components=2), (8,), tfd.MixtureSameFamily),
        (so.MixtureNormal(3, num_components=2), (8, 3), tfd.MixtureSameFamily),
    ],
)
def test_output_random_variables(layer, shape, family):
    rv = layer(X)
    assert isinstance(rv, blayers.RandomVariable) and isinstance(rv.distribution, family)
    assert rv.shape == shape and layer.compute_output_shape(X.shape) == shape
    assert np.all(np.isfinite(rv.distribution.mean().numpy()))
    assert np.all(np.isfinite(rv.distribution.log_prob(rv.value).numpy()))


def test_normal_without_units_is_input_mean_with_learned_scale():
    rv = so.Normal()(X)
    np.testing.assert_allclose(rv.distribution.mean().numpy(), X)
    np.testing.assert_allclose(rv.distribution.stddev().numpy(), np.log(2) + 1e-5, rtol=1e-5)


def test_categorical_and_normal_outputs_train_with_log_prob_loss(tmp_path):
    y_class = (X[:, 0] > 0).astype("int32")
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), so.Categorical(2)]
    )
    model.compile(keras.optimizers.Adam(0.05), loss=NegativeLogLikelihood())
    # 30 epochs of the 8 examples as one Keras epoch (`epochs_of`); the NLL is deterministic.
    start = model.evaluate(X, y_class, verbose=0)
    model.fit(epochs_of(X, y_class, 30), verbose=0)
    assert model.evaluate(X, y_class, verbose=0) < 0.5 * start
    regression = keras.Sequential([keras.Input((6,)), so.Normal(1)])
    regression.compile(keras.optimizers.Adam(0.05), loss=NegativeLogLikelihood())
    y = X[:, :1] * 2.0
    start = regression.evaluate(X, y, verbose=0)
    regression.fit(epochs_of(X, y, 30), verbose=0)
    assert regression.evaluate(X, y, verbose=0) < start
    out = regression(X)
    assert np.isfinite(float(tf.reduce_mean(out.distribution.entropy())))
    regression.save(tmp_path / "normal.keras")
    loaded = keras.models.load_model(tmp_path / "normal.keras")
    np.testing.assert_allclose(
        loaded(X).distribution.mean().numpy(), out.distribution.mean().numpy(), rtol=1e-6
    )


def test_stochastic_output_feeds_the_next_layer():
    model = keras.Sequential(
        [keras.Input((6,)), so.Normal(4), keras.layers.Dense(2), so.Bernoulli()]
    )
    rv = model(X)
    assert rv.shape == (8, 2) and isinstance(rv.distribution, tfd.Bernoulli)


def test_discretize_integrates_unit_bins_with_tail_edges():
    continuous = so.MixtureLogistic(num_components=2)(X[:, :6] * 3.0 + 5.0)
    discrete = so.Discretize(low=0, high=10)(continuous)
    values = tf.range(11.0)[:, None]
    probs = tf.exp(discrete.distribution.log_prob(values)).numpy()
    np.testing.assert_allclose(probs.sum(0), 1.0, rtol=1e-5)
    cdf = continuous.distribution.cdf
    expected_mid = (cdf(3.5) - cdf(2.5)).numpy()
    np.testing.assert_allclose(probs[3], expected_mid, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(probs[0], cdf(0.5).numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(probs[10], 1.0 - cdf(9.5).numpy(), rtol=1e-4, atol=1e-7)
    far = so.Discretize(0, 255)(blayers.Normal(loc=tf.fill([3], 2000.0), scale=1.0))
    assert np.all(np.isfinite(far.distribution.log_prob(tf.fill([3], 255.0)).numpy()))
    with pytest.raises(TypeError, match="RandomVariable"):
        so.Discretize()(X)


def test_vae_elbo_iwae_bounds_and_local_kl():
    from blayers.lab.models import vae
    from blayers.objectives import split_losses

    model = vae((8, 8, 1), 64, latent_dim=4, filters=(8,), hidden_units=32)
    x = (RNG.rand(16, 8, 8, 1) > 0.6).astype("float32")
    out = model(x)
    assert out.shape == (16, 64)
    local, global_ = split_losses(model)
    assert float(local) > 0 and float(global_) == 0.0  # the latent KL is a local loss
    tf.random.set_seed(0)
    elbo = model.elbo(x, k=2000).numpy()
    iwae_small = model.importance_weighted_log_likelihood(x, k=2).numpy()
    iwae_large = model.importance_weighted_log_likelihood(x, k=2000).numpy()
    # E[IWAE_k] increases with k and IWAE_1 = ELBO (Burda et al., 2016).
    assert np.all(iwae_large >= elbo - 1e-3)
    assert np.mean(iwae_large) >= np.mean(iwae_small) - 0.05
    # ELBO by hand: E_q[log p(x|z)] - KL, with the analytic KL the layer adds.
    q = model.encoder(x).distribution
    z = q.sample(2000)
    rec = tf.reduce_sum(
        model.decoder(tf.reshape(z, [-1, 4])).distribution.log_prob(
            tf.tile(tf.reshape(x, [1, 16, 64]), [2000, 1, 1])[None][0].numpy().reshape(-1, 64)
        ),
        -1,
    )
    kl = tf.reduce_sum(tfd.kl_divergence(q, tfd.Normal(0.0, 1.0)), -1)
    by_hand = tf.reduce_mean(tf.reshape(rec, [2000, 16]), 0) - kl
    np.testing.assert_allclose(elbo, by_hand.numpy(), atol=0.5)  # two MC estimates, ~5 SE


def test_discretized_logistic_mixture_is_finite_in_both_tails():
    """Locations 100 and 120: every pixel value 0..255 has a finite log-probability (the upper
    tail was nan), and the probabilities sum to one."""
    params = np.zeros((1, 6), np.float32)
    params[0, 2:4] = [100.0, 120.0]  # locations
    params[0, 4:6] = [2.0, 3.0]  # raw scales
    pixels = so.Discretize()(so.MixtureLogistic(num_components=2)(params))
    values = np.arange(256, dtype=np.float32)[:, None]
    log_prob = pixels.distribution.log_prob(values).numpy()
    assert np.all(np.isfinite(log_prob))
    assert np.exp(log_prob).sum() == pytest.approx(1.0, abs=1e-5)
    with tf.GradientTape() as tape:
        raw = tf.Variable(params)
        mixture = so.MixtureLogistic(num_components=2)(raw)
        loss = -tf.reduce_sum(so.Discretize()(mixture).log_prob(values))
    assert np.all(np.isfinite(tape.gradient(loss, raw).numpy()))


def test_mixture_logistic_takes_the_papers_signature():
    """Figure 6: `MixtureLogistic(3, num_components=5)` then `Discretize`."""
    layer = so.MixtureLogistic(3, num_components=5)
    pixels = so.Discretize()(layer(np.random.randn(2, 16).astype("float32")))
    assert pixels.shape == (2, 3)
    assert layer.projection.units == 3 * 5 * 3
    assert pixels.log_prob(np.full((2, 3), 128.0, np.float32)).shape == (2, 3)


# -- label shapes and scales ---------------------------------------------------------------------


def _linear_gaussian(n=2000, noise=0.1, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 1).astype("float32")
    y = (0.5 * x[:, 0] + 1.0 + noise * rng.randn(n)).astype("float32")
    return x, y  # labels of shape (N,), as TFP's regression tutorial has them


@pytest.mark.parametrize("port", ["layer", "lambda"])
def test_labels_of_shape_n_give_one_log_density_per_example(port):
    """`rv.log_prob(y)` with `y` of shape `(N,)` for an output of shape `(N, 1)` is `(N, 1)`, not
    the `(N, N)` matrix TFP's broadcasting gives; a `blayers.Normal` built in a `Lambda` (the
    port of `DistributionLambda`) likewise; a length that cannot be the batch is refused."""
    x, y = _linear_gaussian(50)
    projected = keras.layers.Dense(2)(x)
    if port == "layer":
        rv = so.Normal(1)(x)
    else:
        rv = keras.layers.Lambda(
            lambda t: blayers.Normal(loc=t[..., :1], scale=1e-3 + tf.nn.softplus(t[..., 1:]))
        )(projected)
    expected = rv.distribution.log_prob(y[:, None]).numpy()
    np.testing.assert_array_equal(rv.log_prob(y).numpy(), expected)
    assert rv.log_prob(y).shape == (50, 1) and rv.cdf(y).shape == (50, 1)
    assert rv.log_prob(np.stack([y, y])[..., None]).shape == (2, 50, 1)  # sample axes still pass
    with pytest.raises(ValueError, match=r"shape \[7\].*shape \[50, 1\]"):
        rv.log_prob(y[:7])
    assert blayers.Normal(0.0, 1.0).log_prob(np.zeros(5, "float32")).shape == (5,)


def test_fit_with_labels_of_shape_n_recovers_the_noise():
    """TFP's regression tutorial as written (labels `(N,)`): the learned scale is the data's 0.1,
    not the inflated value an `(N, N)` log-likelihood gives."""
    x, y = _linear_gaussian()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,)), so.Normal(1)])
    # an epoch's batches in one call: the same steps, fewer calls (150 epochs)
    model.compile(keras.optimizers.Adam(0.05), NegativeLogLikelihood(), steps_per_execution=10)
    model.fit(epochs_of(x, y, 150, batch_size=200), verbose=0)
    scale = model(x).distribution.scale.numpy()
    assert abs(np.mean(scale) - 0.1) < 0.01
    nll = -np.mean(model(x).log_prob(y).numpy())
    assert nll == pytest.approx(np.log(0.1) + 0.5 * np.log(2 * np.pi * np.e), abs=0.05)
    with pytest.raises(ValueError, match="does not fit"):
        blayers.objectives.training_log_prob(model(x).distribution, y[:30])


def test_scale_floor_and_multiplier():
    """`scale = scale_floor + softplus(scale_multiplier * raw)`, saved in the config; the floor
    bounds the density."""
    raw = np.array([[0.0, -1e4], [2.0, 3.0]], "float32")
    layer = so.Normal(scale_floor=1e-3, scale_multiplier=0.05)
    rv = layer(raw)
    expected = 1e-3 + np.log1p(np.exp(0.05 * layer.raw_scale.numpy()))
    np.testing.assert_allclose(rv.distribution.scale.numpy(), np.broadcast_to(expected, (2, 2)))
    projected = so.Normal(1, scale_floor=1e-3, scale_multiplier=0.05)
    out = so.Normal(1, scale_floor=1e-3)(raw)
    assert out.distribution.scale.numpy().min() >= 1e-3
    mixture = so.MixtureNormal(1, num_components=2, scale_floor=0.5)(raw)
    assert mixture.distribution.components_distribution.scale.numpy().min() >= 0.5
    config = so.MixtureLogistic(2, num_components=3, scale_multiplier=0.1).get_config()
    assert config["scale_multiplier"] == 0.1 and config["scale_floor"] == 1e-5
    assert so.Normal.from_config(projected.get_config()).scale_multiplier == 0.05
    with pytest.raises(ValueError, match="scale_floor must be a positive number"):
        so.Normal(1, scale_floor=0)


def test_convert_to_tensor_fn_picks_what_keras_metrics_see():
    """`convert_to_tensor_fn='mean'` hands Keras' metrics the predictive mean (as `tfp.layers`'
    argument does): `RootMeanSquaredError` equals the RMSE of the mean, whereas the default
    (a draw) adds the noise's variance. The loss reads the distribution either way."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 1)).astype("float32")
    y = (2.0 * x).astype("float32")

    def model(conversion):
        keras.utils.set_random_seed(0)
        m = keras.Sequential(
            [
                keras.Input((1,)),
                keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(2.0)),
                blayers.layers.Normal(convert_to_tensor_fn=conversion),
            ]
        )
        m.compile(
            loss=lambda y_true, rv: -rv.distribution.log_prob(y_true),
            metrics=[keras.metrics.RootMeanSquaredError()],
        )
        return m

    scale = float(tf.nn.softplus(0.0)) + 1e-5  # the layer's initial scale
    mean_rmse = model("mean").evaluate(x, y, verbose=0, return_dict=True)
    sample_rmse = model("sample").evaluate(x, y, verbose=0, return_dict=True)
    assert mean_rmse["root_mean_squared_error"] == pytest.approx(0.0, abs=1e-5)
    # A draw's RMSE is the scale: sqrt(mean eps^2) over 2,000 draws, within 5 standard errors.
    se = scale * math.sqrt(2.0 / 2000) / 2
    assert abs(sample_rmse["root_mean_squared_error"] - scale) < 5 * se
    assert mean_rmse["loss"] == pytest.approx(sample_rmse["loss"], rel=1e-5)

    categorical = blayers.layers.Categorical(convert_to_tensor_fn="mode")
    logits = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]], "float32")
    np.testing.assert_array_equal(categorical(logits), [1, 0])
    with pytest.raises(ValueError, match="no analytic mode"):
        blayers.layers.MixtureNormal(1, num_components=2, convert_to_tensor_fn="mode")(X)
    with pytest.raises(ValueError, match="convert_to_tensor_fn must be one of"):
        blayers.layers.Normal(convert_to_tensor_fn="median")
    config = blayers.layers.Normal(convert_to_tensor_fn="mean").get_config()
    assert blayers.layers.Normal.from_config(config).convert_to_tensor_fn == "mean"


@keras.saving.register_keras_serializable("blayers_tests")
def tutorial_normal(t):
    """TFP's regression tutorial's output: `N(t_0, 1e-3 + softplus(0.05 t_1))`."""
    return tfd.Normal(loc=t[..., :1], scale=1e-3 + tf.math.softplus(0.05 * t[..., 1:]))


def test_distribution_lambda_learns_the_noise_and_saves(tmp_path):
    """Heteroscedastic regression through any distribution-making function: the learned scale
    is the data's noise (0.3, within 10%), the mean the line, and the model saves."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(2000, 1)).astype("float32")
    y = (2.0 * x + 0.3 * rng.normal(size=x.shape)).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((1,))
    outputs = blayers.layers.DistributionLambda(tutorial_normal, convert_to_tensor_fn="mean")(
        keras.layers.Dense(2)(inputs)
    )
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.Adam(0.05),
        loss=blayers.objectives.NegativeLogLikelihood(),  # saved by name, not as a lambda
        steps_per_execution=10,  # an epoch's batches in one call: the same steps, fewer calls
    )
    model.fit(epochs_of(x, y, 150, batch_size=200), verbose=0)
    rv = model(x[:5])
    np.testing.assert_allclose(rv.distribution.stddev().numpy(), 0.3, rtol=0.1)
    np.testing.assert_allclose(np.asarray(rv), 2.0 * x[:5], atol=0.05)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)  # safe mode: nothing in the file is a lambda
    np.testing.assert_allclose(np.asarray(loaded(x[:5])), np.asarray(rv), rtol=1e-6)
    with pytest.raises(TypeError, match="not a tfp.distributions.Distribution"):
        blayers.layers.DistributionLambda(lambda t: t)(x[:2])
