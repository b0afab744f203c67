"""MC dropout: dropout as a distribution over pre-activation units (Gal & Ghahramani, 2016).

Bayesian Layers place uncertainty on pre-activation units too (Tran et al., 2019, Sec. 2):
`MCDropout` keeps dropping units at prediction time, so repeated forward passes are Monte Carlo
draws from the approximate predictive. The mask is a traceable `blayers.Bernoulli` random
variable, so `blayers.posterior_mean()` (`take_mean`) replaces it by its mean and the layer acts
as the identity: the usual deterministic "weight-scaling" prediction.
"""

import tensorflow as tf

from blayers import distributions as rv_lib
from blayers import replicas as replicas_lib
from blayers.layers.base import SeededLayer, register

__all__ = ["MCDropout"]


@register
class MCDropout(SeededLayer):
    """Dropout active in training *and* at prediction: `x * mask / (1 - rate)`,
    `mask ~ Bernoulli(1 - rate)` of shape `noise_shape` (default: the input's shape).

    With `replicas=R` (`blayers.replicas`) it is `R` independent dropout layers on
    `[R, batch, ...]` inputs, each with its own rate (`rate` one value or `R`) and masks that
    depend on its own seed alone.

    Args:
      rate: fraction of units dropped, in [0, 1); with replicas, one rate or one a replica.
      noise_shape: as `keras.layers.Dropout`; `None` entries take the input's size.
      seed: seeds the masks.
      replicas, replica_seeds: see `blayers.replicas` (default: an ordinary layer).
    """

    supports_replicas = True

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        self.rate = replicas_lib.per_replica(self, "rate", rate, self.replicas)
        rates = self.rate if self.replicas is not None else [self.rate]
        if not all(0.0 <= r < 1.0 for r in rates):
            raise ValueError(f"MCDropout needs 0 <= rate < 1, got {rate}.")
        self.noise_shape = noise_shape
        self.supports_masking = True
        self.mask = None  # the last call's mask RandomVariable

    def _noise_shape(self, inputs):
        shape = tf.shape(inputs)
        if self.noise_shape is None:
            return shape
        return tf.stack([shape[i] if d is None else d for i, d in enumerate(self.noise_shape)])

    def build(self, input_shape):
        if self.replicas is not None:
            replicas_lib.check_replica_inputs(self, input_shape, min_rank=2)

    def call(self, inputs, training=None):
        del training  # active regardless: that is the point of MC dropout
        if not any(self.rate if self.replicas is not None else [self.rate]):
            return inputs
        inputs = tf.convert_to_tensor(inputs, dtype=self.compute_dtype)
        keep = 1.0 - tf.constant(self.rate, inputs.dtype)
        keep = self.replica_broadcast(keep, inputs.shape.rank)
        self.mask = rv_lib.Bernoulli(
            probs=tf.broadcast_to(keep, self._noise_shape(inputs)),
            dtype=inputs.dtype,
            seed=self.next_seed(),
            name="dropout_mask",
            replica_keys=self.replica_keys,
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
