"""Uncertainty metrics on Monte Carlo predictive samples (NumPy, float64).

Classification metrics take `probs` of shape `[num_samples, n, K]` (one softmax per posterior
draw) and integer `labels` [n]; the predictive is `p = mean_s probs[s]`. Regression metrics take
per-draw Normal means and stddevs `[num_samples, n, d]` and targets `[n, d]`; the predictive is
the equal-weight mixture.
"""

import math

import numpy as np
import scipy.stats
from scipy.special import logsumexp
from sklearn.metrics import roc_auc_score

__all__ = [
    "accuracy",
    "adaptive_ece",
    "augrc",
    "aurc",
    "brier",
    "calibration_error",
    "classification_metrics",
    "classwise_ece",
    "confidence_bins",
    "coverage",
    "draws_differ",
    "ece",
    "entropy",
    "fpr_at_tpr",
    "interval_coverage",
    "mixture_moments",
    "mutual_information",
    "nll",
    "nlpd",
    "ood_auroc",
    "ood_scores",
    "predictive_cdf",
    "predictive_stddev_parts",
    "quantile_calibration",
    "regression_metrics",
    "reliability_bins",
    "risk_coverage_curve",
    "rmse",
    "smooth_ece",
]

_EPS = 1e-12


def _mean_probs(probs):
    return np.asarray(probs, np.float64).mean(axis=0)


def _confidence_and_correct(probs, labels):
    """Per prediction (tokens flattened): the predictive's top probability, and whether its
    argmax is the label."""
    p = _mean_probs(probs).reshape(-1, np.shape(probs)[-1])
    return p.max(-1), p.argmax(-1) == np.asarray(labels).reshape(-1)


def accuracy(probs, labels):
    """Accuracy of the Monte Carlo predictive (the mean of `probs [S, N, K]` over draws)."""
    return float(np.mean(_mean_probs(probs).argmax(-1) == labels))


def nll(probs, labels):
    """`-mean log p(y_i | x_i)` of the predictive."""
    p = _mean_probs(probs)
    picked = np.take_along_axis(p, labels[..., None].astype(int), -1)[..., 0]
    return float(-np.mean(np.log(picked + _EPS)))


