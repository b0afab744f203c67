"""Temperature and vector scaling of logits (Guo et al., 2017, "On Calibration of Modern Neural
Networks")."""

import numpy as np
import scipy.optimize
from scipy.special import log_softmax, softmax

from blayers.posthoc.calibration import check_logits

__all__ = ["TemperatureScaling"]


def _nll_and_grad(params, logits, labels, vector):
    """Mean NLL of `softmax(scale * logits + bias)` and its gradient in the parameters
    (`[log T]`, or `[log w_1..K, b_1..K]` for vector scaling)."""
    n, k = logits.shape
    if vector:
        w, b = np.exp(params[:k]), params[k:]
        scaled = logits * w + b
    else:
        scaled = logits * np.exp(-params[0])
    log_p = log_softmax(scaled, axis=-1)
    nll = -np.mean(log_p[np.arange(n), labels])
    residual = softmax(scaled, axis=-1)  # d NLL / d scaled = (p - onehot) / n
    residual[np.arange(n), labels] -= 1.0
    residual /= n
    if vector:
        grad = np.concatenate([np.sum(residual * logits, 0) * w, np.sum(residual, 0)])
    else:
        grad = np.array([-np.sum(residual * scaled)])
    return nll, grad


class TemperatureScaling:
    """Recalibrates a classifier's logits `z`: `softmax(z / T)` with one temperature `T > 0`, or
    with `vector=True`, `softmax(w * z + b)` with a per-class scale `w > 0` and bias `b`.

    The parameters minimize the NLL of held-out labels (never the training set's), starting
    from the identity; the fitted NLL on that set is never above the uncalibrated one (if the
    optimizer does not improve on the identity, the identity is kept). Temperature scaling does
    not change the argmax, so accuracy is unchanged; vector scaling may change it.

    Args:
      vector: fit vector scaling instead of a single temperature.
    """

    def __init__(self, vector=False):
        self.vector = bool(vector)
        self.params = None

    def fit(self, logits, labels):
        """Fits on held-out `logits [n, K]` and integer `labels [n]`; returns `self`."""
        logits, labels = check_logits("TemperatureScaling", logits, labels)
        k = logits.shape[1]
        identity = np.zeros(2 * k if self.vector else 1)
        result = scipy.optimize.minimize(
            _nll_and_grad,
            identity,
            args=(logits, labels, self.vector),
            jac=True,
            method="L-BFGS-B",
        )
        start, _ = _nll_and_grad(identity, logits, labels, self.vector)
        if not np.isfinite(result.fun):
            raise ValueError(f"TemperatureScaling.fit: the optimizer failed ({result.message}).")
        self.params = result.x if result.fun <= start else identity
        return self

    @property
    def temperature(self):
        """The fitted `T` (temperature scaling only)."""
        self._check_fitted()
        if self.vector:
            raise AttributeError("Vector scaling has a per-class scale, not one temperature.")
        return float(np.exp(self.params[0]))

    def _check_fitted(self):
        if self.params is None:
            raise ValueError("TemperatureScaling: call fit(logits, labels) on held-out data first.")

    def calibrated_logits(self, logits):
        """The recalibrated logits of `logits [..., K]`."""
        self._check_fitted()
        logits = np.asarray(logits, np.float64)
        if self.vector:
            k = logits.shape[-1]
            return logits * np.exp(self.params[:k]) + self.params[k:]
        return logits * np.exp(-self.params[0])

    def predict_proba(self, logits):
        """Recalibrated class probabilities of `logits [..., K]`."""
        return softmax(self.calibrated_logits(logits), axis=-1)

    def get_config(self):
        return {
            "vector": self.vector,
            "params": None if self.params is None else self.params.tolist(),
        }

    @classmethod
    def from_config(cls, config):
        scaler = cls(vector=config["vector"])
        if config.get("params") is not None:
            scaler.params = np.asarray(config["params"], np.float64)
        return scaler
