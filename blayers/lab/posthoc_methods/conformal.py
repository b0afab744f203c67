"""`--method=conformal`: split-conformal sets (classification) and intervals (regression)."""

import numpy as np

from blayers import metrics as metrics_lib
from blayers import posthoc as library
from blayers.lab.posthoc_methods import Method


class Conformal(Method):
    """Split-conformal prediction on the run's own predictive: sets of classes (LAC, APS or
    RAPS, Angelopoulos et al., 2021) or intervals around the predictive mean, normalized by its
    standard deviation; the quantile is fitted on the calibration part and the coverage and
    size are measured on the evaluation part.

    Args:
      alpha: miscoverage: sets and intervals cover `1 - alpha`.
      method: `'lac'`, `'aps'` or `'raps'` for classification sets.
    """

    name, label = "conformal", "split conformal"
    changes_predictive = False

    def __init__(self, alpha=0.1, method="aps"):
        super().__init__()
        self.alpha, self.method = alpha, method

    def metrics(self, fit):
        params = [p[:, : len(fit.x)] for p in fit.base]
        calibration, evaluation, y = fit.calibration, fit.evaluation, fit.y
        if fit.classification:
            probs = np.mean(params[0], 0)
            conformal = library.SplitConformalClassifier(alpha=self.alpha, method=self.method)
            conformal.fit(probs[calibration], y[calibration])
            sets = conformal.predict_set(probs[evaluation])
            covered = sets[np.arange(len(evaluation)), y[evaluation].astype(int)]
            return {
                "conformal_coverage": float(np.mean(covered)),
                "conformal_set_size": float(np.mean(np.sum(sets, -1))),
                "conformal_target_coverage": 1.0 - self.alpha,
            }
        means, stddevs = metrics_lib.mixture_moments(params[0], params[1])
        conformal = library.SplitConformalRegressor(alpha=self.alpha)
        conformal.fit(means[calibration], y[calibration], stddevs[calibration])
        lower, upper = conformal.predict_interval(means[evaluation], stddevs[evaluation])
        inside = (y[evaluation] >= lower) & (y[evaluation] <= upper)
        return {
            "conformal_coverage": float(np.mean(inside)),
            "conformal_width": float(np.mean(upper - lower) * fit.data.target_scale),
            "conformal_target_coverage": 1.0 - self.alpha,
        }
