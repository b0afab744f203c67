"""BatchEnsemble (Wen et al., 2020): `E` members sharing one weight, each with rank-1 fast
weights, run in one pass over a member-major batch (`blayers.layers.EnsembleTile`).

Member `m`'s weight is `W * outer(alpha_m, gamma_m)`, so

    y_m = activation(((x * alpha_m) op W) * gamma_m + b_m)

for any linear `op` (dense matmul, convolution): one `op` over the `E * B` rows costs what the
single network's `op` costs on those rows, and the members add `E (in + out)` parameters (plus
`E * out` biases) to the shared `W`. The same mechanism with *distributions* over `alpha` and
`gamma` is the rank-1 Bayesian network (`blayers.layers.rank1`): which one a layer is depends
only on the initializers (`BayesianLayer`'s rule), so both families share this code.

Also here: the hyper-parameter ensemble layer `DenseHyperBatchEnsemble` (Wenzel et al., 2020)
and the conditional dense layer `CondDense` (CondConv, Yang et al., 2019), whose kernel is a
per-example mixture of expert kernels.
"""

import types

import keras
import numpy as np
import tensorflow as tf

from blayers.initializers import independent_draws
from blayers.layers.base import WEIGHT_ARGS, register
from blayers.layers.convolutional import _Conv1D, _Conv2D
from blayers.layers.dense import _DenseBase, dense_matmul
from blayers.layers.ensemble import check_ensemble_size, member_rows
from blayers.layers.estimators import ReparameterizationEstimator
from blayers.registry import ArgsDoc
from blayers.regularizers import PRIOR

__all__ = [
    "CondConv2D",
    "CondDense",
    "Conv1DBatchEnsemble",
    "Conv2DBatchEnsemble",
    "Conv2DHyperBatchEnsemble",
    "DenseBatchEnsemble",
    "DenseHyperBatchEnsemble",
    "DenseMultihead",
    "DepthwiseCondConv2D",
    "DepthwiseConv2DBatchEnsemble",
    "FastWeights",
    "fast_weight_initializer",
]


def fast_weight_initializer(additive=False):
    """`N(1, 0.5^2)`: fast weights start near the shared weight but differ across members, which
    the members need to diverge (uncertainty-baselines' `random_sign_init = -0.5`); all-ones
    starts would keep identical members identical. Additive perturbations start at
    `N(0, 0.5^2)`, near the identity perturbation 0."""
    return keras.initializers.RandomNormal(mean=0.0 if additive else 1.0, stddev=0.5)


def perturb(values, factors, additive):
    """`values * factors`, or `values + factors` for additive perturbations (edward2's
    `use_additive_perturbation`)."""
    return values + factors if additive else values * factors


FAST_WEIGHT_ARGS = """      ensemble_size: members `E` (keyword; edward2's defaults: 4 for BatchEnsemble, 1 for
        the rank-1 layers); the batch holds `E` member-major copies (`EnsembleTile`).
      alpha_initializer, gamma_initializer: of the fast weights `alpha` `[E, in]` and `gamma`
        `[E, out]`: Keras initializers (BatchEnsemble) or distribution initializers (rank-1
        BNN), see the class's defaults.
      alpha_regularizer, gamma_regularizer: their regularizers (the KL terms of random ones).
      alpha_constraint, gamma_constraint: Keras constraints of deterministic ones.
      use_additive_perturbation: `(x + alpha_m) W + gamma_m` instead of
        `((x * alpha_m) W) * gamma_m` (edward2's rank-1 option); the default fast weights then
        start near 0 and random ones take the `'prior'` regularizer (N(0, 1) unless rebound).
"""


def default_fast_regularizer(regularizer, class_default, layer):
    """A fast weight's regularizer: the one given, else the class's default (rank-1: the
    configurable `'rank1_prior'`, centred on the identity perturbation 1; additive
    perturbations: `'prior'`, centred on 0)."""
    if regularizer is not None or class_default is None:
        return regularizer
    return PRIOR if layer.use_additive_perturbation else class_default


