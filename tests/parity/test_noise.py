"""edward2's `edward2/tensorflow/layers/noise_test.py` (noise contrastive priors), translated:
blayers' perturbation layers act in training only, so the calls pass `training=True` (edward2's
act always; README)."""

import numpy as np
import tensorflow as tf

import blayers
from blayers import layers as ed_layers


def test_ncp_normal_perturb():
    batch_size = 3
    inputs = tf.cast(np.random.rand(batch_size, 4), dtype=tf.float32)
    outputs = ed_layers.NCPNormalPerturb()(inputs, training=True)
    assert outputs.shape == (2 * batch_size, 4)
    np.testing.assert_array_equal(inputs, outputs[:batch_size])


def test_ncp_categorical_perturb():
    input_dim, batch_size = 5, 3
    inputs = tf.cast(np.random.choice(input_dim, size=(batch_size, 4)), dtype=tf.float32)
    outputs = ed_layers.NCPCategoricalPerturb(input_dim)(inputs, training=True)
    assert outputs.shape == (2 * batch_size, 4)
    np.testing.assert_array_equal(inputs, outputs[:batch_size])


def test_ncp_normal_output():
    """edward2 takes the labels as the constructor's `mean`; blayers per call (README)."""
    batch_size = 3
    features = blayers.Normal(loc=tf.random.normal([2 * batch_size, 1]), scale=1.0)
    labels = np.random.rand(batch_size).astype(np.float32)
    model = ed_layers.NCPNormalOutput()
    predictions = model(features, labels, training=True)
    assert len(model.losses) == 1
    np.testing.assert_array_equal(
        tf.convert_to_tensor(features)[:batch_size], tf.convert_to_tensor(predictions)
    )
