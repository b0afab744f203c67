"""Post-hoc recalibration and conformal prediction: temperature scaling finds the temperature
that generated the data and never raises the calibration NLL; conformal sets and intervals
cover at the guaranteed rate over many random splits."""

import numpy as np
import pytest
import scipy.optimize
from scipy.special import log_softmax, softmax

from blayers.posthoc import SplitConformalClassifier, SplitConformalRegressor, TemperatureScaling
from blayers.posthoc.temperature import _nll_and_grad


def _categorical(rng, probs):
    """A label per row of `probs` by the inverse CDF (one `rng.choice` a row took seconds)."""
    below = np.cumsum(probs, -1) < rng.uniform(size=(len(probs), 1))
    return np.minimum(below.sum(-1), probs.shape[-1] - 1)


def _overconfident(n, k=5, temperature=3.0, seed=0):
    """Labels drawn from softmax(z); the model reports `temperature * z`."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 1.5
    labels = _categorical(rng, softmax(z, -1))
    return temperature * z, labels


def _nll(logits, labels):
    return -np.mean(log_softmax(logits, -1)[np.arange(len(labels)), labels])


def test_temperature_scaling_recovers_the_generating_temperature():
    logits, labels = _overconfident(20_000)
    scaler = TemperatureScaling().fit(logits, labels)
    assert scaler.temperature == pytest.approx(3.0, rel=0.05)
    # The fit is the NLL's minimizer (a bounded 1-D search agrees).
    best = scipy.optimize.minimize_scalar(
        lambda t: _nll(logits / t, labels), bounds=(0.05, 20), method="bounded"
    )
    assert scaler.temperature == pytest.approx(best.x, rel=1e-3)
    calibrated = scaler.predict_proba(logits)
    assert np.all(calibrated.argmax(-1) == logits.argmax(-1))  # accuracy is unchanged


@pytest.mark.parametrize("vector", [False, True])
def test_calibration_nll_is_never_above_the_model_s(vector):
    for seed, temperature in enumerate([0.5, 1.0, 3.0]):
        logits, labels = _overconfident(300, temperature=temperature, seed=seed)
        scaler = TemperatureScaling(vector=vector).fit(logits, labels)
        assert _nll(scaler.calibrated_logits(logits), labels) <= _nll(logits, labels) + 1e-12
    # Already calibrated logits stay (close to) the identity.
    logits, labels = _overconfident(20_000, temperature=1.0, seed=7)
    assert TemperatureScaling().fit(logits, labels).temperature == pytest.approx(1.0, rel=0.05)


def test_temperature_scaling_refuses_log_zero_instead_of_keeping_the_identity():
    with np.errstate(divide="ignore"):  # saturated: log 0
        logits = np.log(np.array([[1.0, 0.0], [0.3, 0.7]], np.float32))
    with pytest.raises(ValueError, match="not all finite"):
        TemperatureScaling().fit(logits, np.array([1, 1]))


def test_vector_scaling_recovers_per_class_scales_and_gradients_are_exact():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(40_000, 3)) * 1.5
    labels = _categorical(rng, softmax(z, -1))
    scales = np.array([2.0, 0.5, 1.0])
    scaler = TemperatureScaling(vector=True).fit(z / scales, labels)
    # w * (z / scales) + b = z up to a shift common to all classes.
    np.testing.assert_allclose(np.exp(scaler.params[:3]), scales, rtol=0.06)
    for vector, size in ((False, 1), (True, 6)):
        params = rng.normal(size=size) * 0.3
        _, grad = _nll_and_grad(params, z[:50], labels[:50], vector)
        numeric = scipy.optimize.approx_fprime(
            params, lambda p, v=vector: _nll_and_grad(p, z[:50], labels[:50], v)[0], 1e-7
        )
        np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-6)
    config = scaler.get_config()
    assert np.allclose(TemperatureScaling.from_config(config).params, scaler.params)
    with pytest.raises(ValueError, match="fit"):
        TemperatureScaling().predict_proba(z)


def _coverage_bounds(alpha, n_cal, coverages):
    """The guarantee `[1 - alpha, 1 - alpha + 1/(n+1)]` for the mean coverage, widened by 3
    standard errors of the mean over repetitions."""
    se = np.std(coverages) / np.sqrt(len(coverages))
    return 1 - alpha - 3 * se, 1 - alpha + 1 / (n_cal + 1) + 3 * se


@pytest.mark.parametrize("normalized", [True, False])
def test_conformal_intervals_cover_at_the_guaranteed_rate(normalized):
    rng = np.random.default_rng(4)
    alpha, n_cal, n_test, repeats = 0.1, 200, 200, 400
    coverages, widths = [], []
    for _ in range(repeats):
        x = rng.uniform(-3, 3, size=n_cal + n_test)
        y = np.sin(x) + (0.1 + 0.3 * np.abs(x)) * rng.normal(size=x.size)
        # A model with the right mean and a poor (too small, constant-ish) predictive stddev.
        means, stddevs = np.sin(x), 0.2 + 0.05 * np.abs(x)
        conformal = SplitConformalRegressor(alpha)
        if normalized:
            conformal.fit(means[:n_cal], y[:n_cal], stddevs[:n_cal])
            low, high = conformal.predict_interval(means[n_cal:], stddevs[n_cal:])
        else:
            conformal.fit(means[:n_cal], y[:n_cal])
            low, high = conformal.predict_interval(means[n_cal:])
        coverages.append(np.mean((y[n_cal:] >= low) & (y[n_cal:] <= high)))
        widths.append(np.mean(high - low))
    low_bound, high_bound = _coverage_bounds(alpha, n_cal, coverages)
    assert low_bound <= np.mean(coverages) <= high_bound, np.mean(coverages)
    # The model's own 90% interval (+-1.645 stddev) under-covers; conformal repairs it.
    assert np.mean(np.abs(y - means) <= 1.645 * stddevs) < 0.8


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_conformal_sets_cover_at_the_guaranteed_rate(method):
    rng = np.random.default_rng(5)
    alpha, k, n_cal, n_test, repeats = 0.1, 10, 300, 300, 300
    coverages, sizes = [], []
    for repeat in range(repeats):
        logits = rng.normal(size=(n_cal + n_test, k)) * 2.0
        labels = _categorical(rng, softmax(logits, -1))
        probs = softmax(2.5 * logits, -1)  # an overconfident model
        conformal = SplitConformalClassifier(alpha, method=method, seed=repeat)
        sets = conformal.fit(probs[:n_cal], labels[:n_cal]).predict_set(probs[n_cal:])
        coverages.append(np.mean(sets[np.arange(n_test), labels[n_cal:]]))
        sizes.append(sets.sum(-1).mean())
    low_bound, high_bound = _coverage_bounds(alpha, n_cal, coverages)
    assert low_bound <= np.mean(coverages) <= high_bound, np.mean(coverages)
    assert 1 < np.mean(sizes) < k  # informative sets


def test_aps_sets_grow_with_the_input_s_difficulty():
    rng = np.random.default_rng(6)
    k, n = 10, 4000
    sharp = rng.uniform(size=n) < 0.5
    logits = rng.normal(size=(n, k)) * np.where(sharp, 4.0, 0.3)[:, None]
    probs = softmax(logits, -1)
    labels = np.array([rng.choice(k, p=p) for p in probs])
    conformal = SplitConformalClassifier(0.1, method="aps").fit(probs[:2000], labels[:2000])
    sizes = conformal.predict_set(probs[2000:]).sum(-1)
    assert sizes[~sharp[2000:]].mean() > 3 * sizes[sharp[2000:]].mean()
    with pytest.raises(ValueError, match="lac, aps or raps"):
        SplitConformalClassifier(method="topk")
