"""MC-BatchNorm: each draw normalizes with one training mini-batch's statistics (checked against
the batch's mean and variance by hand), the trained statistics come back, and the draws
spread."""

import keras
import numpy as np
import pytest

from blayers.posthoc import MCBatchNorm


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, name="dense"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Dense(2, name="head"),
        ]
    )
    model.get_layer("bn").gamma.assign([1.0, 2.0, 0.5, 1.5])
    model.get_layer("bn").beta.assign([0.1, -0.2, 0.3, 0.0])
    return model


def test_a_draw_normalizes_with_its_mini_batch():
    model = _model()
    train = np.random.RandomState(0).randn(50, 3).astype("float32")
    x = np.random.RandomState(1).randn(7, 3).astype("float32")
    bn, dense, head = (model.get_layer(n) for n in ("bn", "dense", "head"))
    mcbn = MCBatchNorm(model, train, batch_size=10)
    rows = np.arange(5, 15)
    mcbn.set_batch_statistics(rows)
    h = train[rows] @ dense.kernel.numpy() + dense.bias.numpy()
    mean, var = h.mean(0), h.var(0)
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.numpy(), var, rtol=1e-4, atol=1e-6)
    hx = x @ dense.kernel.numpy() + dense.bias.numpy()
    normalized = (hx - mean) / np.sqrt(var + bn.epsilon) * bn.gamma.numpy() + bn.beta.numpy()
    expected = normalized @ head.kernel.numpy() + head.bias.numpy()
    np.testing.assert_allclose(model(x, training=False), expected, rtol=1e-4, atol=1e-5)

    trained = [v.numpy().copy() for v in (bn.moving_mean, bn.moving_variance)]
    draws = mcbn.predict(x, num_samples=20)
    assert draws.shape == (20, 7, 2) and draws.std(0).mean() > 1e-3
    for variable, value in zip((bn.moving_mean, bn.moving_variance), trained):
        np.testing.assert_array_equal(variable.numpy(), value)  # the trained statistics back
    assert bn.momentum == pytest.approx(0.99)


def test_each_draw_uses_the_rows_batch_rows_names():
    """`batch_rows` is what `draws` normalizes with: distinct rows per batch, seeded, and each
    draw's predictions equal to setting that batch's statistics by hand."""
    model = _model()
    train = np.random.RandomState(0).randn(50, 3).astype("float32")
    x = np.random.RandomState(1).randn(7, 3).astype("float32")
    mcbn = MCBatchNorm(model, train, batch_size=10, seed=3)
    rows = mcbn.batch_rows(4)
    assert len(rows) == 4 and all(len(set(r)) == 10 for r in rows)
    assert all(np.array_equal(a, b) for a, b in zip(rows, mcbn.batch_rows(4)))  # seeded
    draws = mcbn.predict(x, num_samples=4)
    for k, batch in enumerate(rows):
        with mcbn.kept():
            mcbn.set_batch_statistics(batch)
            np.testing.assert_allclose(draws[k], model(x, training=False), rtol=1e-6)


def test_refusals_name_the_problem():
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no BatchNormalization layer"):
        MCBatchNorm(plain, np.zeros((10, 3), "float32"))
    with pytest.raises(ValueError, match="batch_size"):
        MCBatchNorm(_model(), np.zeros((10, 3), "float32"), batch_size=64)
