"""Calibration maps beside temperature scaling: matrix and Dirichlet scaling (Kull et al., 2019,
"Beyond temperature scaling: Obtaining well-calibrated multiclass probabilities with Dirichlet
calibration"), histogram binning (Zadrozny & Elkan, 2001) and isotonic regression (Zadrozny &
Elkan, 2002), the last two one-vs-rest and renormalized.

Each is fitted on held-out `logits [n, K]` (a network's logits, or the log-probabilities of
its predictive) and integer labels, and maps logits to probabilities with `predict_proba`.
"""

import numpy as np
import scipy.optimize
from scipy.special import log_softmax, softmax

__all__ = ["DirichletScaling", "HistogramBinning", "IsotonicCalibration", "MatrixScaling"]


def check_logits(name, logits, labels):
    """Float64 logits `[n, K]` and integer labels `[n]`, or a ValueError naming `name`."""
    logits = np.asarray(logits, np.float64)
    labels = np.asarray(labels).astype(int)
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"{name}.fit: logits must be [n, K] and labels [n]; got {logits.shape} and "
            f"{labels.shape}."
        )
    if not np.all(np.isfinite(logits)):
        raise ValueError(
            f"{name}.fit: the logits are not all finite (log-probabilities of saturated float32 "
            "probabilities hold log 0 = -inf); pass the network's logits or float64 "
            "log-probabilities."
        )
    if labels.min() < 0 or labels.max() >= logits.shape[1]:
        raise ValueError(f"{name}.fit: labels must lie in [0, {logits.shape[1]}).")
    return logits, labels


def _linear_nll(params, features, labels, off_diagonal, bias):
    """Mean NLL of `softmax(features W^T + b)` plus Kull et al.'s ODIR penalty
    `off_diagonal / (K (K - 1)) sum_{i != j} W_ij^2 + bias / K sum_j b_j^2`, and its gradient."""
    n, k = features.shape
    w, b = params[: k * k].reshape(k, k), params[k * k :]
    log_p = log_softmax(features @ w.T + b, axis=-1)
    residual = np.exp(log_p)
    residual[np.arange(n), labels] -= 1.0
    residual /= n
    mask = 1.0 - np.eye(k)
    scale = off_diagonal / (k * (k - 1)) if k > 1 else 0.0
    value = -np.mean(log_p[np.arange(n), labels])
    value += scale * np.sum(np.square(w * mask)) + bias / k * np.sum(np.square(b))
    grad_w = residual.T @ features + 2.0 * scale * w * mask
    grad_b = residual.sum(0) + 2.0 * bias / k * b
    return value, np.concatenate([grad_w.ravel(), grad_b])


def _linear_nll_hessian(params, features, labels, off_diagonal, bias):
    """The Hessian of `_linear_nll` in its parameters: `1/n sum_i (diag p_i - p_i p_i^T) (x)
    a_i a_i^T` for `a_i = [z_i, 1]`, laid out as `params` (`W` row-major, then `b`), plus the
    penalty's diagonal."""
    n, k = features.shape
    w, b = params[: k * k].reshape(k, k), params[k * k :]
    p = softmax(features @ w.T + b, axis=-1)
    curvature = p[:, :, None] * np.eye(k) - p[:, :, None] * p[:, None, :]  # [n, K, K]
    a = np.concatenate([features, np.ones((n, 1))], axis=1)
    outer = (a[:, :, None] * a[:, None, :]).reshape(n, -1)
    # Rows and columns indexed by (class k, input j), j = K being the bias.
    hessian = (curvature.reshape(n, k * k).T @ outer) / n
    hessian = hessian.reshape(k, k, k + 1, k + 1).transpose(0, 2, 1, 3).reshape(k * (k + 1), -1)
    order = np.concatenate([np.arange(k * k).reshape(k, k), k * k + np.arange(k)[:, None]], 1)
    out = np.empty_like(hessian)
    out[np.ix_(order.ravel(), order.ravel())] = hessian
    scale = off_diagonal / (k * (k - 1)) if k > 1 else 0.0
    out[np.diag_indices_from(out)] += np.concatenate(
        [2.0 * scale * (1.0 - np.eye(k)).ravel(), np.full(k, 2.0 * bias / k)]
    )
    return out


# Above this many classes the `K (K+1)`-square Hessian is too large to factor at every step.
_NEWTON_MAX_CLASSES = 32