class FastWeights:
    """Mixin of a `BayesianLayer` family (`_DenseBase`, `_Conv2D`): per-member fast weights
    `alpha` `[E, in]`, `gamma` `[E, out]` and bias `[E, out]` around the family's shared kernel
    (deterministic by default). Random fast weights are drawn once per call, one draw per member
    (reparameterization). The family's own arguments come first (`units`; `filters,
    kernel_size`), the ensemble's are keywords."""

    _default_fast_initializer = staticmethod(fast_weight_initializer)
    _default_fast_regularizer = None  # rank-1 layers: the configurable `rank1_prior`
    _default_kernel_initializer = "glorot_uniform"
    _default_ensemble_size = 4  # edward2's: 4 for BatchEnsemble, 1 for the rank-1 layers

    def __init__(
        self,
        *args,
        ensemble_size=None,
        alpha_initializer=None,
        gamma_initializer=None,
        alpha_regularizer=None,
        gamma_regularizer=None,
        alpha_constraint=None,
        gamma_constraint=None,
        kernel_initializer=None,
        kernel_regularizer=None,
        use_additive_perturbation=False,
        **kwargs,
    ):
        super().__init__(
            *args,
            kernel_initializer=kernel_initializer or self._default_kernel_initializer,
            kernel_regularizer=kernel_regularizer,
            **kwargs,
        )
        if ensemble_size is None:
            ensemble_size = self._default_ensemble_size
        self.ensemble_size = check_ensemble_size(
            f"{type(self).__name__} ({self.name})", ensemble_size
        )
        self.use_additive_perturbation = bool(use_additive_perturbation)
        for name, init, reg, con in (
            ("alpha", alpha_initializer, alpha_regularizer, alpha_constraint),
            ("gamma", gamma_initializer, gamma_regularizer, gamma_constraint),
        ):
            reg = default_fast_regularizer(reg, self._default_fast_regularizer, self)
            init = init or self._default_fast_initializer(self.use_additive_perturbation)
            self._configure_weight(name, init, reg, con)

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                f"{type(self).__name__} ({self.name}) needs a known last input dimension, got "
                f"input shape {input_shape}."
            )
        outputs = self.units if hasattr(self, "units") else self.filters
        kernel_shape = (channels, outputs)
        if hasattr(self, "kernel_size"):
            kernel_shape = self.kernel_size + kernel_shape
        self.add_bayesian_weight("kernel", kernel_shape)
        self.add_bayesian_weight("alpha", (self.ensemble_size, channels))
        self.add_bayesian_weight("gamma", (self.ensemble_size, outputs))
        if self.use_bias:
            self.add_bayesian_weight("bias", (self.ensemble_size, outputs))
        else:
            self.bias = None
        if hasattr(self, "kernel_size"):
            self.input_spec = keras.layers.InputSpec(ndim=len(kernel_shape), axes={-1: channels})
        else:
            self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: channels})

    def call(self, inputs, mask=None):
        del mask
        self.call_weights()
        inputs = tf.convert_to_tensor(inputs, dtype=self.compute_dtype)
        name = f"{type(self).__name__} ({self.name})"
        alpha = tf.convert_to_tensor(self.alpha)
        gamma = tf.convert_to_tensor(self.gamma)
        additive = self.use_additive_perturbation
        outputs = self.apply_kernel(perturb(inputs, member_rows(alpha, inputs, name), additive))
        outputs = perturb(outputs, member_rows(gamma, outputs, name), additive)
        if self.use_bias:
            outputs = outputs + member_rows(tf.convert_to_tensor(self.bias), outputs, name)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def member_kernels(self):
        """`[E, ..., in, out]`: each member's effective kernel `W * outer(alpha_m, gamma_m)` at
        this call's draw (the layer must have been called)."""
        if self.use_additive_perturbation:
            raise ValueError(
                f"{type(self).__name__} ({self.name}): additive perturbations shift the inputs "
                "and outputs; the members share the kernel W (no per-member kernel)."
            )
        kernel = tf.convert_to_tensor(self.kernel)
        alpha = tf.convert_to_tensor(self.alpha)
        gamma = tf.convert_to_tensor(self.gamma)
        middle = [1] * (kernel.shape.rank - 2)
        alpha = tf.reshape(alpha, [self.ensemble_size, *middle, -1, 1])
        gamma = tf.reshape(gamma, [self.ensemble_size, *middle, 1, -1])
        return kernel[None] * alpha * gamma

    def get_config(self):
        return {
            **super().get_config(),
            "ensemble_size": self.ensemble_size,
            "use_additive_perturbation": self.use_additive_perturbation,
            **self._weight_config("alpha"),
            **self._weight_config("gamma"),
        }


class _DenseFastWeights(FastWeights, ReparameterizationEstimator, _DenseBase):
    _args_doc = (
        """    Args:
      units: output size.
"""
        + FAST_WEIGHT_ARGS
        + """      activation, use_bias: as `keras.layers.Dense` (the bias is per member, `[E, units]`).
"""
        + WEIGHT_ARGS
    )


def _conv_fast_weights_doc(keras_name):
    return (
        f"""    Args:
      filters, kernel_size, strides, padding, data_format, dilation_rate, activation, use_bias:
        as `keras.layers.{keras_name}` (the bias is per member, `[E, filters]`).
"""
        + FAST_WEIGHT_ARGS
        + WEIGHT_ARGS
    )


class _Conv2DFastWeights(FastWeights, ReparameterizationEstimator, _Conv2D):
    _args_doc = _conv_fast_weights_doc("Conv2D")
    _default_kernel_initializer = "he_normal"


class _Conv1DFastWeights(FastWeights, ReparameterizationEstimator, _Conv1D):
    _args_doc = _conv_fast_weights_doc("Conv1D")
    _default_kernel_initializer = "he_normal"


@register
class DenseBatchEnsemble(_DenseFastWeights):
    """BatchEnsemble dense layer (Wen et al., 2020): member `m` computes
    `activation(((x * alpha_m) @ W) * gamma_m + b_m)` on its rows of a member-major batch.

    Deterministic fast weights starting at `N(1, 0.5^2)` (`fast_weight_initializer`); the shared
    `W` starts Glorot-uniform. Distribution initializers for `alpha`/`gamma` make it
    `DenseRank1`.
    """


@register
class Conv2DBatchEnsemble(_Conv2DFastWeights):
    """BatchEnsemble 2-D convolution (Wen et al., 2020): member `m` convolves
    `x * alpha_m` (input channels scaled) with the shared kernel and scales the output channels
    by `gamma_m`, then adds its bias `b_m`. The shared kernel starts He-normal."""


@register
class Conv1DBatchEnsemble(_Conv1DFastWeights):
    """BatchEnsemble 1-D convolution (Wen et al., 2020): as `Conv2DBatchEnsemble` over
    `[E * B, length, channels]` inputs."""


