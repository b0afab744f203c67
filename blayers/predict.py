"""Monte Carlo predictive distributions with bounded memory.

`q(y | x) = int p(y | f_theta(x)) q(theta) dtheta` (Tran et al., 2019, Sec. 2.1) is estimated
with `num_samples` forward passes. The passes run one after another and only running sums of
the outputs are kept, so memory holds one pass's activations whatever `num_samples` is.
"""

import collections
import sys
import types

import numpy as np
import tensorflow as tf

from blayers import tracing
from blayers.random_variable import RandomVariable

__all__ = ["Prediction", "predict"]

Prediction = collections.namedtuple("Prediction", ["mean", "stddev", "samples"])
Prediction.__doc__ = """Monte Carlo predictive summary.

mean: predictive mean, shape of one model output.
stddev: predictive standard deviation (law of total variance: the spread of the per-pass means
  plus, for outputs that are random variables, the mean of their variances).
samples: `[num_samples, ...]` per-pass outputs (the output's mean when it is a random
  variable), or None unless `return_samples=True`.
"""


def _output_moments(outputs):
    if isinstance(outputs, RandomVariable):
        distribution = outputs.distribution
        return distribution.mean(), distribution.variance()
    outputs = tf.convert_to_tensor(outputs)
    return outputs, tf.zeros_like(outputs)


def _batches(x, batch_size):
    leaves = tf.nest.flatten(x)
    n = int(leaves[0].shape[0])
    for start in range(0, n, batch_size):
        yield tf.nest.map_structure(lambda a, s=start: a[s : s + batch_size], x)


def predict(model, x, num_samples=10, batch_size=256, return_samples=False, posterior_mean=False):
    """Monte Carlo predictive mean and standard deviation of `model` at inputs `x`.

    Args:
      model: a callable Keras model or layer; its output may be a tensor or a `RandomVariable`.
      x: inputs (array, tensor, or a structure of them for multi-input models).
      num_samples: forward passes per batch (weight draws).
      batch_size: examples per forward pass.
      return_samples: also return the `[num_samples, ...]` per-pass outputs.
      posterior_mean: one pass with every random variable at its mean (`blayers.take_mean`);
        `num_samples` is then 1.

    Returns:
      `Prediction(mean, stddev, samples)` of NumPy arrays.
    """
    if num_samples < 1:
        raise ValueError(f"predict needs num_samples >= 1, got {num_samples}.")
    x = tf.nest.map_structure(lambda a: tf.convert_to_tensor(a), x)
    if posterior_mean:
        num_samples = 1

    # A fresh tf.function per call, traced under the requested interception.
    forward = tf.function(
        lambda inputs: _output_moments(model(inputs, training=False)), autograph=False
    )
    context = tracing.posterior_mean() if posterior_mean else _null_context()

    means, stddevs, samples = [], [], []
    with context:
        for batch in _batches(x, batch_size):
            sum_mean = sum_sq = sum_var = 0.0
            batch_samples = []
            for _ in range(num_samples):
                mean, variance = forward(batch)
                mean = mean.numpy().astype(np.float64)
                sum_mean = sum_mean + mean
                sum_sq = sum_sq + np.square(mean)
                sum_var = sum_var + variance.numpy().astype(np.float64)
                if return_samples:
                    batch_samples.append(mean.astype(np.float32))
            avg = sum_mean / num_samples
            total_var = np.maximum(sum_sq / num_samples - np.square(avg), 0.0)
            total_var += sum_var / num_samples
            means.append(avg.astype(np.float32))
            stddevs.append(np.sqrt(total_var).astype(np.float32))
            if return_samples:
                samples.append(np.stack(batch_samples))
    return Prediction(
        mean=np.concatenate(means),
        stddev=np.concatenate(stddevs),
        samples=np.concatenate(samples, axis=1) if return_samples else None,
    )


class _null_context:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class _CallableModule(types.ModuleType):
    """`blayers.predict` names both this module and its function: importing the module
    (`import blayers.predict`, a documentation tool) rebinds the package's attribute to the
    module, so the module calls the function too."""

    def __call__(self, *args, **kwargs):
        return predict(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
