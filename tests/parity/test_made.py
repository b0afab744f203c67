"""edward2's `edward2/tensorflow/layers/made_test.py`, translated: blayers' `MADE` reads
`[length, channels]` inputs, edward2's layout, with `event_ndims=2` (README)."""

import numpy as np
import tensorflow as tf

from blayers import layers as ed_layers


def _count(network):
    return sum(int(np.prod(weight.shape)) for weight in network.weights)


def test_made_left_to_right():
    np.random.seed(83243)
    batch_size, length, channels, units = 2, 3, 1, 5
    network = ed_layers.MADE(units, [4], activation=tf.nn.relu, event_ndims=2)
    outputs = network(tf.zeros([batch_size, length, channels]))
    assert len(network.weights) == 4
    assert _count(network) == (3 * 1 * 4 + 4) + (4 * 3 * 5 + 3 * 5)
    np.testing.assert_array_equal(outputs[:, 0, :], np.zeros((batch_size, units)))
    assert outputs.shape == (batch_size, length, units)


def test_made_right_to_left():
    np.random.seed(1328)
    batch_size, length, channels, units = 2, 3, 5, 1
    network = ed_layers.MADE(
        units,
        [4, 3],
        input_order="right-to-left",
        activation=tf.nn.relu,
        use_bias=False,
        event_ndims=2,
    )
    outputs = network(tf.zeros([batch_size, length, channels]))
    assert len(network.weights) == 3
    assert _count(network) == 3 * 5 * 4 + 4 * 3 + 3 * 3 * 1
    np.testing.assert_array_equal(outputs[:, -1, :], np.zeros((batch_size, units)))
    assert outputs.shape == (batch_size, length, units)


def test_made_no_hidden():
    np.random.seed(532)
    batch_size, length, channels, units = 2, 3, 5, 4
    network = ed_layers.MADE(units, [], input_order="left-to-right", event_ndims=2)
    outputs = network(tf.zeros([batch_size, length, channels]))
    assert len(network.weights) == 2
    assert _count(network) == 3 * 5 * 3 * 4 + 3 * 4
    np.testing.assert_array_equal(outputs[:, 0, :], np.zeros((batch_size, units)))
    assert outputs.shape == (batch_size, length, units)
