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

from blayers import constraints, initializers, regularizers, sampling
from blayers.config import configurable
from blayers.random_variable import RandomVariable

__all__ = ["BayesianLayer", "NestedLayers", "is_fixed", "register"]


def register(cls):
    """Registers a layer class for Keras serialization and as a gin configurable (in place, so
    the exported class is the configurable: `DenseFlipout.units = 7` changes
    `blayers.layers.DenseFlipout()`)."""
    return configurable(cls.__name__, "blayers.layers", "blayers.layers")(cls)


def is_fixed(weight):
    """True if `weight` is deterministic: a variable/tensor, or a random variable whose value an
    interceptor fixed (it was constructed with a value)."""
    return not isinstance(weight, RandomVariable) or weight.has_value


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


class BayesianLayer(keras.layers.Layer):
    """Base class for layers whose weights may be random variables.

    Subclasses call `self._configure_weight(name, initializer, regularizer, constraint)` in
    `__init__`, `self.add_bayesian_weight(name, shape)` in `build`, and `self.call_weights()` at
    the start of `call` (recurrent cells: once per sequence). `seed` seeds the layer's own noise
    (Flipout signs, local-reparameterization noise); initializers carry their own seeds.
    """

    def __init__(self, seed=None, **kwargs):
        activity_regularizer = kwargs.pop("activity_regularizer", None)
        super().__init__(
            activity_regularizer=keras.regularizers.get(activity_regularizer), **kwargs
        )
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self._bayesian_weights = {}  # name -> shape, in build order
        self._random_weight_names = []

    # Keras' jit_compile='auto' asks every layer; XLA's CPU random kernels are slow.
    @property
    def supports_jit(self):
        return self._supports_jit and sampling.xla_is_fast()

    @supports_jit.setter
    def supports_jit(self, value):
        self._supports_jit = value

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
        """Creates weight `name` of `shape` (in `build`): random or deterministic by initializer."""
        shape = tuple(int(d) for d in shape)
        init = getattr(self, f"{name}_initializer")
        reg = getattr(self, f"{name}_regularizer")
        self._bayesian_weights[name] = shape
        if initializers.is_distribution_initializer(init):
            if not init.built:  # on load, Keras may have built it already
                init.build(shape)
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
                    initializer=init,
                    regularizer=reg,
                    constraint=getattr(self, f"{name}_constraint"),
                ),
            )

    def random_weight_names(self):
        """Names of the weights that are random variables (e.g. `['kernel']`)."""
        return list(self._random_weight_names)

    # -- per forward pass ------------------------------------------------------------------------
    def call_weights(self):
        """Draws every random weight anew and adds its regularizer (KL) to `self.losses`."""
        for name in self._random_weight_names:
            rv = getattr(self, f"{name}_initializer")(self._bayesian_weights[name], self.dtype)
            setattr(self, name, rv)
            regularizer = getattr(self, f"{name}_regularizer")
            if regularizer is not None:
                self._add_weight_loss(regularizer(rv))

    def _add_weight_loss(self, loss):
        """Records a weight's KL; recurrent cells keep theirs per sequence instead."""
        self.add_loss(loss)

    def apply_kernel(self, inputs, name="kernel"):
        """`_linear(inputs, kernel)`: deterministic for a fixed kernel, else the estimator's
        `_random_linear` (supplied by an estimator mixin, see `blayers.layers.estimators`)."""
        kernel = getattr(self, name)
        if is_fixed(kernel):
            return self._linear(inputs, tf.convert_to_tensor(kernel))
        return self._random_linear(inputs, kernel)

    def add_bias_and_activate(self, outputs):
        """`activation(outputs + bias)`, the common tail of the layers with `use_bias` and
        `activation` (a random bias contributes its draw)."""
        if self.use_bias:
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
        config["seed"] = self.seed
        if self.activity_regularizer is not None:
            config["activity_regularizer"] = keras.regularizers.serialize(self.activity_regularizer)
        return config
