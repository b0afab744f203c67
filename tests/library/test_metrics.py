"""Uncertainty metrics against values computed by hand on small arrays."""

import math

import numpy as np
import pytest
import scipy.stats
from scipy.special import logsumexp, softmax

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


def test_smooth_ece_matches_the_authors_relplot():
    """SmoothECE and its bandwidth against `relplot.smECE` (Blasiok & Nakkiran's package): the
    same numbers, saturated confidences of exactly 1 included."""
    relplot = pytest.importorskip("relplot")
    rng = np.random.default_rng(0)
    for n, sharpness in ((300, 1.0), (2000, 2.5), (2000, 0.5), (500, 40.0)):
        labels = rng.integers(0, 10, n)
        logits = rng.normal(size=(n, 10))
        logits[np.arange(n), labels] += 2.0
        probs = softmax(sharpness * logits, -1)
        ours, width = metrics.smooth_ece(probs[None], labels, return_width=True)
        confidence = probs.max(-1)
        correct = (probs.argmax(-1) == labels).astype(float)
        theirs, their_width = relplot.smECE(confidence, correct, return_width=True)
        assert ours == pytest.approx(theirs, rel=1e-9)
        assert width == their_width


def test_smooth_ece_vanishes_for_calibrated_predictions_and_not_otherwise():
    rng = np.random.default_rng(1)
    n = 20000
    confidence = rng.uniform(0.5, 1.0, n)
    correct = rng.uniform(size=n) < confidence  # calibrated by construction
    probs = np.stack([confidence, 1.0 - confidence], -1)
    labels = np.where(correct, 0, 1)
    # The estimator's own noise at n examples is O(n^-1/2).
    assert metrics.smooth_ece(probs[None], labels) < 0.02
    over = np.stack([np.minimum(confidence + 0.2, 1.0), 1 - np.minimum(confidence + 0.2, 1.0)], -1)
    assert metrics.smooth_ece(over[None], labels) > 0.1


def test_classwise_ece_averages_each_class_s_calibration_error():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.6, 0.3, 0.1]])
    labels = np.array([0, 2, 2, 1])
    expected = np.mean(
        [metrics.calibration_error(probs[:, k], labels == k, num_bins=15) for k in range(3)]
    )
    assert metrics.classwise_ece(probs[None], labels) == pytest.approx(expected)
    # By hand for class 0: 15 bins hold each probability alone (labels 1, 0, 0, 0).
    class0 = (abs(1 - 0.7) + abs(0 - 0.1) + abs(0 - 0.3) + abs(0 - 0.6)) / 4
    assert metrics.calibration_error(probs[:, 0], labels == 0, 15) == pytest.approx(class0)


def test_augrc_is_the_mean_joint_risk_over_coverages():
    rng = np.random.default_rng(2)
    n, rate = 20000, 0.2
    correct = rng.uniform(size=n) > rate
    confidence = rng.uniform(size=n)  # no ties, a random ranking
    probs = np.stack([confidence, 1 - confidence], -1)
    probs = np.where(probs[:, :1] >= 0.5, probs, probs[:, ::-1])  # class 0 is the argmax
    labels = np.where(correct, 0, 1)
    top = probs.max(-1)
    order = np.argsort(-top)
    brute = np.mean(np.cumsum(~correct[order]) / n)
    assert metrics.augrc(probs[None], labels) == pytest.approx(brute, rel=1e-12)
    r = np.mean(~correct)
    # A random ranking: r / 2 to sampling noise (the curve's mean has sd ~ r / sqrt(n)).
    assert abs(metrics.augrc(probs[None], labels) - r / 2) < 5 * r / np.sqrt(n)
    # Errors ranked last: r^2 / 2 (plus O(1/n)).
    perfect = np.where(correct, 1.0, 0.6)
    ranked = np.stack([perfect, 1 - perfect], -1)
    assert metrics.augrc(ranked[None], labels) == pytest.approx(r**2 / 2, abs=2.0 / n)


def test_ood_scores_and_their_aurocs():
    rng = np.random.default_rng(3)
    logits_in = rng.normal(size=(1, 500, 5)) * 3
    logits_in[..., 0] += 6.0  # confident
    logits_out = rng.normal(size=(1, 500, 5))  # diffuse and small
    p_in, p_out = softmax(logits_in, -1), softmax(logits_out, -1)
    scores = metrics.ood_scores(p_in, logits_in)
    assert set(scores) == {"max_softmax", "entropy", "max_logit", "energy"}  # one draw: no MI
    np.testing.assert_allclose(scores["max_softmax"], 1 - p_in[0].max(-1))
    np.testing.assert_allclose(scores["energy"], -logsumexp(logits_in[0], -1))
    np.testing.assert_allclose(scores["max_logit"], -logits_in[0].max(-1))
    # Logit scores see a shift of every logit that softmax cannot.
    shifted = metrics.ood_scores(p_in, logits_in + 10.0)
    np.testing.assert_allclose(shifted["max_softmax"], scores["max_softmax"])
    np.testing.assert_allclose(shifted["energy"], scores["energy"] - 10.0)
    result = metrics.classification_metrics(
        p_in, np.zeros(500, int), p_out, logits=logits_in, ood_logits=logits_out
    )
    for name in ("max_softmax", "entropy", "max_logit", "energy"):
        assert result[f"ood_auroc_{name}"] > 0.9, name
        assert result[f"ood_fpr95_{name}"] < 0.5, name
    from sklearn.metrics import roc_auc_score

    truth = np.r_[np.zeros(500), np.ones(500)]
    ranked = np.r_[1 - p_in[0].max(-1), 1 - p_out[0].max(-1)]
    assert result["ood_auroc_max_softmax"] == pytest.approx(roc_auc_score(truth, ranked))
    assert "ood_auroc_mutual_information" not in result
    without_logits = metrics.classification_metrics(p_in, np.zeros(500, int), p_out)
    assert "ood_auroc_energy" not in without_logits  # n/a without logits
