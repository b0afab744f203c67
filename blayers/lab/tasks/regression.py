"""Regression: a heteroscedastic Normal likelihood over standardized targets."""

import os

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import metrics as metrics_lib
from blayers.lab import plots
from blayers.lab.tasks.base import Task, features, register_task, targets
from blayers.sampling import normal_parameters

tfd = tfp.distributions

__all__ = ["MIN_SCALE", "Regression"]

MIN_SCALE = 1e-3
_LOG_2PI = float(np.log(2.0 * np.pi))


@register_task
class Regression(Task):
    """Float targets of shape `[target_dim]`, standardized by the data source.

    Output layout (defined here only): a tensor output's last axis holds a mean and a raw scale
    per target dimension, `[loc_1..loc_d, raw_1..raw_d]`, giving
    `Normal(loc, softplus(raw) + 1e-3)`; a model returning a `RandomVariable` (a GP with a
    Gaussian likelihood) supplies its own distribution over the `target_dim` targets.

    Metrics in the targets' original units: RMSE, test log-likelihood and 95% coverage of the
    Monte Carlo predictive (a mixture of Normals with each draw's mean and variance: a
    Student-t output, `blayers.layers.NormalInverseGamma`, is scored by its moments). Plots: `regression_1d.png` for one input
    feature, else `calibration.png` (predicted vs observed quantiles, coverage by width).
    """

    name = "regression"

    @staticmethod
    def outputs_per_target():
        """Model outputs per target dimension (mean and raw scale)."""
        return 2

    def output_size(self, data):
        return self.outputs_per_target() * data.target_dim

    @classmethod
    def target_dim(cls, output_size):
        """Target dimensions served by a model of `output_size` outputs."""
        return max(output_size // cls.outputs_per_target(), 1)

    def likelihood_from_tensor(self, outputs):
        loc, raw_scale = tf.split(outputs, self.outputs_per_target(), axis=-1)
        return tfd.Independent(tfd.Normal(loc, tf.nn.softplus(raw_scale) + MIN_SCALE), 1)

    def log_likelihood(self, outputs, targets):
        """`log p(y | outputs)`; for a Gaussian likelihood of a GP's marginals (its output's
        `function`, `N(mu, s^2)`), the expectation `E_q[log N(y; f, sigma^2)] = log N(y; mu,
        sigma^2) - s^2 / (2 sigma^2)` in closed form (Hensman et al., 2013) instead of the
        one-draw estimate."""
        function = getattr(outputs, "function", None)
        if function is None:
            return super().log_likelihood(outputs, targets)
        mean, stddev = normal_parameters(function.distribution)
        noise = tf.square(outputs.distribution.stddev())
        y = tf.cast(tf.reshape(targets, tf.shape(mean)), mean.dtype)
        return -0.5 * (
            _LOG_2PI + tf.math.log(noise) + (tf.square(y - mean) + tf.square(stddev)) / noise
        )

    def predictive_moments(self, outputs):
        distribution = self.likelihood(outputs)
        function = getattr(outputs, "function", None)
        if function is None:
            # An evidential output knows its epistemic part in closed form.
            epistemic = getattr(distribution, "epistemic_variance", None)
            closed_form = epistemic() if epistemic is not None else None
            return distribution.mean(), distribution.variance(), closed_form
        mean, stddev = normal_parameters(function.distribution)
        return mean, distribution.variance(), tf.square(stddev)

    def predictive_parameters(self, distribution):
        """Mean and standard deviation of one draw's predictive, and an evidential output's
        closed-form epistemic variance (`epistemic_variance`), which the metrics count in the
        function's spread."""
        parameters = super().predictive_parameters(distribution)
        epistemic = getattr(distribution, "epistemic_variance", None)
        return parameters if epistemic is None else (*parameters, epistemic())

    def evaluate(self, model, data, num_samples=10, batch_size=500):
        means, stddevs, *functions = self.predictive_samples(
            model, data.test, num_samples, batch_size
        )
        y = targets(data.test)
        result = metrics_lib.regression_metrics(
            means,
            stddevs,
            y,
            data.target_scale,
            function_variances=functions[0] if functions else None,
        )
        arrays = {
            "means": means,
            "stddevs": stddevs,
            "targets": y,
            "inputs": features(data.test),
            "scale": data.target_scale,
            "shift": data.target_mean,
        }
        return result, arrays

    def plot(self, model, data, arrays, model_dir):
        inputs = arrays["inputs"]
        if inputs.ndim == 2 and inputs.shape[1] == 1:
            path = os.path.join(model_dir, "regression_1d.png")
            plots.regression_1d(
                inputs,
                arrays["means"],
                arrays["stddevs"],
                arrays["targets"],
                path,
                arrays["scale"],
                arrays["shift"],
            )
        else:
            path = os.path.join(model_dir, "calibration.png")
            plots.regression_calibration(
                arrays["means"], arrays["stddevs"], arrays["targets"], path, arrays["scale"]
            )
        return [path]
