"""Many small networks as one: layers with a leading replica axis.

`R` independent copies of a small network (the splits, grid points and seeds of a UCI table)
train in one step when every weight carries a leading replica axis and every layer maps
`[R, B, ...]` to `[R, B, ...]` replica by replica: one batched matmul
(`einsum('rbi,rio->rbo')`) does the work of `R` matmuls for about the per-step overhead of one.

Nothing mixes replicas. Replica `r`'s output depends on its own weights, inputs and noise only:
each replica's initial weights come from its own seed (`seeds[r]`, drawn as a lone layer of the
same shape would draw them), and its dropout masks from a stateless seed `(seeds[r], t)` at the
layer's `t`-th call. So a replica trained in a group follows the trajectory it follows alone,
given the same data order: the gradient of a sum of per-replica losses with respect to replica
`r`'s weights is the gradient of its own loss, and Adam's update is elementwise.

Unlike the efficient ensembles (`blayers.layers.ensemble`), replicas share nothing: not the
weights, not the batch (each has its own examples), not the hyperparameters (`rates[r]`,
`kernel_decay[r]`).
"""

import keras
import numpy as np
import tensorflow as tf

from blayers.layers.base import register

__all__ = ["ReplicatedDense", "ReplicatedMCDropout", "ReplicatedNoise", "replica_seeds"]


def replica_seeds(seeds, salt=0):
    """A layer's per-replica seeds from each replica's own seed and the layer's `salt` (its
    index in the network): replica `r`'s seed depends on `seeds[r]` alone, so it is the same
    whichever replicas share the model, and no two layers of a replica share a noise stream."""
    return [
        int(np.random.SeedSequence([int(s), int(salt)]).generate_state(1)[0] >> 1) for s in seeds
    ]


def _per_replica(name, values, replicas, layer_name):
    if values is None:
        return None
    values = np.asarray(values, np.float64)
    if values.ndim > 1 or values.size not in (1, replicas):
        raise ValueError(
            f"{layer_name}: {name} needs one value or {replicas} (one per replica), got "
            f"{values.tolist()}."
        )
    return [float(v) for v in np.broadcast_to(values, (replicas,))]


def _check_seeds(seeds, layer_name):
    if (
        not isinstance(seeds, (list, tuple))
        or not seeds
        or not all(isinstance(s, (int, np.integer)) for s in seeds)
    ):
        raise ValueError(
            f"{layer_name}: seeds must be a non-empty list of ints (one per replica; see "
            f"blayers.layers.replicated.replica_seeds), got {seeds!r}."
        )
    return [int(s) for s in seeds]


def _check_input(layer_name, input_shape, replicas, rank=3):
    if len(input_shape) != rank or (input_shape[0] is not None and input_shape[0] != replicas):
        raise ValueError(
            f"{layer_name}: inputs must be [replicas={replicas}, batch, features]; got shape "
            f"{tuple(input_shape)}."
        )


@register
class ReplicatedDense(keras.layers.Layer):
    """`R` independent dense layers: `y[r] = activation(x[r] @ W[r] + b[r])` for inputs
    `x [R, B, in]`, with `W [R, in, units]` and `b [R, units]`.

    Replica `r`'s kernel is drawn by `kernel_initializer` with seed `seeds[r]` and shape
    `[in, units]`, as a lone `keras.layers.Dense` seeded so would draw it; its weight decay
    adds `kernel_decay[r] * ||W[r]||^2` to the layer's losses (an L2 prior of its own per
    replica: Gal & Ghahramani's `l^2 (1 - p) / (2 N tau)`, which differs across a grid).

    Args:
      units: output features of every replica.
      seeds: one int per replica (its length is the number of replicas `R`).
      activation: as `keras.layers.Dense`.
      use_bias: add a per-replica bias.
      kernel_initializer, bias_initializer: Keras initializer names or configs (each replica
        gets its own seeded instance).
      kernel_decay: `None`, one float, or `R` floats: the L2 coefficient of each replica.
    """

    def __init__(
        self,
        units,
        seeds,
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_decay=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = int(units)
        self.seeds = _check_seeds(seeds, self.name)
        self.replicas = len(self.seeds)
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.serialize(
            keras.initializers.get(kernel_initializer)
        )
        self.bias_initializer = keras.initializers.serialize(
            keras.initializers.get(bias_initializer)
        )
        self.kernel_decay = _per_replica("kernel_decay", kernel_decay, self.replicas, self.name)

    def _draw(self, initializer, shape):
        """`[R, *shape]`: replica `r`'s slice drawn with seed `seeds[r]`."""
        config = dict(initializer)
        slices = []
        for seed in self.seeds:
            inner = dict(config.get("config") or {})
            if "seed" in inner:  # random initializers; Zeros and the like take none
                inner["seed"] = seed
            instance = keras.initializers.deserialize({**config, "config": inner})
            slices.append(keras.ops.convert_to_numpy(instance(shape, dtype=self.variable_dtype)))
        return np.stack(slices)

    def build(self, input_shape):
        _check_input(self.name, input_shape, self.replicas)
        fan_in = int(input_shape[-1])
        kernel = self._draw(self.kernel_initializer, (fan_in, self.units))
        self.kernel = self.add_weight(
            name="kernel",
            shape=kernel.shape,
            initializer=keras.initializers.Constant(kernel),
        )
        self.bias = None
        if self.use_bias:
            bias = self._draw(self.bias_initializer, (self.units,))
            self.bias = self.add_weight(
                name="bias", shape=bias.shape, initializer=keras.initializers.Constant(bias)
            )

    def call(self, inputs):
        _check_input(self.name, inputs.shape, self.replicas)
        outputs = tf.einsum("rbi,rio->rbo", inputs, self.kernel)
        if self.bias is not None:
            outputs = outputs + self.bias[:, None, :]
        if self.kernel_decay is not None:
            decay = tf.constant(self.kernel_decay, self.kernel.dtype)
            self.add_loss(tf.reduce_sum(decay * tf.reduce_sum(tf.square(self.kernel), [1, 2])))
        return self.activation(outputs)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "seeds": self.seeds,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": self.kernel_initializer,
            "bias_initializer": self.bias_initializer,
            "kernel_decay": self.kernel_decay,
        }


