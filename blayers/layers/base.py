"""The one mechanism for "a layer with distributions over its weights".

`BayesianLayer` turns each weight declared with `add_bayesian_weight` into either

* a random weight, when its initializer is a distribution initializer (`trainable_normal`, ...):
  the initializer sub-layer holds the variational parameters; every forward pass
  (`call_weights`) draws a fresh `RandomVariable`, stores it as the attribute (`layer.kernel`) and
  adds `regularizer(rv)` (the KL term) to `layer.losses`;
* an ordinary Keras variable, when its initializer is a Keras one (`'zeros'`, `'glorot_uniform'`):
  the layer then is its deterministic twin. Keras regularizers apply as usual; distribution
  regularizers (the KL defaults) do not apply to point estimates and are skipped.

Estimators (`DenseReparameterization`, `DenseFlipout`, ...) differ only in their forward pass.
When a random weight's value is *fixed* (an interceptor such as `blayers.take_mean` set it, see
`blayers.trace`), every estimator computes the deterministic layer with that value.
"""

import keras
import tensorflow as tf

from blayers import constraints, initializers, regularizers, sampling, seeds
from blayers import replicas as replicas_lib
from blayers.random_variable import RandomVariable
from blayers.registry import ArgsDoc, register_layer

WEIGHT_ARGS = """      kernel_initializer: a distribution initializer (`'trainable_normal'`, the default, a
        mean-field Normal; `'trainable_he_normal'`, ...) makes the kernel random; a Keras
        initializer name (`'glorot_uniform'`) makes it deterministic.
      bias_initializer: likewise for the bias (default `'zeros'`, deterministic).
      kernel_regularizer: the kernel's KL term, added to `layer.losses` on every call
        (default `'prior'`, the gin-configurable default prior, N(0, 1) unless rebound).
      bias_regularizer: likewise for the bias (default None).
      kernel_constraint, bias_constraint: Keras constraints of deterministic weights.
      seed: seeds the layer's own noise (Flipout signs, local-reparameterization noise).
      replicas: None (an ordinary layer) or `R`, the number of independent replicas of the layer
        (`blayers.replicas`): every weight gains a leading axis of `R`, inputs and outputs are
        `[R, batch, ...]`, and the KL is the sum of the replicas'.
      replica_seeds: one int a replica (default `0..R-1`): replica `r`'s initial weights and
        noise depend on its seed alone, whatever group it trains in.
      **kwargs: `keras.layers.Layer` arguments (`name`, `dtype`, `activity_regularizer`, ...).
"""

__all__ = [
    "WEIGHT_ARGS",
    "AddsKL",
    "BayesianLayer",
    "LocalLosses",
    "NamedOutput",
    "NestedLayers",
    "SeededLayer",
    "is_fixed",
    "register",
]


register = register_layer  # the one decorator of a public layer (see `blayers.registry`)


def is_fixed(weight):
    """True if `weight` is deterministic: a variable/tensor, or a random variable whose value an
    interceptor fixed (it was constructed with a value). A value drawn lazily (a Monte Carlo
    KL reads it) does not make the weight fixed: the estimator still applies."""
    return not isinstance(weight, RandomVariable) or weight.value_given


class AddsKL:
    """Marker mixin: this layer adds a KL term of its own to `losses` (not through a weight's
    regularizer: a sparse GP's `KL[q(u) || p(u)]`), multiplied by its `scale_factor` attribute,
    which `blayers.set_kl_scale` sets to `1 / N` like every weight regularizer's."""

    scale_factor = 1.0


class LocalLosses:
    """Marker mixin: this layer's `losses` are per-example averages already (a VAE's latent KL,
    a VQ-VAE's codebook and commitment losses), so the ELBO adds them to the likelihood term
    as they are instead of dividing them by the data-set size like a weight's KL
    (`blayers.objectives.split_losses`)."""


