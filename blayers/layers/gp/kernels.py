"""Kernels and the numerics of every GP layer: TFP `psd_kernels` by name with a trainable
amplitude and ARD length scales (`make_kernel`), their serialization, a kernel instance in
another dtype (`kernel_in_dtype`), and the jittered Cholesky factor (`jittered_cholesky`:
`K + jitter * mean(diag K) * I`, retrying with 10x the jitter, then a clear error).
"""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.constraints import softplus_inverse

tfd = tfp.distributions
psd = tfp.math.psd_kernels

__all__ = [
    "KERNELS",
    "SPECTRAL_DEGREES_OF_FREEDOM",
    "jittered_cholesky",
    "kernel_in_dtype",
    "make_kernel",
]


KERNELS = {
    "exponentiated_quadratic": psd.ExponentiatedQuadratic,
    "matern12": psd.MaternOneHalf,
    "matern32": psd.MaternThreeHalves,
    "matern52": psd.MaternFiveHalves,
}


# Spectral density of each kernel name with unit length scale: Normal (None) for the squared
# exponential; Student-t with 2 nu degrees of freedom for Matern-nu.
SPECTRAL_DEGREES_OF_FREEDOM = {
    "exponentiated_quadratic": None,
    "matern12": 1.0,
    "matern32": 3.0,
    "matern52": 5.0,
}


def float_softplus_inverse(x):
    return float(softplus_inverse(x))


