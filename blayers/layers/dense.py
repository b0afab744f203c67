"""Bayesian densely-connected layers: one class per estimator of the same distribution.

All compute `outputs = activation(inputs @ kernel + bias)` with `kernel ~ q(kernel)` given by the
kernel initializer (default `trainable_normal`, a mean-field Normal) and a KL regularizer
(default `normal_kl_divergence`, prior N(0, 1)) in `layer.losses`. They differ only in how the
integral over `q` is estimated (Tran et al., 2019, Sec. 2.1 and Fig. 3):

* `DenseReparameterization`: one weight sample per call, shared by the batch (Kingma & Welling
  2014; Blundell et al. 2015).
* `DenseFlipout`: pseudo-independent perturbations per example via random sign flips
  (Wen et al. 2018): `x @ M + ((x * s) @ (W - M)) * r` with `s, r` in {-1, +1}.
* `DenseLocalReparameterization`: samples the pre-activations, which are Normal given the
  inputs (Kingma et al. 2015): `N(x @ M, x^2 @ S^2)`; no weight matrix is drawn.
* `DenseDVI`: deterministic moment propagation (Wu et al. 2019); returns a `RandomVariable`
  over a multivariate Normal with the outputs' mean and covariance.

Each accepts the mandatory arguments of `keras.layers.Dense` and is a drop-in replacement. With
a Keras (deterministic) kernel initializer, each is an ordinary `Dense`. With `replicas=R` (all
but `DenseDVI`), each is `R` independent layers at once (`blayers.replicas`): kernel
`[R, in, units]`, inputs `[R, batch, ..., in]`, one batched matmul.
"""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import distributions as rv_lib
from blayers import replicas as replicas_lib
from blayers.layers.base import WEIGHT_ARGS, BayesianLayer, is_fixed, register
from blayers.layers.estimators import (
    FlipoutEstimator,
    LocalReparameterizationEstimator,
    ReparameterizationEstimator,
    kernel_moments,
)
from blayers.random_variable import RandomVariable

tfd = tfp.distributions

__all__ = [
    "DenseDVI",
    "DenseFlipout",
    "DenseLocalReparameterization",
    "DenseReparameterization",
    "dense_matmul",
]


def dense_matmul(inputs, kernel):
    """`inputs @ kernel` over the last axis of `inputs` (rank >= 2); a replicated kernel
    `[R, in, units]` maps each replica's `[R, batch, ..., in]` inputs with its own slice."""
    if kernel.shape.rank == 3:
        if inputs.shape.rank == 3:
            return tf.matmul(inputs, kernel)
        shape = tf.shape(inputs)
        flat = tf.reshape(inputs, tf.stack([shape[0], -1, shape[-1]]))
        outputs = tf.matmul(flat, kernel)
        return tf.reshape(outputs, tf.concat([shape[:-1], tf.shape(kernel)[-1:]], 0))
    if inputs.shape.rank == 2:
        return tf.matmul(inputs, kernel)
    return tf.tensordot(inputs, kernel, [[-1], [0]])


class _DenseBase(BayesianLayer):
    """Shared constructor, build, bias/activation and config of the dense estimators."""

    _args_doc = (
        """    Args:
      units: output size (`keras.layers.Dense`'s `units`).
      activation: Keras activation of `x @ W + b` (default none).
      use_bias: add a bias.
"""
        + WEIGHT_ARGS
    )
    supports_replicas = True

    def __init__(
        self,
        units,
        activation=None,
        use_bias=True,
        kernel_initializer="trainable_normal",
        bias_initializer="zeros",
        kernel_regularizer="prior",
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, activity_regularizer=activity_regularizer, **kwargs)
        if not isinstance(units, (int, np.integer)) or units <= 0:
            raise ValueError(
                f"{type(self).__name__} needs a positive integer `units`, got {units!r}."
            )
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self._configure_weight("kernel", kernel_initializer, kernel_regularizer, kernel_constraint)
        self._configure_weight("bias", bias_initializer, bias_regularizer, bias_constraint)
        self.input_spec = keras.layers.InputSpec(min_ndim=2)
        self.supports_masking = True  # the mask of `[batch, time, features]` inputs passes on

    def build(self, input_shape):
        input_dim = input_shape[-1]
        if input_dim is None:
            raise ValueError(
                f"{type(self).__name__} ({self.name}) needs a known last input "
                f"dimension, got input shape {input_shape}."
            )
        if self.replicas is not None:
            replicas_lib.check_replica_inputs(self, input_shape)
        self.add_bayesian_weight("kernel", (input_dim, self.units))
        if self.use_bias:
            self.add_bayesian_weight("bias", (self.units,))
        else:
            self.bias = None
        self.input_spec = keras.layers.InputSpec(
            min_ndim=2 if self.replicas is None else 3, axes={-1: input_dim}
        )

    def call(self, inputs):
        self.call_weights()
        inputs = tf.convert_to_tensor(inputs, dtype=self.compute_dtype)
        return self.add_bias_and_activate(self.apply_kernel(inputs))

    def _linear(self, inputs, kernel):
        return dense_matmul(inputs, kernel)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            **self._weight_config("kernel"),
            **self._weight_config("bias"),
        }


