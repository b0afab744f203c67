"""Deep Gaussian processes: stacked `SparseGaussianProcess` layers (Salimbeni & Deisenroth,
2017; the paper's Figure 5) ending in a `GaussianLikelihood`.

Inner layers have `hidden_units` outputs (default `min(input_dim, 30)`, as Salimbeni &
Deisenroth), a linear mean function starting at the identity (their "linear mean" for inner
layers) and a small initial variational scale, so the stack starts near a single GP; the last
layer has a zero mean and `q(u)` starting at the prior's scale.
"""

import gin
import keras
import numpy as np

from blayers.lab.tasks import Regression
from blayers.layers.gp import GaussianLikelihood, SparseGaussianProcess

__all__ = ["deep_gp"]


@gin.configurable(module="blayers.lab.models")
def deep_gp(
    input_shape,
    num_outputs,
    depth=2,
    num_inducing=100,
    hidden_units=None,
    covariance_fn="exponentiated_quadratic",
    inner_variational_scale=1e-3,
    noise_variance=0.1,
    whiten=True,
    inducing_inputs_initializer="random_normal",
    name="deep_gp",
):
    """`depth` SVGP layers with `num_inducing` inducing points each, then `GaussianLikelihood`.

    `num_outputs` is the regression task's output size; the GP predicts its
    `Regression.target_dim(num_outputs)` targets and the likelihood supplies the noise.
    `inducing_inputs_initializer='kmeans'` starts every layer's inducing inputs at k-means
    centres of its first training batch (Salimbeni & Deisenroth's initialization).
    """
    if depth < 1:
        raise ValueError(f"deep_gp needs depth >= 1, got {depth}.")
    input_dim = int(np.prod(input_shape))
    hidden = hidden_units or min(input_dim, 30)
    model_layers = [keras.Input(tuple(input_shape))]
    if len(input_shape) > 1:
        model_layers.append(keras.layers.Flatten())
    for i in range(depth - 1):
        model_layers.append(
            SparseGaussianProcess(
                hidden,
                num_inducing=num_inducing,
                mean_fn="linear",
                covariance_fn=covariance_fn,
                whiten=whiten,
                initial_variational_scale=inner_variational_scale,
                inducing_inputs_initializer=inducing_inputs_initializer,
                name=f"gp_{i}",
            )
        )
    model_layers.append(
        SparseGaussianProcess(
            Regression.target_dim(num_outputs),
            num_inducing=num_inducing,
            covariance_fn=covariance_fn,
            whiten=whiten,
            initial_variational_scale=1.0,
            inducing_inputs_initializer=inducing_inputs_initializer,
            name=f"gp_{depth - 1}",
        )
    )
    model_layers.append(GaussianLikelihood(noise_variance, name="likelihood"))
    return keras.Sequential(model_layers, name=name)
