"""edward2's `edward2/tensorflow/layers/embeddings_test.py`, translated."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import layers as ed_layers

BATCH, TIMESTEPS, INPUT_DIM, OUTPUT_DIM = 5, 3, 12, 15


@pytest.fixture
def inputs():
    return np.random.randint(INPUT_DIM - 1, size=(BATCH, TIMESTEPS))


@pytest.mark.parametrize(
    "embeddings_initializer,all_close", [("uniform", True), ("trainable_normal", False)]
)
def test_embedding(inputs, embeddings_initializer, all_close):
    layer = ed_layers.EmbeddingReparameterization(
        INPUT_DIM, output_dim=OUTPUT_DIM, embeddings_initializer=embeddings_initializer
    )
    outputs1 = tf.convert_to_tensor(layer(inputs))
    outputs2 = tf.convert_to_tensor(layer(inputs))
    assert outputs1.shape == (BATCH, TIMESTEPS, OUTPUT_DIM)
    assert np.allclose(outputs1, outputs2, rtol=1e-6, atol=1e-6) == all_close


@pytest.mark.parametrize(
    "embeddings_initializer,embeddings_regularizer,all_close,num_losses",
    [("uniform", None, True, 0), ("trainable_normal", "normal_kl_divergence", False, 1)],
)
def test_embedding_model(
    inputs, embeddings_initializer, embeddings_regularizer, all_close, num_losses
):
    model = keras.Sequential(
        [
            ed_layers.EmbeddingReparameterization(
                INPUT_DIM,
                output_dim=OUTPUT_DIM,
                embeddings_initializer=embeddings_initializer,
                embeddings_regularizer=embeddings_regularizer,
            ),
            keras.layers.RNN(keras.layers.LSTMCell(5)),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    outputs1 = model(inputs, training=True)
    outputs2 = model(inputs, training=True)
    assert outputs1.shape == (BATCH, 2)
    assert np.allclose(outputs1, outputs2, rtol=1e-6, atol=1e-6) == all_close
    assert len(model.losses) == num_losses