@register
class DenseMultihead(ReparameterizationEstimator, _DenseBase):
    """Multi-head ensemble output (edward2's `DenseMultihead`): one `Dense(E * units)` on a
    shared body, read as `E` heads, `[B, E, units]`; with `member_major=True` the heads'
    outputs are `[E * B, units]` rows, member-major, the layout `EnsembleOutput` folds into
    the members' mixture. The kernel is deterministic by default; a distribution initializer
    (`kernel_initializer='trainable_normal'`) makes the heads Bayesian with their KL.

    Args:
      units: outputs per head.
      ensemble_size: heads `E`.
      member_major: return `[E * B, units]` rows instead of `[B, E, units]`.
      activation, use_bias: as `keras.layers.Dense`.
      kernel_initializer: default `'glorot_uniform'` (deterministic).
      kernel_regularizer: default `'prior'` (applies to a random kernel only).
      **kwargs: the other `DenseReparameterization` arguments.
    """

    def __init__(
        self,
        units,
        ensemble_size=1,
        member_major=False,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        name = f"DenseMultihead ({kwargs.get('name', 'dense_multihead')})"
        self.ensemble_size = check_ensemble_size(name, ensemble_size)
        if not isinstance(units, (int, np.integer)) or units <= 0:
            raise ValueError(f"{name} needs a positive integer `units`, got {units!r}.")
        self.member_major = bool(member_major)
        super().__init__(
            int(units) * self.ensemble_size, kernel_initializer=kernel_initializer, **kwargs
        )
        self.input_spec = keras.layers.InputSpec(ndim=2)

    def call(self, inputs):
        outputs = super().call(inputs)
        e, units = self.ensemble_size, self.units // self.ensemble_size
        outputs = tf.reshape(outputs, tf.stack([-1, e, units]))
        if self.member_major:
            outputs = tf.reshape(tf.transpose(outputs, [1, 0, 2]), tf.stack([-1, units]))
        return outputs

    def compute_output_shape(self, input_shape):
        batch, units = input_shape[0], self.units // self.ensemble_size
        if self.member_major:
            return (None if batch is None else batch * self.ensemble_size, units)
        return (batch, self.ensemble_size, units)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units // self.ensemble_size,
            "ensemble_size": self.ensemble_size,
            "member_major": self.member_major,
        }


def _l2_key_index(layer_name, lambda_key_to_index, name, weight="kernel", required=True):
    """edward2's `lambda_key_to_index`: the column of `'<layer>_l2_<weight>'`, the layer's name
    with a `/`-delimited group left out (`'group/conv/'` -> `'group'`), as edward2 reads it
    (None for a key that is not `required` and absent)."""
    if not isinstance(lambda_key_to_index, dict):
        raise TypeError(
            f"{name}: lambda_key_to_index is edward2's dict of hyper-parameter columns; got "
            f"{lambda_key_to_index!r} (pass ensemble_size as a keyword)."
        )
    group = layer_name
    start = group.find("/")
    end = group.find("/", start + 1)
    if start > -1 and end > -1:
        group = group[:start] + group[end + 1 :]
    key = f"{group}_l2_{weight}"
    if key not in lambda_key_to_index:
        if not required:
            return None
        raise ValueError(
            f"{name}: lambda_key_to_index has no {key!r} (its keys: {sorted(lambda_key_to_index)})."
        )
    return int(lambda_key_to_index[key])


