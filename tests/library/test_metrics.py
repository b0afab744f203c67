"""Uncertainty metrics against values computed by hand on small arrays."""

import math

import numpy as np
import pytest
import scipy.stats

from blayers import metrics


def test_classification_metrics_by_hand():
    # Two posterior draws, three examples, two classes.
    probs = np.array([[[0.9, 0.1], [0.4, 0.6], [0.2, 0.8]], [[0.7, 0.3], [0.6, 0.4], [0.4, 0.6]]])
    labels = np.array([0, 1, 0])
    mean = np.array([[0.8, 0.2], [0.5, 0.5], [0.3, 0.7]])
    assert metrics.accuracy(probs, labels) == pytest.approx(1 / 3)  # argmax ties -> class 0
    assert metrics.nll(probs, labels) == pytest.approx(-np.mean(np.log([0.8, 0.5, 0.3])))
    assert metrics.brier(probs, labels) == pytest.approx(
        np.mean([0.2**2 + 0.2**2, 0.5**2 + 0.5**2, 0.7**2 + 0.7**2])
    )
    entropy = -np.sum(mean * np.log(mean), -1)
    np.testing.assert_allclose(metrics.entropy(probs), entropy)
    per_draw = -np.sum(probs * np.log(probs), -1).mean(0)
    np.testing.assert_allclose(metrics.mutual_information(probs), entropy - per_draw)


def test_ece_by_hand():
    # Confidences 0.8 (bin 12 of 15), 0.5 (bin 7), 0.7 (bin 10): each bin holds one example.
    probs = np.array([[[0.8, 0.2], [0.5, 0.5], [0.3, 0.7]]])
    labels = np.array([0, 1, 0])  # correct, wrong (predicts 0), wrong
    expected = (abs(1 - 0.8) + abs(0 - 0.5) + abs(0 - 0.7)) / 3
    assert metrics.ece(probs, labels, num_bins=15) == pytest.approx(expected)
    # Two examples in one bin [14/15, 1]: |mean accuracy - mean confidence|.
    probs = np.array([[[0.94, 0.06], [0.96, 0.04]]])
    assert metrics.ece(probs, np.array([0, 1])) == pytest.approx(abs(0.5 - 0.95))


def test_ood_auroc_by_hand():
    assert metrics.ood_auroc([0.1, 0.2], [0.3, 0.4]) == 1.0
    assert metrics.ood_auroc([0.1, 0.4], [0.3, 0.2]) == pytest.approx(0.5)


def test_regression_metrics_by_hand():
    means = np.array([[[1.0], [2.0]], [[3.0], [2.0]]])  # [S=2, n=2, d=1]
    stddevs = np.array([[[1.0], [0.5]], [[1.0], [0.5]]])
    targets = np.array([[2.0], [3.0]])
    assert metrics.rmse(means, targets) == pytest.approx(math.sqrt((0 + 1) / 2))
    assert metrics.rmse(means, targets, scale=2.0) == pytest.approx(2 * math.sqrt(0.5))

    def normal_pdf(y, m, s):
        return math.exp(-0.5 * ((y - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))

    p0 = 0.5 * (normal_pdf(2, 1, 1) + normal_pdf(2, 3, 1))
    p1 = normal_pdf(3, 2, 0.5)
    expected = -(math.log(p0) + math.log(p1)) / 2
    assert metrics.nlpd(means, stddevs, targets) == pytest.approx(expected)
    assert metrics.nlpd(means, stddevs, targets, scale=3.0) == pytest.approx(
        expected + math.log(3.0)
    )
    # Mixture variances: example 0: 1 + 1 = 2 -> |0| within 1.96 sqrt(2); example 1:
    # 0.25 -> |1| > 1.96 * 0.5.
    assert metrics.coverage(means, stddevs, targets) == pytest.approx(0.5)
    # Noise: mean of the stddevs' squares, (1 + 0.25) / 2; function: mean variance of the
    # means over draws, (1 + 0) / 2; each times the scale, and together the mixture variance.
    noise, function = metrics.predictive_stddev_parts(means, stddevs, scale=2.0)
    assert noise == pytest.approx(2.0 * math.sqrt(0.625))
    assert function == pytest.approx(2.0 * math.sqrt(0.5))
    _, variance = metrics.mixture_moments(means, stddevs)
    assert noise**2 + function**2 == pytest.approx(4.0 * np.mean(variance))
    scores = metrics.regression_metrics(means, stddevs, targets, scale=2.0)
    assert scores["noise_stddev"] == noise and scores["function_stddev"] == function
    # A closed-form function variance inside the stddevs moves from the noise to the function.
    closed = np.full_like(stddevs, 0.125)
    moved = metrics.predictive_stddev_parts(means, stddevs, 2.0, function_variances=closed)
    assert moved == pytest.approx((2.0 * math.sqrt(0.5), 2.0 * math.sqrt(0.625)))


def test_adaptive_ece_uses_equal_mass_bins():
    # Confidences 0.6, 0.7 (one right, one wrong) and 0.9, 0.95 (both right), two bins of two.
    probs = np.array([[[0.6, 0.4], [0.7, 0.3], [0.9, 0.1], [0.95, 0.05]]])
    labels = np.array([0, 1, 0, 0])
    expected = (2 * abs(0.5 - 0.65) + 2 * abs(1.0 - 0.925)) / 4
    assert metrics.adaptive_ece(probs, labels, num_bins=2) == pytest.approx(expected)
    # A calibrated predictive's adaptive ECE goes to 0 (confidence ~ U(0.5, 1), correct w.p. it).
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.5, 1.0, 200_000)
    labels = (rng.uniform(size=confidence.size) > confidence).astype(int)
    calibrated = np.stack([confidence, 1 - confidence], -1)[None]
    assert metrics.adaptive_ece(calibrated, labels) < 0.005
    assert metrics.adaptive_ece(calibrated**0 * [[0.99, 0.01]], labels) > 0.2


