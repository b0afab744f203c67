"""edward2's `edward2/tensorflow/layers/discrete_flows_test.py`, translated. `MADE` reads
edward2's `[length, vocab]` events with `event_ndims=2` (README); a flow's random variable has
TFP's `TransformedDistribution`, whose base is `.distribution` (edward2's own class calls it
`.base`)."""

import numpy as np
import pytest
import tensorflow as tf

import blayers as ed
from blayers import layers as ed_layers

LOC_ONLY = pytest.mark.parametrize("loc_only", [False, True])


def _network(loc_only, vocab_size, hidden_dims=()):
    """edward2's network: MADE, and for loc and scale a mask that rules out scale 0."""
    if loc_only:
        network = ed_layers.MADE(vocab_size, list(hidden_dims), event_ndims=2)
        return network, network
    mask = tf.reshape(
        [0.0] * vocab_size + [-1e10] + [0.0] * (vocab_size - 1), [1, 1, 2 * vocab_size]
    )
    network_ = ed_layers.MADE(2 * vocab_size, list(hidden_dims), event_ndims=2)
    return (lambda inputs, **kwargs: mask + network_(inputs, **kwargs)), network_


@LOC_ONLY
def test_discrete_autoregressive_flow_call(loc_only):
    batch_size, vocab_size, length = 3, 79, 5
    network, _ = _network(loc_only, vocab_size)
    inputs = np.random.randint(0, vocab_size - 1, size=(batch_size, length))
    inputs = tf.one_hot(inputs, depth=vocab_size, dtype=tf.float32)
    layer = ed_layers.DiscreteAutoregressiveFlow(network, 1.0)
    outputs = layer(inputs)
    assert outputs.shape == (batch_size, length, vocab_size)
    assert np.all(np.asarray(outputs) >= 0)
    assert np.all(np.asarray(outputs) <= vocab_size - 1)


@LOC_ONLY
def test_discrete_autoregressive_flow_sample(loc_only):
    batch_size, length, vocab_size = 5, 2, 2
    network, _ = _network(loc_only, vocab_size)
    layer = ed_layers.DiscreteAutoregressiveFlow(network, 1.0)
    logits = tf.tile(tf.random.normal([length, vocab_size])[tf.newaxis], [batch_size, 1, 1])
    base = ed.OneHotCategorical(logits=logits, dtype=tf.float32)
    outputs = layer(base)
    assert outputs.shape == (batch_size, length, vocab_size)
    assert np.all(tf.convert_to_tensor(outputs).numpy() >= 0)
    assert np.all(tf.convert_to_tensor(outputs).numpy() <= vocab_size - 1)