@register
class ReplicatedMCDropout(keras.layers.Layer):
    """`R` independent MC dropout layers (`blayers.layers.MCDropout`, active at prediction
    too): `y[r] = x[r] * m[r] / (1 - rates[r])`, `m[r] ~ Bernoulli(1 - rates[r])`.

    Replica `r`'s mask at the layer's `t`-th call is drawn from the stateless seed
    `(seeds[r], t)`, so it does not depend on which other replicas share the call. The call
    counter `t` is the layer's `seed_generator_state` (checkpointed with the seed generators
    of the other layers, and kept out of evaluation by the trainers).

    Args:
      rates: one rate in `[0, 1)`, or one per replica.
      seeds: one int per replica (its length is the number of replicas `R`).
    """

    def __init__(self, rates, seeds, **kwargs):
        super().__init__(**kwargs)
        self.seeds = _check_seeds(seeds, self.name)
        self.replicas = len(self.seeds)
        self.rates = _per_replica("rates", rates, self.replicas, self.name)
        bad = [r for r in self.rates if not 0.0 <= r < 1.0]
        if bad:
            raise ValueError(f"{self.name}: every rate must be in [0, 1), got {bad}.")

    def build(self, input_shape):
        _check_input(self.name, input_shape, self.replicas)
        self.counter = self.add_weight(
            name="seed_generator_state",
            shape=(),
            dtype="int32",
            initializer="zeros",
            trainable=False,
        )

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        _check_input(self.name, inputs.shape, self.replicas)
        if not any(self.rates):
            return inputs
        t = tf.cast(self.counter.value, tf.int32)
        self.counter.assign_add(1)
        shape = tf.shape(inputs)[1:]
        # One stateless draw per replica: a replica's mask is the same alone or in a group.
        uniforms = tf.stack(
            [
                tf.random.stateless_uniform(shape, seed=tf.stack([seed, t]), dtype=inputs.dtype)
                for seed in self.seeds
            ]
        )
        keep = tf.constant([1.0 - r for r in self.rates], inputs.dtype)[:, None, None]
        return tf.where(uniforms < keep, inputs / keep, tf.zeros_like(inputs))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rates": self.rates, "seeds": self.seeds}


@register
class ReplicatedNoise(keras.layers.Layer):
    """A homoscedastic Gaussian likelihood per replica: appends each replica's log noise
    variance to its means, `[R, B, d] -> [R, B, 2d]` (means, then `log sigma_r^2`), so that
    `y[r] ~ N(means[r], sigma_r^2)`. Fixed (MC dropout's `1 / tau`) or learned.

    Args:
      variances: one variance, or one per replica (in the targets' units).
      replicas: the number of replicas `R`.
      trainable: learn the log variances (else they stay fixed).
    """

    def __init__(self, variances, replicas, trainable=False, **kwargs):
        super().__init__(trainable=trainable, **kwargs)
        self.replicas = int(replicas)
        self.variances = _per_replica("variances", variances, self.replicas, self.name)
        if min(self.variances) <= 0:
            raise ValueError(f"{self.name}: variances must be positive, got {self.variances}.")

    def build(self, input_shape):
        _check_input(self.name, input_shape, self.replicas)
        self.log_variance = self.add_weight(
            name="log_variance",
            shape=(self.replicas,),
            initializer=keras.initializers.Constant(np.log(self.variances)),
            trainable=self.trainable,
        )

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        _check_input(self.name, inputs.shape, self.replicas)
        log_variance = tf.cast(self.log_variance, inputs.dtype)[:, None, None]
        return tf.concat([inputs, tf.broadcast_to(log_variance, tf.shape(inputs))], -1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], 2 * input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "variances": self.variances, "replicas": self.replicas}