class MatrixScaling:
    """`softmax(W z + b)` of logits `z` with a full `K x K` matrix `W` and bias `b`, fitted by
    the NLL of held-out labels with the off-diagonal and intercept regularization (ODIR) of
    Kull et al. (2019): `lambda / (K (K-1)) sum_{i != j} W_ij^2 + mu / K sum_j b_j^2`. The
    diagonal is free, so ODIR shrinks towards vector scaling, not towards zero.

    Args:
      off_diagonal: `lambda`; `'cv'` (default) picks it, with `mu = lambda`, from `grid` by
        5-fold cross-validated NLL on the data `fit` is given (Kull et al. choose both by
        cross-validation).
      bias: `mu` (default: `lambda`).
      grid: the candidates for `'cv'`.
    """

    _input = "logits"

    def __init__(self, off_diagonal="cv", bias=None, grid=(1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)):
        if off_diagonal != "cv" and not float(off_diagonal) >= 0:
            raise ValueError(
                f"{type(self).__name__}: off_diagonal must be 'cv' or >= 0, got {off_diagonal!r}."
            )
        self.off_diagonal, self.bias, self.grid = off_diagonal, bias, tuple(grid)
        self.params = self.chosen_off_diagonal = None

    def _features(self, logits):
        logits = np.asarray(logits, np.float64)
        return log_softmax(logits, -1) if self._input == "log_probs" else logits

    @staticmethod
    def _fit_params(features, labels, off_diagonal, bias, start=None):
        """The penalized optimum, from `start` (default: the identity map), or the identity
        where the optimizer ends worse than it."""
        k = features.shape[1]
        identity = np.concatenate([np.eye(k).ravel(), np.zeros(k)])
        # The optimum itself, in the cross-validation's folds too: stopped early, a weak
        # penalty's fit (nearly separable calibration data) is regularized by the stop, and its
        # fold scores would not be the scores of the fit kept. Newton's method (trust region,
        # exact Hessian) reaches it in tens of steps where L-BFGS takes thousands.
        newton = k <= _NEWTON_MAX_CLASSES
        result = scipy.optimize.minimize(
            _linear_nll,
            identity if start is None else start,
            args=(features, labels, off_diagonal, bias),
            jac=True,
            hess=_linear_nll_hessian if newton else None,
            method="trust-exact" if newton else "L-BFGS-B",
            options={"gtol": 1e-9} if newton else {"maxiter": 5000, "ftol": 1e-13, "gtol": 1e-9},
        )
        at_identity, _ = _linear_nll(identity, features, labels, off_diagonal, bias)
        return result.x if np.isfinite(result.fun) and result.fun <= at_identity else identity

    def fit(self, logits, labels):
        """Fits on held-out `logits [n, K]` and integer `labels [n]`; returns `self`."""
        logits, labels = check_logits(type(self).__name__, logits, labels)
        features = self._features(logits)
        off_diagonal = self.off_diagonal
        if off_diagonal == "cv":
            off_diagonal = self._cross_validate(features, labels)
        bias = off_diagonal if self.bias is None else float(self.bias)
        self.chosen_off_diagonal = float(off_diagonal)
        self.params = self._fit_params(features, labels, float(off_diagonal), bias)
        return self

    def _cross_validate(self, features, labels, folds=5):
        order = np.random.default_rng(0).permutation(len(labels))
        parts = np.array_split(order, min(folds, len(labels)))
        scores, starts = {}, [None] * len(parts)
        # Strongest penalty first, each fold's fit starting from its fit at the previous one:
        # the same optima, in a fraction of the iterations.
        for value in sorted(self.grid, reverse=True):
            bias = value if self.bias is None else float(self.bias)
            nll = 0.0
            for i, part in enumerate(parts):
                train = np.setdiff1d(order, part)
                starts[i] = self._fit_params(features[train], labels[train], value, bias, starts[i])
                nll += _linear_nll(starts[i], features[part], labels[part], 0.0, 0.0)[0] * len(part)
            scores[value] = nll
        return min(self.grid, key=lambda value: (scores[value], -value))  # ties: the stronger

    def _check_fitted(self):
        if self.params is None:
            raise ValueError(f"{type(self).__name__}: call fit(logits, labels) first.")

    @property
    def matrix(self):
        self._check_fitted()
        k = int(np.sqrt(len(self.params) + 0.25) - 0.5)  # K^2 + K parameters
        return self.params[: k * k].reshape(k, k)

    @property
    def intercept(self):
        return self.params[len(self.matrix) ** 2 :]

    def calibrated_logits(self, logits):
        """The recalibrated logits of `logits [..., K]`."""
        return self._features(logits) @ self.matrix.T + self.intercept

    def predict_proba(self, logits):
        """Recalibrated class probabilities of `logits [..., K]`."""
        return softmax(self.calibrated_logits(logits), axis=-1)

    def get_config(self):
        return {
            "off_diagonal": self.off_diagonal,
            "bias": self.bias,
            "grid": list(self.grid),
            "params": None if self.params is None else self.params.tolist(),
        }

    @classmethod
    def from_config(cls, config):
        scaler = cls(config["off_diagonal"], config["bias"], config["grid"])
        if config.get("params") is not None:
            scaler.params = np.asarray(config["params"], np.float64)
        return scaler


