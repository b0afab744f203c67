"""edward2's `edward2/tensorflow/layers/bayesian_linear_model_test.py`, translated."""

import numpy as np
import tensorflow as tf

from blayers import layers as ed_layers


def test_bayesian_linear_model():
    """The model makes reasonable predictions."""
    np.random.seed(42)
    train_batch_size, test_batch_size, num_features, noise_variance = 5, 2, 3, 0.01
    coeffs = tf.range(num_features, dtype=tf.float32)
    features = tf.cast(np.random.randn(train_batch_size, num_features), dtype=tf.float32)
    noise = tf.cast(np.random.randn(train_batch_size), dtype=tf.float32)
    labels = tf.tensordot(features, coeffs, [[-1], [0]]) + noise_variance * noise
    model = ed_layers.BayesianLinearModel(noise_variance=noise_variance)
    model.fit(features, labels)
    test_features = np.random.randn(test_batch_size, num_features).astype(np.float32)
    test_labels = tf.tensordot(test_features, coeffs, [[-1], [0]])
    outputs = model(test_features)
    test_predictions = outputs.distribution.mean()
    test_predictions_variance = outputs.distribution.variance()
    assert test_predictions.shape == (test_batch_size,)
    assert test_predictions_variance.shape == (test_batch_size,)
    np.testing.assert_allclose(test_predictions, test_labels, atol=0.1)
    assert np.all(test_predictions_variance.numpy() <= noise_variance)
