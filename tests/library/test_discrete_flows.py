"""Discrete flows and MADE's channels: modular one-hot arithmetic against integers, bijectivity,
and the transformed pmf (normalized, `p(y) = p_base(reverse(y))`)."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers.layers import MADE, DiscreteAutoregressiveFlow, DiscreteBipartiteFlow
from blayers.layers.discrete_flows import (
    hard_permutation,
    multiplicative_inverse,
    one_hot_add,
    one_hot_argmax,
    one_hot_minus,
    one_hot_multiply,
)

K = 5


def _one_hot(values, depth=K):
    return tf.one_hot(values, depth)


def test_one_hot_arithmetic_matches_the_integers():
    a, b = np.meshgrid(np.arange(K), np.arange(K))
    a, b = a.ravel(), b.ravel()
    x, y = _one_hot(a), _one_hot(b)
    np.testing.assert_array_equal(tf.argmax(one_hot_add(x, y), -1), (a + b) % K)
    np.testing.assert_array_equal(tf.argmax(one_hot_minus(x, y), -1), (a - b) % K)
    np.testing.assert_array_equal(tf.argmax(one_hot_multiply(x, y), -1), (a * b) % K)
    units = np.arange(1, K)
    inverse = tf.argmax(multiplicative_inverse(_one_hot(units)), -1).numpy()
    np.testing.assert_array_equal((units * inverse) % K, 1)
    soft = tf.constant([[0.25, 0.75, 0, 0, 0]])  # a weighted shift: 0 w.p. 1/4, 1 w.p. 3/4
    np.testing.assert_allclose(one_hot_add(_one_hot([[2]])[0], soft), [[0, 0, 0.25, 0.75, 0]])


def test_straight_through_argmax_gradient_is_the_softmax():
    logits = tf.constant([[1.0, 2.0, 0.5]])
    with tf.GradientTape() as tape:
        tape.watch(logits)
        out = one_hot_argmax(logits, temperature=0.5)
        loss = tf.reduce_sum(out * [1.0, 0.0, 2.0])
    np.testing.assert_array_equal(out, [[0, 1, 0]])
    gradient = tape.gradient(loss, logits)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        soft = tf.reduce_sum(tf.nn.softmax(logits / 0.5) * [1.0, 0.0, 2.0])
    np.testing.assert_allclose(gradient, tape.gradient(soft, logits), rtol=1e-6)


def _flows(length):
    auto = DiscreteAutoregressiveFlow(MADE([16], params=2 * K, event_ndims=2, seed=0))
    bipartite = DiscreteBipartiteFlow(keras.layers.Dense(2 * K), mask=[1, 0] * (length // 2))
    sinkhorn = blayers.layers.SinkhornAutoregressiveFlow(
        MADE([16], params=K * K, event_ndims=2, seed=0), temperature=0.5
    )
    return [auto, bipartite, sinkhorn]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_flows_are_bijections_and_preserve_the_pmf(index):
    length = 4
    flow = _flows(length)[index]
    everything = np.array(list(itertools.product(range(K), repeat=length)))  # 625 sequences
    x = _one_hot(everything)
    flow(x)
    for w in flow.layer.weights:
        w.assign(3.0 * tf.random.stateless_normal(w.shape, [1, 2]))
    y = flow(x)
    np.testing.assert_array_equal(flow.reverse(y), x)
    codes = tf.argmax(y, -1).numpy() @ (K ** np.arange(length))
    assert len(set(codes.tolist())) == len(everything)  # a permutation of all sequences
    base = blayers.OneHotCategorical(
        logits=tf.random.stateless_normal([length, K], [3, 4]), dtype=tf.float32
    )
    transformed = flow(base)
    log_p = tf.reduce_sum(transformed.distribution.log_prob(y), -1)
    np.testing.assert_allclose(tf.reduce_sum(tf.exp(log_p)), 1.0, rtol=1e-5)
    expected = tf.reduce_sum(base.distribution.log_prob(x), -1)
    np.testing.assert_allclose(log_p, expected, rtol=1e-5, atol=1e-6)


def test_location_only_flow_and_bad_network():
    flow = DiscreteBipartiteFlow(keras.layers.Dense(K), mask=[1, 0, 1])
    x = _one_hot(np.array([[1, 2, 3]]))
    np.testing.assert_array_equal(flow.reverse(flow(x)), x)
    bad = DiscreteBipartiteFlow(keras.layers.Dense(3), mask=[1, 0, 1])
    with pytest.raises(ValueError, match="vocab_size"):
        bad(x)


def test_a_function_as_the_network_as_edward2_writes_it():
    """edward2's `layer=lambda inputs, **kwargs: ...` form: a shift by one (`mu = e_1` at every
    position, location only) for both flows, and a shift by each position's predecessor."""
    x = _one_hot(np.array([[1, 2, 4, 0], [3, 3, 0, 2]]))
    shift = np.zeros(K, "float32")
    shift[1] = 1.0
    bipartite = DiscreteBipartiteFlow(
        lambda inputs, **kwargs: 10.0 * tf.ones_like(inputs) * shift, mask=[1, 0, 1, 0]
    )
    y = bipartite(x).numpy().argmax(-1)  # forward (sampling) is x - mu; reverse adds mu
    np.testing.assert_array_equal(y, [[1, 1, 4, 4], [3, 2, 0, 1]])
    np.testing.assert_array_equal(bipartite.reverse(bipartite(x)), x)

    def previous(inputs, **kwargs):  # causal: position t sees position t - 1 only
        return 10.0 * tf.pad(inputs[..., :-1, :], [[0, 0], [1, 0], [0, 0]])

    auto = DiscreteAutoregressiveFlow(previous)
    np.testing.assert_array_equal(auto.reverse(auto(x)), x)
    np.testing.assert_array_equal(auto(auto.reverse(x)), x)
    with pytest.raises(TypeError, match="a Keras layer or a function"):
        DiscreteAutoregressiveFlow("dense")


