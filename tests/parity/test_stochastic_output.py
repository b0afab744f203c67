"""edward2's `edward2/tensorflow/layers/stochastic_output_test.py`, translated."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import layers as ed_layers


@pytest.mark.xfail(
    strict=True,
    reason="blayers' MixtureLogistic takes Keras' units first (MixtureLogistic(units, "
    "num_components)); edward2's first argument is num_components, with a scalar output per "
    "example (docs/edward2.md)",
)
def test_mixture_logistic():
    batch_size = 3
    features = np.random.rand(batch_size, 4).astype(np.float32)
    labels = np.random.rand(batch_size).astype(np.float32)
    model = keras.Sequential([keras.layers.Dense(2, activation=None), ed_layers.MixtureLogistic(5)])
    outputs = model(features)
    log_likelihood = tf.reduce_sum(outputs.distribution.log_prob(labels))
    assert log_likelihood.shape == ()
    assert float(log_likelihood) <= 0.0
    assert outputs.shape == (batch_size,)
