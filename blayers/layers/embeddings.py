"""Bayesian embeddings: a distribution over the embedding table.

`EmbeddingReparameterization(input_dim, output_dim)` draws one table `E ~ q` per call
(default `trainable_normal` with a `normal_kl_divergence` regularizer) and looks up rows, as
`keras.layers.Embedding` does with its fixed table.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from blayers.layers.base import BayesianLayer, register

__all__ = ["EmbeddingReparameterization", "PositionalEncoding", "sinusoid_table"]


@register
class EmbeddingReparameterization(BayesianLayer):
    """Embedding lookup `E[ids]` with one draw of the table per call.

    Args:
      input_dim: vocabulary size.
      output_dim: embedding size.
      embeddings_initializer: a distribution initializer (default `'trainable_normal'`) makes
        the table random; a Keras initializer name makes it deterministic.
      embeddings_regularizer: the table's KL term (default `'prior'`).
      embeddings_constraint: a Keras constraint of a deterministic table.
      mask_zero: id 0 is padding and produces a Keras mask, as in `keras.layers.Embedding`.
      seed: seeds the layer's noise.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        input_dim,
        output_dim,
        embeddings_initializer="trainable_normal",
        embeddings_regularizer="prior",
        embeddings_constraint=None,
        mask_zero=False,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        self.mask_zero = mask_zero
        self.supports_masking = mask_zero
        self._configure_weight(
            "embeddings", embeddings_initializer, embeddings_regularizer, embeddings_constraint
        )

    def build(self, input_shape=None):
        self.add_bayesian_weight("embeddings", (self.input_dim, self.output_dim))

    def call(self, inputs):
        self.call_weights()
        ids = tf.cast(inputs, tf.int32)
        return tf.gather(tf.convert_to_tensor(self.embeddings), ids)

    def compute_mask(self, inputs, mask=None):
        return keras.ops.not_equal(inputs, 0) if self.mask_zero else None

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        return {
            **super().get_config(),
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "mask_zero": self.mask_zero,
            **self._weight_config("embeddings"),
        }


def sinusoid_table(length, depth):
    """`[length, depth]` sinusoidal positions (Vaswani et al., 2017): `sin` on even and `cos` on
    odd features of `position / 10000^(2i / depth)`."""
    positions = np.arange(length)[:, None]
    rates = 1.0 / np.power(10_000.0, (2 * (np.arange(depth) // 2)) / depth)
    angles = positions * rates[None]
    return np.where(np.arange(depth) % 2 == 0, np.sin(angles), np.cos(angles))


@register
class PositionalEncoding(keras.layers.Layer):
    """`x * sqrt(d_model) + PE`, the sinusoidal positions of Vaswani et al. (2017); the input's
    Keras mask passes through.

    Args:
      max_length: longest sequence.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, max_length=2048, **kwargs):
        super().__init__(**kwargs)
        self.max_length = int(max_length)
        self.supports_masking = True

    def build(self, input_shape):
        depth = int(input_shape[-1])
        self.table = tf.constant(sinusoid_table(self.max_length, depth), self.compute_dtype)
        self.scale = math.sqrt(depth)

    def call(self, inputs):
        length = tf.shape(inputs)[1]
        return inputs * self.scale + self.table[None, :length]

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length}
