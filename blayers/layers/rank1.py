"""Rank-1 Bayesian neural networks (Dusenberry et al., 2020).

A rank-1 BNN is BatchEnsemble (`blayers.layers.batch_ensemble`) with distributions over the
fast weights: member `m`'s weight is `W * outer(r_m, s_m)` with a shared deterministic `W` and
`r_m ~ q(r_m)`, `s_m ~ q(s_m)` (here `alpha`, `gamma`), mean-field Normal by default. Over the
`E` members the posterior of the rank-1 factors is a mixture of `E` Gaussians, one component
per member; prediction averages the members' predictive distributions
(`blayers.layers.EnsembleOutput`) and, over calls, the factors' draws.

Defaults (uncertainty-baselines' rank-1 ResNets): factor means start at `N(1, 0.5^2)`, their
stddevs in `[1e-3, 5e-2]`; the factors' prior is the gin-configurable `rank1_prior`
(`N(1, 1)` unless rebound), its KL in `layer.losses`. Each call draws one `(r_m, s_m)` per
member, shared by the member's rows (reparameterization).
"""

import keras
import tensorflow as tf

from blayers import initializers
from blayers.layers.base import register
from blayers.layers.batch_ensemble import (
    _Conv1DFastWeights,
    _Conv2DFastWeights,
    _DenseFastWeights,
    default_fast_regularizer,
    perturb,
)
from blayers.layers.ensemble import check_ensemble_size, member_rows
from blayers.layers.estimators import ReparameterizationEstimator
from blayers.layers.recurrent import _LSTMCell
from blayers.regularizers import RANK1_PRIOR

__all__ = ["Conv1DRank1", "Conv2DRank1", "DenseRank1", "LSTMCellRank1", "rank1_initializer"]


def rank1_initializer(additive=False):
    """Mean-field Normal over a rank-1 factor whose means start at `N(1, 0.5^2)` (additive
    perturbations: `N(0, 0.5^2)`)."""
    return initializers.TrainableNormal(
        mean_initializer=keras.initializers.RandomNormal(mean=0.0 if additive else 1.0, stddev=0.5)
    )


@register
class DenseRank1(_DenseFastWeights):
    """Rank-1 Bayesian dense layer: member `m` computes
    `activation(((x * r_m) @ W) * s_m + b_m)` with `r_m ~ q(alpha_m)`, `s_m ~ q(gamma_m)`
    drawn once per call, on its rows of a member-major batch (`EnsembleTile`)."""

    _default_fast_initializer = staticmethod(rank1_initializer)
    _default_fast_regularizer = RANK1_PRIOR
    _default_ensemble_size = 1


@register
class Conv1DRank1(_Conv1DFastWeights):
    """Rank-1 Bayesian 1-D convolution: as `Conv2DRank1` over `[E * B, length, channels]`."""

    _default_fast_initializer = staticmethod(rank1_initializer)
    _default_fast_regularizer = RANK1_PRIOR
    _default_ensemble_size = 1


@register
class Conv2DRank1(_Conv2DFastWeights):
    """Rank-1 Bayesian 2-D convolution: member `m` convolves `x * r_m` (input channels) with the
    shared kernel, scales output channels by `s_m`, adds `b_m`; `r_m`, `s_m` drawn per call."""

    _default_fast_initializer = staticmethod(rank1_initializer)
    _default_fast_regularizer = RANK1_PRIOR
    _default_ensemble_size = 1


