"""Neural processes: the attention rules against their formulas, the ELBO's KL between the
latent encoders in closed form, the predictive's shapes, and that a neural process learns a
family of functions from many small tasks."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers import layers as L
from blayers.layers import neural_process as np_lib


def test_attention_rules_are_their_formulas():
    rng = np.random.RandomState(0)
    q, k, v = rng.randn(2, 3, 4), rng.randn(2, 5, 4), rng.randn(2, 5, 6)
    np.testing.assert_allclose(
        np_lib.uniform_attention(q, v), np.repeat(v.mean(1, keepdims=True), 3, axis=1)
    )
    logits = -np.abs(k[:, None] - q[:, :, None]).sum(-1) / 0.5
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(np_lib.laplace_attention(q, k, v, 0.5), w @ v, rtol=1e-6)
    logits = np.einsum("bik,bjk->bij", q, k) / 2.0
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(np_lib.dot_product_attention(q, k, v), w @ v, rtol=1e-6)


def _tasks(rng, batch, n):
    amplitude = rng.uniform(0.5, 2.0, (batch, 1, 1))
    phase = rng.uniform(0, np.pi, (batch, 1, 1))
    x = rng.uniform(-3, 3, (batch, n, 1))
    return x.astype("float32"), (amplitude * np.sin(x + phase)).astype("float32")


@pytest.mark.parametrize("attention", ["uniform", "laplace", "dot_product", "multihead"])
def test_shapes_and_the_elbo_kl(attention):
    rng = np.random.RandomState(1)
    x, y = _tasks(rng, 4, 12)
    layer = L.NeuralProcess([16, 16], 8, [16, 2], attention_type=attention, num_heads=2, seed=0)
    rv = layer(((x[:, :5], y[:, :5]), x), target_y=y)
    assert rv.distribution.batch_shape == (4, 12) and rv.distribution.event_shape == (1,)
    assert rv.distribution.log_prob(y).shape == (4, 12)
    prior = layer.latent_distribution(x[:, :5], y[:, :5])
    posterior = layer.latent_distribution(x, y)
    np.testing.assert_allclose(
        float(layer.losses[0]), float(tf.reduce_mean(posterior.kl_divergence(prior))), rtol=1e-5
    )
    fresh = L.NeuralProcess([16, 16], 8, [16, 2], attention_type=attention, num_heads=2)
    fresh(((x[:, :5], y[:, :5]), x))  # prediction: no targets, no KL
    assert not fresh.losses


def test_a_neural_process_learns_a_family_of_functions(tmp_path):
    """Sine curves of random amplitude and phase: after training on many 10-point contexts,
    the predictive at held-out targets of new tasks beats the untrained model's."""
    blayers.set_seed(0)
    layer = L.NeuralProcess([32, 32], 16, [32, 32, 2], attention_type="dot_product", seed=0)
    optimizer = keras.optimizers.Adam(3e-3)
    rng = np.random.RandomState(2)
    test_x, test_y = _tasks(np.random.RandomState(3), 64, 20)

    def test_nll():
        rv = layer(((test_x[:, :10], test_y[:, :10]), test_x[:, 10:]))
        return -float(tf.reduce_mean(rv.distribution.log_prob(test_y[:, 10:])))

    before = test_nll()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            rv = layer(((x[:, :10], y[:, :10]), x), target_y=y)
            loss = -tf.reduce_mean(rv.distribution.log_prob(y)) + tf.add_n(layer.losses) / 20.0
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(grads, layer.trainable_variables))

    for _ in range(300):
        step(*_tasks(rng, 16, 20))
    assert test_nll() < before - 0.5
    config = layer.get_config()
    assert L.NeuralProcess.from_config(config).attention_type == "dot_product"
