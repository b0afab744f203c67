"""Point processes fitted by variational inference over programs (Tran et al., 2019, Sec. 2.5):
the model's output is its own loss (`-ELBO` per point), and the judge is the held-out pattern.

* `VariationalInference`: a task whose loss is the model's output, the negative ELBO of a
  `blayers.programs.VariationalProgram`, per example.
* `PointProcess`: examples are the points of a pattern in the unit window `[0, 1]^d` (the
  original `window` rescaled), split by independent thinning with probability `train_fraction`
  (`blayers.lab.data.point_pattern`). A rate fitted to the training pattern predicts the held-out
  one as `(1 - p) / p` times itself.

`PointProcess` metrics (log-likelihoods in the original units: intensities per unit of the
original window, `log p_orig = log p_unit - n log |W|`):
  test_log_likelihood: the posterior predictive `log mean_s p(X_test | rate_s)`, `rate_s` joint
    posterior draws at the held-out points and the quadrature nodes;
  test_log_likelihood_per_event: the same divided by the held-out count;
  kde_test_log_likelihood: a Gaussian kernel intensity estimate on the training pattern
    (edge-corrected, bandwidth by leave-one-out likelihood, Diggle 1985), the usual baseline;
  homogeneous_test_log_likelihood: the constant rate `n_train / |W|`;
  expected_test_count, test_count: the posterior mean of the held-out count against the count.
Plot: `intensity.png`: the posterior intensity (mean, 5-95% band) with the events, beside the
kernel estimate (1-D), or as images (2-D).
"""

import os
import typing

import numpy as np
from scipy import special, stats

from blayers.lab import plots
from blayers.lab.tasks.base import Task, features, register_task

__all__ = [
    "PointProcess",
    "PointProcessModel",
    "VariationalInference",
    "kernel_intensity",
]


@register_task
class VariationalInference(Task):
    """The model's output is its per-example loss, the negative ELBO of a model program and a
    posterior program (`blayers.programs.VariationalProgram`); the trainer minimizes it."""

    name = "variational_inference"

    def output_size(self, data):
        return data.target_dim

    def negative_log_likelihood(self, outputs, targets):
        del targets
        return outputs

    def evaluate(self, model, data, num_samples=10, batch_size=500):
        x = features(data.test)
        result = model.elbo(x, num_samples=num_samples)
        return {"test_elbo_per_example": float(result.elbo) / max(len(x), 1)}, {}


@typing.runtime_checkable
class PointProcessModel(typing.Protocol):
    """What a point-process model offers the `PointProcess` task: `posterior_rate(locations,
    num_samples)`, joint posterior draws `[num_samples, m]` of the rate (unit window) at
    `locations [m, d]`, and `quadrature()`, the `(nodes, weights)` of its integral."""

    def posterior_rate(self, locations, num_samples): ...

    def quadrature(self): ...


def _edge_mass(centres, bandwidth, low, high):
    """Mass of the Gaussian kernels at `centres` inside the box `[low, high]`."""
    upper = stats.norm.cdf((high - centres) / bandwidth)
    lower = stats.norm.cdf((low - centres) / bandwidth)
    return np.prod(upper - lower, axis=-1)


def _log_kernel(x, centres, bandwidth):
    d = x.shape[-1]
    sq = np.sum((x[:, None, :] - centres[None, :, :]) ** 2, -1)
    return -0.5 * sq / bandwidth**2 - d * np.log(bandwidth * np.sqrt(2 * np.pi))


def kernel_intensity(points, low=0.0, high=1.0, bandwidths=None):
    """Edge-corrected Gaussian kernel intensity estimate, bandwidth by leave-one-out likelihood.

    `lam(x) = sum_i k_h(x - x_i) / c_h(x_i)`, `c_h(x_i)` the mass of the kernel inside the
    window, so `integral_W lam = n`. The bandwidth maximizes the leave-one-out log-likelihood
    `sum_i log lam_{-i}(x_i)` (the integral is `n - 1` for every `h`) over `bandwidths` (default
    40 values log-spaced from 0.2% to 50% of the window).

    Returns:
      `(fn, bandwidth)`: `fn(x [m, d]) -> lam [m]`.
    """
    points = np.asarray(points, "float64")
    bandwidths = np.geomspace(0.002, 0.5, 40) if bandwidths is None else np.asarray(bandwidths)

    def log_terms(x, h):
        return _log_kernel(x, points, h) - np.log(_edge_mass(points, h, low, high))[None]

    best, best_score = None, -np.inf
    for h in bandwidths:
        terms = log_terms(points, h)
        np.fill_diagonal(terms, -np.inf)
        score = np.sum(special.logsumexp(terms, axis=1))
        if score > best_score:
            best, best_score = float(h), score

    def fn(x):
        return np.exp(special.logsumexp(log_terms(np.asarray(x, "float64"), best), axis=1))

    return fn, best


