"""Bayesian dense layers in Mesh TensorFlow ops (graph mode), for the model-parallel Bayesian
Transformer (paper Section 3.1): the same estimators as `blayers.layers.estimators`, written in
`mtf` ops so that the kernel's mean and scale are split over the mesh like any `mtf` weight.

`bayesian_dense(x, new_dims, estimator=...)` computes `x @ W + b` contracting `x`'s last
dimension, with a mean-field Normal `q(W) = N(M, softplus(rho)^2)`:

* `'flipout'` (Wen et al., 2018): `x @ M + ((x * s) @ (S * eps)) * r`, one `eps` per call and
  per-example signs `s` (input features) and `r` (output features);
* `'local_reparameterization'` (Kingma et al., 2015): `x @ M + sqrt(x^2 @ S^2) * eps`, the
  pre-activations sampled per example;
* `'reparameterization'`: `x @ (M + S * eps)`;
* `None`: the deterministic dense layer (`M` only, no KL).

It returns `(y, kl)` with `kl = KL[q(W) || N(0, prior_stddev^2)]` summed (a scalar mtf tensor,
zero for `None`), which the caller adds to the loss divided by the data-set size. Noise comes
from a `blayers.lab.mesh.random.NoiseSource`: a function of the seed, the step and each entry's place
in the whole tensor, so a run is reproducible and every layout draws the same numbers.
"""

import math

import tensorflow as tf

from blayers.initializers import RHO_RANGE
from blayers.lab.mesh.random import NoiseSource, mtf

__all__ = ["ESTIMATORS", "bayesian_dense", "default_noise"]

ESTIMATORS = (None, "reparameterization", "flipout", "local_reparameterization")


def default_noise(mesh):
    """The `NoiseSource` of `mesh`'s graph when a caller passes none: seed 0, keyed by the
    TF graph's global step (made if missing)."""
    source = getattr(mesh.graph, "_blayers_noise", None)
    if source is None:
        source = NoiseSource(0, tf.compat.v1.train.get_or_create_global_step())
        mesh.graph._blayers_noise = source
    return source


def _normal_kl(mean, stddev, prior_stddev):
    """`sum KL[N(mean, stddev^2) || N(0, prior_stddev^2)]` over every entry."""
    variance_ratio = mtf.square(stddev) / (prior_stddev**2)
    terms = 0.5 * (variance_ratio + mtf.square(mean) / (prior_stddev**2) - 1.0) - mtf.log(
        stddev / prior_stddev
    )
    return mtf.reduce_sum(terms)


def bayesian_dense(
    x,
    new_dims,
    name,
    estimator="flipout",
    use_bias=True,
    activation=None,
    prior_stddev=1.0,
    mean_initializer=None,
    rho_initializer=None,
    reduced_dims=None,
    noise=None,
):
    """A Bayesian dense layer in mtf ops; see the module docstring.

    Args:
      x: an mtf tensor; its last dimension is contracted (or `reduced_dims`).
      new_dims: an `mtf.Dimension` or a list of them (the output's new dimensions).
      name: variable scope.
      estimator: one of `ESTIMATORS`.
      use_bias: a deterministic bias over `new_dims`.
      activation: an mtf activation (e.g. `mtf.relu`) or None.
      prior_stddev: the N(0, prior_stddev^2) prior's scale.
      mean_initializer: the kernel mean's initializer (default Glorot-uniform-like scaling).
      rho_initializer: the initializer of `rho`, the stddev's softplus preimage (default
        uniform on softplus^{-1} of [1e-3, 5e-2], as `trainable_normal`).
      reduced_dims: the dimensions of `x` to contract (default its last), e.g. attention's
        heads and head size in the output projection.
      noise: the `NoiseSource` to draw from (default: `default_noise(x.mesh)`).

    Returns:
      `(y, kl)`: the output and the kernel's KL (a scalar mtf tensor).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"bayesian_dense {name!r}: estimator must be one of {ESTIMATORS}.")
    new_dims = [new_dims] if isinstance(new_dims, mtf.Dimension) else list(new_dims)
    mesh = x.mesh
    reduced = list(reduced_dims) if reduced_dims else [x.shape.dims[-1]]
    batch_dims = [d for d in x.shape.dims if d not in reduced]
    kernel_shape = mtf.Shape([*reduced, *new_dims])
    output_shape = mtf.Shape([*batch_dims, *new_dims])
    fan_in = math.prod(d.size for d in reduced)
    fan_out = math.prod(d.size for d in new_dims)
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    with tf.compat.v1.variable_scope(name):
        mean = mtf.get_variable(
            mesh,
            "kernel_mean",
            kernel_shape,
            initializer=mean_initializer or tf.compat.v1.random_uniform_initializer(-limit, limit),
        )
        kl = mtf.zeros(mesh, mtf.Shape([]), dtype=x.dtype)
        if estimator is None:
            y = mtf.einsum([x, mean], output_shape=output_shape)
        else:
            rho = mtf.get_variable(
                mesh,
                "kernel_rho",
                kernel_shape,
                initializer=rho_initializer or tf.compat.v1.random_uniform_initializer(*RHO_RANGE),
            )
            stddev = mtf.softplus(rho)
            noise = noise or default_noise(mesh)
            kl = _normal_kl(mean, stddev, prior_stddev)
            if estimator == "reparameterization":
                eps = noise.normal(mesh, kernel_shape, x.dtype)
                y = mtf.einsum([x, mean + stddev * eps], output_shape=output_shape)
            elif estimator == "flipout":
                eps = noise.normal(mesh, kernel_shape, x.dtype)
                sign_in = noise.rademacher(mesh, x.shape, x.dtype)
                sign_out = noise.rademacher(mesh, output_shape, x.dtype)
                perturbed = mtf.einsum([x * sign_in, stddev * eps], output_shape=output_shape)
                y = mtf.einsum([x, mean], output_shape=output_shape) + perturbed * sign_out
            else:  # local reparameterization
                loc = mtf.einsum([x, mean], output_shape=output_shape)
                variance = mtf.einsum(
                    [mtf.square(x), mtf.square(stddev)], output_shape=output_shape
                )
                y = loc + mtf.sqrt(variance + 1e-12) * noise.normal(mesh, output_shape, x.dtype)
        if use_bias:
            bias = mtf.get_variable(
                mesh, "bias", mtf.Shape(new_dims), initializer=tf.compat.v1.zeros_initializer()
            )
            y += bias
    if activation is not None:
        y = activation(y)
    return y, kl
