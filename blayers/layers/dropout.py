"""MC dropout: dropout as a distribution over pre-activation units (Gal & Ghahramani, 2016).

Bayesian Layers place uncertainty on pre-activation units too (Tran et al., 2019, Sec. 2):
`MCDropout` keeps dropping units at prediction time, so repeated forward passes are Monte Carlo
draws from the approximate predictive. The mask is a traceable `blayers.Bernoulli` random
variable, so `blayers.posterior_mean()` (`take_mean`) replaces it by its mean and the layer acts
as the identity: the usual deterministic "weight-scaling" prediction.
"""

import tensorflow as tf

from blayers import distributions as rv_lib
from blayers.layers.base import SeededLayer, register

__all__ = ["MCDropout"]


@register
class MCDropout(SeededLayer):
    """Dropout active in training *and* at prediction: `x * mask / (1 - rate)`,
    `mask ~ Bernoulli(1 - rate)` of shape `noise_shape` (default: the input's shape).

    Args:
      rate: fraction of units dropped, in [0, 1).
      noise_shape: as `keras.layers.Dropout`; `None` entries take the input's size.
      seed: seeds the masks.
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"MCDropout needs 0 <= rate < 1, got {rate}.")
        self.rate = float(rate)
        self.noise_shape = noise_shape
        self.supports_masking = True
        self.mask = None  # the last call's mask RandomVariable

    def _noise_shape(self, inputs):
        shape = tf.shape(inputs)
        if self.noise_shape is None:
            return shape
        return tf.stack([shape[i] if d is None else d for i, d in enumerate(self.noise_shape)])

    def call(self, inputs, training=None):
        del training  # active regardless: that is the point of MC dropout
        if self.rate == 0.0:
            return inputs
        inputs = tf.convert_to_tensor(inputs, dtype=self.compute_dtype)
        keep = 1.0 - self.rate
        self.mask = rv_lib.Bernoulli(
            probs=tf.fill(self._noise_shape(inputs), tf.constant(keep, inputs.dtype)),
            dtype=inputs.dtype,
            seed=self.next_seed(),
            name="dropout_mask",
        )
        # Under take_mean the mask's value is its mean, `keep`, and the output equals the input.
        return inputs * tf.convert_to_tensor(self.mask) / keep

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "rate": self.rate,
            "noise_shape": self.noise_shape,
        }
