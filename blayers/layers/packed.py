"""Packed-Ensembles (Laurent et al., ICLR 2023): `M` independent members, each a network of width
`alpha * C / M` (for a base network of width `C`), packed into grouped layers that run every
member in one op.

The paper packs the members on the channel axis (a grouped convolution with `M * gamma` groups,
`first` and `last` layers excepted). blayers keeps its one ensemble layout instead, the
member-major batch of BatchEnsemble (`blayers.layers.EnsembleTile`, `EnsembleOutput`): rows
`[m B, (m + 1) B)` belong to member `m`, and each row holds that member's own `alpha C / M`
channels. The arithmetic is the paper's: member `m`'s layer maps its input channels to its
output channels through `gamma` independent groups,

    y_m[g] = activation(x_m[g] @ W_{m, g} + b_m[g]),    g = 1..gamma,

with `x_m[g]` the `g`-th block of the member's input channels. A `first` layer reads the raw
input (tiled by `EnsembleTile`, `gamma = 1`); a `last` layer gives each member the base
network's `units` outputs (the classes), which `EnsembleOutput` folds into the members' mixture.
With `alpha = M` and `gamma = 1` the members are a deep ensemble of the base network; with
`alpha = 1` the ensemble costs what one base network costs.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from blayers.initializers import independent_draws
from blayers.layers.base import register
from blayers.layers.batch_ensemble import _conv2d_output_shape
from blayers.layers.ensemble import check_ensemble_size, check_member_major
from blayers.registry import ArgsDoc

__all__ = ["PackedConv2D", "PackedDense", "packed_width"]


def packed_width(units, alpha, num_estimators, gamma=1, last=False):
    """Output channels of one member of a packed layer: `units` for a `last` layer, else
    `ceil(alpha * units / num_estimators)` rounded up to a multiple of `gamma` (the paper's
    `alpha * C` channels over `M` members, made divisible by the groups, as torch-uncertainty
    does)."""
    if last:
        return int(units)
    width = max(math.ceil(alpha * units / num_estimators - 1e-9), 1)
    return int(math.ceil(width / gamma) * gamma)


def _check_positive_int(name, argument, value):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: {argument} must be a positive integer, got {value!r}.")
    return int(value)


class _Packed(ArgsDoc, keras.layers.Layer):
    """A packed layer's shared arguments, weights and member-major bookkeeping; subclasses give
    the grouped linear map (`_grouped`) and the kernel's per-group shape."""

    _args_doc = """    Args:
      units: the base network's width at this layer (for a `last` layer, each member's outputs:
        the classes); each member has `packed_width(units, alpha, num_estimators, gamma)`.
      alpha: width multiplier `alpha` (a positive number): the members together have
        `alpha * units` channels.
      num_estimators: members `M` (the batch holds `M` member-major copies, `EnsembleTile`).
      gamma: groups within each member (the paper's `gamma`); the member's input channels must
        divide by it. A `first` layer has one group.
      first: the network's first packed layer: its input is the raw (tiled) input.
      last: the network's last packed layer: each member outputs `units` channels.
      activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, kernel_constraint, bias_constraint: as Keras' layer of that kind
        (initializers draw every group of every member independently, with the group's fans).
      **kwargs: `keras.layers.Layer` arguments.
"""

    def __init__(
        self,
        units,
        alpha,
        num_estimators,
        gamma=1,
        first=False,
        last=False,
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        name = f"{type(self).__name__} ({self.name})"
        self.units = _check_positive_int(name, "units", units)
        if not isinstance(alpha, (int, float, np.number)) or isinstance(alpha, bool) or alpha <= 0:
            raise ValueError(f"{name}: alpha must be a positive number, got {alpha!r}.")
        self.alpha = alpha
        self.num_estimators = check_ensemble_size(name, num_estimators)
        self.gamma = _check_positive_int(name, "gamma", gamma)
        self.first, self.last = bool(first), bool(last)
        self.groups = 1 if self.first else self.gamma
        self.member_units = packed_width(units, alpha, self.num_estimators, self.groups, last)
        if self.member_units % self.groups:
            raise ValueError(
                f"{name}: a last layer's units ({units}) must divide by gamma ({gamma}); use "
                "gamma=1 on the last layer."
            )
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)

    def _group_input(self, channels):
        if channels is None:
            raise ValueError(
                f"{type(self).__name__} ({self.name}): the channel axis must be known."
            )
        if channels % self.groups:
            raise ValueError(
                f"{type(self).__name__} ({self.name}): each member's input has {channels} "
                f"channels, which do not divide into gamma = {self.groups} groups; give the "
                "previous packed layer units whose member width divides by gamma."
            )
        return channels // self.groups

    def _add_kernel(self, group_shape, shape):
        """The kernel `shape`, initialized as `M * gamma` independent draws of `group_shape`."""
        count = self.num_estimators * self.groups
        initializer = self.kernel_initializer

        def init(shape_, dtype=None):
            draws = independent_draws(initializer, group_shape, count, dtype)
            return tf.reshape(tf.stack(draws), shape_)

        self.kernel = self.add_weight(
            name="kernel",
            shape=shape,
            initializer=init,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(self.num_estimators, self.member_units),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )

    def _members(self, inputs):
        """`[M * B, ...] -> [M, B, ...]` after checking the member-major layout."""
        name = f"{type(self).__name__} ({self.name})"
        batch = check_member_major(tf.shape(inputs)[0], inputs.shape[0], self.num_estimators, name)
        shape = tf.concat(
            [[self.num_estimators, batch // self.num_estimators], tf.shape(inputs)[1:]], 0
        )
        return tf.reshape(inputs, shape)

    def _finish(self, outputs):
        """`[M, B, ..., units_m]` + per-member bias, activation, back to `[M * B, ...]`."""
        if self.use_bias:
            bias = tf.cast(self.bias, outputs.dtype)
            outputs = outputs + tf.reshape(
                bias, [self.num_estimators, 1] + [1] * (outputs.shape.rank - 3) + [-1]
            )
        outputs = tf.reshape(outputs, tf.concat([[-1], tf.shape(outputs)[2:]], 0))
        return self.activation(outputs) if self.activation is not None else outputs

    def get_config(self):
        ser = keras.saving.serialize_keras_object
        return {
            **super().get_config(),
            "units": self.units,
            "alpha": self.alpha,
            "num_estimators": self.num_estimators,
            "gamma": self.gamma,
            "first": self.first,
            "last": self.last,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": ser(self.kernel_initializer),
            "bias_initializer": ser(self.bias_initializer),
            "kernel_regularizer": ser(self.kernel_regularizer),
            "bias_regularizer": ser(self.bias_regularizer),
            "kernel_constraint": ser(self.kernel_constraint),
            "bias_constraint": ser(self.bias_constraint),
        }


@register
class PackedDense(_Packed):
    """Packed-Ensembles' dense layer (torch-uncertainty's `PackedLinear`) on a member-major batch:
    `[M * B, ..., c_m] -> [M * B, ..., packed_width(units, ...)]`, member `m`'s `gamma` groups
    each a dense map `W_{m, g}` of shape `[c_m / gamma, width / gamma]` (one batched matmul for
    all members and groups). Parameters: `M * c_m * width / gamma` (+ biases), against
    `c * units` for the base layer."""

    def build(self, input_shape):
        group_in = self._group_input(input_shape[-1])
        group_out = self.member_units // self.groups
        self._add_kernel(
            (group_in, group_out), (self.num_estimators, self.groups, group_in, group_out)
        )

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        members = self._members(x)  # [M, B, ..., c_m]
        flat = tf.reshape(
            members, [self.num_estimators, -1, self.groups, x.shape[-1] // self.groups]
        )
        outputs = tf.einsum("mngi,mgio->mngo", flat, tf.cast(self.kernel, x.dtype))
        outputs = tf.reshape(outputs, tf.concat([tf.shape(members)[:-1], [self.member_units]], 0))
        return self._finish(outputs)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.member_units)


@register
class PackedConv2D(_Packed):
    """Packed-Ensembles' convolution (torch-uncertainty's `PackedConv2d`) on a member-major batch
    of channels-last images: `[M * B, H, W, c_m] -> [M * B, H', W', width]`, one grouped
    convolution with `M * gamma` groups over the members' channels side by side.

    Args (besides the family's, which name `units` `filters`):
      filters: the base network's filters at this layer.
      kernel_size, strides, padding, dilation_rate: as `keras.layers.Conv2D`.
    """

    def __init__(
        self,
        filters,
        kernel_size,
        alpha,
        num_estimators,
        strides=1,
        padding="valid",
        dilation_rate=1,
        **kwargs,
    ):
        super().__init__(filters, alpha, num_estimators, **kwargs)
        self.kernel_size = _pair(kernel_size)
        self.strides = _pair(strides)
        self.dilation_rate = _pair(dilation_rate)
        if str(padding).lower() not in ("valid", "same"):
            raise ValueError(f"PackedConv2D ({self.name}): padding must be 'valid' or 'same'.")
        self.padding = str(padding).lower()

    def build(self, input_shape):
        group_in = self._group_input(input_shape[-1])
        group_out = self.member_units // self.groups
        count = self.num_estimators * self.groups
        self._add_kernel(
            (*self.kernel_size, group_in, group_out),
            (count, *self.kernel_size, group_in, group_out),
        )

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        m, c = self.num_estimators, x.shape[-1]
        members = self._members(x)  # [M, B, H, W, c]
        packed = tf.transpose(
            members, [1, 2, 3, 0, 4]
        )  # [B, H, W, M, c]: members' channels side by side
        packed = tf.reshape(packed, tf.concat([tf.shape(packed)[:3], [m * c]], 0))
        # [G, kh, kw, i, o] -> [kh, kw, i, G * o]: group g's filters are output channels g*o..
        kernel = tf.transpose(tf.cast(self.kernel, x.dtype), [1, 2, 3, 0, 4])
        kernel = tf.reshape(kernel, [*self.kernel_size, c // self.groups, -1])
        outputs = tf.nn.conv2d(
            packed, kernel, self.strides, self.padding.upper(), dilations=self.dilation_rate
        )
        shape = tf.shape(outputs)
        outputs = tf.reshape(outputs, tf.concat([shape[:3], [m, self.member_units]], 0))
        return self._finish(tf.transpose(outputs, [3, 0, 1, 2, 4]))

    def compute_output_shape(self, input_shape):
        return _conv2d_output_shape(self, input_shape, self.member_units)

    def get_config(self):
        config = super().get_config()
        config["filters"] = config.pop("units")
        return {
            **config,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "padding": self.padding,
            "dilation_rate": self.dilation_rate,
        }


def _pair(value):
    return (
        (int(value),) * 2 if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    )
