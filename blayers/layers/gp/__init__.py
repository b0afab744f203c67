"""Gaussian-process layers: distributions over functions given by their values at the inputs
(Tran et al., 2019, Sec. 2.2 and Figure 5).

* `GaussianProcess(units)`: exact GP; returns a `RandomVariable` over the function values at the
  batch inputs (`[batch, units]`, one independent GP per output unit sharing the kernel): the
  prior, or the exact posterior given `conditional_inputs` / `conditional_outputs`. No
  regularizer (exact inference has none).
* `SparseGaussianProcess(units, num_inducing)`: inducing-point variational GP (Hensman et al.,
  2013), whitened by default, with trainable inducing inputs and `q(u)` mean-field or full
  Cholesky; `KL[q(u) || p(u)]` in `layer.losses`; returns the marginal predictions
  `N(mu(x), sigma^2(x))` as a `RandomVariable` whose value is a reparameterized draw, so stacked
  layers form Salimbeni & Deisenroth's (2017) doubly stochastic deep GP.
* `RandomFourierFeatures(units, num_features)`: `f(x) = phi(x)^T w` with the random features of
  the ExponentiatedQuadratic kernel (Rahimi & Recht, 2007) and a Bayesian output layer whose KL
  regularizes `w` (Cutajar et al., 2017).
* `GaussianLikelihood`: `y ~ N(f, sigma^2)` with a trainable noise variance, the output layer of
  GP regression.

Kernels are TFP `psd_kernels` (`'exponentiated_quadratic'` (default), `'matern12'`,
`'matern32'`, `'matern52'`) with a trainable amplitude and ARD length scales (`FeatureScaled`),
both `softplus` of unconstrained variables. Mean functions: `'zero'`, `'constant'` (one
trainable value per unit) or `'linear'` (trainable `x @ W + b`, `W` starting at the identity).

Numerics: Cholesky factors are taken of `K + jitter * mean(diag K) * I`, retrying with 10x the
jitter up to `max_jitter_tries` times when the factor is not finite, and failing with a clear
error after that; `cholesky_dtype='float64'` does the linear algebra in double precision.

The package: `kernels` (kernels and numerics), `base` (the exact and sparse layers' base),
`exact`, `sparse`, `random_features`, `sngp`.
"""

from blayers.layers.gp.exact import GaussianLikelihood, GaussianProcess
from blayers.layers.gp.kernels import KERNELS, jittered_cholesky, kernel_in_dtype, make_kernel
from blayers.layers.gp.random_features import RandomFourierFeatures
from blayers.layers.gp.sngp import (
    LaplaceRandomFeatureCovariance,
    RandomFeatureGaussianProcess,
    mean_field_logits,
)
from blayers.layers.gp.sparse import SparseGaussianProcess

__all__ = [
    "KERNELS",
    "GaussianLikelihood",
    "GaussianProcess",
    "LaplaceRandomFeatureCovariance",
    "RandomFeatureGaussianProcess",
    "RandomFourierFeatures",
    "SparseGaussianProcess",
    "jittered_cholesky",
    "kernel_in_dtype",
    "make_kernel",
    "mean_field_logits",
]