def confidence_bins(confidence, correctness, num_bins=15):
    """Per equal-width confidence bin: (count, mean confidence, mean correctness). Correctness
    may be fractional (a sentence's BLEU / 100 for sequence-level calibration)."""
    confidence = np.asarray(confidence, np.float64).reshape(-1)
    correctness = np.asarray(correctness, np.float64).reshape(-1)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    index = np.clip(np.digitize(confidence, edges[1:-1], right=True), 0, num_bins - 1)
    counts = np.bincount(index, minlength=num_bins)
    conf_sum = np.bincount(index, weights=confidence, minlength=num_bins)
    acc_sum = np.bincount(index, weights=correctness, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts, conf_sum / counts, acc_sum / counts


def calibration_error(confidence, correctness, num_bins=15):
    """`sum_b (n_b / n) |correctness_b - confidence_b|` over equal-width confidence bins."""
    counts, conf, acc = confidence_bins(confidence, correctness, num_bins)
    mask = counts > 0
    return float(np.sum(counts[mask] / counts.sum() * np.abs(acc[mask] - conf[mask])))


def reliability_bins(probs, labels, num_bins=15):
    """Per equal-width confidence bin: (count, mean confidence, accuracy)."""
    return confidence_bins(*_confidence_and_correct(probs, labels), num_bins)


def ece(probs, labels, num_bins=15):
    """Expected calibration error: `sum_b (n_b / n) |acc_b - conf_b|`, equal-width bins."""
    return calibration_error(*_confidence_and_correct(probs, labels), num_bins)


def adaptive_ece(probs, labels, num_bins=15):
    """Adaptive (equal-mass) calibration error: `sum_b (n_b / n) |acc_b - conf_b|` over
    `num_bins` bins holding equal numbers of examples sorted by confidence (Nixon et al., 2019),
    so sparse high-confidence regions do not hide in one wide bin."""
    confidence, correct = _confidence_and_correct(probs, labels)
    correct = correct.astype(np.float64)
    order = np.argsort(confidence, kind="stable")
    error = 0.0
    for chunk in np.array_split(order, min(num_bins, len(order))):
        error += len(chunk) * abs(correct[chunk].mean() - confidence[chunk].mean())
    return float(error / len(order))


def classwise_ece(probs, labels, num_bins=15):
    """Classwise calibration error (Kull et al., 2019): the mean over classes `k` of
    `sum_b (n_b / n) |freq_b(y = k) - mean_b p_k|` with `num_bins` equal-width bins of `p_k`,
    so every class's probability is calibrated, not only the top one."""
    p = _mean_probs(probs).reshape(-1, np.shape(probs)[-1])
    labels = np.asarray(labels).reshape(-1).astype(int)
    return float(
        np.mean([calibration_error(p[:, k], labels == k, num_bins) for k in range(p.shape[1])])
    )


def _reflected_smooth(f, values, sigma, points):
    """`sum_i values_i K(t, f_i)` of a Gaussian kernel of width `sigma` reflected at 0 and 1,
    at `points`, computed as the authors' `relplot` does: the values linearly binned on a grid
    of `max(2000, 20 / sigma) // 2 + 1` nodes, the grid mirrored at both ends (its end nodes
    not repeated) and convolved with the kernel, then interpolated."""
    from scipy.signal import fftconvolve

    n = max(2000, round(20 / sigma)) // 2 + 1
    grid = np.zeros(n)
    index = np.clip((f * (n - 1)).astype(int), 0, n - 2)
    frac = f * (n - 1) - index
    np.add.at(grid, index, (1 - frac) * values)
    np.add.at(grid, index + 1, frac * values)
    nodes = np.linspace(0.0, 1.0, n)
    kernel = np.exp(-np.square(nodes - 0.5) / (2 * sigma**2)) / (np.sqrt(2 * np.pi) * sigma)
    extended = np.concatenate([np.flip(grid)[:-1], grid, np.flip(grid)[1:]])
    smoothed = fftconvolve(extended, kernel, "valid")[n // 2 : n // 2 + n]
    where = np.clip((points * (n - 1)).astype(int), 0, n - 2)
    weight = (points - where / (n - 1)) * (n - 1)
    return smoothed[where] * (1 - weight) + smoothed[where + 1] * weight


def _smooth_ece_at(f, residual, sigma):
    points = np.linspace(0.0, 1.0, max(round(10 / sigma), 200))
    density = _reflected_smooth(f, np.ones_like(f), sigma, points) + 1e-4
    smoothed = _reflected_smooth(f, residual, sigma, points) / density
    return float(np.sum(np.abs(smoothed) * density) / np.sum(density))


def smooth_ece(probs, labels, return_width=False):
    """SmoothECE (Blasiok & Nakkiran, 2023) of the top-label confidence: the residual
    `f - y` (confidence minus correctness) kernel-smoothed with a Gaussian of width `sigma`
    reflected at 0 and 1, `smECE_sigma = int |r_sigma(t)| delta_sigma(t) dt` over the smoothed
    density of confidences, at the fixed point `smECE_sigma = sigma` (bisection). Consistent
    and continuous in the predictions, unlike binned ECE.

    Computed as the authors' `relplot` computes it (a grid of the confidences, mirrored without
    repeating its end nodes), so the numbers are theirs; that grid gives the mass of
    confidences within a grid step of 1 half the weight of the others in the density."""
    confidence, correct = _confidence_and_correct(probs, labels)
    residual = confidence - correct.astype(np.float64)

    def wide_enough(sigma):
        return sigma < 1e-3 or sigma < _smooth_ece_at(confidence, residual, sigma)

    sigma = 1.0
    if not wide_enough(sigma):
        high, low = 1.0, 0.0
        for _ in range(10):
            middle = (high + low) / 2
            if wide_enough(middle):
                low = middle
            else:
                high = middle
        sigma = high
    value = _smooth_ece_at(confidence, residual, sigma)
    return (value, sigma) if return_width else value


def risk_coverage_curve(confidence, correct):
    """Selective prediction: keeping the `k` most confident examples (k = 1..n), the coverage
    `k / n` and the risk (error rate among them). Returns `(coverage [n], risk [n])`.

    Examples of equal confidence (saturated probabilities of 1.0 are common) have no order
    between them: the risk is its expectation over their orders, so within a tie each kept
    example counts the tie's mean error, and the curve does not depend on the data's order."""
    confidence = np.asarray(confidence, np.float64).reshape(-1)
    errors = 1.0 - np.asarray(correct, np.float64).reshape(-1)
    order = np.argsort(-confidence, kind="stable")
    sorted_conf, sorted_errors = confidence[order], errors[order]
    starts = np.flatnonzero(np.r_[True, sorted_conf[1:] != sorted_conf[:-1]])
    sizes = np.diff(np.r_[starts, len(order)])
    group_mean = np.add.reduceat(sorted_errors, starts) / sizes if len(order) else sorted_errors
    kept = np.arange(1, len(order) + 1)
    return kept / len(order), np.cumsum(np.repeat(group_mean, sizes)) / kept


def aurc(probs, labels):
    """Area under the risk-coverage curve of the predictive's confidence (Geifman & El-Yaniv,
    2017): the mean selective risk over coverages `k / n`; lower is better. A perfect ranking of
    errors last gives `r + (1 - r) log(1 - r)` at error rate `r`."""
    _, risk = risk_coverage_curve(*_confidence_and_correct(probs, labels))
    return float(np.mean(risk))


def augrc(probs, labels):
    """Area under the generalized risk-coverage curve (Traub et al., 2024): the mean over
    coverages `k / n` of the joint risk `P(error and kept)` = errors among the `k` most confident
    over `n`; lower is better. Unlike AURC it does not weight the few most confident examples'
    errors by `1 / k`: a random ranking gives `r / 2`, a perfect one `r^2 / 2` (error rate
    `r`, large `n`)."""
    coverage, risk = risk_coverage_curve(*_confidence_and_correct(probs, labels))
    return float(np.mean(coverage * risk))


def fpr_at_tpr(in_scores, ood_scores, tpr=0.95):
    """False-positive rate when flagging OOD by a score (higher = OOD) at the threshold that
    flags `tpr` of the OOD examples: the fraction of in-distribution examples flagged too."""
    threshold = np.quantile(np.asarray(ood_scores, np.float64), 1.0 - tpr)
    return float(np.mean(np.asarray(in_scores, np.float64) >= threshold))


def brier(probs, labels):
    """`mean_i sum_k (p_ik - 1[y_i = k])^2`."""
    p = _mean_probs(probs)
    onehot = np.eye(p.shape[-1])[labels.astype(int)]
    return float(np.mean(np.sum(np.square(p - onehot), -1)))


def _entropy(p):
    return -np.sum(p * np.log(p + _EPS), -1)


def entropy(probs):
    """Per-example predictive entropy `H[p]` [n]."""
    return _entropy(_mean_probs(probs))


def mutual_information(probs):
    """Per-example `H[mean_s p_s] - mean_s H[p_s]` (epistemic uncertainty, BALD) [n]."""
    probs = np.asarray(probs, np.float64)
    # Non-negative by Jensen; clip the float rounding of identical draws.
    return np.maximum(_entropy(probs.mean(0)) - _entropy(probs).mean(0), 0.0)


def ood_scores(probs, logits=None):
    """Per-example out-of-distribution scores (higher = more likely OOD) of predictive draws
    `probs [S, n, K]` and, when given, their logits `[S, n, K]`:

    * `max_softmax`: `1 - max_k p_k` (Hendrycks & Gimpel, 2017);
    * `entropy`: `H[p]`;
    * `mutual_information`: `H[p] - mean_s H[p_s]` (only when the draws differ);
    * `max_logit`: `-max_k z_k` (Hendrycks et al., 2022), averaged over draws;
    * `energy`: `-log sum_k exp(z_k)` (Liu et al., 2020), averaged over draws.
    """
    scores = {"max_softmax": 1.0 - _mean_probs(probs).max(-1), "entropy": entropy(probs)}
    if draws_differ(probs):
        scores["mutual_information"] = mutual_information(probs)
    if logits is not None:
        logits = np.asarray(logits, np.float64)
        scores["max_logit"] = -logits.max(-1).mean(0)
        scores["energy"] = -logsumexp(logits, axis=-1).mean(0)
    return scores


def ood_auroc(in_scores, ood_scores):
    """AUROC of separating OOD (positive) from in-distribution by a score (higher = OOD)."""
    labels = np.r_[np.zeros(len(in_scores)), np.ones(len(ood_scores))]
    return float(roc_auc_score(labels, np.r_[in_scores, ood_scores]))


def mixture_moments(means, stddevs):
    """Mean and variance over examples of the equal-weight Gaussian mixture
    `1/S sum_s N(means[s], stddevs[s]^2)` (draws on the first axis)."""
    means, stddevs = np.asarray(means, np.float64), np.asarray(stddevs, np.float64)
    mean = means.mean(0)
    variance = (np.square(stddevs) + np.square(means)).mean(0) - np.square(mean)
    return mean, np.maximum(variance, 0.0)


def rmse(means, targets, scale=1.0):
    """Root mean squared error of the predictive mean (`means [S, N, ...]` averaged over draws),
    in original units (`scale`: the targets' standardization scale)."""
    mean = np.asarray(means, np.float64).mean(0)
    return float(scale * np.sqrt(np.mean(np.square(mean - targets))))


def predictive_stddev_parts(means, stddevs, scale=1.0, function_variances=None):
    """`(noise, function)`: the mixture predictive's variance split in its two parts, each as
    the root of its mean over examples (and target dimensions), in original units. `noise^2`
    is the data noise the model predicts (aleatoric), `mean E_s[stddevs_s^2]`; `function^2`
    the function's spread (epistemic), `mean Var_s[means_s]`, the regression counterpart of
    `mutual_information`. Their squares sum to the mean predictive variance
    (`mixture_moments`); a noise wider than the RMSE means an over-wide predictive.

    `function_variances` (same shape as `stddevs`): where a draw's `stddevs^2` already holds
    a function variance in closed form (a GP's marginal), that part moves to `function`.
    """
    means, stddevs = np.asarray(means, np.float64), np.asarray(stddevs, np.float64)
    noise, function = np.square(stddevs), np.var(means, axis=0)
    if function_variances is not None:
        closed_form = np.asarray(function_variances, np.float64)
        noise, function = noise - closed_form, function + closed_form.mean(0)
    return (
        float(scale * np.sqrt(max(np.mean(noise), 0.0))),
        float(scale * np.sqrt(np.mean(function))),
    )


def nlpd(means, stddevs, targets, scale=1.0):
    """Negative log predictive density per example (and per target dimension summed) of the
    mixture `1/S sum_s N(y; m_s, s_s^2)`, in the original units (`+ log scale` per dim)."""
    means, stddevs = np.asarray(means, np.float64), np.asarray(stddevs, np.float64)
    log_probs = (
        -0.5 * np.square((targets - means) / stddevs)
        - np.log(stddevs)
        - 0.5 * math.log(2 * math.pi)
    )  # [S, n, d]
    log_mix = logsumexp(log_probs, axis=0) - math.log(len(means))
    return float(-np.mean(np.sum(log_mix, -1)) + means.shape[-1] * math.log(scale))


def coverage(means, stddevs, targets, z=1.959964):
    """Fraction of targets inside the moment-matched central interval `mean +- z sd` (95%)."""
    mean, variance = mixture_moments(means, stddevs)
    return float(np.mean(np.abs(targets - mean) <= z * np.sqrt(variance)))


def predictive_cdf(means, stddevs, targets):
    """`P(Y <= y)` under the mixture predictive `1/S sum_s N(m_s, s_s^2)`, per example and
    target dimension (the probability integral transform; uniform when calibrated)."""
    means, stddevs = np.asarray(means, np.float64), np.asarray(stddevs, np.float64)
    return scipy.stats.norm.cdf((np.asarray(targets, np.float64) - means) / stddevs).mean(0)


def quantile_calibration(means, stddevs, targets, levels):
    """For each predicted quantile level `p`, the observed fraction of targets below the
    predictive's `p`-quantile, i.e. of PIT values `<= p` (equal to `p` when calibrated)."""
    pit = predictive_cdf(means, stddevs, targets).ravel()
    return np.array([np.mean(pit <= p) for p in levels])


def interval_coverage(means, stddevs, targets, levels, scale=1.0):
    """For central intervals of nominal probability `levels` (moment-matched Normal
    `mean +- z sd`): `(levels, observed coverage, mean width in original units)`."""
    mean, variance = mixture_moments(means, stddevs)
    sd = np.sqrt(variance)
    z = scipy.stats.norm.ppf(0.5 + np.asarray(levels) / 2.0)
    covered = np.array([np.mean(np.abs(targets - mean) <= zi * sd) for zi in z])
    width = np.array([2.0 * zi * scale * np.mean(sd) for zi in z])
    return np.asarray(levels), covered, width


def classification_metrics(
    probs, labels, ood_probs=None, num_bins=15, logits=None, ood_logits=None
):
    """Accuracy, NLL, ECE (`num_bins` equal-width bins), adaptive ECE (equal-mass bins),
    classwise ECE and SmoothECE, Brier score, AURC and AUGRC, mean predictive entropy and
    mutual information of `probs [S, N, K]` (S posterior draws); per-token perplexity for
    sequence labels; given `ood_probs`, the OOD AUROC and the FPR at 95% TPR of each of
    `ood_scores` (`ood_auroc_<score>`, `ood_fpr95_<score>`; the logit scores with `logits` and
    `ood_logits`; mutual information left out when every draw is the same: not applicable)."""
    flat = np.ndim(labels) == 1
    result = {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "ece": ece(probs, labels, num_bins),
        "adaptive_ece": adaptive_ece(probs, labels, num_bins),
        **(
            {
                "classwise_ece": classwise_ece(probs, labels, num_bins),
                "smooth_ece": smooth_ece(probs, labels),
            }
            if flat
            else {}
        ),
        "aurc": aurc(probs, labels),
        "augrc": augrc(probs, labels),
        "brier": brier(probs, labels),
        "entropy": float(np.mean(entropy(probs))),
        "mutual_information": float(np.mean(mutual_information(probs))),
    }
    if np.ndim(labels) > 1:  # sequences: per-token NLL, so exp(NLL) is the perplexity
        result["perplexity"] = float(np.exp(result["nll"]))
    if ood_probs is not None:
        with_logits = logits is not None and ood_logits is not None
        inside = ood_scores(probs, logits if with_logits else None)
        outside = ood_scores(ood_probs, ood_logits if with_logits else None)
        if "mutual_information" in inside or "mutual_information" in outside:
            inside["mutual_information"] = mutual_information(probs)
            outside["mutual_information"] = mutual_information(ood_probs)
        # else the mutual information is identically zero (one draw, or a deterministic
        # model's equal draws): ranking by its float rounding would be a number with no
        # meaning, so the metric is left out (not applicable).
        for name in inside:
            result[f"ood_auroc_{name}"] = ood_auroc(inside[name], outside[name])
            result[f"ood_fpr95_{name}"] = fpr_at_tpr(inside[name], outside[name])
    return result


def draws_differ(probs, atol=1e-6):
    """Whether the posterior draws `probs [S, N, K]` differ anywhere by more than `atol` (a
    deterministic model's draws, or one draw, do not: their mutual information is zero)."""
    probs = np.asarray(probs)
    return probs.shape[0] > 1 and bool(np.max(np.abs(probs - probs[:1])) > atol)


def regression_metrics(means, stddevs, targets, scale=1.0, function_variances=None):
    """RMSE, NLPD, test log-likelihood (its negative), 95% coverage, and the predictive's
    noise and function standard deviations (`predictive_stddev_parts`, which takes
    `function_variances`) of the Gaussian mixture predictive `N(means[s], stddevs[s]^2)` over
    draws `s`, in original units."""
    noise, function = predictive_stddev_parts(means, stddevs, scale, function_variances)
    loss = nlpd(means, stddevs, targets, scale)
    return {
        "rmse": rmse(means, targets, scale),
        "nlpd": loss,
        "test_log_likelihood": -loss,
        "coverage_95": coverage(means, stddevs, targets),
        "noise_stddev": noise,
        "function_stddev": function,
    }