@register
class LSTMCellRank1(ReparameterizationEstimator, _LSTMCell):
    """Rank-1 Bayesian LSTM cell (Dusenberry et al., 2020): shared deterministic kernels `W`
    (input) and `U` (recurrent) with rank-1 factors per member,

        z = ((x * r_m) @ W) * s_m + ((h * r'_m) @ U) * s'_m + b_m,

    the factors drawn once per sequence (`get_initial_state` or the first step) and shared by
    its steps, on a member-major batch. Gates as `keras.layers.LSTMCell`.

    Args:
      units: state size.
      ensemble_size: members `E`.
      alpha_initializer, gamma_initializer: of the input factors `[E, in]`, `[E, 4 units]`
        (default: Normal with means at `N(1, 0.5^2)`); `recurrent_alpha_initializer`,
        `recurrent_gamma_initializer` of the recurrent ones `[E, units]`, `[E, 4 units]`.
      alpha_regularizer, gamma_regularizer: their KL terms (default `'rank1_prior'`);
        `recurrent_alpha_regularizer`, `recurrent_gamma_regularizer` likewise.
      kernel_initializer, recurrent_initializer: of `W`, `U` (default Glorot-uniform,
        orthogonal); kernel_regularizer, recurrent_regularizer: theirs (default None).
      use_additive_perturbation: `(x + r_m) @ W + s_m` (and likewise for `h`) instead of the
        products (edward2's option); factors then start near 0 with the `'prior'` KL.
      **kwargs: the other `_LSTMCell` arguments (activation, use_bias, unit_forget_bias, ...).
    """

    _FACTORS = ("alpha", "gamma", "recurrent_alpha", "recurrent_gamma")

    def __init__(
        self,
        units,
        ensemble_size=1,
        alpha_initializer=None,
        gamma_initializer=None,
        recurrent_alpha_initializer=None,
        recurrent_gamma_initializer=None,
        alpha_regularizer=None,
        gamma_regularizer=None,
        recurrent_alpha_regularizer=None,
        recurrent_gamma_regularizer=None,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        kernel_regularizer=None,
        recurrent_regularizer=None,
        use_additive_perturbation=False,
        **kwargs,
    ):
        super().__init__(
            units,
            kernel_initializer=kernel_initializer,
            recurrent_initializer=recurrent_initializer,
            kernel_regularizer=kernel_regularizer,
            recurrent_regularizer=recurrent_regularizer,
            **kwargs,
        )
        self.ensemble_size = check_ensemble_size(f"LSTMCellRank1 ({self.name})", ensemble_size)
        self.use_additive_perturbation = bool(use_additive_perturbation)
        for factor, init, reg in (
            ("alpha", alpha_initializer, alpha_regularizer),
            ("gamma", gamma_initializer, gamma_regularizer),
            ("recurrent_alpha", recurrent_alpha_initializer, recurrent_alpha_regularizer),
            ("recurrent_gamma", recurrent_gamma_initializer, recurrent_gamma_regularizer),
        ):
            init = init or rank1_initializer(self.use_additive_perturbation)
            reg = default_fast_regularizer(reg, RANK1_PRIOR, self)
            self._configure_weight(factor, init, reg, None)

    def _bias_shape(self):
        return (self.ensemble_size, self.gates * self.units)

    def build(self, input_shape):
        super().build(input_shape)
        e, gates = self.ensemble_size, self.gates * self.units
        self.add_bayesian_weight("alpha", (e, input_shape[-1]))
        self.add_bayesian_weight("gamma", (e, gates))
        self.add_bayesian_weight("recurrent_alpha", (e, self.units))
        self.add_bayesian_weight("recurrent_gamma", (e, gates))

    def _projections(self, sequence):
        """The sequence's factors expanded to the member-major rows."""
        name = f"LSTMCellRank1 ({self.name})"
        rows_like = tf.zeros(tf.stack([sequence.batch_size, 1]), self.compute_dtype)
        rows = {
            factor: member_rows(tf.convert_to_tensor(getattr(self, factor)), rows_like, name)
            for factor in self._FACTORS
        }
        kernel = tf.convert_to_tensor(self.kernel)
        recurrent = tf.convert_to_tensor(self.recurrent_kernel)
        add = self.use_additive_perturbation
        projections = {
            "kernel": lambda x: perturb(
                tf.matmul(perturb(x, rows["alpha"], add), kernel), rows["gamma"], add
            ),
            "recurrent_kernel": lambda h: perturb(
                tf.matmul(perturb(h, rows["recurrent_alpha"], add), recurrent),
                rows["recurrent_gamma"],
                add,
            ),
        }
        bias = None
        if self.use_bias:
            bias = member_rows(tf.convert_to_tensor(self.bias), rows_like, name)
        return projections, bias

    def get_config(self):
        config = {
            **super().get_config(),
            "ensemble_size": self.ensemble_size,
            "use_additive_perturbation": self.use_additive_perturbation,
        }
        config.update(self._weight_config("alpha"))
        config.update(self._weight_config("gamma"))
        config.update(self._weight_config("recurrent_alpha"))
        config.update(self._weight_config("recurrent_gamma"))
        for factor in self._FACTORS:
            config.pop(f"{factor}_constraint", None)
        return config
