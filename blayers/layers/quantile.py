"""Quantile regression output (Koenker & Bassett, 1978), the model of conformalized quantile
regression (Romano et al., 2019; `blayers.posthoc.ConformalizedQuantileRegressor`)."""

import keras
import numpy as np

from blayers.layers.base import register

__all__ = ["QuantileOutput", "pinball_loss"]


@register
class QuantileOutput(keras.layers.Layer):
    """Predicts the `quantiles` (levels in (0, 1), increasing) of each of `units` targets:
    outputs `[..., units, Q]` that never cross, `q_1 = a_1` and `q_j = q_{j-1} + softplus(a_j)`
    of a dense layer's `a`. Train with `pinball_loss` (the quantiles' proper scoring rule).

    Args:
      units: targets per example.
      quantiles: the levels, e.g. `(0.05, 0.95)` for a 90% interval (add 0.5 for a median).
      **kwargs: `keras.layers.Dense` arguments (initializers, regularizers) and
        `keras.layers.Layer` ones.
    """

    def __init__(self, units, quantiles=(0.05, 0.5, 0.95), **kwargs):
        dense_keys = (
            "kernel_initializer",
            "bias_initializer",
            "kernel_regularizer",
            "bias_regularizer",
        )
        dense = {k: kwargs.pop(k) for k in dense_keys if k in kwargs}
        super().__init__(**kwargs)
        levels = np.asarray(quantiles, np.float64).reshape(-1)
        if not (
            len(levels) and np.all((levels > 0) & (levels < 1)) and np.all(np.diff(levels) > 0)
        ):
            raise ValueError(
                f"QuantileOutput ({self.name}): quantiles must be increasing levels in (0, 1), "
                f"got {quantiles!r}."
            )
        if not isinstance(units, (int, np.integer)) or units < 1:
            raise ValueError(f"QuantileOutput ({self.name}): units must be >= 1, got {units!r}.")
        self.units, self.quantiles = int(units), tuple(float(q) for q in levels)
        self._dense_config = dense
        self.dense = keras.layers.Dense(
            self.units * len(self.quantiles), name="quantiles", dtype=self.dtype_policy, **dense
        )

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, inputs):
        raw = self.dense(inputs)
        raw = keras.ops.reshape(raw, (*keras.ops.shape(raw)[:-1], self.units, len(self.quantiles)))
        first, rest = raw[..., :1], keras.ops.softplus(raw[..., 1:])
        return keras.ops.concatenate([first, first + keras.ops.cumsum(rest, axis=-1)], -1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units, len(self.quantiles))

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, quantiles=list(self.quantiles))
        config.update(
            {k: keras.saving.serialize_keras_object(v) for k, v in self._dense_config.items()}
        )
        return config


def pinball_loss(targets, predictions, quantiles):
    """Per-example mean pinball (check) loss `rho_tau(y - q) = max(tau (y - q), (tau - 1)(y - q))`
    over targets and levels: predictions `[..., d, Q]` of the levels `quantiles [Q]` of
    targets `[..., d]`. Its minimizer over `q` is the `tau`-quantile."""
    targets = keras.ops.convert_to_tensor(targets, predictions.dtype)
    taus = keras.ops.convert_to_tensor(np.asarray(quantiles), predictions.dtype)
    residual = keras.ops.expand_dims(targets, -1) - predictions
    loss = keras.ops.maximum(taus * residual, (taus - 1.0) * residual)
    return keras.ops.mean(loss, axis=(-2, -1))