@LOC_ONLY
def test_discrete_autoregressive_flow_inverse(loc_only):
    batch_size, vocab_size, length = 2, 79, 5
    network, _ = _network(loc_only, vocab_size)
    inputs = np.random.randint(0, vocab_size - 1, size=(batch_size, length))
    inputs = tf.one_hot(inputs, depth=vocab_size, dtype=tf.float32)
    layer = ed_layers.DiscreteAutoregressiveFlow(network, 1.0)
    rev_fwd_inputs = layer.reverse(layer(inputs))
    fwd_rev_inputs = layer(layer.reverse(inputs))
    np.testing.assert_allclose(inputs, rev_fwd_inputs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(inputs, fwd_rev_inputs, rtol=1e-4, atol=1e-4)


@LOC_ONLY
def test_discrete_autoregressive_flow_random_variable(loc_only):
    batch_size, length, vocab_size = 2, 4, 5
    network, _ = _network(loc_only, vocab_size)
    base = ed.OneHotCategorical(
        logits=tf.random.normal([batch_size, length, vocab_size]), dtype=tf.float32
    )
    flow = ed_layers.DiscreteAutoregressiveFlow(network, 1.0)
    flow_rv = flow(base)
    assert flow_rv.dtype == tf.float32
    assert flow_rv.shape == (batch_size, length, vocab_size)
    assert np.all(tf.convert_to_tensor(flow_rv).numpy() >= 0)
    assert np.all(tf.convert_to_tensor(flow_rv).numpy() <= vocab_size - 1)

    inputs = np.random.randint(0, vocab_size - 1, size=(batch_size, length))
    inputs = tf.one_hot(inputs, depth=vocab_size, dtype=tf.float32)
    outputs = flow(inputs)
    rev_outputs = flow.reverse(outputs)
    np.testing.assert_allclose(inputs, rev_outputs, rtol=1e-6, atol=1e-6)

    inputs_log_prob = base.distribution.log_prob(inputs)
    outputs_log_prob = flow_rv.distribution.log_prob(outputs)
    assert inputs_log_prob.shape == (batch_size, length)
    np.testing.assert_allclose(inputs_log_prob, outputs_log_prob, rtol=1e-6, atol=1e-6)


@LOC_ONLY
def test_discrete_autoregressive_flow_reverse_gradients(loc_only):
    batch_size, length, vocab_size = 2, 4, 2
    network, network_ = _network(loc_only, vocab_size, hidden_dims=(16, 16))
    with tf.GradientTape() as tape:
        base = ed.OneHotCategorical(logits=tf.random.normal([batch_size, length, vocab_size]))
        flow = ed_layers.DiscreteAutoregressiveFlow(network, 1.0)
        flow_rv = flow(base)
        features = np.random.randint(0, vocab_size - 1, size=(batch_size, length))
        features = tf.one_hot(features, depth=vocab_size, dtype=tf.float32)
        loss = tf.reduce_sum(
            tf.nn.softmax_cross_entropy_with_logits(
                labels=flow.reverse(features), logits=flow_rv.distribution.distribution.logits
            )
        )
    grads = tape.gradient(loss, network_.trainable_weights)
    for grad in grads:
        assert grad is not None


def test_discrete_bipartite_flow_call():
    batch_size, vocab_size, length = 3, 79, 5
    inputs = np.random.randint(0, vocab_size - 1, size=(batch_size, length))
    inputs = tf.one_hot(inputs, depth=vocab_size, dtype=tf.float32)
    layer = ed_layers.DiscreteBipartiteFlow(
        lambda inputs, **kwargs: tf.identity(inputs),
        mask=tf.random.uniform([length], minval=0, maxval=2, dtype=tf.int32),
        temperature=1.0,
    )
    outputs = layer(inputs)
    assert outputs.shape == (batch_size, length, vocab_size)
    assert np.all(np.asarray(outputs) >= 0)
    assert np.all(np.asarray(outputs) <= vocab_size - 1)


def test_discrete_bipartite_flow_inverse():
    batch_size, vocab_size, length = 2, 79, 5
    inputs = np.random.randint(0, vocab_size - 1, size=(batch_size, length))
    inputs = tf.one_hot(inputs, depth=vocab_size, dtype=tf.float32)
    layer = ed_layers.DiscreteBipartiteFlow(
        lambda inputs, **kwargs: tf.identity(inputs),
        mask=tf.random.uniform([length], minval=0, maxval=2, dtype=tf.int32),
        temperature=1.0,
    )
    rev_fwd_inputs = layer.reverse(layer(inputs))
    fwd_rev_inputs = layer(layer.reverse(inputs))
    np.testing.assert_allclose(inputs, rev_fwd_inputs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(inputs, fwd_rev_inputs, rtol=1e-6, atol=1e-6)


def test_sinkhorn_autoregressive_flow_call():
    batch_size, vocab_size, length = 3, 79, 5
    units = vocab_size**2
    inputs = np.random.randint(0, vocab_size - 1, size=(batch_size, length))
    inputs = tf.one_hot(inputs, depth=vocab_size, dtype=tf.float32)
    layer = ed_layers.SinkhornAutoregressiveFlow(ed_layers.MADE(units, [], event_ndims=2), 1.0)
    outputs = layer(inputs)
    assert outputs.shape == (batch_size, length, vocab_size)
    assert np.all(np.asarray(outputs) >= 0)
    assert np.all(np.asarray(outputs) <= vocab_size - 1)


def test_discrete_sinkhorn_flow_inverse():
    batch_size, vocab_size, length = 2, 79, 5
    units = vocab_size**2
    inputs = np.random.randint(0, vocab_size - 1, size=(batch_size, length))
    inputs = tf.one_hot(inputs, depth=vocab_size, dtype=tf.float32)
    layer = ed_layers.SinkhornAutoregressiveFlow(ed_layers.MADE(units, [], event_ndims=2), 1.0)
    rev_fwd_inputs = layer.reverse(layer(inputs))
    fwd_rev_inputs = layer(layer.reverse(inputs))
    np.testing.assert_array_equal(inputs, rev_fwd_inputs)
    np.testing.assert_array_equal(inputs, fwd_rev_inputs)
