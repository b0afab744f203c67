"""Split conformal prediction: intervals for regression and sets for classification with
finite-sample marginal coverage.

Given a calibration set of `n` exchangeable examples never used in training, with conformity
scores `s_1..s_n`, the threshold `q = s_(k)`, the `k = ceil((n + 1)(1 - alpha))`-th smallest,
gives for a new exchangeable example

    1 - alpha <= P(y in C(x)) <= 1 - alpha + 1 / (n + 1)

(the upper bound when scores have no ties, which the randomized classification scores ensure;
Vovk et al., 2005; Lei et al., 2018; Angelopoulos & Bates, 2021). If `k > n`, `C(x)` is
everything.
"""

import math

import numpy as np

__all__ = [
    "ConformalizedQuantileRegressor",
    "CrossConformalRegressor",
    "SplitConformalClassifier",
    "SplitConformalRegressor",
    "conformal_quantile",
]


def conformal_quantile(scores, alpha):
    """`s_(k)`, the `k = ceil((n + 1)(1 - alpha))`-th smallest score (inf when `k > n`)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}.")
    scores = np.sort(np.asarray(scores, np.float64).reshape(-1))
    k = math.ceil((len(scores) + 1) * (1.0 - alpha))
    return float(scores[k - 1]) if k <= len(scores) else math.inf


class SplitConformalRegressor:
    """Prediction intervals `mean +- q * scale` from any regression model.

    Scores are `|y - mean| / stddev` when the model gives a predictive standard deviation
    (`normalized`, so intervals adapt to the model's uncertainty: wider where it is unsure),
    else `|y - mean|` (constant width).

    Args:
      alpha: miscoverage; intervals cover with probability at least `1 - alpha`.
    """

    def __init__(self, alpha=0.1):
        self.alpha = float(alpha)
        self.quantile = None

    @staticmethod
    def _scale(means, stddevs):
        if stddevs is None:
            return np.ones_like(means)
        stddevs = np.asarray(stddevs, np.float64)
        if stddevs.shape != means.shape or np.any(stddevs <= 0):
            raise ValueError(
                "SplitConformalRegressor: stddevs must be positive and shaped as the means "
                f"{means.shape}; got {stddevs.shape}."
            )
        return stddevs

    def fit(self, means, targets, stddevs=None):
        """Calibrates on held-out predictions `means [n, ...]` (and `stddevs`) and `targets`."""
        means = np.asarray(means, np.float64)
        targets = np.asarray(targets, np.float64).reshape(means.shape)
        scores = np.abs(targets - means) / self._scale(means, stddevs)
        self.normalized = stddevs is not None
        self.quantile = conformal_quantile(scores, self.alpha)
        return self

    def predict_interval(self, means, stddevs=None):
        """`(lower, upper)` of each prediction."""
        if self.quantile is None:
            raise ValueError("SplitConformalRegressor: call fit on a calibration set first.")
        if self.normalized and stddevs is None:
            raise ValueError("SplitConformalRegressor: fitted with stddevs, so predict with them.")
        means = np.asarray(means, np.float64)
        half = self.quantile * self._scale(means, stddevs)
        return means - half, means + half


class ConformalizedQuantileRegressor:
    """Conformalized quantile regression (CQR, Romano et al., 2019): a model's lower and upper
    quantile predictions `(lo, hi)` (e.g. the 5% and 95% of a pinball-loss network,
    `blayers.layers.QuantileOutput`) widened by the conformal quantile `q` of the calibration
    scores `max(lo - y, y - hi)`: `[lo - q, hi + q]` covers with probability at least
    `1 - alpha` whatever the quantiles' quality, and adapts its width to the input as they do
    (`q` may be negative: intervals that over-cover shrink). With `symmetric=False`, Romano et
    al.'s asymmetric variant: the lower end moves by the `1 - alpha / 2` conformal quantile of
    `lo - y` and the upper by that of `y - hi`, each end then miscovering at most `alpha / 2`.

    Args:
      alpha: miscoverage.
      symmetric: one correction for both ends (default) or one each.
    """

    def __init__(self, alpha=0.1, symmetric=True):
        self.alpha, self.symmetric = float(alpha), bool(symmetric)
        self.quantile = None

    @staticmethod
    def _pair(lower, upper):
        lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
        if lower.shape != upper.shape:
            raise ValueError(
                f"ConformalizedQuantileRegressor: lower {lower.shape} and upper {upper.shape} "
                "quantiles must have one shape."
            )
        return lower, upper

    def fit(self, lower, upper, targets):
        """Calibrates on held-out quantile predictions and targets."""
        lower, upper = self._pair(lower, upper)
        targets = np.asarray(targets, np.float64).reshape(lower.shape)
        if self.symmetric:
            q = conformal_quantile(np.maximum(lower - targets, targets - upper), self.alpha)
            self.quantile = (q, q)
        else:
            self.quantile = (
                conformal_quantile(lower - targets, self.alpha / 2),
                conformal_quantile(targets - upper, self.alpha / 2),
            )
        return self

    def predict_interval(self, lower, upper):
        """`(lower - q, upper + q)` (each end's own `q` when not symmetric)."""
        if self.quantile is None:
            raise ValueError("ConformalizedQuantileRegressor: call fit on a calibration set first.")
        lower, upper = self._pair(lower, upper)
        return lower - self.quantile[0], upper + self.quantile[1]


class CrossConformalRegressor:
    """Jackknife+ and CV+ intervals (Barber et al., 2021) from `K` models, model `k` trained
    without fold `k` of the training set (`K = n` folds of one example each: the jackknife+).
    With the out-of-fold residuals `R_i = |y_i - mu_{-k(i)}(x_i)|`, a new input's interval is

        [ q-_alpha { mu_{-k(i)}(x) - R_i },  q+_alpha { mu_{-k(i)}(x) + R_i } ]

    over the `n` training examples `i`, `q-` the `floor(alpha (n + 1))`-th smallest value and
    `q+` the `ceil((1 - alpha)(n + 1))`-th smallest; coverage is at least `1 - 2 alpha` in the
    worst case and about `1 - alpha` in practice, without a held-out calibration set. Every
    model's prediction of the new input enters, not an average (`method='plus'`); `'minmax'`
    (jackknife-minmax) uses the smallest and largest of them, guaranteed `1 - alpha`.

    Args:
      alpha: miscoverage.
      method: `'plus'` or `'minmax'`.
    """

    def __init__(self, alpha=0.1, method="plus"):
        if method not in ("plus", "minmax"):
            raise ValueError(
                f"CrossConformalRegressor: method {method!r} is not 'plus' or 'minmax'."
            )
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}.")
        self.alpha, self.method = float(alpha), method
        self.residuals = None

    def fit(self, out_of_fold, targets, folds):
        """Takes the training set's out-of-fold predictions `[n]` (example `i` predicted by the
        model trained without its fold), targets `[n]` and fold indices `[n]` in `[0, K)`."""
        out_of_fold = np.asarray(out_of_fold, np.float64).reshape(-1)
        targets = np.asarray(targets, np.float64).reshape(-1)
        folds = np.asarray(folds).reshape(-1).astype(int)
        if not out_of_fold.shape == targets.shape == folds.shape:
            raise ValueError(
                "CrossConformalRegressor.fit: out_of_fold, targets and folds need one length; "
                f"got {out_of_fold.shape}, {targets.shape} and {folds.shape}."
            )
        self.residuals, self.folds = np.abs(targets - out_of_fold), folds
        self.num_folds = int(folds.max()) + 1
        return self

    def predict_interval(self, fold_predictions):
        """`(lower, upper)` of new inputs from every fold model's predictions `[K, m]`."""
        if self.residuals is None:
            raise ValueError("CrossConformalRegressor: call fit on the out-of-fold predictions.")
        predictions = np.asarray(fold_predictions, np.float64)
        if predictions.ndim != 2 or len(predictions) != self.num_folds:
            raise ValueError(
                f"CrossConformalRegressor: fold_predictions must be [K={self.num_folds}, m]; got "
                f"{predictions.shape}."
            )
        n = len(self.residuals)
        if self.method == "minmax":
            low = predictions.min(0)[:, None] - self.residuals[None]
            high = predictions.max(0)[:, None] + self.residuals[None]
        else:
            per_example = predictions[self.folds].T  # [m, n]: mu_{-k(i)}(x)
            low, high = per_example - self.residuals, per_example + self.residuals
        k_low = math.floor(self.alpha * (n + 1))
        k_high = math.ceil((1.0 - self.alpha) * (n + 1))
        lower = np.sort(low, -1)[:, k_low - 1] if k_low >= 1 else np.full(len(low), -math.inf)
        upper = np.sort(high, -1)[:, k_high - 1] if k_high <= n else np.full(len(high), math.inf)
        return lower, upper


class SplitConformalClassifier:
    """Prediction sets from any classifier's probabilities.

    Scores (for the true label `y` at calibration, for every label at prediction):

    * `'lac'`: `1 - p_y` (least ambiguous sets: the smallest on average; Sadinle et al., 2019);
    * `'aps'`: the mass of the labels ranked at or above `y`, `sum_{j <= r(y)} p_(j)`, minus
      `u * p_y` with `u ~ U(0, 1)` when `randomized` (adaptive sets: coverage holds for easy
      and hard inputs alike; Romano et al., 2020);
    * `'raps'`: APS plus `lam * max(0, r(y) - k_reg)`, which keeps sets small when the tail of
      the probabilities is noise (Angelopoulos et al., 2021).

    A set holds every label whose score is at most the calibrated threshold.

    Args:
      alpha: miscoverage; sets cover the true label with probability at least `1 - alpha`.
      method: `'lac'`, `'aps'` or `'raps'`.
      randomized: APS/RAPS's tie-breaking `u` (exact coverage up to `1 / (n + 1)`); without it
        the sets are conservative.
      k_reg, lam: RAPS's penalty (labels beyond rank `k_reg` cost `lam` each).
      seed: of the `u` draws.
    """

    def __init__(self, alpha=0.1, method="aps", randomized=True, k_reg=1, lam=0.01, seed=0):
        if method not in ("lac", "aps", "raps"):
            raise ValueError(
                f"SplitConformalClassifier: method {method!r} is not lac, aps or raps."
            )
        self.alpha, self.method, self.randomized = float(alpha), method, bool(randomized)
        self.k_reg, self.lam = int(k_reg), float(lam)
        self._rng = np.random.default_rng(seed)
        self.quantile = None

    def _all_scores(self, probs):
        """Scores `[n, K]` of every label (one `u` per example)."""
        probs = np.asarray(probs, np.float64)
        if self.method == "lac":
            return 1.0 - probs
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, -1)
        inclusive = np.cumsum(sorted_p, -1)
        u = self._rng.uniform(size=probs.shape[:1] + (1,)) if self.randomized else 0.0
        scores_sorted = inclusive - u * sorted_p
        if self.method == "raps":
            ranks = np.arange(1, probs.shape[-1] + 1)
            scores_sorted = scores_sorted + self.lam * np.maximum(0, ranks - self.k_reg)
        scores = np.empty_like(scores_sorted)
        np.put_along_axis(scores, order, scores_sorted, -1)
        return scores

    def fit(self, probs, labels):
        """Calibrates on held-out `probs [n, K]` and integer `labels [n]`."""
        labels = np.asarray(labels).astype(int)
        scores = self._all_scores(probs)[np.arange(len(labels)), labels]
        self.quantile = conformal_quantile(scores, self.alpha)
        return self

    def predict_set(self, probs):
        """Boolean `[n, K]`: which labels each prediction set holds."""
        if self.quantile is None:
            raise ValueError("SplitConformalClassifier: call fit on a calibration set first.")
        return self._all_scores(probs) <= self.quantile