class _HyperBatchEnsemble(ArgsDoc, keras.layers.Layer):
    """Hyper-BatchEnsemble (Wenzel et al., 2020) around any linear map `op(x, W)`: subclasses
    give the kernel's shape (`_kernel_shape`), `op` (`_linear`) and the output size (`outputs`).

        y = activation(op(x * r_m, W) * s_m + e1(lambda) * (op(x * u_m, W') * v_m)
                       + b_m + e2(lambda) * b'_m),   [e1, e2](lambda) = lambda @ E

    on a member-major batch; the self-tuned L2 penalty of the effective kernel is
    `mean_rows c ||K_m + D_m diag(e1)||^2`, computed per output channel (with
    `regularize_fast_weights=False`, of `W + W' diag(e1)`), plus `mean_rows c_b ||b_m + e2
    b'_m||^2` with a bias column.

    The weights carry edward2's names: `kernel`, `alpha`, `gamma` and the members' biases
    `ensemble_bias` (`b_m`) of the main map; `delta_kernel`, `delta_alpha`, `delta_gamma` and
    `bias` (`b'_m`, edward2's name for it) of the hyper-parameter map; `layer.dense` /
    `layer.delta_dense` (convolutions: `conv2d` / `delta_conv2d`) are views with edward2's
    attributes (`kernel`, `alpha`, `gamma`, `ensemble_bias`)."""

    _HYPER_ARGS = """      lambda_key_to_index: edward2's `{'<layer>_l2_kernel': column, ...}` (optional; sets
        `l2_index`).
      ensemble_size: members `E` (keyword).
      activation, use_bias: as the Keras twin.
      alpha_initializer, gamma_initializer: of the fast weights (default `N(1, 0.5^2)`).
      kernel_initializer: of `W` and `W'`.
      embedding_initializer: of `E` `[h, 2 outputs]`.
      bias_initializer: of `b` and `b'` (`[E, outputs]` each).
      l2_index: the column of `lambdas` holding the L2 coefficient (None: no penalty).
      l2_bias_index: the column holding the biases' L2 coefficient (None: no bias penalty;
        edward2's `'<layer>_l2_bias'` key sets it).
      regularize_fast_weights: the penalty is on the members' effective kernels (True,
        edward2's default) or on the shared kernels `W + W' diag(e1)` (False).
      fast_weights_eq_contraint: the hyper-parameter map shares the main map's fast weights
        (`u_m = r_m`, `v_m = s_m`; edward2's spelling).
      rank: the fast weights' rank (1, the only one; edward2's argument).
      **kwargs: `keras.layers.Layer` arguments.
"""

    def __init__(
        self,
        outputs,
        lambda_key_to_index=None,
        ensemble_size=4,
        activation=None,
        use_bias=True,
        alpha_initializer=None,
        gamma_initializer=None,
        kernel_initializer="glorot_uniform",
        embedding_initializer="glorot_uniform",
        bias_initializer="zeros",
        l2_index=None,
        l2_bias_index=None,
        regularize_fast_weights=True,
        fast_weights_eq_contraint=False,
        rank=1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        name = f"{type(self).__name__} ({self.name})"
        if not isinstance(outputs, (int, np.integer)) or outputs <= 0:
            raise ValueError(f"{name} needs a positive integer output size, got {outputs!r}.")
        if rank != 1:
            raise ValueError(f"{name}: only rank-1 fast weights are supported, got rank={rank}.")
        if lambda_key_to_index is not None:
            if l2_index is not None:
                raise ValueError(f"{name}: give l2_index or lambda_key_to_index, not both.")
            l2_index = _l2_key_index(self.name, lambda_key_to_index, name)
            if l2_bias_index is None:
                l2_bias_index = _l2_key_index(
                    self.name, lambda_key_to_index, name, "bias", required=False
                )
        self.lambda_key_to_index = lambda_key_to_index
        self.l2_bias_index = l2_bias_index
        self.regularize_fast_weights = bool(regularize_fast_weights)
        self.fast_weights_eq_contraint = bool(fast_weights_eq_contraint)
        self.outputs = int(outputs)
        self.ensemble_size = check_ensemble_size(name, ensemble_size)
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.alpha_initializer, self.gamma_initializer = _fast_initializers(
            alpha_initializer, gamma_initializer
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.embedding_initializer = keras.initializers.get(embedding_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.l2_index = l2_index

    def build(self, input_shape):
        x_shape, lambda_shape = input_shape[0], input_shape[1]
        d, h = x_shape[-1], lambda_shape[-1]
        name = f"{type(self).__name__} ({self.name})"
        if d is None or h is None:
            raise ValueError(
                f"{name} needs known feature and hyper-parameter sizes, got {input_shape}."
            )
        if self.l2_index is not None and not 0 <= self.l2_index < h:
            raise ValueError(
                f"{name}: l2_index {self.l2_index} is outside the {h} hyper-parameters."
            )
        for index, what in ((self.l2_index, "l2_index"), (self.l2_bias_index, "l2_bias_index")):
            if index is not None and not 0 <= index < h:
                raise ValueError(f"{name}: {what} {index} is outside the {h} hyper-parameters.")
        e, u = self.ensemble_size, self.outputs
        for prefix in ("", "delta_"):
            shapes = {"kernel": (self._kernel_shape(d), self.kernel_initializer)}
            if not (prefix and self.fast_weights_eq_contraint):
                shapes["alpha"] = ((e, d), self.alpha_initializer)
                shapes["gamma"] = ((e, u), self.gamma_initializer)
            if self.use_bias:  # edward2's names: b_m is `ensemble_bias`, b'_m is `bias`
                shapes["ensemble_bias" if not prefix else "bias"] = ((e, u), self.bias_initializer)
            for weight, (shape, initializer) in shapes.items():
                attribute = weight if weight in ("ensemble_bias", "bias") else f"{prefix}{weight}"
                variable = self.add_weight(name=attribute, shape=shape, initializer=initializer)
                setattr(self, attribute, variable)
        if self.fast_weights_eq_contraint:
            self.delta_alpha, self.delta_gamma = self.alpha, self.gamma
        self.embedding = None
        if len(input_shape) == 2:  # else edward2's `e` comes with the inputs
            self.embedding = self.add_weight(
                name="embedding", shape=(h, 2 * u), initializer=self.embedding_initializer
            )

    def call(self, inputs):
        x, lambdas, *given = (tf.convert_to_tensor(t, self.compute_dtype) for t in inputs)
        name = f"{type(self).__name__} ({self.name})"
        embedded = given[0] if given else tf.matmul(lambdas, self.embedding)
        e1, e2 = tf.split(embedded, 2, axis=-1)

        def rank_one(kernel, alpha, gamma):
            projected = self._linear(x * member_rows(alpha, x, name), kernel)
            return projected * member_rows(gamma, projected, name)

        outputs = rank_one(self.kernel, self.alpha, self.gamma)
        per_row = [-1] + [1] * (outputs.shape.rank - 2) + [self.outputs]
        outputs += tf.reshape(e1, per_row) * rank_one(
            self.delta_kernel, self.delta_alpha, self.delta_gamma
        )
        if self.use_bias:
            outputs += member_rows(self.ensemble_bias, outputs, name)
            outputs += tf.reshape(e2, per_row) * member_rows(self.bias, outputs, name)
        penalty = None
        if self.l2_index is not None:
            penalty = self._l2_penalty(lambdas[:, self.l2_index], e1)
        if self.use_bias and self.l2_bias_index is not None:
            biases = member_rows(self.ensemble_bias, e2, name) + e2 * member_rows(
                self.bias, e2, name
            )
            bias_penalty = tf.reduce_mean(
                lambdas[:, self.l2_bias_index] * tf.reduce_sum(tf.square(biases), axis=-1)
            )
            penalty = bias_penalty if penalty is None else penalty + bias_penalty
        if penalty is not None:
            self.add_loss(penalty)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def _l2_penalty(self, coefficients, e1):
        """`mean_i c_i ||K_m + D_m diag(e1_i)||_F^2`, output channel by channel:
        `sum_j |K_j|^2 + 2 e1_ij <K_j, D_j> + e1_ij^2 |D_j|^2` with `K_j`, `D_j` the member's
        effective kernel's slices for output channel `j`."""
        e, d, u = self.ensemble_size, self.alpha.shape[-1], self.outputs

        def kernels(kernel, alpha, gamma):  # [E, taps, d, u]
            flat = tf.reshape(kernel, [1, -1, d, u])
            if not self.regularize_fast_weights:  # the shared kernels alone
                return tf.tile(flat, [e, 1, 1, 1])
            return flat * tf.reshape(alpha, [e, 1, d, 1]) * tf.reshape(gamma, [e, 1, 1, u])

        k = kernels(self.kernel, self.alpha, self.gamma)
        dk = kernels(self.delta_kernel, self.delta_alpha, self.delta_gamma)
        name = f"{type(self).__name__} ({self.name})"
        kk = member_rows(tf.reduce_sum(k * k, [1, 2]), e1, name)  # [E * B, u]
        kd = member_rows(tf.reduce_sum(k * dk, [1, 2]), e1, name)
        dd = member_rows(tf.reduce_sum(dk * dk, [1, 2]), e1, name)
        norms = tf.reduce_sum(kk + 2.0 * e1 * kd + tf.square(e1) * dd, axis=-1)
        return tf.reduce_mean(coefficients * norms)

    def get_config(self):
        serialize = keras.initializers.serialize
        return {
            **super().get_config(),
            "ensemble_size": self.ensemble_size,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "alpha_initializer": serialize(self.alpha_initializer),
            "gamma_initializer": serialize(self.gamma_initializer),
            "kernel_initializer": serialize(self.kernel_initializer),
            "embedding_initializer": serialize(self.embedding_initializer),
            "bias_initializer": serialize(self.bias_initializer),
            "l2_index": self.l2_index,
            "l2_bias_index": self.l2_bias_index,
            "regularize_fast_weights": self.regularize_fast_weights,
            "fast_weights_eq_contraint": self.fast_weights_eq_contraint,
        }

    def _view(self, prefix):
        """edward2's inner layer: its `kernel`, `alpha`, `gamma` (and `ensemble_bias`)."""
        view = types.SimpleNamespace(
            kernel=getattr(self, f"{prefix}kernel"),
            alpha=getattr(self, f"{prefix}alpha"),
            gamma=getattr(self, f"{prefix}gamma"),
        )
        if not prefix and self.use_bias:
            view.ensemble_bias = self.ensemble_bias
        return view


@register
class DenseHyperBatchEnsemble(_HyperBatchEnsemble):
    """Hyper-BatchEnsemble dense layer (Wenzel et al., 2020): an ensemble over both weights and
    hyper-parameters, each member conditioned on its own hyper-parameters `lambda`.

    Called on `[x, lambdas]` (`lambdas`: `[E * B, h]`, each row the hyper-parameters of its
    member, e.g. log L2 strength and dropout rate, rescaled to about [-1, 1]):

        y = activation(x K_m + e1(lambda) * (x D_m) + b_m + e2(lambda) * b'_m),
        K_m = W * outer(r_m, s_m),  D_m = W' * outer(u_m, v_m),
        [e1, e2](lambda) = lambda @ E   (linear, no bias, as in the paper)

    With `l2_index`, column `l2_index` of `lambdas` is each example's L2 coefficient `c` and the
    layer adds the self-tuning penalty `mean_rows c ||K_m + D_m diag(e1(lambda))||^2` to its
    losses (the effective kernel's norm, computed per output column without materializing it).

    edward2's form is accepted too: `DenseHyperBatchEnsemble(units, lambda_key_to_index, ...)`
    with the L2 column found under `'<layer>_l2_kernel'`, and `[x, lambdas, e]` inputs whose
    `e` `[E * B, 2 units]` (an embedding computed outside) replaces the layer's `lambdas @ E`.
    """

    _args_doc = (
        """    Args:
      units: output size.
"""
        + _HyperBatchEnsemble._HYPER_ARGS
    )

    def __init__(self, units, lambda_key_to_index=None, **kwargs):
        super().__init__(units, lambda_key_to_index, **kwargs)

    @property
    def units(self):
        return self.outputs

    @property
    def dense(self):
        """edward2's main `DenseBatchEnsemble` (a view of this layer's weights)."""
        return self._view("")

    @property
    def delta_dense(self):
        """edward2's hyper-parameter `DenseBatchEnsemble` (a view)."""
        return self._view("delta_")

    def _kernel_shape(self, channels):
        return (channels, self.outputs)

    def _linear(self, inputs, kernel):
        return dense_matmul(inputs, kernel)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0][:-1]) + (self.outputs,)

    def get_config(self):
        return {**super().get_config(), "units": self.outputs}


@register
class Conv2DHyperBatchEnsemble(_HyperBatchEnsemble):
    """Hyper-BatchEnsemble 2-D convolution (Wenzel et al., 2020): `DenseHyperBatchEnsemble`'s
    member- and hyper-parameter-conditioned kernels `K_m + e1(lambda) D_m` as convolutions,
    the fast weights scaling input channels and filters; called on `[x, lambdas]` (or
    edward2's `[x, lambdas, e]`). edward2's argument order (`lambda_key_to_index, filters,
    kernel_size`) is accepted too.
    """

    _args_doc = (
        """    Args:
      filters, kernel_size, strides, padding, dilation_rate: as `keras.layers.Conv2D`
        (channels last).
"""
        + _HyperBatchEnsemble._HYPER_ARGS
    )

    def __init__(
        self,
        *args,
        filters=None,
        kernel_size=None,
        lambda_key_to_index=None,
        strides=1,
        padding="valid",
        dilation_rate=1,
        **kwargs,
    ):
        # Keras' order `(filters, kernel_size)`, or edward2's `(lambda_key_to_index, filters,
        # kernel_size)`, positionally or by keyword.
        args = list(args)
        if args and isinstance(args[0], dict):
            lambda_key_to_index = args.pop(0)
        if len(args) > 2:
            raise TypeError(f"Conv2DHyperBatchEnsemble: too many positional arguments {args}.")
        given = dict(zip(("filters", "kernel_size"), args))
        for name in given:
            if {"filters": filters, "kernel_size": kernel_size}[name] is not None:
                raise TypeError(f"Conv2DHyperBatchEnsemble: {name} given twice.")
        filters = given.get("filters", filters)
        kernel_size = given.get("kernel_size", kernel_size)
        if filters is None or kernel_size is None:
            raise TypeError("Conv2DHyperBatchEnsemble needs filters and kernel_size.")
        _set_conv_geometry(self, kernel_size, strides, padding, dilation_rate)
        super().__init__(filters, lambda_key_to_index, **kwargs)

    @property
    def filters(self):
        return self.outputs

    @property
    def conv2d(self):
        """edward2's main `Conv2DBatchEnsemble` (a view of this layer's weights)."""
        return self._view("")

    @property
    def delta_conv2d(self):
        """edward2's hyper-parameter `Conv2DBatchEnsemble` (a view)."""
        return self._view("delta_")

    def _kernel_shape(self, channels):
        return (*self.kernel_size, channels, self.outputs)

    def _linear(self, inputs, kernel):
        return keras.ops.conv(
            inputs, kernel, self.strides, self.padding, dilation_rate=self.dilation_rate
        )

    def compute_output_shape(self, input_shape):
        return _conv2d_output_shape(self, input_shape[0], self.outputs)

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.outputs,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "padding": self.padding,
            "dilation_rate": self.dilation_rate,
        }


