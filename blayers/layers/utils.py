"""edward2's layer utilities (`ed.layers.utils`) under their edward2 names: modular arithmetic
of one-hot vectors (for discrete flows), Sinkhorn normalization and hard permutations, the
mean-field logits, and `add_weight`, which makes any Keras layer class take distribution
initializers (`'trainable_normal'`, ...) for its weights.
"""

import functools

import keras
import tensorflow as tf

from blayers import initializers, regularizers
from blayers.layers.discrete_flows import (
    hard_permutation,
    one_hot_add,
    one_hot_argmax,
    one_hot_minus,
    one_hot_multiply,
    sinkhorn,
)
from blayers.layers.discrete_flows import multiplicative_inverse as _multiplicative_inverse
from blayers.layers.gp.sngp import mean_field_logits

__all__ = [
    "add_weight",
    "mean_field_logits",
    "multiplicative_inverse",
    "one_hot_add",
    "one_hot_argmax",
    "one_hot_minus",
    "one_hot_multiply",
    "sinkhorn",
    "soft_to_hard_permutation",
]


def multiplicative_inverse(a, n=None):
    """The one-hot inverse modulo `K` of one-hot `a` `[..., K]`. `n`: edward2's modulus
    argument, which must be the vocabulary size `K` (the one-hot width) when given."""
    if n is not None and int(n) != a.shape[-1]:
        raise ValueError(
            f"multiplicative_inverse: the modulus n={n} must be the one-hot width "
            f"{a.shape[-1]} (the vocabulary size)."
        )
    return _multiplicative_inverse(tf.convert_to_tensor(a))


def soft_to_hard_permutation(inputs):
    """Permutation matrices `[B, K, K]` from (doubly stochastic) scores `[..., K, K]`, with the
    straight-through gradient of the scores (`hard + scores - stop_gradient(scores)`). The
    matching is blayers' greedy one (`hard_permutation`, a TF op), where edward2 runs scipy's
    Hungarian algorithm: both give a permutation, maybe not the same one on near ties."""
    inputs = tf.convert_to_tensor(inputs)
    vocab = inputs.shape[-1]
    scores = tf.reshape(inputs, [-1, vocab, vocab])
    hard = hard_permutation(scores)
    return tf.stop_gradient(hard - scores) + scores


def add_weight(cls):
    """Class decorator (edward2's `ed.layers.utils.add_weight`): a subclass of the Keras layer
    `cls` whose weights may take distribution initializers. A weight built with one (say
    `keras.layers.Dense(..., kernel_initializer=blayers.initializers.TrainableNormal())`)
    is a random variable: its variational parameters are the initializer's variables, tracked
    by the layer, and every call draws it anew and adds its regularizer's KL to `losses` (a
    distribution regularizer with trainable parameters, such as
    `TrainableNormalKLDivergenceStdDev`, is built and tracked too). Weights with ordinary Keras
    initializers stay deterministic. The draw is a Reparameterization one (the weight itself
    is sampled); the paper's estimators with lower variance are blayers' own layers.

    Example: `BayesianConv3D = blayers.layers.utils.add_weight(keras.layers.Conv3D)`.
    """

    @functools.wraps(cls, updated=())
    class RandomWeights(cls):
        def add_weight(
            self, shape=None, initializer=None, dtype=None, regularizer=None, name=None, **kwargs
        ):
            if isinstance(regularizer, keras.layers.Layer) and not regularizer.built:
                regularizer.build(shape)  # a prior with trainable parameters
            if not initializers.is_distribution_initializer(initializer):
                if isinstance(regularizer, regularizers.DistributionRegularizer):
                    regularizer = None  # a KL has no meaning for a deterministic weight
                return super().add_weight(
                    shape=shape,
                    initializer=initializer,
                    dtype=dtype,
                    regularizer=regularizer,
                    name=name,
                    **kwargs,
                )
            shape = tuple(int(d) for d in shape)
            if not initializer.built:
                initializer.dtype_policy = self.dtype_policy
                initializer.name = name  # stable paths: '<layer>/<weight>/mean'
                initializer.build(shape)
            initializer.variable_name = f"{self.name}/{name}"
            value = initializer(shape, dtype)
            if not hasattr(self, "_drawn_weights"):
                self._drawn_weights = []
            # The attribute the layer keeps the weight in is known after `build`.
            self._drawn_weights.append([None, value, initializer, regularizer, shape, dtype])
            # Tracked by this layer: their variables join `layer.weights` and train.
            setattr(self, f"_{name}_distribution", initializer)
            if isinstance(regularizer, keras.layers.Layer):
                setattr(self, f"_{name}_prior", regularizer)
            return value

        @functools.wraps(cls.call)  # Keras reads the call's signature (`inputs`, `training`)
        def call(self, *args, **kwargs):
            for entry in getattr(self, "_drawn_weights", ()):
                attribute, value, initializer, regularizer, shape, dtype = entry
                if attribute is None:
                    attribute = next(k for k, v in vars(self).items() if v is value)
                    entry[0] = attribute
                entry[1] = initializer(shape, dtype)
                object.__setattr__(self, attribute, entry[1])
                if regularizer is not None:
                    self.add_loss(regularizer(entry[1]))
            return super().call(*args, **kwargs)

    RandomWeights.__name__ = RandomWeights.__qualname__ = cls.__name__
    return RandomWeights