def positive_number(layer_name, argument, value):
    """`float(value)`, or a ValueError naming the layer and the argument."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{layer_name}: {argument} must be a positive number, got {value!r}.")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{layer_name}: {argument} must be positive and finite, got {value!r}.")
    return value


def non_negative_number(layer_name, argument, value):
    """`float(value)` >= 0 and finite, or a ValueError naming the layer and the argument."""
    if value == 0:
        return 0.0
    return positive_number(layer_name, argument, value)


def make_kernel(covariance_fn, amplitude, length_scale):
    """The TFP kernel a GP layer uses, from its `covariance_fn` and its trainable
    hyperparameters (`amplitude` scalar, ARD `length_scale` [d]):

    * a name in `KERNELS` or a `psd.PositiveSemidefiniteKernel` subclass:
      `FeatureScaled(cls(amplitude=amplitude), scale_diag=length_scale)`;
    * a callable `fn(amplitude, length_scale) -> kernel` (e.g. a `RationalQuadratic` with the
      layer's hyperparameters, or a sum of kernels);
    * a kernel instance: used as it is (its hyperparameters are not the layer's and do not
      train).
    """
    if isinstance(covariance_fn, str):
        covariance_fn = KERNELS[covariance_fn]
    if isinstance(covariance_fn, psd.PositiveSemidefiniteKernel):
        return covariance_fn
    if isinstance(covariance_fn, type) and issubclass(
        covariance_fn, psd.PositiveSemidefiniteKernel
    ):
        return psd.FeatureScaled(covariance_fn(amplitude=amplitude), scale_diag=length_scale)
    kernel = covariance_fn(amplitude, length_scale)
    if not isinstance(kernel, psd.PositiveSemidefiniteKernel):
        raise TypeError(
            f"covariance_fn {covariance_fn!r} returned {type(kernel).__name__}, not a TFP "
            "PositiveSemidefiniteKernel."
        )
    return kernel


def check_covariance_fn(layer_name, covariance_fn):
    if isinstance(covariance_fn, str):
        if covariance_fn not in KERNELS:
            raise ValueError(
                f"{layer_name}: unknown covariance_fn {covariance_fn!r}; choose one of "
                f"{sorted(KERNELS)}, a tfp.math.psd_kernels kernel (class or instance), or a "
                "callable fn(amplitude, length_scale) returning one."
            )
    elif not (isinstance(covariance_fn, psd.PositiveSemidefiniteKernel) or callable(covariance_fn)):
        raise TypeError(
            f"{layer_name}: covariance_fn must be a kernel name, a TFP PSD kernel (class or "
            f"instance) or a callable, got {covariance_fn!r}."
        )


def serialize_covariance_fn(covariance_fn):
    if isinstance(covariance_fn, str):
        return covariance_fn
    if isinstance(covariance_fn, type):
        return {"psd_kernel_class": covariance_fn.__name__}
    if isinstance(covariance_fn, psd.PositiveSemidefiniteKernel):
        parameters = {}
        for key, value in covariance_fn.parameters.items():
            if key in ("name", "validate_args") or value is None:
                continue
            if isinstance(value, (psd.PositiveSemidefiniteKernel, tf.Variable)):
                raise NotImplementedError(  # saving nested kernels is not supported; intentional
                    f"Cannot serialize the kernel {covariance_fn.name}: its parameter {key!r} is "
                    "a kernel or a variable. Pass a callable fn(amplitude, length_scale) instead."
                )
            parameters[key] = np.asarray(value).tolist()
        return {"psd_kernel": type(covariance_fn).__name__, "parameters": parameters}
    return keras.saving.serialize_keras_object(covariance_fn)


def deserialize_covariance_fn(config):
    if isinstance(config, dict) and "psd_kernel_class" in config:
        return getattr(psd, config["psd_kernel_class"])
    if isinstance(config, dict) and "psd_kernel" in config:
        return getattr(psd, config["psd_kernel"])(**config["parameters"])
    if isinstance(config, dict):
        return keras.saving.deserialize_keras_object(config)
    return config


@tf.custom_gradient
def _cholesky_from_value(target, value):
    """`value` (the Cholesky factor of `target`, computed already) with Cholesky's gradient
    with respect to `target` (Murray, 2016; TF's `_CholeskyGrad`)."""

    def grad(upstream):
        eye = tf.eye(tf.shape(value)[-1], dtype=value.dtype)
        inverse = tf.linalg.triangular_solve(value, tf.broadcast_to(eye, tf.shape(value)))
        middle = tf.matmul(value, upstream, adjoint_a=True)
        middle = tf.linalg.set_diag(middle, 0.5 * tf.linalg.diag_part(middle))
        middle = tf.linalg.band_part(middle, -1, 0)
        grad_target = tf.matmul(tf.matmul(inverse, middle, adjoint_a=True), inverse)
        grad_target = 0.5 * (grad_target + tf.linalg.adjoint(grad_target))
        return grad_target, tf.zeros_like(value)

    return tf.identity(value), grad


def kernel_in_dtype(kernel, dtype):
    """A TFP kernel instance with its floating parameters in `dtype` (a float32 kernel under
    `cholesky_dtype='float64'`); nested kernels (sums, products, feature transforms) too. The
    kernel itself when it already is, or has no dtype."""
    dtype = tf.as_dtype(dtype)
    if kernel.dtype is None or tf.as_dtype(kernel.dtype) == dtype:
        return kernel

    def convert(value):
        if isinstance(value, psd.PositiveSemidefiniteKernel):
            return kernel_in_dtype(value, dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(convert(v) for v in value)
        if (tf.is_tensor(value) or isinstance(value, (float, np.ndarray, np.floating))) and (
            tf.as_dtype(getattr(value, "dtype", tf.float32)).is_floating
        ):
            return tf.cast(value, dtype)
        return value

    parameters = {k: convert(v) for k, v in kernel.parameters.items()}
    try:
        return type(kernel)(**parameters)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"The kernel {kernel.name} ({kernel.dtype.name}) could not be rebuilt in "
            f"{dtype.name} for cholesky_dtype ({error}); make it in {dtype.name}, or leave "
            "cholesky_dtype unset."
        ) from None


def jittered_cholesky(matrix, jitter=1e-6, max_tries=4, name="kernel matrix", level=None):
    """Cholesky factor of `matrix + j * mean(diag) * I` for `j = jitter, 10 jitter, ...`.

    Tries the next jitter while the factor has non-finite entries (TF returns NaN for matrices
    that are not positive definite), and raises `InvalidArgumentError` naming `name` when all
    `max_tries` fail. Works eagerly and inside `tf.function`; gradients flow through the one
    successful factorization only.

    Every failed try makes TensorFlow's Cholesky kernel log a warning. `level`, an integer
    variable (the GP layers keep one, saved with their checkpoints), makes the jitter sticky:
    tries start at the jitter that worked last and the variable keeps the largest used, so a
    matrix that needs more jitter than `jitter` warns once per run, not once per step.
    """
    matrix = tf.convert_to_tensor(matrix)
    size = tf.shape(matrix)[-1]
    eye = tf.eye(size, dtype=matrix.dtype)

    def attempt(i, target):
        # The jitter scales with the (differentiable) mean diagonal: it is part of the objective,
        # so a gradient that ignored it would be biased (two GPs whose amplitudes drift apart
        # pay for the mismatch of their jitters in log p(f) - log q(f)).
        scale = tf.reduce_mean(tf.linalg.diag_part(target), axis=-1)[..., None, None]
        factor = jitter * tf.pow(tf.constant(10.0, matrix.dtype), tf.cast(i, matrix.dtype))
        return tf.linalg.cholesky(target + factor * scale * eye)

    def failed(chol):
        return tf.logical_not(tf.reduce_all(tf.math.is_finite(chol)))

    # Find the smallest working jitter without gradients (a failed factor is NaN, and NaN * 0
    # would poison the backward pass); the successful factor is the result, and its gradient
    # with respect to the jittered matrix is Cholesky's (one factorization, not two).
    frozen = tf.stop_gradient(matrix)
    first = tf.constant(0)
    if level is not None:
        first = tf.minimum(tf.cast(level, tf.int32), max_tries - 1)
    tries, value = tf.while_loop(
        lambda i, chol: tf.logical_and(i < max_tries - 1, failed(chol)),
        lambda i, chol: (i + 1, attempt(i + 1, frozen)),
        (first, attempt(first, frozen)),
    )
    if level is not None:
        level.assign(tf.cast(tf.maximum(tries, first), level.dtype))
    scale = tf.reduce_mean(tf.linalg.diag_part(matrix), axis=-1)[..., None, None]
    factor = jitter * tf.pow(tf.constant(10.0, matrix.dtype), tf.cast(tries, matrix.dtype))
    chol = _cholesky_from_value(matrix + factor * scale * eye, value)
    message = (
        f"Cholesky factorization of the {name} failed even with jitter "
        f"{jitter * 10 ** (max_tries - 1):g} x mean(diag): the matrix is not positive "
        "definite (non-finite inputs? try cholesky_dtype='float64', a larger jitter or "
        "larger length scales)."
    )
    with tf.control_dependencies([tf.debugging.Assert(tf.logical_not(failed(chol)), [message])]):
        return tf.identity(chol)