def _conv2d_output_shape(layer, input_shape, filters=None):
    """The output shape of Keras' 2-D convolution with `layer`'s kernel size, strides, padding
    and dilation (`filters` output channels; without them, depthwise with the layer's
    `depth_multiplier`)."""
    geometry = {
        "strides": layer.strides,
        "padding": layer.padding,
        "dilation_rate": layer.dilation_rate,
    }
    if filters is None:
        twin = keras.layers.DepthwiseConv2D(
            layer.kernel_size, depth_multiplier=layer.depth_multiplier, **geometry
        )
    else:
        twin = keras.layers.Conv2D(filters, layer.kernel_size, **geometry)
    return tuple(twin.compute_output_shape(input_shape))


def _fast_initializers(alpha_initializer, gamma_initializer):
    """The fast weights' Keras initializers, `N(1, 0.5^2)` where not given."""
    return tuple(
        keras.initializers.get(given or fast_weight_initializer())
        for given in (alpha_initializer, gamma_initializer)
    )


def _set_conv_geometry(layer, kernel_size, strides, padding, dilation_rate):
    """A 2-D convolution's `kernel_size`, `strides`, `padding`, `dilation_rate` on `layer`,
    checked."""
    if str(padding).lower() not in ("valid", "same"):
        raise ValueError(
            f"{type(layer).__name__}: padding must be 'valid' or 'same', got {padding!r}."
        )
    layer.kernel_size = _pair(kernel_size, "kernel_size")
    layer.strides = _pair(strides, "strides")
    layer.padding = str(padding).lower()
    layer.dilation_rate = _pair(dilation_rate, "dilation_rate")


