"""SG-MCMC: each sampler's draws against the closed-form posterior of Bayesian linear regression
(mean and covariance within Monte Carlo error from batch means, plus the step's known
discretization bias), the cyclical schedule against its formula, exact replay from a step, and
the kept samples as a model that `blayers.predict` averages."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers import sgmcmc

N, D, NOISE, PRIOR = 100, 2, 1.0, 1.0


def _problem():
    rng = np.random.RandomState(0)
    x = rng.randn(N, D)
    x = (x - x.mean(0)) / x.std(0)
    y = x @ np.array([0.7, -1.2]) + NOISE * rng.randn(N)
    precision = x.T @ x / NOISE**2 + np.eye(D) / PRIOR**2
    cov = np.linalg.inv(precision)
    return x, y, cov @ x.T @ y / NOISE**2, cov


def _chain(optimizer, steps, burn_in, start=None):
    """Full-batch draws of the weights under the per-example loss `L = mean (y - x w)^2 / (2
    sigma^2) + |w|^2 / (2 s^2 N)`."""
    x, y, _, _ = _problem()
    x, y = tf.constant(x), tf.constant(y)
    w = tf.Variable(np.zeros(D) if start is None else start)
    optimizer.build([w])

    @tf.function
    def run(count):
        draws = tf.TensorArray(tf.float64, size=count)
        for i in tf.range(count):
            with tf.GradientTape() as tape:
                residual = y - tf.linalg.matvec(x, w)
                loss = tf.reduce_mean(residual**2) / (2 * NOISE**2) + tf.reduce_sum(w**2) / (
                    2 * PRIOR**2 * N
                )
            optimizer.apply_gradients([(tape.gradient(loss, w), w)])
            draws = draws.write(i, w.value())
        return draws.stack()

    run(burn_in)
    return run(steps).numpy(), w


def _batch_means_se(draws, batches=40):
    means = np.stack([b.mean(0) for b in np.array_split(draws, batches)])
    return means.std(0, ddof=1) / np.sqrt(batches)


@pytest.mark.parametrize(
    "make",
    [
        lambda: sgmcmc.SGLD(0.01, num_data=N, seed=3),
        lambda: sgmcmc.SGHMC(0.002, num_data=N, friction=0.1, seed=3),
    ],
    ids=["sgld", "sghmc"],
)
def test_samples_match_the_closed_form_posterior(make):
    _, _, mean, cov = _problem()
    draws, _ = _chain(make(), steps=60_000, burn_in=2_000)
    se = _batch_means_se(draws)
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), 5 * se)
    # Covariance: batch-means error of each entry of the centred products, plus the step's
    # relative bias (about lr h / 2 = 0.5% for SGLD here).
    centred = draws - mean
    products = centred[:, :, None] * centred[:, None, :]
    estimate = products.mean(0)
    error = _batch_means_se(products.reshape(len(draws), -1)).reshape(D, D)
    np.testing.assert_array_less(np.abs(estimate - cov), 5 * error + 0.02 * np.abs(cov))
    assert np.all(np.abs(np.diag(estimate) / np.diag(cov) - 1) < 0.1)


def test_temperature_scales_the_posterior_spread():
    """T = 0.25: the cold posterior's covariance is T times the posterior's."""
    _, _, _, cov = _problem()
    draws, _ = _chain(sgmcmc.SGLD(0.01, num_data=N, temperature=0.25, seed=5), 40_000, 2_000)
    ratio = np.diag(np.cov(draws.T)) / np.diag(cov)
    np.testing.assert_allclose(ratio, 0.25, rtol=0.15)


def test_noise_replays_exactly_from_a_restored_step(tmp_path):
    """The noise is a function of (seed, step, variable): a chain restored from a checkpoint
    at step 50 (weights, momenta, step) continues as the uninterrupted one."""
    whole, _ = _continue(sgmcmc.SGHMC(0.002, num_data=N, seed=1), tf.Variable(np.zeros(D)), 100)
    first, w = _continue(sgmcmc.SGHMC(0.002, num_data=N, seed=1), tf.Variable(np.zeros(D)), 50)
    path = tf.train.Checkpoint(optimizer=first.optimizer, w=w).save(str(tmp_path / "ckpt"))
    restored = sgmcmc.SGHMC(0.002, num_data=N, seed=1)
    w_restored = tf.Variable(np.zeros(D))
    restored.build([w_restored])
    tf.train.Checkpoint(optimizer=restored, w=w_restored).restore(path).assert_consumed()
    rest, _ = _continue(restored, w_restored, 50)
    np.testing.assert_array_equal(np.concatenate([first.draws, rest.draws]), whole.draws)


class _Run:
    def __init__(self, optimizer, draws):
        self.optimizer, self.draws = optimizer, draws


def _continue(optimizer, w, steps):
    x, y, _, _ = _problem()
    x, y = tf.constant(x), tf.constant(y)
    out = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            residual = y - tf.linalg.matvec(x, w)
            loss = tf.reduce_mean(residual**2) / (2 * NOISE**2) + tf.reduce_sum(w**2) / (
                2 * PRIOR**2 * N
            )
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
        out.append(w.numpy())
    return _Run(optimizer, np.array(out)), w


def test_cyclical_schedule_is_the_papers():
    schedule = sgmcmc.CyclicalSchedule(0.1, cycle_length=10, exploration_fraction=0.8)
    steps = np.arange(25)
    expected = 0.05 * (np.cos(np.pi * (steps % 10) / 10) + 1)
    np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, rtol=1e-6)
    assert [float(schedule.sampling(s)) for s in range(10)] == [0.0] * 8 + [1.0] * 2
    # Exploration adds no noise: a cyclical SGLD step there is the plain gradient step.
    w = tf.Variable([1.0, 2.0])
    sampler = sgmcmc.SGLD(schedule, num_data=N)
    sampler.apply_gradients([(tf.constant([0.5, -0.5]), w)])
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.1 * 0.5, 2.0 + 0.1 * 0.5], rtol=1e-6)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="SGHMC: friction"):
        sgmcmc.SGHMC(0.01, num_data=10, friction=2.0)
    with pytest.raises(ValueError, match="SGLD: num_data"):
        sgmcmc.SGLD(0.01, num_data=0)
    with pytest.raises(ValueError, match="cycle_length"):
        sgmcmc.CyclicalSchedule(0.1, cycle_length=0)


def test_kept_samples_average_through_predict():
    """`PosteriorSamples` as a model: `blayers.predict` over the kept samples gives their
    average (and spread); the network's own weights are untouched."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    samples = sgmcmc.PosteriorSamples(model, max_samples=3)
    x = np.random.RandomState(0).randn(5, 3).astype("float32")
    outputs = []
    for k in range(4):  # the ring keeps the last three
        model.layers[0].kernel.assign(np.full((3, 2), float(k), "float32"))
        samples.keep()
        outputs.append(x @ np.full((3, 2), float(k)) + 0.0)
    own = model.get_weights()
    samples.reset_cursor()
    prediction = blayers.predict(samples, x, num_samples=samples.num_kept, return_samples=True)
    np.testing.assert_allclose(prediction.mean, np.mean(outputs[1:], 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(prediction.stddev, np.std(outputs[1:], 0), rtol=1e-4, atol=1e-5)
    for a, b in zip(model.get_weights(), own):
        np.testing.assert_array_equal(a, b)
    assert samples.num_kept == 3
