"""Bayesian convolutions: `Conv1D`, `Conv2D`, `Conv3D` and `Conv2DTranspose`, each with the
Reparameterization, Flipout and local-reparameterization estimators.

The kernel (`kernel_size + (in_channels, filters)`; transposed: `kernel_size + (filters,
in_channels)`) has a distribution from `kernel_initializer` (default `trainable_normal`) and a
KL regularizer (default `normal_kl_divergence`), exactly as the dense layers: the estimators are
the shared ones of `blayers.layers.estimators` applied to the convolution. Flipout signs are per
example and per channel (shared over positions, as Wen et al.); since a convolution reuses each
weight at many positions, drawing the weights is cheap beside the arithmetic.

Arguments follow `keras.layers.Conv2D` (`filters`, `kernel_size`, `strides`, `padding`,
`dilation_rate`, `activation`, `use_bias`, ...). Only `data_format='channels_last'` is supported.
"""

import keras
import tensorflow as tf

from blayers.layers.base import WEIGHT_ARGS, BayesianLayer, register
from blayers.layers.estimators import (
    FlipoutEstimator,
    LocalReparameterizationEstimator,
    ReparameterizationEstimator,
)

__all__ = [
    f"{family}{estimator}"
    for family in ("Conv1D", "Conv2D", "Conv3D", "Conv2DTranspose")
    for estimator in ("Reparameterization", "Flipout", "LocalReparameterization")
]


def _tuple(value, rank, name):
    if isinstance(value, int):
        return (value,) * rank
    value = tuple(int(v) for v in value)
    if len(value) != rank:
        raise ValueError(f"`{name}` must be an int or {rank} ints, got {value}.")
    return value


class _ConvBase(BayesianLayer):
    """Shared constructor, build, forward pass and config of the Bayesian convolutions."""

    _args_doc = (
        """    Args:
      filters: output channels.
      kernel_size: an int or a tuple, one entry per spatial axis.
      strides: an int or a tuple (default 1).
      padding: `'valid'` or `'same'`.
      data_format: `'channels_last'` only.
      dilation_rate: an int or a tuple (default 1).
      activation: Keras activation (default none).
      use_bias: add a bias per filter.
"""
        + WEIGHT_ARGS
        + """
    A Keras mask (a padded sequence) passes through with stride 1 and `'same'` padding;
    masked steps are zeroed first, so they do not reach their neighbours' outputs.
"""
    )

    rank = None
    transpose = False
    _keras_twin = None  # the Keras layer with the same shapes (for output-shape inference)

    def __init__(
        self,
        filters,
        kernel_size,
        strides=1,
        padding="valid",
        data_format="channels_last",
        dilation_rate=1,
        activation=None,
        use_bias=True,
        kernel_initializer="trainable_normal",
        bias_initializer="zeros",
        kernel_regularizer="prior",
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, activity_regularizer=activity_regularizer, **kwargs)
        name = type(self).__name__
        if not isinstance(filters, int) or filters <= 0:
            raise ValueError(f"{name} needs a positive integer `filters`, got {filters!r}.")
        if data_format not in (None, "channels_last"):
            raise ValueError(
                f"{name} supports data_format='channels_last' only, got {data_format!r}."
            )
        if str(padding).lower() not in ("valid", "same"):
            raise ValueError(f"{name}: padding must be 'valid' or 'same', got {padding!r}.")
        self.filters = filters
        self.kernel_size = _tuple(kernel_size, self.rank, "kernel_size")
        self.strides = _tuple(strides, self.rank, "strides")
        self.padding = str(padding).lower()
        self.dilation_rate = _tuple(dilation_rate, self.rank, "dilation_rate")
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self._configure_weight("kernel", kernel_initializer, kernel_regularizer, kernel_constraint)
        self._configure_weight("bias", bias_initializer, bias_regularizer, bias_constraint)
        self.input_spec = keras.layers.InputSpec(ndim=self.rank + 2)
        self.supports_masking = True

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                f"{type(self).__name__} ({self.name}) needs a known number of "
                f"input channels, got input shape {input_shape}."
            )
        pair = (self.filters, channels) if self.transpose else (channels, self.filters)
        self.add_bayesian_weight("kernel", self.kernel_size + pair)
        if self.use_bias:
            self.add_bayesian_weight("bias", (self.filters,))
        else:
            self.bias = None
        self.input_spec = keras.layers.InputSpec(ndim=self.rank + 2, axes={-1: channels})

    def _linear(self, inputs, kernel):
        if self.transpose:
            return keras.ops.conv_transpose(
                inputs, kernel, self.strides, self.padding, dilation_rate=self.dilation_rate
            )
        return keras.ops.conv(
            inputs, kernel, self.strides, self.padding, dilation_rate=self.dilation_rate
        )

    def call(self, inputs, mask=None):
        self.call_weights()
        inputs = tf.convert_to_tensor(inputs, dtype=self.compute_dtype)
        if mask is not None:  # padded steps contribute nothing to their neighbours' outputs
            inputs = inputs * tf.cast(mask, inputs.dtype)[..., None]
        return self.add_bias_and_activate(self.apply_kernel(inputs))

    def compute_mask(self, inputs, mask=None):
        """A mask (e.g. of a padded sequence) passes on where the output keeps the input's
        positions: stride 1, 'same' padding, no transposition; otherwise it is dropped."""
        if mask is None or self.transpose or self.padding != "same":
            return None
        return mask if all(s == 1 for s in self.strides) else None

    def compute_output_shape(self, input_shape):
        twin = self._keras_twin(
            self.filters,
            self.kernel_size,
            strides=self.strides,
            padding=self.padding,
            dilation_rate=self.dilation_rate,
        )
        return tuple(twin.compute_output_shape(input_shape))

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.filters,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "padding": self.padding,
            "dilation_rate": self.dilation_rate,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            **self._weight_config("kernel"),
            **self._weight_config("bias"),
        }