def _pair(value, name):
    if isinstance(value, (int, np.integer)):
        return (int(value), int(value))
    value = tuple(int(v) for v in value)
    if len(value) != 2:
        raise ValueError(f"`{name}` must be an int or 2 ints, got {value}.")
    return value


def _experts_initializer(per_expert):
    """`[K, *shape]` as K independent draws of a Keras initializer of `shape`: each expert is
    initialized as a kernel of its own (its fans, not the expert axis)."""

    def initializer(shape, dtype=None):
        return tf.stack(independent_draws(per_expert, shape[1:], shape[0], dtype))

    return initializer


class _Experts(ArgsDoc, keras.layers.Layer):
    """`num_experts` kernels and biases mixed per example by routing weights (CondConv, Yang et
    al., 2019): `y_i = activation(op(x_i, sum_k r_ik W_k) + sum_k r_ik b_k)`, called as
    `layer(x, routing_weights)` with `routing_weights` `[B, num_experts]` (e.g. a softmax or
    sigmoid of a router on `x`; one-hot rows select one expert per example). Subclasses build
    with `_build_experts` and mix the experts' outputs in `call`."""

    def __init__(
        self,
        num_experts=1,
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_experts, (int, np.integer)) or num_experts < 1:
            raise ValueError(
                f"{type(self).__name__} ({self.name}) needs a positive integer num_experts, "
                f"got {num_experts!r}."
            )
        self.num_experts = int(num_experts)
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)

    def _build_experts(self, kernel_shape, outputs):
        """`kernel` `[K, *kernel_shape]` (each expert initialized as a kernel of its own) and
        `bias` `[K, outputs]`."""
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.num_experts, *kernel_shape),
            initializer=_experts_initializer(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(self.num_experts, outputs),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
            )

    def _bias_and_activate(self, outputs, routing_weights):
        if self.use_bias:
            bias = tf.matmul(routing_weights, self.bias)
            outputs += tf.reshape(bias, [-1] + [1] * (outputs.shape.rank - 2) + [bias.shape[-1]])
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def get_config(self):
        serialize = keras.initializers.serialize
        return {
            **super().get_config(),
            "num_experts": self.num_experts,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": serialize(self.kernel_initializer),
            "bias_initializer": serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
        }