def _pattern_log_likelihood(log_rate_at_points, integral):
    return np.sum(log_rate_at_points, axis=-1) - integral


@register_task
class PointProcess(VariationalInference):
    """A point pattern in the unit window, split by independent thinning (see the module).

    Args:
      window: the original window `[[low, high], ...]` (for the reported units and the plots).
      train_fraction: the thinning probability `p` of the split.
      unit: the name of one original coordinate unit (`'year'`), for plots.
    """

    name = "point_process"

    def __init__(self, window=((0.0, 1.0),), train_fraction=0.5, unit=""):
        self.window = np.asarray(window, "float64")
        self.train_fraction = float(train_fraction)
        self.unit = unit

    @property
    def log_volume(self):
        return float(np.sum(np.log(self.window[:, 1] - self.window[:, 0])))

    def evaluate(self, model, data, num_samples=10, batch_size=500):
        if not isinstance(model, PointProcessModel):
            raise TypeError(
                f"The point_process task needs a model with posterior_rate() and quadrature() "
                f"(blayers.lab.models.CoxProcess), got {type(model).__name__}."
            )
        train, test = features(data.train), features(data.test)
        ratio = (1.0 - self.train_fraction) / self.train_fraction
        nodes, weights = (np.asarray(a, "float64") for a in model.quadrature())
        n = len(test)
        locations = np.concatenate([test, nodes]).astype("float32")
        rates = np.asarray(model.posterior_rate(locations, num_samples), "float64") * ratio
        per_draw = _pattern_log_likelihood(np.log(rates[:, :n]), rates[:, n:] @ weights)
        cox = special.logsumexp(per_draw) - np.log(len(per_draw)) - n * self.log_volume
        kde, bandwidth = kernel_intensity(train)
        kde_test = kde(test) * ratio
        kde_ll = np.sum(np.log(kde_test)) - ratio * len(train) - n * self.log_volume
        rate0 = ratio * len(train)  # unit window: the homogeneous rate is the count
        homogeneous = n * np.log(rate0) - rate0 - n * self.log_volume
        grid = self._plot_grid()
        draws = np.asarray(model.posterior_rate(grid.astype("float32"), num_samples), "float64")
        metrics = {
            "test_log_likelihood": float(cox),
            "test_log_likelihood_per_event": float(cox / max(n, 1)),
            "kde_test_log_likelihood": float(kde_ll),
            "homogeneous_test_log_likelihood": float(homogeneous),
            "kde_bandwidth": bandwidth,
            "expected_test_count": float(np.mean(rates[:, n:] @ weights)),
            "test_count": float(n),
            "train_elbo_per_point": float(model.elbo(train).elbo) / max(len(train), 1),
        }
        arrays = {"grid": grid, "draws": draws, "kde": kde(grid), "train": train, "test": test}
        return metrics, arrays

    def _plot_grid(self):
        d = len(self.window)
        size = 200 if d == 1 else 40
        axes = np.meshgrid(*[(np.arange(size) + 0.5) / size] * d, indexing="ij")
        return np.stack([a.ravel() for a in axes], -1)

    def plot(self, model, data, arrays, model_dir):
        if not arrays or len(self.window) > 2:
            return []
        path = os.path.join(model_dir, "intensity.png")
        plots.point_process_intensity(
            arrays["grid"],
            arrays["draws"],
            arrays["kde"],
            arrays["train"],
            arrays["test"],
            self.window,
            path,
            unit=self.unit,
        )
        return [path]
