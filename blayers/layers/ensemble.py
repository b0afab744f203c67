"""The batch layout of efficient ensembles: members share one batch, member-major.

BatchEnsemble (Wen et al., 2020) and rank-1 Bayesian networks (Dusenberry et al., 2020) run
their `E` members in one forward pass: the batch is tiled `E` times (`EnsembleTile`), so rows
`[m * B, (m + 1) * B)` belong to member `m`, and every fast-weight layer scales the rows of
member `m` by that member's vectors. The network's head (`EnsembleOutput`) folds the members
back: `[E * B, ...]` logits become one `RandomVariable` per example over the uniform mixture of
the members' predictive distributions (`EnsembleMixture`).

Training follows the papers: each member is fitted to every example (the loss averages the
members' negative log-likelihoods, `EnsembleMixture.member_log_prob`); evaluation reads the
mixture, `p(y | x) = 1/E sum_m p_m(y | x)`.
"""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.layers.base import NamedOutput, register
from blayers.random_variable import RandomVariable

tfd = tfp.distributions

__all__ = [
    "EnsembleMixture",
    "EnsembleOutput",
    "EnsembleSyncBatchNorm",
    "EnsembleTile",
    "check_ensemble_size",
    "check_member_major",
    "ensemble_random_variable",
    "member_rows",
]


def check_ensemble_size(layer_name, ensemble_size):
    """`ensemble_size` as an int, or a ValueError naming the layer when it is not a positive
    integer."""
    if (
        not isinstance(ensemble_size, (int, np.integer))
        or isinstance(ensemble_size, bool)
        or ensemble_size < 1
    ):
        raise ValueError(
            f"{layer_name}: ensemble_size must be a positive integer, got {ensemble_size!r}."
        )
    return int(ensemble_size)


def check_member_major(batch, static_batch, ensemble_size, layer_name):
    """Refuses a batch that is not `E` member-major copies, naming the layer, the batch size and
    the fix (a Python error when the batch size is known, else a graph assertion).

    Returns `batch`; in a graph, behind the assertion, so that ops built from it cannot fail on
    the mismatched shape before the assertion names it (graph ops run in any order)."""

    def message(size):
        return (
            f"{layer_name}: the batch ({size} rows) must hold ensemble_size = {ensemble_size} "
            "member-major copies of the examples (rows [m B, (m + 1) B) for member m): put "
            "blayers.layers.EnsembleTile(ensemble_size) before the first ensemble layer, which "
            "tiles a batch of B examples into E * B rows (edward2 tiles the inputs by hand, "
            "tf.tile(x, [E, 1]), the same layout)."
        )

    if static_batch is not None:
        if static_batch % ensemble_size:
            raise ValueError(message(static_batch))
        return batch
    if tf.executing_eagerly():
        if int(batch) % ensemble_size:
            raise ValueError(message(int(batch)))
        return batch
    head, tail = message("BATCH").split("BATCH")
    check = tf.debugging.Assert(
        tf.equal(batch % ensemble_size, 0), [head, batch, tail], summarize=1
    )
    with tf.control_dependencies([check]):
        return tf.identity(batch)


