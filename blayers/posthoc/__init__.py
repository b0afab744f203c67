"""Uncertainty for a model that is already trained: recalibration and conformal prediction.

* `Laplace`: a Gaussian posterior over the last layer's weights around the trained ones, with
  the generalized Gauss-Newton curvature (full, Kronecker-factored or diagonal), the prior
  precision chosen by the evidence, and probit or Monte Carlo predictives (Daxberger et al.,
  2021). `Laplace.to_model()` is a Keras model of the predictive, saved with its posterior as a
  `.keras` file. With `subset_of_weights='all'` it is an `AllWeightsLaplace`: KFAC or diagonal
  over every dense and convolutional layer, with the linearized network's predictive (also a
  `.keras` model with `to_model()`). `SubnetworkLaplace`: a full covariance over the weights
  of largest marginal variance (Daxberger et al., 2021b).
* `SWAG`: SWA and SWA-Gaussian moments of the weights visited by continued training, as a
  callback or a wrapper, with Monte Carlo predictives (Maddox et al., 2019).
* `TemperatureScaling` (and vector scaling): one temperature (or a per-class scale and bias) on
  the logits, fitted by NLL on held-out data (Guo et al., 2017).
* `MatrixScaling`, `DirichletScaling` (Kull et al., 2019, with their off-diagonal and
  intercept regularization), `HistogramBinning`, `IsotonicCalibration` (one-vs-rest,
  renormalized): calibration maps fitted on held-out logits.
* `SplitConformalRegressor`, `SplitConformalClassifier`: prediction intervals and sets with
  finite-sample coverage `P(y in C(x)) >= 1 - alpha` under exchangeability (Vovk et al., 2005;
  Angelopoulos et al., 2021 for APS and RAPS); `ConformalizedQuantileRegressor` (CQR, Romano
  et al., 2019) and `CrossConformalRegressor` (jackknife+ and CV+, Barber et al., 2021).
* `MCBatchNorm`: Monte Carlo batch normalization, each draw normalizing with a random training
  mini-batch's statistics (Teye et al., 2018).
* `MahalanobisScore`, `FeatureDensity`: out-of-distribution scores of a classifier's
  penultimate features (Lee et al., 2018; DDU, Mukhoti et al., 2023).

They work on NumPy arrays of a model's outputs (logits, class probabilities, predictive means
and standard deviations), so any Keras model, Bayesian or not, can be wrapped.
"""

import importlib

# Each name loads its module on first use: `python -m blayers.posthoc` starts quietly (TensorFlow
# loads after the command line has set its logging up).
_MODULES = {
    "AllWeightsLaplace": "blayers.posthoc.all_weights",
    "MCBatchNorm": "blayers.posthoc.mc_batchnorm",
    "DirichletScaling": "blayers.posthoc.calibration",
    "HistogramBinning": "blayers.posthoc.calibration",
    "IsotonicCalibration": "blayers.posthoc.calibration",
    "MatrixScaling": "blayers.posthoc.calibration",
    "AllWeightsLaplacePredictive": "blayers.posthoc.all_weights",
    "ConformalizedQuantileRegressor": "blayers.posthoc.conformal",
    "CrossConformalRegressor": "blayers.posthoc.conformal",
    "FeatureDensity": "blayers.posthoc.feature_density",
    "MahalanobisScore": "blayers.posthoc.feature_density",
    "Laplace": "blayers.posthoc.laplace",
    "LaplacePredictive": "blayers.posthoc.laplace",
    "SWAG": "blayers.posthoc.swag",
    "SubnetworkLaplace": "blayers.posthoc.subnetwork",
    "SplitConformalClassifier": "blayers.posthoc.conformal",
    "SplitConformalRegressor": "blayers.posthoc.conformal",
    "TemperatureScaling": "blayers.posthoc.temperature",
}
__all__ = [
    "SWAG",
    "AllWeightsLaplace",
    "AllWeightsLaplacePredictive",
    "ConformalizedQuantileRegressor",
    "CrossConformalRegressor",
    "DirichletScaling",
    "FeatureDensity",
    "HistogramBinning",
    "IsotonicCalibration",
    "Laplace",
    "LaplacePredictive",
    "MCBatchNorm",
    "MahalanobisScore",
    "MatrixScaling",
    "SplitConformalClassifier",
    "SplitConformalRegressor",
    "SubnetworkLaplace",
    "TemperatureScaling",
]


def __getattr__(name):
    if name not in _MODULES:
        raise AttributeError(f"module 'blayers.posthoc' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULES[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_MODULES])