class DirichletScaling(MatrixScaling):
    """Dirichlet calibration (Kull et al., 2019): `softmax(W log p + b)` of the model's
    probabilities `p = softmax(z)` with a full matrix and ODIR, i.e. matrix scaling of the
    log-probabilities; the calibrated probabilities are a Dirichlet family's parametric map.
    Same arguments as `MatrixScaling`."""

    _input = "log_probs"


class _OneVsRest:
    """One-vs-rest maps of each class's probability `p_k -> q_k(p_k)`, renormalized over classes
    (Zadrozny & Elkan, 2002); `floor` keeps every calibrated probability positive, so a class
    the calibration data never saw near some confidence keeps a finite log-likelihood."""

    def __init__(self, floor):
        if not 0 <= floor < 1:
            raise ValueError(f"{type(self).__name__}: floor must be in [0, 1), got {floor!r}.")
        self.floor = float(floor)
        self.maps = None

    def fit(self, logits, labels):
        """Fits on held-out `logits [n, K]` and integer `labels [n]`; returns `self`."""
        logits, labels = check_logits(type(self).__name__, logits, labels)
        probs = softmax(logits, -1)
        self.maps = [
            self._fit_one(probs[:, k], (labels == k).astype(np.float64))
            for k in range(probs.shape[1])
        ]
        return self

    def predict_proba(self, logits):
        """Recalibrated class probabilities of `logits [..., K]`."""
        if self.maps is None:
            raise ValueError(f"{type(self).__name__}: call fit(logits, labels) first.")
        probs = softmax(np.asarray(logits, np.float64), -1)
        shape = probs.shape
        probs = probs.reshape(-1, shape[-1])
        out = np.stack([self._apply(m, probs[:, k]) for k, m in enumerate(self.maps)], -1)
        out = np.maximum(out, self.floor)
        total = out.sum(-1, keepdims=True)
        # Every class mapped to 0 (only with floor=0): keep the model's own probabilities.
        out = np.where(total > 0, out / np.where(total > 0, total, 1.0), probs)
        return out.reshape(shape)


class HistogramBinning(_OneVsRest):
    """Histogram binning: each class's probability falls in one of `num_bins` equal-width bins of
    [0, 1], and is replaced by the fraction of that bin's held-out examples that belong to the
    class. With `prior_strength = m > 0` that fraction is shrunk towards the bin's mean
    confidence as `m` pseudo-examples would, `(hits + m conf_b) / (n_b + m)` (a bin of a few
    examples does not jump to 0 or 1); `prior_strength=0, floor=0` is the textbook estimator
    (and netcal's). Empty bins keep their centre.

    Args:
      num_bins: bins of [0, 1].
      prior_strength: pseudo-examples at the bin's mean confidence.
      floor: the smallest probability before renormalizing.
    """

    def __init__(self, num_bins=10, prior_strength=2.0, floor=1e-4):
        super().__init__(floor)
        if int(num_bins) < 1 or prior_strength < 0:
            raise ValueError(
                f"HistogramBinning: num_bins must be >= 1 and prior_strength >= 0, got "
                f"{num_bins!r} and {prior_strength!r}."
            )
        self.num_bins, self.prior_strength = int(num_bins), float(prior_strength)

    def _bin(self, p):
        edges = np.linspace(0.0, 1.0, self.num_bins + 1)
        return np.clip(np.digitize(p, edges, right=True) - 1, 0, self.num_bins - 1)

    def _fit_one(self, p, hits):
        index = self._bin(p)
        count = np.bincount(index, minlength=self.num_bins).astype(np.float64)
        positives = np.bincount(index, hits, minlength=self.num_bins)
        centre = (np.arange(self.num_bins) + 0.5) / self.num_bins
        confidence = np.bincount(index, p, minlength=self.num_bins)
        mean_confidence = np.where(count > 0, confidence / np.maximum(count, 1.0), centre)
        m = self.prior_strength
        values = (positives + m * mean_confidence) / np.maximum(count + m, 1e-300)
        return np.where(count + m > 0, values, centre)

    def _apply(self, values, p):
        return values[self._bin(p)]


class IsotonicCalibration(_OneVsRest):
    """Isotonic regression: each class's probability is mapped by the non-decreasing step
    function fitted to the held-out one-vs-rest labels by least squares (scikit-learn's
    `IsotonicRegression`, clipped to the fitted range), then renormalized.

    Args:
      floor: the smallest probability before renormalizing (isotonic maps send low confidences
        to exactly 0, an infinite NLL the first time such a class is the label).
    """

    def __init__(self, floor=1e-3):
        super().__init__(floor)

    def _fit_one(self, p, hits):
        from sklearn.isotonic import IsotonicRegression

        return IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(p, hits)

    def _apply(self, iso, p):
        return iso.predict(p)
