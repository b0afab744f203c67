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

from blayers import constraints as constraints_lib
from blayers.initializers import RHO_RANGE
from blayers.layers.base import register

__all__ = [
    "ReplicatedDense",
    "ReplicatedDenseFlipout",
    "ReplicatedMCDropout",
    "ReplicatedNoise",
    "replica_seeds",
]


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


def _next_call(counter):
    """The layer's call index `t` (then counts the call): the second half of its draws' seeds."""
    t = tf.cast(counter.value, tf.int32)
    counter.assign_add(1)
    return t


def _stateless(sampler, shape, seeds, t, dtype):
    """`[R, *shape]`: replica `r`'s slice drawn by `sampler` from the stateless seed
    `(seeds[r], t)`, so it is the same whichever replicas share the call."""
    return tf.stack([sampler(shape, seed=tf.stack([seed, t]), dtype=dtype) for seed in seeds])


def _call_counter(layer):
    # Named like Keras' seed generators' state: checkpointed with them, kept out of evaluation.
    return layer.add_weight(
        name="seed_generator_state", shape=(), dtype="int32", initializer="zeros", trainable=False
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

    def _draw(self, initializer, shape, seeds=None):
        """`[R, *shape]`: replica `r`'s slice drawn with seed `seeds[r]` (default the layer's)."""
        config = dict(keras.initializers.serialize(keras.initializers.get(initializer)))
        slices = []
        for seed in self.seeds if seeds is None else seeds:
            inner = dict(config.get("config") or {})
            if "seed" in inner:  # random initializers; Zeros and the like take none
                inner["seed"] = seed
            instance = keras.initializers.deserialize({**config, "config": inner})
            with tf.init_scope():  # eager values, even when first built inside a tf.function
                slices.append(
                    keras.ops.convert_to_numpy(instance(shape, dtype=self.variable_dtype))
                )
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
class ReplicatedDenseFlipout(ReplicatedDense):
    """`R` independent mean-field Bayesian dense layers with the Flipout estimator
    (`blayers.layers.DenseFlipout`, Wen et al., 2018): replica `r`'s kernel has the posterior
    `q_r(W) = N(M_r, softplus(rho_r)^2)` elementwise, and its outputs are
    `activation(x @ M_r + ((x * s) @ dW_r) * o + b_r)` with one perturbation
    `dW_r = softplus(rho_r) * eps` per call and per-row signs `s`, `o` in {-1, +1}.

    Replica `r`'s draws at the layer's `t`-th call come from stateless seeds derived from
    `(seeds[r], t)`, so they do not depend on which other replicas share the call; its initial
    means and stddev parameters are drawn as `DenseFlipout`'s defaults draw them (means
    `TruncatedNormal(stddev=1e-5)`, `rho ~ U(softplus^-1(1e-3), softplus^-1(5e-2))`), each
    from its own seed. The layer's loss is `sum_r kl_weight[r] * KL[q_r(W) || N(0,
    prior_stddev[r]^2)]` (the bias is deterministic, as `DenseFlipout`'s default): with
    `kl_weight[r] = 1 / N_r` a replica's objective is `DenseFlipout`'s negative ELBO per example.

    The rows of one call share the call's perturbation `dW_r` (as the examples of one batch do
    in `DenseFlipout`), so Monte Carlo draws of a predictive take one call each
    (`independent_rows` is False).

    Args:
      units: output features of every replica.
      seeds: one int per replica (its length is the number of replicas `R`).
      activation, use_bias: as `keras.layers.Dense`.
      kernel_initializer: initializer of the kernel means (default `TruncatedNormal(1e-5)`).
      stddev_initializer: initializer of the unconstrained `rho` (stddev = softplus(rho)).
      bias_initializer: initializer of the deterministic bias.
      prior_stddev: one float or `R`: the stddev of each replica's zero-mean Normal prior.
      kl_weight: one float or `R`: each replica's KL coefficient (`1 / N_r` for an ELBO per
        example); None adds no KL.
    """

    independent_rows = False

    def __init__(
        self,
        units,
        seeds,
        activation=None,
        use_bias=True,
        kernel_initializer=None,
        stddev_initializer=None,
        bias_initializer="zeros",
        prior_stddev=1.0,
        kl_weight=None,
        **kwargs,
    ):
        kwargs.pop("kernel_decay", None)
        super().__init__(
            units,
            seeds,
            activation=activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer
            or keras.initializers.TruncatedNormal(stddev=1e-5),
            bias_initializer=bias_initializer,
            **kwargs,
        )
        self.stddev_initializer = keras.initializers.serialize(
            keras.initializers.get(
                stddev_initializer or keras.initializers.RandomUniform(*RHO_RANGE)
            )
        )
        self.prior_stddev = _per_replica("prior_stddev", prior_stddev, self.replicas, self.name)
        if min(self.prior_stddev) <= 0:
            raise ValueError(f"{self.name}: prior_stddev must be positive, got {prior_stddev}.")
        self.kl_weight = _per_replica("kl_weight", kl_weight, self.replicas, self.name)
        # Independent streams per replica for the init of rho, the noise and the two signs.
        self._rho_seeds, self._noise_seeds, self._in_seeds, self._out_seeds = (
            replica_seeds(self.seeds, salt) for salt in range(1, 5)
        )

    def build(self, input_shape):
        super().build(input_shape)
        rho = self._draw(self.stddev_initializer, self.kernel.shape[1:], self._rho_seeds)
        self.kernel_rho = self.add_weight(
            name="kernel_rho", shape=rho.shape, initializer=keras.initializers.Constant(rho)
        )
        self.counter = _call_counter(self)

    @property
    def kernel_stddev(self):
        return tf.nn.softplus(self.kernel_rho)

    def kl_divergence(self):
        """`[R]`: each replica's `KL[q_r(W) || N(0, prior_stddev[r]^2)]`, summed over entries."""
        prior = tf.constant(self.prior_stddev, self.kernel.dtype)[:, None, None]
        ratio = self.kernel_stddev / prior
        kl = -tf.math.log(ratio) + 0.5 * (tf.square(ratio) + tf.square(self.kernel / prior)) - 0.5
        return tf.reduce_sum(kl, [1, 2])

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        _check_input(self.name, inputs.shape, self.replicas)
        t = _next_call(self.counter)
        dtype = inputs.dtype
        kernel, stddev = tf.cast(self.kernel, dtype), tf.cast(self.kernel_stddev, dtype)
        eps = _stateless(
            tf.random.stateless_normal, tf.shape(kernel)[1:], self._noise_seeds, t, dtype
        )
        rows = tf.shape(inputs)[1]
        sign_in = _rademacher([rows, tf.shape(inputs)[2]], self._in_seeds, t, dtype)
        sign_out = _rademacher([rows, self.units], self._out_seeds, t, dtype)
        outputs = tf.einsum("rbi,rio->rbo", inputs, kernel)
        outputs += tf.einsum("rbi,rio->rbo", inputs * sign_in, stddev * eps) * sign_out
        if self.bias is not None:
            outputs = outputs + tf.cast(self.bias, dtype)[:, None, :]
        if self.kl_weight is not None:
            weight = tf.constant(self.kl_weight, self.kernel.dtype)
            self.add_loss(tf.reduce_sum(weight * self.kl_divergence()))
        return self.activation(outputs)

    def get_config(self):
        config = super().get_config()
        config.pop("kernel_decay")
        return {
            **config,
            "stddev_initializer": self.stddev_initializer,
            "prior_stddev": self.prior_stddev,
            "kl_weight": self.kl_weight,
        }


def _rademacher(shape, seeds, t, dtype):
    draws = _stateless(
        lambda shape, seed, dtype: tf.random.stateless_uniform(
            shape, seed=seed, minval=0, maxval=2, dtype=tf.int32
        ),
        shape,
        seeds,
        t,
        tf.int32,
    )
    return tf.cast(2 * draws - 1, dtype)


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

    independent_rows = True  # every row has its own mask: Monte Carlo draws may share a call

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
        self.counter = _call_counter(self)

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        _check_input(self.name, inputs.shape, self.replicas)
        if not any(self.rates):
            return inputs
        t = _next_call(self.counter)
        uniforms = _stateless(
            tf.random.stateless_uniform, tf.shape(inputs)[1:], self.seeds, t, inputs.dtype
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
    `y[r] ~ N(means[r], sigma_r^2)`. Fixed (MC dropout's `1 / tau`) or learned, with
    `sigma_r^2 = softplus(raw_r)` as `blayers.layers.GaussianLikelihood` parameterizes it.

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
        self.raw_noise_variance = self.add_weight(
            name="noise_variance",
            shape=(self.replicas,),
            initializer=keras.initializers.Constant(
                [float(constraints_lib.softplus_inverse(v)) for v in self.variances]
            ),
            trainable=self.trainable,
        )

    @property
    def noise_variance(self):
        """`[R]`: each replica's noise variance."""
        return tf.nn.softplus(self.raw_noise_variance)

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        _check_input(self.name, inputs.shape, self.replicas)
        log_variance = tf.math.log(tf.cast(self.noise_variance, inputs.dtype))[:, None, None]
        return tf.concat([inputs, tf.broadcast_to(log_variance, tf.shape(inputs))], -1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], 2 * input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "variances": self.variances, "replicas": self.replicas}
