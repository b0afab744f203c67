"""The quantile output layer: non-crossing quantiles that the pinball loss fits, and CQR on
top of them covering at the promised rate."""

import keras
import numpy as np
import pytest
from conftest import epochs_of

from blayers.layers import QuantileOutput
from blayers.layers.quantile import pinball_loss
from blayers.posthoc import ConformalizedQuantileRegressor


def test_quantiles_never_cross_and_the_layer_round_trips():
    layer = QuantileOutput(2, quantiles=(0.1, 0.5, 0.9))
    out = keras.ops.convert_to_numpy(layer(np.random.default_rng(0).normal(size=(64, 3)) * 50))
    assert out.shape == (64, 2, 3)
    assert np.all(np.diff(out, axis=-1) >= 0)  # never decreasing (softplus may underflow to 0)
    clone = QuantileOutput.from_config(layer.get_config())
    assert clone.quantiles == (0.1, 0.5, 0.9) and clone.units == 2
    with pytest.raises(ValueError, match="quantiles must be increasing levels"):
        QuantileOutput(1, quantiles=(0.9, 0.1))


def test_pinball_loss_is_minimized_by_the_quantile():
    rng = np.random.default_rng(1)
    y = rng.exponential(size=(20000, 1)).astype("float32")
    grid = np.linspace(0.0, 4.0, 401)
    for tau in (0.1, 0.5, 0.9):
        losses = [
            float(
                np.mean(
                    keras.ops.convert_to_numpy(
                        pinball_loss(y, np.full((1, 1, 1), q, "float32") + 0 * y[..., None], [tau])
                    )
                )
            )
            for q in grid
        ]
        best = grid[int(np.argmin(losses))]
        # The exponential's tau-quantile, to the sample quantile's noise and the grid's step.
        assert best == pytest.approx(-np.log(1 - tau), abs=0.05)


def test_cqr_on_a_trained_quantile_network_covers():
    rng = np.random.default_rng(2)
    n = 3000
    x = rng.uniform(-3, 3, (n, 1)).astype("float32")
    y = (np.sin(x[:, 0]) + (0.1 + 0.2 * np.abs(x[:, 0])) * rng.normal(size=n)).astype("float32")
    keras.utils.set_random_seed(0)
    levels = (0.05, 0.95)
    model = keras.Sequential(
        [
            keras.Input((1,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            QuantileOutput(1, quantiles=levels),
        ]
    )
    model.compile("adam", lambda t, p: pinball_loss(t, p, levels))
    model.fit(epochs_of(x[:1500], y[:1500, None], 60, batch_size=100), verbose=0)
    q = model.predict(x[1500:], verbose=0)[:, 0]
    cal, test = slice(0, 750), slice(750, None)
    cqr = ConformalizedQuantileRegressor(alpha=0.1).fit(q[cal, 0], q[cal, 1], y[1500:][cal])
    lower, upper = cqr.predict_interval(q[test, 0], q[test, 1])
    covered = np.mean((y[1500:][test] >= lower) & (y[1500:][test] <= upper))
    assert abs(covered - 0.9) < 4 * np.sqrt(0.09 / 750) + 1 / 751
    width = upper - lower
    # Adaptive: the noise grows with |x|, and so do the intervals.
    wide = np.abs(x[1500:][test, 0]) > 2
    assert width[wide].mean() > 1.5 * width[np.abs(x[1500:][test, 0]) < 1].mean()