_EXPERT_ARGS = """      num_experts: kernels mixed per example.
      activation, use_bias: as the Keras twin.
      kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer: per expert
        (each expert's kernel initialized as a kernel of its own).
      **kwargs: `keras.layers.Layer` arguments.
"""


@register
class CondDense(_Experts):
    """Conditional dense layer (CondConv, Yang et al., 2019): `num_experts` kernels and biases,
    mixed per example by routing weights, `y_i = activation(x_i (sum_k r_ik W_k) + sum_k r_ik
    b_k)`. Called as `layer(x, routing_weights)` with `routing_weights` `[B, num_experts]` (e.g.
    a softmax or sigmoid of a router on `x`; one-hot rows select one expert per example)."""

    _args_doc = "    Args:\n      units: output size.\n" + _EXPERT_ARGS

    def __init__(self, units, num_experts=1, **kwargs):
        if not isinstance(units, (int, np.integer)) or units <= 0:
            raise ValueError(f"CondDense needs positive integer units, got {units!r}.")
        self.units = int(units)
        super().__init__(num_experts, **kwargs)

    def build(self, inputs_shape, routing_weights_shape=None):
        self._build_experts((inputs_shape[-1], self.units), self.units)

    def call(self, inputs, routing_weights):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        r = tf.convert_to_tensor(routing_weights, self.compute_dtype)
        # sum_k r_ik (x_i W_k): one matmul per expert, no per-example kernels materialized.
        per_expert = tf.einsum("bd,kdu->bku", x, self.kernel)
        return self._bias_and_activate(tf.einsum("bk,bku->bu", r, per_expert), r)

    def compute_output_shape(self, inputs_shape, routing_weights_shape=None):
        return tuple(inputs_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class _CondConv(_Experts):
    """Conditional convolution (CondConv, Yang et al., 2019): `num_experts` kernels and biases
    mixed per example by routing weights, `y_i = conv(x_i, sum_k r_ik W_k) + sum_k r_ik b_k`,
    computed as `sum_k r_ik conv(x_i, W_k)` (one convolution with the experts stacked on the
    output channels: exact, K times one convolution's work, no per-example kernels).
    Called as `layer(x, routing_weights)` with `routing_weights` `[B, num_experts]`."""

    _args_doc = (
        """    Args:
      kernel_size, strides, padding, dilation_rate: as the Keras convolution (channels last).
"""
        + _EXPERT_ARGS
    )

    def __init__(
        self, kernel_size, num_experts=1, strides=1, padding="valid", dilation_rate=1, **kwargs
    ):
        _set_conv_geometry(self, kernel_size, strides, padding, dilation_rate)
        super().__init__(num_experts, **kwargs)

    def build(self, inputs_shape, routing_weights_shape=None):
        channels = inputs_shape[-1]
        self._build_experts(
            (*self.kernel_size, channels, self._per_channel(channels)),
            self._out_channels(channels),
        )

    def call(self, inputs, routing_weights):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        r = tf.convert_to_tensor(routing_weights, self.compute_dtype)
        # [K, kh, kw, in, out] -> [kh, kw, in, K * out]: the experts side by side.
        stacked = tf.transpose(self.kernel, [1, 2, 3, 0, 4])
        stacked = tf.reshape(stacked, [*self.kernel_size, stacked.shape[2], -1])
        return self._bias_and_activate(self._mix(self._convolve(x, stacked), r), r)

    def get_config(self):
        return {
            **super().get_config(),
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "padding": self.padding,
            "dilation_rate": self.dilation_rate,
        }


@register
class CondConv2D(_CondConv):
    """Conditional 2-D convolution (edward2's `CondConv2D`): `filters` output channels, the
    per-example kernel a routing-weighted sum of `num_experts` expert kernels."""

    _args_doc = (
        "    Args:\n      filters: output channels.\n" + _CondConv._args_doc.split("\n", 1)[1]
    )

    def __init__(self, filters, kernel_size, num_experts=1, **kwargs):
        if not isinstance(filters, (int, np.integer)) or filters <= 0:
            raise ValueError(f"CondConv2D needs a positive integer `filters`, got {filters!r}.")
        self.filters = int(filters)
        super().__init__(kernel_size, num_experts=num_experts, **kwargs)

    def _per_channel(self, channels):
        return self.filters

    def _out_channels(self, channels):
        return self.filters

    def _convolve(self, x, kernel):
        return keras.ops.conv(
            x, kernel, self.strides, self.padding, dilation_rate=self.dilation_rate
        )

    def _mix(self, outputs, r):
        outputs = tf.reshape(
            outputs, tf.concat([tf.shape(outputs)[:3], [self.num_experts, self.filters]], 0)
        )
        return tf.einsum("bhwkf,bk->bhwf", outputs, r)

    def compute_output_shape(self, inputs_shape, routing_weights_shape=None):
        return _conv2d_output_shape(self, inputs_shape, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters}


@register
class DepthwiseCondConv2D(_CondConv):
    """Conditional depthwise 2-D convolution (edward2's `DepthwiseCondConv2D`): each input
    channel convolved with its own `depth_multiplier` filters, the per-example depthwise kernel
    a routing-weighted sum of `num_experts` expert kernels."""

    _args_doc = (
        "    Args:\n      depth_multiplier: filters per input channel.\n"
        + _CondConv._args_doc.split("\n", 1)[1]
    )

    def __init__(self, kernel_size, num_experts=1, depth_multiplier=1, **kwargs):
        if not isinstance(depth_multiplier, (int, np.integer)) or depth_multiplier <= 0:
            raise ValueError(
                f"DepthwiseCondConv2D needs a positive integer depth_multiplier, got "
                f"{depth_multiplier!r}."
            )
        self.depth_multiplier = int(depth_multiplier)
        super().__init__(kernel_size, num_experts=num_experts, **kwargs)

    def _per_channel(self, channels):
        return self.depth_multiplier

    def _out_channels(self, channels):
        return channels * self.depth_multiplier

    def _convolve(self, x, kernel):
        return keras.ops.depthwise_conv(
            x, kernel, self.strides, self.padding, dilation_rate=self.dilation_rate
        )

    def _mix(self, outputs, r):
        # Depthwise output channels are (input channel, expert, multiplier), in that order.
        channels = self.kernel.shape[-2]
        shape = tf.shape(outputs)
        outputs = tf.reshape(
            outputs,
            tf.concat([shape[:3], [channels, self.num_experts, self.depth_multiplier]], 0),
        )
        mixed = tf.einsum("bhwckm,bk->bhwcm", outputs, r)
        return tf.reshape(mixed, tf.concat([shape[:3], [channels * self.depth_multiplier]], 0))

    def compute_output_shape(self, inputs_shape, routing_weights_shape=None):
        return _conv2d_output_shape(self, inputs_shape)

    def get_config(self):
        return {**super().get_config(), "depth_multiplier": self.depth_multiplier}


@register
class DepthwiseConv2DBatchEnsemble(ArgsDoc, keras.layers.Layer):
    """BatchEnsemble depthwise 2-D convolution (edward2's `DepthwiseConv2DBatchEnsemble`):
    member `m` convolves `x * alpha_m` (input channels scaled) depthwise with the shared kernel
    `[kh, kw, in, depth_multiplier]`, scales the `in * depth_multiplier` output channels by
    `gamma_m` and adds `b_m`, on a member-major batch (`EnsembleTile`)."""

    _args_doc = """    Args:
      kernel_size, strides, padding, depth_multiplier, dilation_rate, activation, use_bias:
        as `keras.layers.DepthwiseConv2D` (channels last).
      ensemble_size: members `E` (keyword).
      alpha_initializer, gamma_initializer: of the fast weights `[E, in]`, `[E, in * mult]`
        (default `N(1, 0.5^2)`).
      depthwise_initializer: of the shared kernel (default He-normal).
      bias_initializer: of the members' biases `[E, in * mult]`.
      **kwargs: `keras.layers.Layer` arguments.
"""

    def __init__(
        self,
        kernel_size,
        ensemble_size=4,
        strides=1,
        padding="valid",
        depth_multiplier=1,
        dilation_rate=1,
        activation=None,
        use_bias=True,
        alpha_initializer=None,
        gamma_initializer=None,
        depthwise_initializer="he_normal",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        name = f"DepthwiseConv2DBatchEnsemble ({self.name})"
        self.ensemble_size = check_ensemble_size(name, ensemble_size)
        _set_conv_geometry(self, kernel_size, strides, padding, dilation_rate)
        self.depth_multiplier = int(depth_multiplier)
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.alpha_initializer, self.gamma_initializer = _fast_initializers(
            alpha_initializer, gamma_initializer
        )
        self.depthwise_initializer = keras.initializers.get(depthwise_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, input_shape):
        channels, e = input_shape[-1], self.ensemble_size
        outputs = channels * self.depth_multiplier
        self.depthwise_kernel = self.add_weight(
            name="depthwise_kernel",
            shape=(*self.kernel_size, channels, self.depth_multiplier),
            initializer=self.depthwise_initializer,
        )
        self.alpha = self.add_weight(
            name="alpha", shape=(e, channels), initializer=self.alpha_initializer
        )
        self.gamma = self.add_weight(
            name="gamma", shape=(e, outputs), initializer=self.gamma_initializer
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(e, outputs), initializer=self.bias_initializer
            )

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        name = f"DepthwiseConv2DBatchEnsemble ({self.name})"
        outputs = keras.ops.depthwise_conv(
            x * member_rows(self.alpha, x, name),
            self.depthwise_kernel,
            self.strides,
            self.padding,
            dilation_rate=self.dilation_rate,
        )
        outputs = outputs * member_rows(self.gamma, outputs, name)
        if self.use_bias:
            outputs = outputs + member_rows(self.bias, outputs, name)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def member_kernels(self):
        """`[E, kh, kw, in, mult]`: member `m`'s depthwise kernel `K * alpha_m (x) gamma_m`."""
        e, (_, _, channels, mult) = self.ensemble_size, self.depthwise_kernel.shape
        alpha = tf.reshape(self.alpha, [e, 1, 1, channels, 1])
        gamma = tf.reshape(self.gamma, [e, 1, 1, channels, mult])
        return self.depthwise_kernel[None] * alpha * gamma

    def compute_output_shape(self, input_shape):
        return _conv2d_output_shape(self, input_shape)

    def get_config(self):
        serialize = keras.initializers.serialize
        return {
            **super().get_config(),
            "kernel_size": self.kernel_size,
            "ensemble_size": self.ensemble_size,
            "strides": self.strides,
            "padding": self.padding,
            "depth_multiplier": self.depth_multiplier,
            "dilation_rate": self.dilation_rate,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "alpha_initializer": serialize(self.alpha_initializer),
            "gamma_initializer": serialize(self.gamma_initializer),
            "depthwise_initializer": serialize(self.depthwise_initializer),
            "bias_initializer": serialize(self.bias_initializer),
        }
