"""edward2's `edward2/tensorflow/constraints_test.py`, translated (`ed.constraints` is
`blayers.constraints`; Keras 3's `NonNeg` is `keras.constraints.NonNeg`)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers


@pytest.mark.parametrize("name", ["exp", "positive", "softplus"])
def test_positive_constraint(name):
    weight = tf.random.normal((3,))
    constraint = blayers.constraints.get(name)
    constrained_weight = constraint(weight)
    assert np.all(np.asarray(constrained_weight) > 0.0)


def test_constraints_get():
    assert isinstance(blayers.constraints.get("positive"), blayers.constraints.Positive)
    assert isinstance(blayers.constraints.get("non_neg"), keras.constraints.NonNeg)
