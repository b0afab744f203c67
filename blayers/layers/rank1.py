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
from blayers.layers.batch_ensemble import _Conv2DFastWeights, _DenseFastWeights
from blayers.layers.ensemble import check_ensemble_size, member_rows
from blayers.layers.estimators import ReparameterizationEstimator
from blayers.layers.recurrent import _LSTMCell
from blayers.regularizers import RANK1_PRIOR

__all__ = ["Conv2DRank1", "DenseRank1", "LSTMCellRank1", "rank1_initializer"]


def rank1_initializer():
    """Mean-field Normal over a rank-1 factor whose means start at `N(1, 0.5^2)`."""
    return initializers.TrainableNormal(
        mean_initializer=keras.initializers.RandomNormal(mean=1.0, stddev=0.5)
    )


@register
class DenseRank1(_DenseFastWeights):
    """Rank-1 Bayesian dense layer: member `m` computes
    `activation(((x * r_m) @ W) * s_m + b_m)` with `r_m ~ q(alpha_m)`, `s_m ~ q(gamma_m)`
    drawn once per call, on its rows of a member-major batch (`EnsembleTile`)."""

    _default_fast_initializer = staticmethod(rank1_initializer)
    _default_fast_regularizer = RANK1_PRIOR


@register
class Conv2DRank1(_Conv2DFastWeights):
    """Rank-1 Bayesian 2-D convolution: member `m` convolves `x * r_m` (input channels) with the
    shared kernel, scales output channels by `s_m`, adds `b_m`; `r_m`, `s_m` drawn per call."""

    _default_fast_initializer = staticmethod(rank1_initializer)
    _default_fast_regularizer = RANK1_PRIOR


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
      alpha_regularizer, gamma_regularizer, recurrent_alpha_regularizer,
        recurrent_gamma_regularizer: their KL terms (default `'rank1_prior'`).
      kernel_initializer, recurrent_initializer: of `W`, `U` (default Glorot-uniform,
        orthogonal); kernel_regularizer, recurrent_regularizer: theirs (default None).
      **kwargs: the other `_LSTMCell` arguments (activation, use_bias, unit_forget_bias, ...).
    """

    _FACTORS = ("alpha", "gamma", "recurrent_alpha", "recurrent_gamma")

    def __init__(
        self,
        units,
        ensemble_size=4,
        alpha_initializer=None,
        gamma_initializer=None,
        recurrent_alpha_initializer=None,
        recurrent_gamma_initializer=None,
        alpha_regularizer=RANK1_PRIOR,
        gamma_regularizer=RANK1_PRIOR,
        recurrent_alpha_regularizer=RANK1_PRIOR,
        recurrent_gamma_regularizer=RANK1_PRIOR,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        kernel_regularizer=None,
        recurrent_regularizer=None,
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
        self._configure_weight(
            "alpha", alpha_initializer or rank1_initializer(), alpha_regularizer, None
        )
        self._configure_weight(
            "gamma", gamma_initializer or rank1_initializer(), gamma_regularizer, None
        )
        self._configure_weight(
            "recurrent_alpha",
            recurrent_alpha_initializer or rank1_initializer(),
            recurrent_alpha_regularizer,
            None,
        )
        self._configure_weight(
            "recurrent_gamma",
            recurrent_gamma_initializer or rank1_initializer(),
            recurrent_gamma_regularizer,
            None,
        )

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
        projections = {
            "kernel": lambda x: tf.matmul(x * rows["alpha"], kernel) * rows["gamma"],
            "recurrent_kernel": lambda h: (
                tf.matmul(h * rows["recurrent_alpha"], recurrent) * rows["recurrent_gamma"]
            ),
        }
        bias = None
        if self.use_bias:
            bias = member_rows(tf.convert_to_tensor(self.bias), rows_like, name)
        return projections, bias

    def get_config(self):
        config = {**super().get_config(), "ensemble_size": self.ensemble_size}
        config.update(self._weight_config("alpha"))
        config.update(self._weight_config("gamma"))
        config.update(self._weight_config("recurrent_alpha"))
        config.update(self._weight_config("recurrent_gamma"))
        for factor in self._FACTORS:
            config.pop(f"{factor}_constraint", None)
        return config
