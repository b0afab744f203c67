"""Hierarchical priors over weights (Louizos et al., 2017, Bayesian compression; the horseshoe
of Carvalho et al., 2009): input units share a scale.

The kernel is written non-centred, `W_ij = V_ij * s_i * g`, with `V ~ N(0, 1)` a priori, a local
scale `s_i` per input unit (per input channel of a convolution) and one global scale `g`,
both half-Cauchy a priori: `W_ij` is horseshoe-distributed, which shrinks whole input units
toward zero (unit pruning) while leaving strong ones alone. The variational posterior is
mean-field: Normal `V` (Flipout), log-normal `s` and `g` (so posterior means exist for
prediction), each with its KL in `layer.losses` (the scales' by Monte Carlo).

Forward pass: `op(x * s * g, V)`, i.e. the inputs scaled per unit by one draw of the scales per
call, then the Flipout estimator of the kernel.
"""

import tensorflow as tf

from blayers import regularizers
from blayers.layers.base import register
from blayers.layers.convolutional import _Conv2D
from blayers.layers.dense import _DenseBase
from blayers.layers.estimators import FlipoutEstimator

__all__ = ["Conv2DHierarchical", "DenseHierarchical", "Hierarchical"]


HIERARCHICAL_ARGS = """      local_scale_initializer, global_scale_initializer: distribution initializers of the
        scales (default `'trainable_log_normal'`, starting near 1).
      local_scale_regularizer: the local scales' prior KL (default
        `'half_cauchy_kl_divergence'`, HalfCauchy(0, 1)).
      global_scale_regularizer: default `HalfCauchyKLDivergence(scale=1e-5)`, the small global
        scale of Louizos et al. (strong shrinkage; rebind for a weaker one).
      local_scale_constraint, global_scale_constraint: Keras constraints when deterministic.
"""


class Hierarchical(FlipoutEstimator):
    """Mixin of a `BayesianLayer` family: a local scale per input unit and a global scale.

    Its arguments, besides the family's:
      local_scale_initializer, global_scale_initializer: distribution initializers of the
        scales (default `'trainable_log_normal'`, starting near 1).
      local_scale_regularizer: their prior's KL (default `'half_cauchy_kl_divergence'`,
        HalfCauchy(0, 1)).
      global_scale_regularizer: default `HalfCauchyKLDivergence(scale=1e-5)`, the small global
        scale of Louizos et al. (strong shrinkage; rebind for a weaker one).
      local_scale_constraint, global_scale_constraint: Keras constraints when deterministic.
    """

    def __init__(
        self,
        *args,
        local_scale_initializer="trainable_log_normal",
        global_scale_initializer="trainable_log_normal",
        local_scale_regularizer="half_cauchy_kl_divergence",
        global_scale_regularizer=None,
        local_scale_constraint=None,
        global_scale_constraint=None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if global_scale_regularizer is None:
            global_scale_regularizer = regularizers.HalfCauchyKLDivergence(scale=1e-5)
        self._configure_weight(
            "local_scale",
            local_scale_initializer,
            local_scale_regularizer,
            local_scale_constraint,
        )
        self._configure_weight(
            "global_scale",
            global_scale_initializer,
            global_scale_regularizer,
            global_scale_constraint,
        )

    def build(self, input_shape):
        super().build(input_shape)
        self.add_bayesian_weight("local_scale", (input_shape[-1],))
        self.add_bayesian_weight("global_scale", ())

    def call(self, inputs, mask=None):
        del mask
        self.call_weights()
        inputs = tf.convert_to_tensor(inputs, dtype=self.compute_dtype)
        scale = tf.convert_to_tensor(self.local_scale) * tf.convert_to_tensor(self.global_scale)
        return self.add_bias_and_activate(self.apply_kernel(inputs * scale))

    def get_config(self):
        return {
            **super().get_config(),
            **self._weight_config("local_scale"),
            **self._weight_config("global_scale"),
        }


@register
class DenseHierarchical(Hierarchical, _DenseBase):
    """Dense layer with a hierarchical (horseshoe) prior: `W_ij = V_ij s_i g`, a local scale per
    input unit and a global scale, half-Cauchy a priori (Louizos et al., 2017)."""

    _args_doc = _DenseBase._args_doc + HIERARCHICAL_ARGS


@register
class Conv2DHierarchical(Hierarchical, _Conv2D):
    """2-D convolution with a hierarchical (horseshoe) prior: a local scale per input channel
    and a global scale, half-Cauchy a priori (Louizos et al., 2017)."""

    _args_doc = _Conv2D._args_doc + HIERARCHICAL_ARGS
