"""Spectral normalization (Miyato et al., 2018) with a soft bound (Liu et al., 2020, SNGP).

The wrapped layer computes with `W / max(1, sigma(W) / c)`: its spectral norm `sigma(W)` is
estimated by power iteration (one step per training call, the vectors `u`, `v` kept as
non-trainable variables and carried across steps), and only kernels whose norm exceeds the
bound `c` (`norm_multiplier`) are scaled down, which bounds the layer's Lipschitz constant
while leaving small kernels alone: the distance-preserving hidden mapping of SNGP. Gradients
flow through the normalization (`u`, `v` are constants of the step, as in Miyato et al.).

The wrapped layer keeps its own `kernel` variable, unnormalized; the wrapper substitutes the
normalized kernel for one call (`keras.StatelessScope`), so any layer with a `kernel` works:
`keras.layers.Dense`, `Conv2D`, blayers' deterministic twins.

* `SpectralNormalization(layer)`: `sigma` of the kernel reshaped to `[-1, out]`, the bound
  used for dense layers.
* `SpectralNormalizationConv2D(layer)`: `sigma` of the convolution *operator* on the layer's
  input size (Gouk et al., 2021), by power iteration with the convolution and its transpose,
  which is the Lipschitz constant of the convolution itself.
"""

import keras
import tensorflow as tf

from blayers.layers.base import NestedLayers, register

__all__ = ["SpectralNormalization", "SpectralNormalizationConv2D"]


class _SpectralNormBase(NestedLayers, keras.layers.Layer):
    nested_layer_args = ("layer",)

    def __init__(self, layer, iteration=1, norm_multiplier=0.95, **kwargs):
        super().__init__(**kwargs)
        name = f"{type(self).__name__} ({self.name})"
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(f"{name}: `layer` must be a Keras layer, got {layer!r}.")
        if not isinstance(iteration, int) or iteration < 1:
            raise ValueError(f"{name}: iteration must be a positive integer, got {iteration!r}.")
        if not norm_multiplier > 0:
            raise ValueError(f"{name}: norm_multiplier must be > 0, got {norm_multiplier}.")
        self.layer = layer
        self.iteration, self.norm_multiplier = iteration, float(norm_multiplier)

    def _check_kernel(self):
        kernel = getattr(self.layer, "kernel", None)
        if not isinstance(kernel, keras.Variable):
            raise TypeError(
                f"{type(self).__name__} ({self.name}): the wrapped layer "
                f"{self.layer.name!r} has no deterministic `kernel` variable to normalize."
            )
        return kernel

    def normalized_kernel(self, training=False):
        """`(W / max(1, sigma / c), sigma)`; in training one power-iteration step updates `u`
        and `v`."""
        kernel = tf.convert_to_tensor(self.layer.kernel)
        u, v = tf.convert_to_tensor(self.u), tf.convert_to_tensor(self.v)
        if training:
            for _ in range(self.iteration):
                u, v = self._power_step(kernel, u)
            self.u.assign(u)
            self.v.assign(v)
        u, v = tf.stop_gradient(u), tf.stop_gradient(v)
        sigma = self._sigma(kernel, u, v)
        factor = tf.maximum(1.0, sigma / self.norm_multiplier)
        return kernel / factor, sigma

    def call(self, inputs, training=None):
        kernel, _ = self.normalized_kernel(bool(training))
        with keras.StatelessScope(state_mapping=[(self.layer.kernel, kernel)]):
            return self.layer(inputs)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "iteration": self.iteration,
            "norm_multiplier": self.norm_multiplier,
            **self._nested_config(),
        }


@register
class SpectralNormalization(_SpectralNormBase):
    """Spectral normalization of a dense-like layer's kernel (reshaped to `[-1, out]`):
    `W / max(1, sigma(W) / norm_multiplier)`, `sigma` by power iteration.

    Args:
      layer: the wrapped Keras layer (with a deterministic `kernel`).
      iteration: power-iteration steps per training call.
      norm_multiplier: the bound `c` on the spectral norm (SNGP's 0.95; smaller = smoother).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
        kernel = self._check_kernel()
        rows, cols = int(tf.reduce_prod(kernel.shape[:-1])), int(kernel.shape[-1])
        normal = keras.initializers.RandomNormal()
        self.u = self.add_weight(name="u", shape=(cols,), initializer=normal, trainable=False)
        self.v = self.add_weight(name="v", shape=(rows,), initializer=normal, trainable=False)

    def _power_step(self, kernel, u):
        matrix = tf.reshape(kernel, [-1, kernel.shape[-1]])
        v = tf.math.l2_normalize(tf.linalg.matvec(matrix, u))
        u = tf.math.l2_normalize(tf.linalg.matvec(matrix, v, transpose_a=True))
        return u, v

    def _sigma(self, kernel, u, v):
        matrix = tf.reshape(kernel, [-1, kernel.shape[-1]])
        return tf.tensordot(v, tf.linalg.matvec(matrix, u), 1)


@register
class SpectralNormalizationConv2D(_SpectralNormBase):
    """Spectral normalization of a 2-D convolution as an operator (Gouk et al., 2021; the SNGP
    convolutional bound): `sigma` is the largest singular value of the linear map
    `x -> conv(x, W)` on inputs of the layer's spatial size, found by power iteration with
    `conv` and `conv_transpose`.

    Args:
      layer: a `keras.layers.Conv2D` (or a blayers deterministic twin) with known input size.
      iteration: power-iteration steps per training call.
      norm_multiplier: the bound `c` on the operator norm.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
        kernel = self._check_kernel()
        if None in tuple(input_shape[1:3]):
            raise ValueError(
                f"SpectralNormalizationConv2D ({self.name}) needs known spatial input sizes, got "
                f"{input_shape}."
            )
        if any(d != 1 for d in getattr(self.layer, "dilation_rate", (1, 1))):
            raise ValueError(f"SpectralNormalizationConv2D ({self.name}): dilation unsupported.")
        self._strides = tuple(self.layer.strides)
        self._padding = str(self.layer.padding).upper()
        self._in_shape = (1, *tuple(input_shape[1:3]), int(kernel.shape[2]))
        out_shape = self.layer.compute_output_shape((1, *tuple(input_shape[1:])))
        normal = keras.initializers.RandomNormal()
        self.u = self.add_weight(
            name="u", shape=tuple(out_shape), initializer=normal, trainable=False
        )
        self.v = self.add_weight(
            name="v", shape=self._in_shape, initializer=normal, trainable=False
        )

    def _conv(self, x, kernel):
        return tf.nn.conv2d(x, kernel, self._strides, self._padding)

    def _power_step(self, kernel, u):
        v = tf.nn.conv2d_transpose(u, kernel, self._in_shape, self._strides, self._padding)
        v = tf.reshape(tf.math.l2_normalize(tf.reshape(v, [-1])), self._in_shape)
        u = self._conv(v, kernel)
        u = tf.reshape(tf.math.l2_normalize(tf.reshape(u, [-1])), tf.shape(u))
        return u, v

    def _sigma(self, kernel, u, v):
        return tf.reduce_sum(self._conv(v, kernel) * u)
