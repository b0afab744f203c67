"""Density estimation: the targets are the points; the model returns a random variable."""

import os
import typing

import numpy as np
import tensorflow as tf

from blayers.lab import plots
from blayers.lab.tasks.base import Task, features, register_task

__all__ = ["Density", "DensityModel"]


@typing.runtime_checkable
class DensityModel(typing.Protocol):
    """What a latent-variable density model (a VAE, a VQ-VAE) offers the `Density` task beyond
    `model(x).distribution.log_prob(x)`, which a flow's exact density already is.

    `density_metrics(x, num_samples)` returns a dict with at least `test_nll` (nats per
    example, e.g. an importance-weighted bound); `reconstruct(x)` and `sample(n, seed)` return
    arrays shaped like `x` for the sample grid.
    """

    def density_metrics(self, x, num_samples): ...

    def reconstruct(self, x): ...

    def sample(self, n, seed=None): ...


@register_task
class Density(Task):
    """`p(x)`: features and targets are the same points; the model's output is a
    `RandomVariable` whose distribution scores them (a flow, a VAE's decoder).

    Metrics: the test NLL `-log mean_s p_s(x)` over `num_samples` passes, in nats and bits per
    dimension (for dequantized data, `data.reference['levels']`: bits per discrete pixel, the
    figure papers report, beside the continuous density's bits on the unit scale;
    NLL above the true entropy for synthetic data, `data.reference['entropy']`), or a
    `DensityModel`'s own `density_metrics`. Plots: a sample grid for images, the learned density
    for 2-D points.
    """

    name = "density"

    def output_size(self, data):
        return data.target_dim

    def evaluate(self, model, data, num_samples=10, batch_size=500):
        x = features(data.test)
        if isinstance(model, DensityModel):
            result = model.density_metrics(x, num_samples)
        else:
            result = self._flow_metrics(model, data, num_samples, batch_size)
        if "entropy" in data.reference:
            result["nll_minus_true_entropy"] = result["test_nll"] - data.reference["entropy"]
        return result, {"inputs": x}

    @staticmethod
    def _flow_metrics(model, data, num_samples, batch_size):
        @tf.function(autograph=False)
        def log_prob(x):
            return model(x, training=False).distribution.log_prob(x)

        batched = data.test.batch(batch_size)
        passes = [
            np.concatenate([log_prob(x).numpy() for x, _ in batched]) for _ in range(num_samples)
        ]
        stacked = np.stack(passes).astype(np.float64)
        log_density = np.logaddexp.reduce(stacked, axis=0) - np.log(num_samples)
        dims = int(np.prod(data.input_shape))
        nll = float(-log_density.mean())
        bits = nll / (dims * np.log(2.0))
        if "levels" not in data.reference:
            return {"test_nll": nll, "bits_per_dim": bits}
        # Dequantized pixels in [0, 1): the continuous density's bits per dimension are on that
        # unit scale (negative once the density exceeds 1); the discrete pixels' bits, the
        # number papers report, add log2(levels) (Theis et al., 2016).
        return {
            "test_nll": nll,
            "bits_per_dim_continuous_unit_scale": bits,
            "bits_per_pixel_discrete": bits + np.log2(data.reference["levels"]),
        }

    def plot(self, model, data, arrays, model_dir):
        x = arrays["inputs"]
        if isinstance(model, DensityModel):
            path = os.path.join(model_dir, "samples.png")
            plots.image_grid(model, x, path, sample_label=getattr(model, "sample_label", "sample"))
        elif x.ndim == 2 and x.shape[1] == 2:
            path = os.path.join(model_dir, "density.png")
            plots.density_2d(model, x, path)
        else:
            path = os.path.join(model_dir, "samples.png")
            if not plots.flow_samples(model, x, path):
                return []
        return [path]