class NamedOutput:
    """Mixin for layers that return a `RandomVariable` (stochastic output and GP layers): the
    variable is named `output_name` (default: the layer's name), the name `blayers.condition`,
    `blayers.tape` and `blayers.programs.make_log_joint` know it by. A posterior program's layer
    passes the name of the model's variable it approximates (`output_name='f'`)."""

    def __init__(self, *args, output_name=None, **kwargs):
        super().__init__(*args, **kwargs)
        if output_name is not None and (not isinstance(output_name, str) or not output_name):
            raise ValueError(
                f"{type(self).__name__} ({self.name}): output_name must be a non-empty string, "
                f"got {output_name!r}."
            )
        self._output_name = output_name

    @property
    def output_name(self):
        """The name of the random variable this layer returns."""
        return self._output_name or self.name

    def get_config(self):
        return {**super().get_config(), "output_name": self._output_name}


class NestedLayers:
    """Mixin for layers built from other layers passed as constructor arguments (a flow's
    `network`, a RevNet's `f` and `g`): serializes and restores the arguments named in
    `nested_layer_args`."""

    nested_layer_args = ()

    def _nested_config(self):
        return {
            name: keras.saving.serialize_keras_object(getattr(self, name))
            for name in self.nested_layer_args
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for name in cls.nested_layer_args:
            config[name] = keras.saving.deserialize_keras_object(config[name])
        return cls(**config)


class SeededLayer(ArgsDoc, keras.layers.Layer):
    """A layer that draws fresh stateless seeds on every call: stochastic output layers, MC
    dropout, GP layers, and (through `BayesianLayer`) every layer with random weights.

    A layer that sets `supports_replicas` also takes `replicas` and `replica_seeds`
    (`blayers.replicas`): its per-call seed is then shared by the replicas, and each replica's
    draws are mixed with its own key (`replica_keys`), so they depend on its seed alone.

    Args:
      seed: seeds the layer's `keras.random.SeedGenerator` (None: from the global seed set by
        `blayers.set_seed`). Its state is a variable of the layer, so checkpoints carry it.
      replicas: None, or the number of independent replicas (layers that support them).
      replica_seeds: one int a replica (default `0..replicas-1`).
      **kwargs: `keras.layers.Layer` arguments (`name`, `dtype`, `trainable`, ...).
    """

    supports_replicas = False

    def __init__(self, seed=None, replicas=None, replica_seeds=None, **kwargs):
        super().__init__(**kwargs)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.replicas, self.replica_seeds = replicas_lib.check_replicas(
            self, replicas, replica_seeds, self.supports_replicas
        )
        self.replica_keys = (
            None if self.replicas is None else sampling.replica_keys(self.replica_seeds)
        )

    # Keras' jit_compile='auto' asks every layer; XLA's CPU random kernels are slow.
    @property
    def supports_jit(self):
        return self._supports_jit and sampling.xla_is_fast()

    @supports_jit.setter
    def supports_jit(self, value):
        self._supports_jit = value

    def next_seed(self):
        """A fresh stateless seed (int32, shape [2]) for one random op of this call."""
        return seeds.next_seed(self.seed_generator)

    def replica_initializer(self, initializer):
        """A weight's initializer as this layer's replicas draw it (`ReplicaInitializer`; the
        initializer itself for an ordinary layer)."""
        if self.replicas is None:
            return initializer
        return replicas_lib.ReplicaInitializer(initializer, self.replica_seeds)

    def replica_shape(self, shape):
        """A weight's shape with this layer's replica axis in front (ordinary layers: as is)."""
        shape = tuple(int(d) for d in shape)
        return shape if self.replicas is None else (self.replicas, *shape)

    def replica_broadcast(self, value, rank):
        """A per-replica `[R, ...]` value reshaped to broadcast against `rank`-axis outputs
        (`[R, 1, ..., 1, ...]`); an ordinary layer's value unchanged."""
        if self.replicas is None:
            return value
        value = tf.convert_to_tensor(value)
        inner = value.shape.rank - 1
        return tf.reshape(value, [self.replicas] + [1] * (rank - 1 - inner) + list(value.shape[1:]))

    def get_config(self):
        config = {**super().get_config(), "seed": self.seed}
        if self.replicas is not None:
            config.update(replicas=self.replicas, replica_seeds=self.replica_seeds)
        return config


class BayesianLayer(SeededLayer):
    """Base class for layers whose weights may be random variables.

    The contract a subclass fulfils:

    * `__init__`: `self._configure_weight(name, initializer, regularizer, constraint)` for each
      weight (a distribution initializer such as `'trainable_normal'` makes it random, a Keras
      one deterministic; the regularizer `'prior'` is the gin-configurable default prior,
      `blayers.regularizers.prior`);
    * `build`: `self.add_bayesian_weight(name, shape)` for each weight;
    * `call`: `self.call_weights()` first (recurrent cells: once per sequence), then
      `self.apply_kernel(inputs)` for the linear part and `self.add_bias_and_activate(outputs)`;
    * the hooks it defines: `_linear(inputs, kernel)`, the deterministic linear map of the
      family (dense matmul, convolution, einsum); and the attributes `use_bias` and
      `activation` read by `add_bias_and_activate`;
    * the hook an estimator mixin (`blayers.layers.estimators`) supplies: `linear_fn(kernel_rv)`,
      the forward pass under one draw of a random kernel (Reparameterization, Flipout, local
      reparameterization).

    Weights follow the layer's dtype (`dtype='float64'` gives float64 variational parameters).

    Args:
      seed: seeds the layer's own noise (Flipout signs, local-reparameterization noise);
        initializers carry their own seeds.
      activity_regularizer: as in Keras.
      **kwargs: `keras.layers.Layer` arguments.
    """

    use_bias = False
    activation = None

    # Weights whose estimator reads the variance with the stddev (local reparameterization's
    # kernel): their trainable Normal forms both in one pass.
    _variance_weights = ()

    def __init__(self, seed=None, **kwargs):
        activity_regularizer = kwargs.pop("activity_regularizer", None)
        super().__init__(
            seed=seed, activity_regularizer=keras.regularizers.get(activity_regularizer), **kwargs
        )
        self._bayesian_weights = {}  # name -> shape, in build order
        self._random_weight_names = []

    # -- declaration -----------------------------------------------------------------------------
    def _configure_weight(self, name, initializer, regularizer, constraint):
        try:
            init = initializers.get(initializer)
            reg = regularizers.get(regularizer)
            con = constraints.get(constraint)
        except ValueError as error:
            raise ValueError(f"{type(self).__name__} ({self.name}): {error}") from None
        setattr(self, f"{name}_initializer", init)
        setattr(self, f"{name}_regularizer", reg)
        setattr(self, f"{name}_constraint", con)

    def add_bayesian_weight(self, name, shape):
        """Creates weight `name` of `shape` (in `build`): random or deterministic by initializer.
        A replicated layer's weight is `[replicas, *shape]`, each replica's slice initialized
        as one replica's weight with its own seed."""
        shape = self.replica_shape(shape)
        init = getattr(self, f"{name}_initializer")
        reg = getattr(self, f"{name}_regularizer")
        self._bayesian_weights[name] = shape
        if initializers.is_distribution_initializer(init):
            if not init.built:
                init.dtype_policy = self.dtype_policy  # float64 layers get float64 parameters
                init.replica_seeds = self.replica_seeds
                # Named after the weight: stable paths (`dense_flipout/kernel/mean`) that do not
                # depend on how many initializers a process created, for weight loading and
                # layout maps.
                init.name = name
                init.variance_wanted = name in self._variance_weights
                init.build(shape)
            # The weight's random variable is known as '<layer>/<weight>' (`condition`, `tape`,
            # `blayers.programs.make_log_joint`).
            init.variable_name = f"{self.name}/{name}"
            if isinstance(reg, keras.layers.Layer) and not reg.built:
                reg.build(shape)  # a prior with trainable parameters, tracked by this layer
            self._random_weight_names.append(name)
            setattr(self, name, None)  # filled by call_weights
        else:
            if isinstance(reg, regularizers.DistributionRegularizer):
                reg = None
            setattr(
                self,
                name,
                self.add_weight(
                    name=name,
                    shape=shape,
                    initializer=self.replica_initializer(init),
                    regularizer=reg,
                    constraint=getattr(self, f"{name}_constraint"),
                ),
            )

    def random_weight_names(self):
        """Names of the weights that are random variables (e.g. `['kernel']`)."""
        return list(self._random_weight_names)

    # -- per forward pass ------------------------------------------------------------------------
    def call_weights(self, add_losses=True):
        """Draws every random weight anew and adds its regularizer (KL) to `self.losses`
        (not with `add_losses=False`: a draw outside a Keras call, such as a planner's)."""
        self.set_kl_priors(add_losses)
        for name in self._random_weight_names:
            rv = getattr(self, f"{name}_initializer")(self._bayesian_weights[name], self.dtype)
            setattr(self, name, rv)
        if add_losses:
            for loss in self.weight_kl_terms():
                self.add_loss(loss)

    def set_kl_priors(self, enabled=True):
        """Tells each random weight's initializer the Normal prior of its KL term (`enabled`,
        and the regularizer is `normal_kl_divergence`), so that a trainable Normal forms its
        parameters and their KL in one fused pass; else None (no KL wanted: not computed)."""
        for name in self._random_weight_names:
            init = getattr(self, f"{name}_initializer")
            if isinstance(init, initializers.TrainableInitializer):
                regularizer = getattr(self, f"{name}_regularizer")
                init.kl_prior = regularizers.normal_kl_prior(regularizer) if enabled else None

    def weight_kl_terms(self):
        """The regularizers (KL terms) of the current draw of every random weight."""
        terms = []
        for name in self._random_weight_names:
            regularizer = getattr(self, f"{name}_regularizer")
            if regularizer is not None:
                terms.append(regularizer(getattr(self, name)))
        return terms

    def apply_kernel(self, inputs, name="kernel"):
        """`_linear(inputs, kernel)`: deterministic for a fixed kernel, else the estimator's
        forward pass (`linear_fn`, from an estimator mixin, see `blayers.layers.estimators`)."""
        return self.kernel_fn(name)(inputs)

    def kernel_fn(self, name="kernel", batch_size=None, seed=None):
        """`x -> _linear(x, kernel)` with this call's draw of weight `name` fixed: every
        application shares one weight draw (and, for Flipout, one set of sign seeds), as the
        steps of one sequence do in a recurrent cell. `batch_size` (dense-shaped kernels only)
        lets an estimator draw its per-example noise once, up front; `seed` fixes the
        estimator's own noise (default: the layer's next seed)."""
        kernel = getattr(self, name)
        if is_fixed(kernel):
            fixed = tf.convert_to_tensor(kernel)
            return lambda x: self._linear(x, fixed)
        return self.linear_fn(kernel, batch_size=batch_size, seed=seed)

    def _linear(self, inputs, kernel):
        raise NotImplementedError(  # a declared hook; intentional
            f"{type(self).__name__} defines no `_linear(inputs, kernel)`, the deterministic "
            "linear map that BayesianLayer.apply_kernel needs."
        )

    def linear_fn(self, kernel, batch_size=None, seed=None):
        raise TypeError(
            f"{type(self).__name__} has a random kernel but no estimator: mix in one of "
            "blayers.layers.estimators' ReparameterizationEstimator, FlipoutEstimator or "
            "LocalReparameterizationEstimator."
        )

    def add_bias_and_activate(self, outputs):
        """`activation(outputs + bias)`, the common tail of the layers with `use_bias` and
        `activation` (a random bias contributes its draw)."""
        if self.use_bias and self.replicas is not None:  # `[R, units]`, per replica
            outputs = outputs + self.replica_broadcast(self.bias, outputs.shape.rank)
        elif self.use_bias:
            outputs = tf.nn.bias_add(outputs, tf.convert_to_tensor(self.bias))
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    # -- config ----------------------------------------------------------------------------------
    def _weight_config(self, name, arg_prefix=None):
        """Serialized initializer/regularizer/constraint of weight `name`, keyed by the
        constructor's argument names (`arg_prefix`: e.g. 'recurrent' for 'recurrent_kernel')."""
        prefix = arg_prefix or name
        return {
            f"{prefix}_initializer": initializers.serialize(getattr(self, f"{name}_initializer")),
            f"{prefix}_regularizer": regularizers.serialize(getattr(self, f"{name}_regularizer")),
            f"{prefix}_constraint": constraints.serialize(getattr(self, f"{name}_constraint")),
        }

    def get_config(self):
        config = super().get_config()
        if self.activity_regularizer is not None:
            config["activity_regularizer"] = keras.regularizers.serialize(self.activity_regularizer)
        return config
