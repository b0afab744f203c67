"""Constraints mapping an unconstrained variable to a constrained parameter.

Unlike Keras constraints (projections applied after each optimizer step), these are
*parameterizations*, applied every time the parameter is used: a trainable initializer stores an
unconstrained variable `rho` and builds its distribution with `scale = constraint(rho)`, so the
optimizer works in an unconstrained space (Blundell et al., 2015, use `softplus`).

`get` also accepts Keras constraint names and objects, which the deterministic path of a layer
(`kernel_initializer` not a distribution) passes to `add_weight` as usual.
"""

import keras
import tensorflow as tf

from blayers.registry import Registry

__all__ = ["Exp", "Positive", "Softplus", "deserialize", "get", "serialize"]

_REGISTRY = Registry(
    "constraint", "blayers.constraints", keras.constraints.get, "'non_neg', 'max_norm'"
)
_register = _REGISTRY.register


@_register("softplus")
class Softplus(keras.constraints.Constraint):
    """`softplus(w) = log(1 + exp(w))`: smooth, positive, linear for large `w`."""

    def __call__(self, w):
        return tf.nn.softplus(w)

    def inverse(self, y):
        """`softplus^{-1}(y) = log(expm1(y))`, computed stably for small and large `y`."""
        y = tf.convert_to_tensor(y)
        return y + tf.math.log(-tf.math.expm1(-y))

    def get_config(self):
        return {}


@_register("positive")
class Positive(keras.constraints.Constraint):
    """`max(w, epsilon)`: positive by clipping (gradients vanish below `epsilon`)."""

    def __init__(self, epsilon=1e-7):
        self.epsilon = epsilon

    def __call__(self, w):
        return tf.maximum(w, tf.cast(self.epsilon, w.dtype))

    def inverse(self, y):
        return tf.convert_to_tensor(y)

    def get_config(self):
        return {"epsilon": self.epsilon}


@_register("exp")
class Exp(keras.constraints.Constraint):
    """`exp(w)`: positive; the log-parameterization of scales."""

    def __call__(self, w):
        return tf.exp(w)

    def inverse(self, y):
        return tf.math.log(tf.convert_to_tensor(y))

    def get_config(self):
        return {}


get = _REGISTRY.get
serialize = _REGISTRY.serialize
deserialize = _REGISTRY.deserialize
