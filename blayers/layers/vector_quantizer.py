"""The VQ-VAE bottleneck (van den Oord et al., 2017).

`VectorQuantizer(num_codes)` replaces each input vector (last axis) by its nearest codebook
entry. The forward value is the code; the backward pass is straight-through (`z + sg(e - z)`,
gradient identity to the encoder). `layer.losses` gets the codebook and commitment terms
`||sg(z) - e||^2 + beta ||z - sg(e)||^2` (means over elements). `layer.codes` holds the last
call's code indices and `layer.perplexity` the exponentiated entropy of their usage.
"""

import keras
import tensorflow as tf

from blayers.layers.base import LocalLosses, register

__all__ = ["VectorQuantizer"]


@register
class VectorQuantizer(LocalLosses, keras.layers.Layer):
    """Nearest-code quantization with straight-through gradients and a commitment loss.

    Args:
      num_codes: codebook size K; the code dimension is the input's last axis.
      commitment_cost: beta, weight of `||z - sg(e)||^2` (0.25 in the paper).
      codebook_initializer: Keras initializer of the `[num_codes, code_dim]` codebook.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self, num_codes, commitment_cost=0.25, codebook_initializer="variance_scaling", **kwargs
    ):
        super().__init__(**kwargs)
        self.num_codes = int(num_codes)
        self.commitment_cost = float(commitment_cost)
        self.codebook_initializer = keras.initializers.get(codebook_initializer)
        self.codes = None
        self.perplexity = None

    def build(self, input_shape):
        self.codebook = self.add_weight(
            name="codebook",
            shape=(self.num_codes, input_shape[-1]),
            initializer=self.codebook_initializer,
        )

    def call(self, inputs):
        z = tf.convert_to_tensor(inputs, self.compute_dtype)
        flat = tf.reshape(z, [-1, z.shape[-1]])
        distances = (
            tf.reduce_sum(tf.square(flat), 1, keepdims=True)
            - 2.0 * tf.matmul(flat, self.codebook, transpose_b=True)
            + tf.reduce_sum(tf.square(self.codebook), 1)[None]
        )
        codes = tf.argmin(distances, axis=1, output_type=tf.int32)
        quantized = tf.reshape(tf.gather(self.codebook, codes), tf.shape(z))
        codebook_loss = tf.reduce_mean(tf.square(tf.stop_gradient(z) - quantized))
        commitment = tf.reduce_mean(tf.square(z - tf.stop_gradient(quantized)))
        self.add_loss(codebook_loss + self.commitment_cost * commitment)
        usage = tf.reduce_mean(tf.one_hot(codes, self.num_codes, dtype=z.dtype), 0)
        self.perplexity = tf.exp(-tf.reduce_sum(usage * tf.math.log(usage + 1e-10)))
        self.codes = tf.reshape(codes, tf.shape(z)[:-1])
        return z + tf.stop_gradient(quantized - z)  # straight-through estimator

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_codes": self.num_codes,
            "commitment_cost": self.commitment_cost,
            "codebook_initializer": keras.initializers.serialize(self.codebook_initializer),
        }
