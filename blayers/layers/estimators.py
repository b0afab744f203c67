"""The estimators, written once for any linear operation `op(inputs, kernel)`.

A Bayesian layer family (dense, convolution, transposed convolution, einsum, the projections of
recurrent cells and attention) defines its deterministic linear map `_linear(inputs, kernel)`;
mixing in one of these classes supplies `linear_fn(kernel_rv, batch_size=None, seed=None)`, the
forward pass under one draw of a random kernel (a function of the inputs, reused by a recurrent
cell for every step; `seed`, by default the layer's next, fixes the estimator's own noise so that
a cell can form the same draw again):

* `ReparameterizationEstimator`: `op(x, W)` with one draw `W ~ q` per call.
* `FlipoutEstimator` (Wen et al., 2018): `op(x, M) + op(x * s, dW) * r` with one perturbation
  `dW = W - M` per call and random signs `s` (input channels) and `r` (output channels) drawn per
  example, exactly +-1. Each example sees a valid draw from q when q is symmetric about its mean.
* `LocalReparameterizationEstimator` (Kingma et al., 2015): `op(x, M) + sqrt(op(x^2, S^2)) * eps`,
  exact in distribution for a linear `op` and a mean-field Normal q, per output unit.

Everything is exact for a mean-field Normal q (`normal_parameters`); other q fall back to
`mean()` / `stddev()` / `value - mean`. A replicated layer (`blayers.replicas`) runs the same
code on `[R, batch, ...]` inputs and `[R, ...]` kernels: its draws take the layer's
`replica_keys`, and the per-example noise is per replica and per example.
"""

import tensorflow as tf
import tensorflow_probability as tfp

from blayers.sampling import (
    flat_multivariate_normal,
    flip_signs,
    normal_parameters,
    normal_variance,
    rademacher,
    standard_normal,
    standard_normal_like,
)

__all__ = [
    "FlipoutEstimator",
    "LocalReparameterizationEstimator",
    "ReparameterizationEstimator",
    "kernel_moments",
    "kernel_perturbation",
]


def kernel_moments(kernel):
    """`(mean, stddev)` of a random kernel: its Normal parameters when it is mean-field Normal
    (no copies), else TFP's generic `mean()` and `stddev()`."""
    params = normal_parameters(kernel.distribution)
    if params is not None:
        return params
    return kernel.distribution.mean(), kernel.distribution.stddev()


def kernel_perturbation(kernel, seed, dtype, keys=None):
    """`(M, dW)`: the kernel's mean and one zero-mean perturbation `W - M`. For a Normal q only
    `S * eps` is drawn; `M + S * eps` is never materialized. `keys`: a replicated kernel's."""
    params = normal_parameters(kernel.distribution)
    if params is not None:
        mean, scale = params
        return mean, scale * standard_normal(kernel.shape, seed, dtype, keys)
    mean = kernel.distribution.mean()
    return mean, kernel.value - mean


def _example_axes(layer):
    return 1 if getattr(layer, "replicas", None) is None else 2


class ReparameterizationEstimator:
    """`op(x, W)`, one kernel draw per call shared by the batch."""

    def linear_fn(self, kernel, batch_size=None, seed=None):
        del batch_size, seed  # the kernel's draw carries its own seed
        weight = kernel.value
        return lambda x: self._linear(x, weight)


class FlipoutEstimator:
    """`op(x, M) + op(x * s, dW) * r`, signs per example and per channel.

    One perturbation `dW` and one pair of sign seeds per draw: applied again (the steps of a
    sequence), the stateless signs repeat, so each example keeps its weight for the sequence.
    With `batch_size` (a dense-shaped kernel `[in, out]` applied to `[batch, in]` inputs, as in
    a recurrent cell) the signs are drawn once, up front, instead of at every application.
    """

    def linear_fn(self, kernel, batch_size=None, seed=None):
        seed = self.next_seed() if seed is None else seed
        noise_seed, in_seed, out_seed = tfp.random.split_seed(seed, n=3)
        dtype, keys, axes = self.compute_dtype, self.replica_keys, _example_axes(self)
        mean, perturbation = kernel_perturbation(kernel, noise_seed, dtype, keys)
        if batch_size is not None:
            sign_in = rademacher(tf.stack([batch_size, kernel.shape[0]]), in_seed, dtype)
            sign_out = rademacher(tf.stack([batch_size, kernel.shape[-1]]), out_seed, dtype)
            return lambda x: (
                self._linear(x, mean) + self._linear(x * sign_in, perturbation) * sign_out
            )

        def apply(x):
            outputs = self._linear(x, mean)
            perturbed = self._linear(flip_signs(x, in_seed, axes, keys), perturbation)
            return outputs + flip_signs(perturbed, out_seed, axes, keys)

        return apply


class LocalReparameterizationEstimator:
    """`op(x, M) + sqrt(op(x^2, S^2)) * eps`: pre-activations sampled, no kernel drawn."""

    _variance_weights = ("kernel",)  # its initializer forms S and S^2 in one pass

    def linear_fn(self, kernel, batch_size=None, seed=None):
        del batch_size
        if flat_multivariate_normal(kernel.distribution) is not None:
            raise ValueError(
                f"{type(self).__name__} ({self.name}): local reparameterization is exact only "
                "for a factorized q, and this kernel's q has a full covariance; use the "
                "reparameterization or Flipout estimator."
            )
        mean, stddev = kernel_moments(kernel)
        variance_kernel = normal_variance(kernel.distribution)
        if variance_kernel is None:
            variance_kernel = tf.square(stddev)
        if variance_kernel.shape != kernel.shape:
            variance_kernel = tf.broadcast_to(variance_kernel, kernel.shape)
        seed = self.next_seed() if seed is None else seed

        def apply(x):
            loc = self._linear(x, mean)
            variance = self._linear(tf.square(x), variance_kernel)
            noise = standard_normal_like(loc, seed, self.replica_keys)
            # The small floor keeps sqrt's gradient finite where an input patch is all zeros.
            return loc + tf.sqrt(variance + 1e-12) * noise

        return apply
