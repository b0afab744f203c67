"""edward2's `edward2/tensorflow/layers/gaussian_process_test.py`, translated."""

import keras
import numpy as np
import tensorflow as tf

from blayers import layers as ed_layers


def test_gaussian_process_posterior():
    train_batch_size, test_batch_size, input_dim, output_dim = 3, 2, 4, 5
    features = np.random.rand(train_batch_size, input_dim).astype(np.float32)
    labels = np.random.rand(train_batch_size, output_dim).astype(np.float32)
    layer = ed_layers.GaussianProcess(
        output_dim, conditional_inputs=features, conditional_outputs=labels
    )
    test_features = np.random.rand(test_batch_size, input_dim).astype(np.float32)
    test_labels = np.random.rand(test_batch_size, output_dim).astype(np.float32)
    test_outputs = layer(test_features)
    test_nats = -test_outputs.distribution.log_prob(test_labels)
    assert test_nats.shape == ()
    assert float(test_nats) >= 0.0
    assert test_outputs.shape == (test_batch_size, output_dim)


def test_gaussian_process_prior():
    batch_size, input_dim, output_dim = 3, 4, 5
    features = np.random.rand(batch_size, input_dim).astype(np.float32)
    labels = np.random.rand(batch_size, output_dim).astype(np.float32)
    model = keras.Sequential(
        [keras.layers.Dense(2, activation=None), ed_layers.GaussianProcess(output_dim)]
    )
    outputs = model(features)
    log_prob = outputs.distribution.log_prob(labels)
    assert log_prob.shape == ()
    assert float(log_prob) <= 0.0
    assert outputs.shape == (batch_size, output_dim)


def test_sparse_gaussian_process():
    dataset_size, batch_size, input_dim, output_dim = 10, 3, 4, 5
    features = np.random.rand(batch_size, input_dim).astype(np.float32)
    labels = np.random.rand(batch_size, output_dim).astype(np.float32)
    model = ed_layers.SparseGaussianProcess(output_dim, num_inducing=2)
    for _ in range(2):  # the second iteration checks the initializers recall their weights
        with tf.GradientTape() as tape:
            predictions = model(features)
            nll = -tf.reduce_mean(predictions.distribution.log_prob(labels))
            kl = sum(model.losses) / dataset_size
            loss = nll + kl
        # The trainable variables: blayers' layers also hold their random streams' states.
        for grad in tape.gradient(loss, model.trainable_variables):
            assert grad is not None
        assert loss.shape == ()
        assert float(loss) >= 0.0
        assert predictions.shape == (batch_size, output_dim)