@register
class DenseReparameterization(ReparameterizationEstimator, _DenseBase):
    """Bayesian dense layer, reparameterization estimator: one kernel draw `W ~ q` per call,
    `activation(x @ W + b)`. Gradients reach q's parameters through `W = M + S * eps`."""


@register
class DenseFlipout(FlipoutEstimator, _DenseBase):
    """Bayesian dense layer, Flipout estimator (Wen et al., 2018).

    `x @ M + ((x * s) @ dW) * r`, with one perturbation `dW = W - M` per call and per-example
    signs `s` (shape of `x`) and `r` (shape of the output), exactly +-1. Each example sees the
    weight `M + dW * outer(s, r)`, a valid draw from q when q is symmetric about its mean
    (a mean-field Normal is); examples' perturbations are pseudo-independent, which lowers the
    gradient variance below Reparameterization's at the cost of a second matmul.
    """


@register
class DenseLocalReparameterization(LocalReparameterizationEstimator, _DenseBase):
    """Bayesian dense layer, local reparameterization (Kingma et al., 2015).

    For a mean-field q with means M and variances S^2, the pre-activation is exactly
    `N(x @ M, x^2 @ S^2)` given x; it is sampled directly, independently per example. The kernel
    random variable (`layer.kernel`) is the posterior q; no weight matrix is drawn.
    """


def _normal_pdf(x):
    return tf.exp(-0.5 * tf.square(x)) / math.sqrt(2.0 * math.pi)


def _normal_cdf(x):
    return 0.5 * tf.math.erfc(-x / math.sqrt(2.0))


_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(24)


def bivariate_normal_cdf(a, b, rho):
    """`P(Z1 <= a, Z2 <= b)` for standard normals with correlation `rho` (broadcasting).

    Uses `Phi2 = Phi(a) Phi(b) + 1/(2 pi) int_0^{asin rho} exp(-(a^2 - 2ab sin t + b^2) /
    (2 cos^2 t)) dt` (Drezner & Wesolowsky, 1990), whose integrand is smooth and bounded, with
    24-point Gauss-Legendre quadrature (error below 1e-7 for |rho| <= 0.999).
    """
    theta_max = tf.asin(tf.clip_by_value(rho, -0.999, 0.999))
    nodes = tf.constant(0.5 * (_GL_NODES + 1.0), a.dtype)  # on [0, 1]
    weights = tf.constant(0.5 * _GL_WEIGHTS, a.dtype)
    theta = theta_max[..., None] * nodes
    sin_t, cos_t = tf.sin(theta), tf.cos(theta)
    a_, b_ = a[..., None], b[..., None]
    exponent = -(tf.square(a_) - 2.0 * a_ * b_ * sin_t + tf.square(b_)) / (2.0 * tf.square(cos_t))
    integral = theta_max * tf.reduce_sum(weights * tf.exp(exponent), axis=-1)
    return _normal_cdf(a) * _normal_cdf(b) + integral / (2.0 * math.pi)


def relu_moments(mean, covariance):
    """Mean and covariance of `relu(z)` for `z ~ N(mean, covariance)` (last axis = units).

    Exact (Rosenbaum, 1961): with standardized means `a_i = m_i / s_i` and correlations `rho`,
    `E[relu(z_i)] = s_i SR(a_i)`, `SR(a) = phi(a) + a Phi(a)`, and
    `E[relu(z_i) relu(z_j)] = s_i s_j [(a_i a_j + rho) Phi2(a_i, a_j; rho)
        + a_i phi(a_j) Phi((a_i - rho a_j)/r) + a_j phi(a_i) Phi((a_j - rho a_i)/r)
        + r / (2 pi) exp(-(a_i^2 - 2 rho a_i a_j + a_j^2) / (2 r^2))]`, `r = sqrt(1 - rho^2)`.
    Wu et al. (2019) approximate the bivariate term; we evaluate it by quadrature
    (`bivariate_normal_cdf`). Cost O(units^2) per example.
    """
    variance = tf.linalg.diag_part(covariance)
    scale = tf.sqrt(variance + 1e-12)
    a = mean / scale
    pdf_a, cdf_a = _normal_pdf(a), _normal_cdf(a)
    out_mean = scale * (pdf_a + a * cdf_a)
    # Diagonal in closed form: E[relu(z)^2] = s^2 [(a^2 + 1) Phi(a) + a phi(a)].
    second_diag = tf.square(scale) * ((tf.square(a) + 1.0) * cdf_a + a * pdf_a)
    rho = covariance / (scale[..., :, None] * scale[..., None, :])
    rho = tf.clip_by_value(rho, -0.999, 0.999)
    r = tf.sqrt(1.0 - tf.square(rho))
    ai, aj = a[..., :, None], a[..., None, :]
    second = (
        (ai * aj + rho) * bivariate_normal_cdf(ai + 0.0 * aj, aj + 0.0 * ai, rho)
        + ai * _normal_pdf(aj) * _normal_cdf((ai - rho * aj) / r)
        + aj * _normal_pdf(ai) * _normal_cdf((aj - rho * ai) / r)
        + r
        / (2.0 * math.pi)
        * tf.exp(-(tf.square(ai) - 2.0 * rho * ai * aj + tf.square(aj)) / (2.0 * tf.square(r)))
    )
    second = second * scale[..., :, None] * scale[..., None, :]
    second = tf.linalg.set_diag(second, second_diag)
    out_cov = second - out_mean[..., :, None] * out_mean[..., None, :]
    return out_mean, out_cov