def member_rows(vectors, inputs, layer_name):
    """Per-row copies of per-member `vectors` `[E, k]` for member-major `inputs` `[E * B, ...,
    k']`: `[E * B, 1, ..., 1, k]`, broadcasting against the inputs' middle axes."""
    ensemble_size = vectors.shape[0]
    batch = check_member_major(tf.shape(inputs)[0], inputs.shape[0], ensemble_size, layer_name)
    rows = tf.repeat(vectors, batch // ensemble_size, axis=0)
    middle = inputs.shape.rank - 2
    if middle > 0:
        rows = tf.reshape(rows, tf.concat([tf.shape(rows)[:1], [1] * middle, [-1]], 0))
    return rows


@register
class EnsembleTile(keras.layers.Layer):
    """`[B, ...] -> [E * B, ...]`: `E` member-major copies of the batch (member `m` gets rows
    `[m * B, (m + 1) * B)`), the input of a network of BatchEnsemble or rank-1 layers.

    Args:
      ensemble_size: members `E`.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, ensemble_size, **kwargs):
        super().__init__(**kwargs)
        self.ensemble_size = check_ensemble_size(f"EnsembleTile ({self.name})", ensemble_size)

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        multiples = tf.concat([[self.ensemble_size], tf.ones([inputs.shape.rank - 1], tf.int32)], 0)
        return tf.tile(inputs, multiples)

    def compute_output_shape(self, input_shape):
        batch = input_shape[0]
        return (None if batch is None else batch * self.ensemble_size, *input_shape[1:])

    def get_config(self):
        return {**super().get_config(), "ensemble_size": self.ensemble_size}


class EnsembleMixture(tfd.MixtureSameFamily):
    """The uniform mixture `1/E sum_m p_m(y)` of an ensemble's members.

    `members` has batch shape `[..., E]` (the members on the last batch axis). `log_prob` is the
    mixture's; `member_log_prob(y)` is `[..., E]`, each member's own log-likelihood, which the
    training loss averages (members are fitted independently, as in Lakshminarayanan et al.,
    2017 and Wen et al., 2020). `probs_parameter()` (categorical members) is the mixture's
    class probabilities.
    """

    def __init__(self, components_distribution, validate_args=False, name="EnsembleMixture"):
        parameters = dict(locals())
        members = components_distribution
        ensemble_size = members.batch_shape[-1]
        dtype = members.dtype if members.dtype.is_floating else tf.float32
        weights = tfd.Categorical(logits=tf.zeros(members.batch_shape_tensor(), dtype))
        super().__init__(weights, members, validate_args=validate_args, name=name)
        self._parameters = parameters
        self.ensemble_size = ensemble_size

    @property
    def members(self):
        return self.components_distribution

    def member_log_prob(self, value):
        """`log p_m(value)` of every member, `[..., E]`."""
        value = tf.convert_to_tensor(value)
        event_rank = self.members.event_shape.rank or 0
        return self.members.log_prob(tf.expand_dims(value, -1 - event_rank))

    def probs_parameter(self):
        """The mixture's class probabilities (categorical members)."""
        return tf.reduce_mean(self.members.probs_parameter(), axis=-2)

    @classmethod
    def _parameter_properties(cls, dtype, num_classes=None):
        properties = tfd.MixtureSameFamily._parameter_properties(dtype, num_classes)
        return {"components_distribution": properties["components_distribution"]}


ENSEMBLE_LIKELIHOODS = ("categorical", "normal")


def check_ensemble_likelihood(layer_name, distribution):
    """`distribution` if it is one of `ENSEMBLE_LIKELIHOODS`, else a ValueError naming the layer."""
    if distribution not in ENSEMBLE_LIKELIHOODS:
        raise ValueError(
            f"{layer_name}: distribution must be 'categorical' or 'normal', got {distribution!r}."
        )
    return distribution


def ensemble_random_variable(outputs, ensemble_size, distribution, layer_name):
    """Member-major `[E * B, k]` outputs -> a `RandomVariable` over the members' uniform mixture
    (`EnsembleMixture`, batch `[B]`): `distribution='categorical'` reads logits, `'normal'`
    means and softplus-scales (`k = 2 d`). Its value is the mixture's most probable class, or
    its mean."""
    size = outputs.shape[-1]
    # [E * B, k] -> [B, E, k]: members on the last batch axis.
    outputs = tf.reshape(outputs, tf.stack([ensemble_size, -1, size]))
    outputs = tf.transpose(outputs, [1, 0, 2])
    if distribution == "categorical":
        members = tfd.Categorical(logits=outputs)
    else:
        if size % 2:
            raise ValueError(
                f"{layer_name}: distribution='normal' needs an even number of outputs (means "
                f"and scales), got {size}."
            )
        loc, raw = tf.split(outputs, 2, axis=-1)
        members = tfd.Independent(
            tfd.Normal(loc, tf.nn.softplus(raw) + 1e-6), reinterpreted_batch_ndims=1
        )
    mixture = EnsembleMixture(members)
    # The value: the mixture's most probable class, or its mean; metrics read the distribution.
    if distribution == "categorical":
        value = tf.argmax(mixture.probs_parameter(), axis=-1, output_type=tf.int32)
    else:
        value = mixture.mean()
    return RandomVariable(mixture, value=tf.stop_gradient(value))


@register
class EnsembleOutput(NamedOutput, keras.layers.Layer):
    """The head of a member-major network: `[E * B, k]` outputs -> a `RandomVariable` over
    `EnsembleMixture` per example (batch `[B]`).

    Args:
      ensemble_size: members `E` (as the network's `EnsembleTile`).
      distribution: the members' likelihood: `'categorical'` (the `k` outputs are logits) or
        `'normal'` (`k = 2 d`: means and softplus-scales of `d` targets).
      output_name: the random variable's name (default: the layer's).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, ensemble_size, distribution="categorical", **kwargs):
        super().__init__(**kwargs)
        self.ensemble_size = check_ensemble_size(f"EnsembleOutput ({self.name})", ensemble_size)
        self.distribution = check_ensemble_likelihood(f"EnsembleOutput ({self.name})", distribution)

    def call(self, inputs):
        outputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        return ensemble_random_variable(
            outputs, self.ensemble_size, self.distribution, f"EnsembleOutput ({self.name})"
        )

    def compute_output_shape(self, input_shape):
        batch = input_shape[0]
        batch = None if batch is None else batch // self.ensemble_size
        return (batch,) if self.distribution == "categorical" else (batch, input_shape[-1] // 2)

    def get_config(self):
        return {
            **super().get_config(),
            "ensemble_size": self.ensemble_size,
            "distribution": self.distribution,
        }


@register
class EnsembleSyncBatchNorm(keras.layers.Layer):
    """Batch normalization of a member-major batch with each member's own statistics and scale
    (edward2's `EnsembleSyncBatchNorm`): member `m`'s rows `[m B, (m + 1) B)` are normalized
    with their mean and variance over every axis but the channels, taken across all the
    devices of a `tf.distribute` strategy (the mean of each device's `E[x]` and `E[x^2]`), then
    scaled by `gamma_m` and shifted by `beta_m`; the moving statistics are per member too.

    Args:
      ensemble_size: members `E`.
      momentum: of the moving statistics, `moving <- momentum moving + (1 - momentum) batch`.
      epsilon: added to the variance.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, ensemble_size=1, momentum=0.99, epsilon=1e-3, **kwargs):
        kwargs.pop("axis", None)  # edward2's argument: channels last only, as edward2's
        super().__init__(**kwargs)
        self.ensemble_size = check_ensemble_size(
            f"EnsembleSyncBatchNorm ({self.name})", ensemble_size
        )
        self.momentum, self.epsilon = float(momentum), float(epsilon)

    def build(self, input_shape):
        shape = (self.ensemble_size, input_shape[-1])
        self.gamma = self.add_weight(name="gamma", shape=shape, initializer="ones")
        self.beta = self.add_weight(name="beta", shape=shape, initializer="zeros")
        self.moving_mean = self.add_weight(
            name="moving_mean", shape=shape, initializer="zeros", trainable=False
        )
        self.moving_variance = self.add_weight(
            name="moving_variance", shape=shape, initializer="ones", trainable=False
        )

    def _batch_statistics(self, members):
        """Per member `(mean, variance)` `[E, C]` of `[E, B, ..., C]`, across devices."""
        axes = list(range(1, members.shape.rank - 1))
        mean = tf.reduce_mean(members, axis=axes)
        mean_square = tf.reduce_mean(tf.square(members), axis=axes)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            mean, mean_square = context.all_reduce(tf.distribute.ReduceOp.MEAN, [mean, mean_square])
        return mean, tf.maximum(mean_square - tf.square(mean), 0.0)

    def call(self, inputs, training=None):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        name = f"EnsembleSyncBatchNorm ({self.name})"
        batch = check_member_major(tf.shape(x)[0], x.shape[0], self.ensemble_size, name)
        members = tf.reshape(
            x, tf.concat([[self.ensemble_size, batch // self.ensemble_size], tf.shape(x)[1:]], 0)
        )
        if training:
            mean, variance = self._batch_statistics(members)
            for moving, value in ((self.moving_mean, mean), (self.moving_variance, variance)):
                moving.assign(self.momentum * moving + (1.0 - self.momentum) * value)
        else:
            mean, variance = self.moving_mean, self.moving_variance
        scale = tf.cast(self.gamma, x.dtype) * tf.math.rsqrt(
            tf.cast(variance, x.dtype) + self.epsilon
        )
        shift = tf.cast(self.beta, x.dtype) - tf.cast(mean, x.dtype) * scale
        # [E, C] -> [E, 1, ..., 1, C] against the members' rows.
        expand = [self.ensemble_size] + [1] * (members.shape.rank - 2) + [-1]
        out = members * tf.reshape(scale, expand) + tf.reshape(shift, expand)
        return tf.reshape(out, tf.shape(x))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "ensemble_size": self.ensemble_size,
            "momentum": self.momentum,
            "epsilon": self.epsilon,
        }
