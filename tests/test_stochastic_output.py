"""Stochastic output layers: shapes, distributions, use as model outputs with their log_prob as
the loss (also in fit), composability, and Discretize's bin probabilities."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

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
    history = model.fit(X, y_class, epochs=30, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    regression = keras.Sequential([keras.Input((6,)), so.Normal(1)])
    regression.compile(keras.optimizers.Adam(0.05), loss=NegativeLogLikelihood())
    y = X[:, :1] * 2.0
    history = regression.fit(X, y, epochs=30, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
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
    from blayers.models import vae
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