def _input_moments(inputs, dtype):
    """Mean and covariance of a tensor (covariance None) or a RandomVariable input."""
    if not isinstance(inputs, RandomVariable):
        return tf.convert_to_tensor(inputs, dtype), None
    distribution = inputs.distribution
    mean = distribution.mean()
    try:
        covariance = distribution.covariance()
    except NotImplementedError:
        covariance = tf.linalg.diag(distribution.variance())
    return mean, covariance


@register
class DenseDVI(_DenseBase):
    """Bayesian dense layer with deterministic variational inference (Wu et al., 2019).

    Propagates the first two moments instead of samples. For inputs with mean m and covariance
    C (a tensor input has C = 0; a `RandomVariable` input, e.g. another `DenseDVI`'s output,
    supplies its own) and a mean-field kernel with means M and variances V:

    * `E[y] = m @ M + E[b]`,
    * `Cov[y] = M^T C M + diag((m^2 + diag C) @ V) + Var[b]`  (exact for independent weights),

    then, for `activation='relu'`, the exact mean and covariance of the rectified Gaussian
    (`relu_moments`). Returns a `RandomVariable` over `MultivariateNormalTriL` with that mean and
    covariance (a little jitter keeps its Cholesky factor defined); losses such as Wu et al.'s
    closed-form expected log-likelihood read `outputs.distribution`. Activations other than
    linear and ReLU raise. Cost O(batch * units^2 * input_dim).
    """

    supports_replicas = False  # moment propagation over one layer's units

    def __init__(self, units, activation=None, **kwargs):
        super().__init__(units, activation=activation, **kwargs)
        name = keras.activations.serialize(self.activation) if self.activation else "linear"
        if isinstance(name, dict):
            name = name.get("config", name.get("class_name"))
        if name not in ("linear", "relu"):
            raise ValueError(
                f"DenseDVI supports activation None/'linear' or 'relu', got "
                f"{activation!r}: other nonlinearities have no moment formulas here."
            )
        self._relu = name == "relu"

    def call(self, inputs):
        self.call_weights()
        in_mean, in_cov = _input_moments(inputs, self.compute_dtype)
        kernel = self.kernel
        if is_fixed(kernel):
            k_mean = tf.convert_to_tensor(kernel)
            k_var = tf.zeros_like(k_mean)
        else:
            k_mean, k_std = kernel_moments(kernel)
            k_var = tf.broadcast_to(tf.square(k_std), kernel.shape)
        mean = dense_matmul(in_mean, k_mean)
        second_in = tf.square(in_mean)
        if in_cov is not None:
            second_in += tf.linalg.diag_part(in_cov)
        diag = dense_matmul(second_in, k_var)
        if self.use_bias:
            bias = self.bias
            if is_fixed(bias):
                mean += tf.convert_to_tensor(bias)
            else:
                b_mean, b_std = kernel_moments(bias)
                mean += b_mean
                diag += tf.broadcast_to(tf.square(b_std), bias.shape)
        if in_cov is not None:
            # M^T C M per example: [..., in, in] x [in, units] -> [..., units, units].
            cov = tf.linalg.matrix_transpose(
                tf.tensordot(
                    tf.linalg.matrix_transpose(tf.tensordot(in_cov, k_mean, [[-1], [0]])),
                    k_mean,
                    [[-1], [0]],
                )
            )
            cov = tf.linalg.set_diag(cov, tf.linalg.diag_part(cov) + diag)
        else:
            cov = tf.linalg.diag(diag)
        if self._relu:
            mean, cov = relu_moments(mean, cov)
        jitter = 1e-6 * tf.reduce_mean(tf.linalg.diag_part(cov), axis=-1, keepdims=True) + 1e-12
        scale_tril = tf.linalg.cholesky(tf.linalg.set_diag(cov, tf.linalg.diag_part(cov) + jitter))
        return rv_lib.MultivariateNormalTriL(loc=mean, scale_tril=scale_tril)
