"""edward2's `edward2/tensorflow/transformed_random_variable_test.py`, translated: an edward2
reversible callable (any Keras layer with `reverse` and `log_det_jacobian`, the latter in
edward2's convention) is accepted besides blayers' `ReversibleLayer`s."""

import keras
import numpy as np
import tensorflow as tf

import blayers as ed


def test_transformed_random_variable():
    class Exp(keras.layers.Layer):
        """Exponential activation function for reversible networks."""

        def __call__(self, inputs, *args, **kwargs):
            if not isinstance(inputs, ed.RandomVariable):
                return super().__call__(inputs, *args, **kwargs)
            return ed.TransformedRandomVariable(inputs, self)

        def call(self, inputs):
            return tf.exp(inputs)

        def reverse(self, inputs):
            return tf.math.log(inputs)

        def log_det_jacobian(self, inputs):
            return -tf.math.log(inputs)

    x = ed.Normal(0.0, 1.0)
    y = Exp()(x)
    y_sample = y.distribution.sample()
    y_log_prob = y.distribution.log_prob(y_sample)
    assert float(y_sample) > 0.0
    assert np.isfinite(y_log_prob)