class _Conv1D(_ConvBase):
    rank, _keras_twin = 1, keras.layers.Conv1D


class _Conv2D(_ConvBase):
    rank, _keras_twin = 2, keras.layers.Conv2D


class _Conv3D(_ConvBase):
    rank, _keras_twin = 3, keras.layers.Conv3D


class _Conv2DTranspose(_ConvBase):
    rank, transpose, _keras_twin = 2, True, keras.layers.Conv2DTranspose


@register
class Conv1DReparameterization(ReparameterizationEstimator, _Conv1D):
    """1-D convolution, one kernel draw per call."""


@register
class Conv1DFlipout(FlipoutEstimator, _Conv1D):
    """1-D convolution, Flipout (signs per example and channel)."""


@register
class Conv1DLocalReparameterization(LocalReparameterizationEstimator, _Conv1D):
    """1-D convolution, pre-activations sampled from `N(conv(x, M), conv(x^2, S^2))`."""


@register
class Conv2DReparameterization(ReparameterizationEstimator, _Conv2D):
    """2-D convolution, one kernel draw per call."""


@register
class Conv2DFlipout(FlipoutEstimator, _Conv2D):
    """2-D convolution, Flipout (signs per example and channel)."""


@register
class Conv2DLocalReparameterization(LocalReparameterizationEstimator, _Conv2D):
    """2-D convolution, pre-activations sampled from `N(conv(x, M), conv(x^2, S^2))`."""


@register
class Conv3DReparameterization(ReparameterizationEstimator, _Conv3D):
    """3-D convolution, one kernel draw per call."""


@register
class Conv3DFlipout(FlipoutEstimator, _Conv3D):
    """3-D convolution, Flipout (signs per example and channel)."""


@register
class Conv3DLocalReparameterization(LocalReparameterizationEstimator, _Conv3D):
    """3-D convolution, pre-activations sampled from `N(conv(x, M), conv(x^2, S^2))`."""


@register
class Conv2DTransposeReparameterization(ReparameterizationEstimator, _Conv2DTranspose):
    """Transposed 2-D convolution, one kernel draw per call."""


@register
class Conv2DTransposeFlipout(FlipoutEstimator, _Conv2DTranspose):
    """Transposed 2-D convolution, Flipout (signs per example and channel)."""


@register
class Conv2DTransposeLocalReparameterization(LocalReparameterizationEstimator, _Conv2DTranspose):
    """Transposed 2-D convolution, pre-activations sampled from
    `N(conv_t(x, M), conv_t(x^2, S^2))`."""
