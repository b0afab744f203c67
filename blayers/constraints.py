"""Constraints mapping an unconstrained variable to a constrained parameter.

Unlike Keras constraints (projections applied after each optimizer step), these are
*parameterizations*, applied every time the parameter is used: a trainable initializer stores an
unconstrained variable `rho` and builds its distribution with `scale = constraint(rho)`, so the
optimizer works in an unconstrained space (Blundell et al., 2015, use `softplus`).

`get` also accepts Keras constraint names and objects, which the deterministic path of a layer
(`kernel_initializer` not a distribution) passes to `add_weight` as usual.
"""

import keras
import numpy as np
import tensorflow as tf

from blayers import fused
from blayers.registry import Registry

__all__ = ["Exp", "Positive", "Softplus", "deserialize", "get", "serialize", "softplus_inverse"]

_REGISTRY = Registry(
    "constraint", "blayers.constraints", keras.constraints.get, "'non_neg', 'max_norm'"
)
_register = _REGISTRY.register


def softplus_inverse(y):
    """`softplus^{-1}(y) = log(expm1(y)) = y + log(-expm1(-y))`, stable for small and large `y`
    (the naive form overflows to inf for `y` above about 88 in float32 and 709 in float64).

    A Python number or NumPy array gives a NumPy float64 result (for initial values); a tensor
    gives a tensor.
    """
    if tf.is_tensor(y):
        return y + tf.math.log(-tf.math.expm1(-y))
    y = np.asarray(y, np.float64)
    if np.any(y <= 0):
        raise ValueError(f"softplus_inverse needs positive values, got {y}.")
    return y + np.log(-np.expm1(-y))


@_register("softplus")
class Softplus(keras.constraints.Constraint):
    """`softplus(w) = log(1 + exp(w))`: smooth, positive, linear for large `w`."""

    def __call__(self, w):
        return fused.softplus(w)

    def with_square(self, w):
        """`(softplus(w), softplus(w)^2)` in one fused pass (`fused.softplus_and_square`)."""
        return fused.softplus_and_square(w)

    def inverse(self, y):
        """`softplus^{-1}(y)`, stably (`softplus_inverse`)."""
        return softplus_inverse(tf.convert_to_tensor(y))

    def get_config(self):
        return {}


@_register("positive")
class Positive(keras.constraints.Constraint):
    """`max(w, epsilon)`: positive by clipping (gradients vanish below `epsilon`).

    Args:
      epsilon: the smallest value.
    """

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
