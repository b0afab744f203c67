"""SWA / SWAG: the moments match the iterates they summarise, draws have the stated covariance,
the callback and the wrapper collect what they should, and batch-norm statistics are recomputed
exactly."""

import keras
import numpy as np
import pytest

from blayers.posthoc import SWAG
from blayers.posthoc.swag import update_batch_norm


def _tiny(seed=0, units=3):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(units)])
    return model


def _flat(model):
    return np.concatenate([np.asarray(v).reshape(-1) for v in model.trainable_variables])


def _collect_iterates(swag, model, iterates):
    for theta in iterates:
        swag._assign(theta)
        swag.collect()


def test_moments_match_the_iterates():
    model = _tiny()
    p = _flat(model).size
    rng = np.random.default_rng(0)
    iterates = rng.normal(size=(12, p)) * rng.uniform(0.1, 2.0, size=p) + 3.0
    swag = SWAG(model, max_rank=5)
    _collect_iterates(swag, model, iterates)
    assert swag.num_collected == 12
    np.testing.assert_allclose(swag.mean, iterates.mean(0), rtol=1e-6)
    np.testing.assert_allclose(swag.variance, iterates.var(0), rtol=1e-5)
    # D holds the last K deviations from the running mean at the time of each collection.
    running = np.cumsum(iterates, 0) / np.arange(1, 13)[:, None]
    np.testing.assert_allclose(swag.deviations, (iterates - running)[-5:], rtol=1e-6, atol=1e-6)
    # Diagonal SWAG keeps no deviations.
    diagonal = SWAG(model, max_rank=0)
    _collect_iterates(diagonal, model, iterates)
    assert diagonal.deviations.shape == (0, p)
    np.testing.assert_allclose(diagonal.covariance(), 0.5 * np.diag(iterates.var(0)), rtol=1e-5)


def test_draws_have_the_stated_mean_and_covariance():
    model = _tiny(units=2)
    p = _flat(model).size
    rng = np.random.default_rng(1)
    iterates = rng.normal(size=(8, p)) @ rng.normal(size=(p, p)) * 0.3
    swag = SWAG(model, max_rank=4)
    _collect_iterates(swag, model, iterates)
    deviations = swag.deviations
    expected = 0.5 * (np.diag(iterates.var(0)) + deviations.T @ deviations / 3)
    np.testing.assert_allclose(swag.covariance(), expected, rtol=1e-6)
    n = 40_000
    draw_rng = np.random.default_rng(2)
    draws = np.stack([swag.sample_flat(draw_rng) for _ in range(n)])
    sd = np.sqrt(np.diag(expected))
    # Mean within 5 standard errors; each covariance entry within 5 of its standard errors
    # (Var[x_i x_j] = s_ii s_jj + s_ij^2 for a Gaussian).
    assert np.all(np.abs(draws.mean(0) - swag.mean) < 5 * sd / np.sqrt(n))
    empirical = np.cov(draws.T)
    se = np.sqrt((np.outer(sd**2, sd**2) + expected**2) / n)
    assert np.all(np.abs(empirical - expected) < 5 * se)


def test_callback_collects_each_epoch_from_start_epoch_and_every_n_steps():
    x = np.random.default_rng(0).normal(size=(64, 2)).astype("float32")
    y = x @ np.array([[1.0, -1.0, 0.5], [0.3, 0.2, -2.0]], "float32")
    model = _tiny()
    model.compile(keras.optimizers.SGD(0.05), "mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(_flat(self.model))

    swag = SWAG(start_epoch=2, max_rank=3)
    model.fit(x, y, epochs=6, batch_size=16, verbose=0, callbacks=[Record(), swag])
    assert swag.num_collected == 4
    np.testing.assert_allclose(swag.mean, np.mean(seen[2:], 0), rtol=1e-5, atol=1e-7)
    steps = SWAG(model, collect_every=2)
    steps.fit(x, y, epochs=2, batch_size=16, verbose=0, learning_rate=0.01)
    assert steps.num_collected == 4  # 8 steps, every 2nd
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)


def test_wrapper_needs_a_compiled_model_and_rejects_rank_one():
    with pytest.raises(ValueError, match="compile"):
        SWAG(_tiny()).fit(np.zeros((4, 2)), np.zeros((4, 3)), epochs=1)
    with pytest.raises(ValueError, match="max_rank=1"):
        SWAG(max_rank=1)
    with pytest.raises(ValueError, match="nothing collected"):
        _ = SWAG(_tiny()).mean


def test_swag_on_a_classifier_predicts_and_restores_weights(tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
    )
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.9),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x[:1200], y[:1200], epochs=10, batch_size=64, verbose=0)
    before = [np.array(v) for v in model.variables]
    swag = SWAG(model, max_rank=5)
    swag.fit(x[:1200], y[:1200], epochs=8, batch_size=64, verbose=0, learning_rate=0.02)
    after_fit = [np.array(v) for v in model.variables]
    logits = swag.predict(x[1200:], num_samples=8, seed=0)
    assert logits.shape == (8, len(x) - 1200, 10)
    assert np.std(logits, 0).mean() > 1e-3  # the draws differ
    for saved, variable in zip(after_fit, model.variables):
        np.testing.assert_array_equal(saved, np.array(variable))
    accuracy = np.mean(keras.ops.softmax(logits).numpy().mean(0).argmax(-1) == y[1200:])
    assert accuracy > 0.85
    assert any(not np.allclose(a, b) for a, b in zip(before, after_fit))
    # The moments survive a round trip through a file.
    swag.save(tmp_path / "swag.npz")
    loaded = SWAG.load(tmp_path / "swag.npz", model)
    np.testing.assert_array_equal(loaded.mean, swag.mean)
    np.testing.assert_array_equal(loaded.deviations, swag.deviations)
    assert loaded.get_config() == swag.get_config()
    loaded.assign_swa()
    np.testing.assert_allclose(_flat(model), swag.mean.astype("float32"))


def test_batch_norm_statistics_are_the_plain_average_over_the_data():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(momentum=0.99)])
    x = np.random.default_rng(0).normal(loc=[1.0, -2.0, 5.0], size=(400, 3)).astype("float32")
    update_batch_norm(model, x, batch_size=100)
    layer = model.layers[0]
    batch_means = x.reshape(4, 100, 3).mean(1)
    batch_vars = x.reshape(4, 100, 3).var(1)
    np.testing.assert_allclose(np.array(layer.moving_mean), batch_means.mean(0), rtol=1e-5)
    np.testing.assert_allclose(np.array(layer.moving_variance), batch_vars.mean(0), rtol=1e-4)
    assert layer.momentum == 0.99