def test_sinkhorn_flow_inverts_both_ways_and_passes_gradients():
    """Beyond the bijection and pmf checks every flow gets: forward inverts reverse too, the map
    is not the identity, the network gets a (straight-through) gradient, and the hard
    permutations are permutation matrices."""
    length = 3
    flow = _flows(length)[2]
    x = _one_hot(np.array(list(itertools.product(range(K), repeat=length))))
    flow(x)
    for w in flow.layer.weights:
        w.assign(3.0 * tf.random.stateless_normal(w.shape, [5, 6]))
    y = flow(x)
    np.testing.assert_array_equal(flow(flow.reverse(x)), x)
    assert len(set(tf.argmax(y[:, 1], -1).numpy().tolist())) > 1  # not the identity map
    base_logits = tf.random.stateless_normal([length, K], [3, 4])
    with tf.GradientTape() as tape:  # the base log-likelihood of the soft one-hot reverse
        loss = -tf.reduce_sum(flow.reverse(y) * tf.nn.log_softmax(base_logits))
    grads = tape.gradient(loss, flow.layer.trainable_weights)
    assert any(g is not None and float(tf.reduce_max(tf.abs(g))) > 0 for g in grads)
    permutations = hard_permutation(tf.random.stateless_normal([7, K, K], [1, 1]))
    np.testing.assert_array_equal(tf.reduce_sum(permutations, -1), np.ones([7, K]))
    np.testing.assert_array_equal(tf.reduce_sum(permutations, -2), np.ones([7, K]))


def test_made_channels_are_autoregressive_over_positions():
    made = MADE([12], params=2, event_ndims=2, use_bias=False, seed=1)
    x = tf.random.stateless_normal([2, 5, 3], [0, 1])
    made(x)
    made.kernels[-1].assign(tf.random.stateless_normal(made.kernels[-1].shape, [2, 3]))
    assert all(b is None for b in made.biases)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = made(x)
    jacobian = tape.batch_jacobian(y, x).numpy()  # [2, 5, 2, 5, 3]
    dependence = np.abs(jacobian).sum(axis=(0, 2, 4)) > 0
    np.testing.assert_array_equal(dependence, np.tril(np.ones((5, 5), bool), -1))


def test_flow_round_trip(tmp_path):
    flow = _flows(4)[0]
    model = keras.Sequential([keras.Input((4, K)), flow])
    x = _one_hot(np.array([[0, 1, 2, 3], [4, 4, 0, 1]]))
    y = model(x)
    model.save(tmp_path / "flow.keras")
    np.testing.assert_array_equal(keras.models.load_model(tmp_path / "flow.keras")(x), y)
