"""edward2's `edward2/tensorflow/losses_test.py`, translated (`ed.losses` is
`blayers.losses`)."""

import numpy as np
import pytest
import tensorflow as tf

import blayers as ed

CASES = [
    (sparse, num_classes, entropy_reg)
    for sparse in (True, False)
    for num_classes in (2, 6)
    for entropy_reg in (1e-5, 1e-2)
]


def _generate_data(sparse, num_classes):
    labels = np.random.randint(low=0, high=num_classes, size=(16,))
    if not sparse:
        labels = np.eye(num_classes)[labels]
    alphas = np.random.random(size=(16, num_classes))
    return (
        tf.convert_to_tensor(alphas, dtype=tf.float32),
        tf.convert_to_tensor(labels, dtype=tf.float32),
    )


@pytest.mark.parametrize(
    "sparse, num_classes, entropy_reg", CASES, ids=[f"_uce_loss_{s}_{c}_{e}" for s, c, e in CASES]
)
def test_uce_loss(sparse, num_classes, entropy_reg):
    alphas, labels = _generate_data(sparse, num_classes)
    loss_fn = ed.losses.uce_loss(entropy_reg=entropy_reg, sparse=sparse, num_classes=num_classes)
    loss_value = loss_fn(labels, alphas)
    assert loss_value is not None


def test_uce_value():
    labels = np.random.randint(low=0, high=5, size=(16,))
    alphas = np.eye(5)[labels].astype(np.float32) + 1.0
    loss_fn = ed.losses.uce_loss(sparse=True, entropy_reg=1e-6, num_classes=5)
    loss_value = loss_fn(labels, alphas)
    np.testing.assert_allclose(loss_value, 1.2833369, rtol=1e-3, atol=1e-3)
