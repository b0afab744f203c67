"""Noise contrastive priors (Hafner et al., 2019): a prior on the outputs at inputs near the
data's boundary, where a network should be uncertain.

An input prior perturbs a copy of the batch (`NCPNormalPerturb` for continuous inputs,
`NCPCategoricalPerturb` for integer ones) and concatenates it, doubling the batch; an output
prior (`NCPNormalOutput`) splits the batch again, returns the clean half and adds
`KL[p_ood(y | x~) || q(y | x~)]` averaged over the perturbed half to its losses: the model's
predictive distribution at perturbed inputs is pulled toward a wide output prior (centred at the
labels, or a fixed mean). Both act in training only (`training=True`); at prediction they pass
the batch through, so the same model predicts normally.

    x = NCPNormalPerturb(stddev=0.1)(inputs)
    h = keras.layers.Dense(64, activation='relu')(x)
    mean = DenseVariationalDropout(1)(h)
    mean = NCPNormalOutput(stddev=1.0)(mean, targets)     # KL in losses; clean half out
"""

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.layers.base import LocalLosses, SeededLayer, register
from blayers.random_variable import RandomVariable, align_value
from blayers.sampling import standard_normal

tfd = tfp.distributions

__all__ = ["NCPCategoricalPerturb", "NCPNormalOutput", "NCPNormalPerturb"]


@register
class NCPNormalPerturb(SeededLayer):
    """Input prior for continuous inputs: in training, `[x; x + eps]` with
    `eps ~ N(mean, stddev^2)` per entry (batch doubled); at prediction, `x`.

    Args:
      mean, stddev: the perturbation's Normal.
      seed: seeds the perturbations.
    """

    def __init__(self, mean=0.0, stddev=1.0, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        if not stddev > 0:
            raise ValueError(f"NCPNormalPerturb ({self.name}): stddev must be > 0, got {stddev}.")
        self.mean, self.stddev = float(mean), float(stddev)

    def call(self, inputs, training=None):
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        if not training:
            return inputs
        noise = self.mean + self.stddev * standard_normal(
            tf.shape(inputs), self.next_seed(), inputs.dtype
        )
        return tf.concat([inputs, inputs + noise], 0)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "stddev": self.stddev}


@register
class NCPCategoricalPerturb(SeededLayer):
    """Input prior for integer (categorical) inputs: in training, `[x; x~]` where each entry of
    `x~` is, with probability `probs`, replaced by a category drawn uniformly from
    `[0, input_dim)`; at prediction, `x`.

    Args:
      input_dim: number of categories (the largest index + 1).
      probs: probability of replacing an entry.
      seed: seeds the flips.
    """

    def __init__(self, input_dim, probs=0.1, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        if not isinstance(input_dim, int) or input_dim < 1:
            raise ValueError(
                f"NCPCategoricalPerturb ({self.name}): input_dim must be a positive integer, "
                f"got {input_dim!r}."
            )
        if not 0.0 <= probs <= 1.0:
            raise ValueError(f"NCPCategoricalPerturb ({self.name}): probs in [0, 1], got {probs}.")
        self.input_dim, self.probs = input_dim, float(probs)

    def call(self, inputs, training=None):
        inputs = tf.convert_to_tensor(inputs)
        if not training:
            return inputs
        flip_seed, value_seed = tf.unstack(
            tf.random.experimental.stateless_split(self.next_seed(), 2)
        )
        shape = tf.shape(inputs)
        flip = tf.random.stateless_uniform(shape, flip_seed) < self.probs
        values = tf.random.stateless_uniform(
            shape, value_seed, minval=0, maxval=self.input_dim, dtype=tf.int32
        )
        perturbed = tf.where(flip, tf.cast(values, inputs.dtype), inputs)
        return tf.concat([inputs, perturbed], 0)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "input_dim": self.input_dim, "probs": self.probs}


@register
class NCPNormalOutput(LocalLosses, keras.layers.Layer):
    """Output prior: in training, splits a doubled batch, returns the clean half and adds
    `sum_d KL[N(mu, stddev^2) || q(y_d | x~)] / B` (the perturbed half's mean KL per example) to
    its losses, with `mu` the targets (`layer(outputs, targets)`, Hafner et al.'s data prior) or
    the constant `mean`. A tensor input stands for `q = N(input, 1)` (squared error); a
    `RandomVariable` input supplies its own distribution (Normal family, any with a registered
    KL). At prediction the input passes through.

    Args:
      mean: the prior's mean when no targets are passed.
      stddev: the prior's standard deviation (wide: the model should be uncertain there).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, mean=0.0, stddev=1.0, **kwargs):
        super().__init__(**kwargs)
        if not stddev > 0:
            raise ValueError(f"NCPNormalOutput ({self.name}): stddev must be > 0, got {stddev}.")
        self.mean, self.stddev = float(mean), float(stddev)

    def call(self, inputs, targets=None, training=None):
        if not training:
            return inputs
        if isinstance(inputs, RandomVariable):
            distribution = inputs.distribution
            value = inputs.value
        else:
            value = tf.convert_to_tensor(inputs, self.compute_dtype)
            distribution = tfd.Normal(value, tf.ones([], value.dtype))
        half = tf.shape(value)[0] // 2
        clean = distribution[:half]
        perturbed = distribution[half:]
        if targets is None:
            loc = self.mean
        else:  # labels `(B,)` for outputs `(2B, 1)`: one per example, never an outer product
            loc = align_value(
                targets, value[half:].shape, f"NCPNormalOutput ({self.name}) targets", value.dtype
            )
        prior = tfd.Normal(
            tf.broadcast_to(tf.cast(loc, value.dtype), tf.shape(value[half:])),
            tf.cast(self.stddev, value.dtype),
        )
        kl = prior.kl_divergence(perturbed)
        self.add_loss(tf.reduce_sum(kl) / tf.cast(half, kl.dtype))
        if isinstance(inputs, RandomVariable):
            return RandomVariable(clean, value=value[:half])
        return value[:half]

    def compute_output_shape(self, inputs_shape, targets_shape=None):
        return inputs_shape

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "stddev": self.stddev}
