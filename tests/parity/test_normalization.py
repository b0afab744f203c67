"""edward2's `edward2/tensorflow/layers/normalization_test.py`, translated. edward2's spectral
normalization assigns the normalized kernel to the wrapped layer's variable
(`update_weights()`); blayers' computes it for the call and keeps the raw variable, so the
normalized kernel is read from `normalized_kernel(training=True)` (README)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import layers as ed_layers

NUM_ITERATIONS, NORM_MULTIPLIER = 1000, 0.95


def _compute_spectral_norm(weight, input_shape):
    if weight.ndim > 2:  # Conv2D via the FFT, as in Sedghi et al. (2019)
        weight = np.fft.fft2(weight, input_shape[1:3], axes=[0, 1])
    return np.max(np.linalg.svd(weight, compute_uv=False))


def test_act_norm():
    np.random.seed(83243)
    batch_size, length, channels = 25, 15, 4
    inputs = tf.cast(3.0 + 0.8 * np.random.randn(batch_size, length, channels), tf.float32)
    layer = ed_layers.ActNorm()
    outputs = layer(inputs)
    mean, variance = tf.nn.moments(outputs, axes=[0, 1])
    np.testing.assert_allclose(mean, np.zeros(channels), atol=1e-3)
    np.testing.assert_allclose(variance, np.ones(channels), atol=1e-3)
    inputs = tf.cast(3.0 + 0.8 * np.random.randn(batch_size, length, channels), tf.float32)
    mean, variance = tf.nn.moments(layer(inputs), axes=[0, 1])
    np.testing.assert_allclose(mean, np.zeros(channels), atol=0.25)
    np.testing.assert_allclose(variance, np.ones(channels), atol=0.25)


@pytest.mark.parametrize(
    "input_shape,make_layer,norm_wrapper",
    [
        ((None, 10), lambda: keras.layers.Dense(10), ed_layers.SpectralNormalization),
        (
            (None, 32, 32, 3),
            lambda: keras.layers.Conv2D(filters=64, kernel_size=3, padding="valid"),
            ed_layers.SpectralNormalizationConv2D,
        ),
    ],
    ids=["Dense", "Conv2D"],
)
def test_spec_norm_magnitude(input_shape, make_layer, norm_wrapper):
    """The kernel's spectral norm converges to norm_multiplier, and the layer is K-Lipschitz."""
    layer = make_layer()
    layer.build(input_shape)
    sn_layer = norm_wrapper(layer, iteration=NUM_ITERATIONS, norm_multiplier=NORM_MULTIPLIER)
    sn_layer.build(input_shape)
    normalized_kernel, _ = sn_layer.normalized_kernel(True)  # edward2: update_weights()
    computed = _compute_spectral_norm(normalized_kernel.numpy(), input_shape)
    np.testing.assert_allclose(computed, NORM_MULTIPLIER, atol=1e-2)
    new_input_shape = (16,) + input_shape[1:]
    new_input = tf.random.uniform(new_input_shape)
    delta_vec = tf.random.uniform(new_input_shape)
    output1 = sn_layer(new_input)
    output2 = sn_layer(new_input + delta_vec)
    delta_input = tf.norm(tf.reshape(delta_vec, (-1,))).numpy()
    delta_output = tf.norm(tf.reshape(output2 - output1, (-1,))).numpy()
    assert delta_output <= NORM_MULTIPLIER * delta_input