def test_aurc_against_its_closed_forms():
    rng = np.random.default_rng(1)
    n, error_rate = 100_000, 0.2
    correct = rng.uniform(size=n) > error_rate
    r = 1 - correct.mean()
    # Errors ranked last (the oracle): AURC = r + (1 - r) log(1 - r), up to O(log n / n).
    oracle = np.where(correct, 0.9, 0.6)
    _, risk = metrics.risk_coverage_curve(oracle, correct)
    assert risk[-1] == pytest.approx(r)
    assert np.mean(risk) == pytest.approx(r + (1 - r) * np.log(1 - r), abs=1e-3)
    # Confidence unrelated to correctness: every coverage has risk ~ r, so AURC ~ r.
    _, risk = metrics.risk_coverage_curve(rng.uniform(size=n), correct)
    assert np.mean(risk) == pytest.approx(r, abs=0.01)
    # Through the predictive: a confident right answer and an unsure wrong one.
    probs = np.array([[[0.9, 0.1], [0.6, 0.4]]])
    assert metrics.aurc(probs, np.array([0, 1])) == pytest.approx((0 + 0.5) / 2)


def test_risk_coverage_averages_over_the_orders_of_tied_confidences():
    """Saturated probabilities tie; the curve is the expectation over every order of the tied
    examples (checked by enumerating them), so it does not depend on the data's order."""
    import itertools

    confidence = np.array([1.0, 1.0, 1.0, 0.7, 0.7, 0.2])
    correct = np.array([1, 0, 1, 1, 0, 0])
    curves = []
    for first in itertools.permutations(range(3)):
        for second in itertools.permutations(range(3, 5)):
            order = [*first, *second, 5]
            errors = 1.0 - correct[order]
            curves.append(np.cumsum(errors) / np.arange(1, 7))
    _, risk = metrics.risk_coverage_curve(confidence, correct)
    np.testing.assert_allclose(risk, np.mean(curves, 0))
    shuffled = np.random.default_rng(0).permutation(6)
    _, again = metrics.risk_coverage_curve(confidence[shuffled], correct[shuffled])
    np.testing.assert_allclose(again, risk)


def test_fpr_at_95_tpr():
    rng = np.random.default_rng(2)
    same = rng.normal(size=50_000)
    assert metrics.fpr_at_tpr(same, rng.normal(size=50_000)) == pytest.approx(0.95, abs=0.01)
    assert metrics.fpr_at_tpr(rng.normal(size=1000), rng.normal(size=1000) + 20) == 0.0
    # Shifted by d: the threshold is the OOD 5% quantile d - 1.645; FPR = 1 - Phi(d - 1.645).
    fpr = metrics.fpr_at_tpr(rng.normal(size=200_000), rng.normal(size=200_000) + 2.0)
    assert fpr == pytest.approx(1 - scipy.stats.norm.cdf(2.0 - 1.6449), abs=0.005)


def test_ood_auroc_by_mutual_information_is_left_out_when_the_draws_agree():
    """A deterministic model's draws are equal: its mutual information is float rounding
    (~1e-19), and an AUROC ranked by it would be a number with no meaning."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(1, 50, 4))
    one = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    same = np.repeat(one, 5, axis=0)
    ood = np.repeat(np.full((1, 20, 4), 0.25), 5, axis=0)
    labels = rng.integers(0, 4, 50)
    fixed = metrics.classification_metrics(same, labels, ood_probs=ood)
    assert "ood_auroc_mutual_information" not in fixed and "ood_auroc_entropy" in fixed
    assert "ood_auroc_mutual_information" not in metrics.classification_metrics(
        one, labels, ood_probs=ood[:1]
    )
    noisy = same * np.exp(0.3 * rng.normal(size=same.shape))
    noisy /= noisy.sum(-1, keepdims=True)
    varied = metrics.classification_metrics(noisy, labels, ood_probs=ood)
    assert 0.0 <= varied["ood_auroc_mutual_information"] <= 1.0
