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
"""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import distributions as rv_lib
from blayers import initializers as initializers_lib
from blayers.constraints import softplus_inverse
from blayers.layers.base import AddsKL, NamedOutput, NestedLayers, SeededLayer, register
from blayers.layers.dense import DenseReparameterization
from blayers.random_variable import RandomVariable

tfd = tfp.distributions
psd = tfp.math.psd_kernels

__all__ = [
    "KERNELS",
    "GaussianLikelihood",
    "GaussianProcess",
    "RandomFeatureGaussianProcess",
    "RandomFourierFeatures",
    "SparseGaussianProcess",
    "jittered_cholesky",
    "make_kernel",
    "mean_field_logits",
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


def _softplus_inverse(x):
    return float(softplus_inverse(x))


def _positive(layer_name, argument, value):
    """`float(value)`, or a ValueError naming the layer and the argument."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{layer_name}: {argument} must be a positive number, got {value!r}.")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{layer_name}: {argument} must be positive and finite, got {value!r}.")
    return value


def _non_negative(layer_name, argument, value):
    """`float(value)` >= 0 and finite, or a ValueError naming the layer and the argument."""
    if value == 0:
        return 0.0
    return _positive(layer_name, argument, value)


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


def _check_covariance_fn(layer_name, covariance_fn):
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


def _serialize_covariance_fn(covariance_fn):
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


def _deserialize_covariance_fn(config):
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


class _GPBase(NamedOutput, SeededLayer):
    """Kernel and mean-function variables, shared by the GP layers."""

    def __init__(
        self,
        units,
        mean_fn="zero",
        covariance_fn="exponentiated_quadratic",
        amplitude=1.0,
        length_scale=1.0,
        jitter=1e-6,
        max_jitter_tries=4,
        cholesky_dtype=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"{type(self).__name__} ({self.name})"
        if not isinstance(units, (int, np.integer)) or isinstance(units, bool) or units <= 0:
            raise ValueError(f"{name} needs a positive integer `units`, got {units!r}.")
        covariance_fn = _deserialize_covariance_fn(covariance_fn)
        _check_covariance_fn(name, covariance_fn)
        if mean_fn not in ("zero", "constant", "linear"):
            raise ValueError(
                f"{name}: mean_fn must be 'zero', 'constant' or 'linear', got {mean_fn!r}."
            )
        self.units, self.mean_fn, self.covariance_fn = int(units), mean_fn, covariance_fn
        self.amplitude_init = _positive(name, "amplitude", amplitude)
        self.length_scale_init = _positive(name, "length_scale", length_scale)
        self.jitter = _positive(name, "jitter", jitter)
        if not isinstance(max_jitter_tries, (int, np.integer)) or max_jitter_tries < 1:
            raise ValueError(f"{name}: max_jitter_tries must be >= 1, got {max_jitter_tries!r}.")
        self.max_jitter_tries = int(max_jitter_tries)
        self.input_dim = None
        self.cholesky_dtype = cholesky_dtype

    def _build_kernel_and_mean(self, input_dim):
        if input_dim is None:
            raise ValueError(
                f"{type(self).__name__} ({self.name}) needs a known number of input features."
            )
        self.input_dim = int(input_dim)
        # The jitter that worked last (`jittered_cholesky`'s sticky `level`), saved with the
        # layer so that a resumed run factorizes exactly as the uninterrupted one.
        self.jitter_level = self.add_weight(
            name="jitter_level",
            shape=(),
            dtype="int64",
            initializer="zeros",
            trainable=False,
            aggregation="only_first_replica",
        )
        constant = keras.initializers.Constant
        if not self.fixed_kernel:  # a kernel instance keeps its own hyperparameters
            self.raw_amplitude = self.add_weight(
                name="amplitude",
                shape=(),
                initializer=constant(_softplus_inverse(self.amplitude_init)),
            )
            self.raw_length_scale = self.add_weight(
                name="length_scale",
                shape=(input_dim,),
                initializer=constant(_softplus_inverse(self.length_scale_init)),
            )
        if self.mean_fn == "constant":
            self.mean_bias = self.add_weight(
                name="mean_bias", shape=(self.units,), initializer="zeros"
            )
        elif self.mean_fn == "linear":
            eye = np.eye(input_dim, self.units, dtype="float32")
            self.mean_kernel = self.add_weight(
                name="mean_kernel", shape=(input_dim, self.units), initializer=constant(eye)
            )
            self.mean_bias = self.add_weight(
                name="mean_bias", shape=(self.units,), initializer="zeros"
            )

    @property
    def fixed_kernel(self):
        """True when `covariance_fn` is a kernel instance: the layer then has no amplitude or
        length-scale weights (nothing would train them)."""
        return isinstance(self.covariance_fn, psd.PositiveSemidefiniteKernel)

    def kernel(self, dtype=None):
        """The layer's current TFP kernel (`make_kernel` of `covariance_fn` and the trainable
        amplitude and ARD length scales; a kernel instance as it is)."""
        if self.fixed_kernel:
            return kernel_in_dtype(self.covariance_fn, dtype or self.compute_dtype)
        dtype = dtype or self.compute_dtype
        amplitude = tf.cast(tf.nn.softplus(self.raw_amplitude), dtype)
        length_scale = tf.cast(tf.nn.softplus(self.raw_length_scale), dtype)
        return make_kernel(self.covariance_fn, amplitude, length_scale)

    def covariance(self, kernel, a, b=None):
        """`k(a, b)` (`[n, m]`), or with `b=None` the diagonal `k(a_i, a_i)` (`[n]`). In float64
        the default exponentiated quadratic takes GPflow's route, one matmul for the squared
        distances (`|a|^2 + |b|^2 - 2 a b^T`, clipped at 0), faster than TFP's broadcast
        differences; in float32 that cancellation would cost near-diagonal accuracy, so float32
        and other kernels go through TFP."""
        if self.covariance_fn != "exponentiated_quadratic" or a.dtype != tf.float64:
            return kernel.matrix(a, b) if b is not None else kernel.apply(a, a, example_ndims=1)
        amplitude = tf.cast(tf.nn.softplus(self.raw_amplitude), a.dtype)
        if b is None:
            return tf.fill(tf.shape(a)[:1], tf.square(amplitude))
        length_scale = tf.cast(tf.nn.softplus(self.raw_length_scale), a.dtype)
        a, b = a / length_scale, b / length_scale
        squared = (
            tf.reduce_sum(tf.square(a), -1)[:, None]
            + tf.reduce_sum(tf.square(b), -1)[None, :]
            - 2.0 * tf.matmul(a, b, transpose_b=True)
        )
        return tf.square(amplitude) * tf.exp(-0.5 * tf.maximum(squared, 0.0))

    def mean(self, x):
        """The prior mean `m(x)`, `[batch, units]`."""
        if self.mean_fn == "zero":
            return tf.zeros(tf.concat([tf.shape(x)[:-1], [self.units]], 0), x.dtype)
        if self.mean_fn == "constant":
            return tf.zeros(tf.concat([tf.shape(x)[:-1], [self.units]], 0), x.dtype) + tf.cast(
                self.mean_bias, x.dtype
            )
        return tf.matmul(x, tf.cast(self.mean_kernel, x.dtype)) + tf.cast(self.mean_bias, x.dtype)

    def _linalg_dtype(self):
        return tf.as_dtype(self.cholesky_dtype or self.compute_dtype)

    def _cholesky(self, matrix, what):
        return jittered_cholesky(
            matrix,
            self.jitter,
            self.max_jitter_tries,
            f"{what} of layer '{self.name}'",
            level=self.jitter_level,
        )

    def _inputs(self, inputs, argument="inputs"):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        if x.shape.rank != 2:
            raise ValueError(
                f"{type(self).__name__} ({self.name}) takes {argument} of shape "
                f"[batch, features], got {x.shape}."
            )
        if self.input_dim is not None and x.shape[-1] not in (None, self.input_dim):
            raise ValueError(
                f"{type(self).__name__} ({self.name}) was built for {self.input_dim} input "
                f"features; {argument} have {x.shape[-1]} (shape {x.shape})."
            )
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "mean_fn": self.mean_fn,
            "covariance_fn": _serialize_covariance_fn(self.covariance_fn),
            "amplitude": self.amplitude_init,
            "length_scale": self.length_scale_init,
            "jitter": self.jitter,
            "max_jitter_tries": self.max_jitter_tries,
            "cholesky_dtype": self.cholesky_dtype,
        }


@register
class GaussianProcess(_GPBase):
    """Exact GP layer: `f ~ GP(m, k)` at the batch inputs, optionally conditioned on data.

    With `conditional_inputs` X `[N, d]` and `conditional_outputs` Y `[N, units]` observed with
    Gaussian noise (trainable `observation_noise_variance`), the output is the exact posterior
    `N(m(x) + K_xX (K_XX + s^2 I)^{-1} (Y - m(X)), K_xx - K_xX (K_XX + s^2 I)^{-1} K_Xx)`.
    The output is a `RandomVariable` over a `MatrixNormalLinearOperator` (event `[batch, units]`:
    rows share the covariance, units are independent).

    Args:
      units: independent output functions.
      mean_fn: `'zero'`, `'constant'` (trainable per unit) or `'linear'` (trainable, identity
        start).
      covariance_fn: a kernel name (`'exponentiated_quadratic'`, `'matern12'`, `'matern32'`,
        `'matern52'`) or a `tfp.math.psd_kernels` class, both with a trainable amplitude and
        ARD length scales; a callable `fn(amplitude, length_scale) -> kernel` built from those
        trainable hyperparameters; or a kernel instance, used as it is, with no amplitude or
        length-scale weights of the layer (see `make_kernel`).
      conditional_inputs: observed inputs X `[N, d]` (or None for the prior).
      conditional_outputs: observed outputs Y `[N, units]`, one row per row of X.
      observation_noise_variance: initial noise variance `s^2` of the observations.
      amplitude, length_scale: initial kernel hyperparameters (positive).
      jitter, max_jitter_tries, cholesky_dtype: the jittered Cholesky (`jittered_cholesky`).
      seed: seeds the output's draws.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        units,
        mean_fn="zero",
        covariance_fn="exponentiated_quadratic",
        conditional_inputs=None,
        conditional_outputs=None,
        observation_noise_variance=0.1,
        **kwargs,
    ):
        super().__init__(units, mean_fn=mean_fn, covariance_fn=covariance_fn, **kwargs)
        name = f"GaussianProcess ({self.name})"
        if (conditional_inputs is None) != (conditional_outputs is None):
            raise ValueError(
                f"{name} needs both conditional_inputs and conditional_outputs, or neither."
            )
        self.conditional_inputs = None
        self.conditional_outputs = None
        if conditional_inputs is not None:
            inputs = np.asarray(conditional_inputs, "float32")
            if inputs.ndim != 2:
                raise ValueError(
                    f"{name}: conditional_inputs must be [num_points, features], got shape "
                    f"{inputs.shape}."
                )
            outputs = np.asarray(conditional_outputs, "float32")
            outputs = outputs.reshape(len(outputs), -1) if outputs.ndim else outputs
            if outputs.ndim != 2 or len(outputs) != len(inputs):
                raise ValueError(
                    f"{name}: conditional_inputs have {len(inputs)} rows but "
                    f"conditional_outputs have shape {np.shape(conditional_outputs)}; they must "
                    "have one row per point."
                )
            if outputs.shape[1] != units:
                raise ValueError(
                    f"{name}: conditional_outputs have {outputs.shape[1]} columns, units={units}."
                )
            self.conditional_inputs, self.conditional_outputs = inputs, outputs
        self.noise_init = _positive(name, "observation_noise_variance", observation_noise_variance)

    def build(self, input_shape):
        if (
            self.conditional_inputs is not None
            and input_shape[-1] is not None
            and self.conditional_inputs.shape[1] != input_shape[-1]
        ):
            raise ValueError(
                f"GaussianProcess ({self.name}): inputs have {input_shape[-1]} features but "
                f"conditional_inputs have {self.conditional_inputs.shape[1]}."
            )
        self._build_kernel_and_mean(input_shape[-1])
        self.raw_noise_variance = self.add_weight(
            name="observation_noise_variance",
            shape=(),
            initializer=keras.initializers.Constant(_softplus_inverse(self.noise_init)),
            trainable=self.conditional_inputs is not None,  # a prior has no observations
        )

    @property
    def observation_noise_variance(self):
        return tf.nn.softplus(self.raw_noise_variance)

    def call(self, inputs):
        x = self._inputs(inputs)
        dtype = self._linalg_dtype()
        kernel = self.kernel(dtype)
        xd = tf.cast(x, dtype)
        mean = tf.cast(self.mean(x), dtype)
        k_xx = kernel.matrix(xd, xd)
        if self.conditional_inputs is not None:
            data_x = tf.constant(self.conditional_inputs, dtype)
            data_y = tf.constant(self.conditional_outputs, dtype)
            noise = tf.cast(self.observation_noise_variance, dtype)
            k_data = kernel.matrix(data_x, data_x) + noise * tf.eye(
                tf.shape(data_x)[0], dtype=dtype
            )
            chol_data = self._cholesky(k_data, "training covariance")
            solved = tf.linalg.triangular_solve(chol_data, kernel.matrix(data_x, xd))
            residual = data_y - tf.cast(self.mean(tf.cast(data_x, x.dtype)), dtype)
            mean = mean + tf.matmul(
                solved, tf.linalg.triangular_solve(chol_data, residual), transpose_a=True
            )
            k_xx = k_xx - tf.matmul(solved, solved, transpose_a=True)
        chol = self._cholesky(
            k_xx,
            "posterior covariance" if self.conditional_inputs is not None else "prior covariance",
        )
        out_dtype = self.compute_dtype
        return rv_lib.MatrixNormalLinearOperator(
            loc=tf.cast(mean, out_dtype),
            scale_row=tf.linalg.LinearOperatorLowerTriangular(tf.cast(chol, out_dtype)),
            scale_column=tf.linalg.LinearOperatorIdentity(self.units, dtype=out_dtype),
            seed=self.next_seed(),
            name=self.output_name,
        )

    def get_config(self):
        config = {**super().get_config(), "observation_noise_variance": self.noise_init}
        if self.conditional_inputs is not None:
            config["conditional_inputs"] = self.conditional_inputs.tolist()
            config["conditional_outputs"] = self.conditional_outputs.tolist()
        return config


@register
class SparseGaussianProcess(AddsKL, _GPBase):
    """Sparse variational GP layer (Hensman et al., 2013) for scalable and deep GPs.

    Inducing inputs `Z` `[num_inducing, d]` (trainable) and, per output unit, `q(v) = N(m, L L^T)`
    over whitened inducing outputs `v = L_Z^{-1} u` (`whiten=True`, prior `N(0, I)`) or over `u`
    itself (`whiten=False`, prior `N(0, K_ZZ)`). With `A = L_Z^{-1} K_Zx` the marginals are

    `mu(x) = m(x) + A^T m`, `sigma^2(x) = k(x, x) - ||A_x||^2 + ||L^T A_x||^2` (whitened),

    and `KL[q || p]` (analytic, TFP) is added to `layer.losses` on every call.

    Args:
      units: independent output functions.
      num_inducing: number of inducing points M (a positive integer).
      mean_fn: `'zero'`, `'constant'` or `'linear'` (inner layers of a deep GP).
      covariance_fn: a kernel name, a `tfp.math.psd_kernels` class or instance, or a callable
        `fn(amplitude, length_scale) -> kernel` (as `GaussianProcess`).
      whiten: parameterize `q` over whitened inducing outputs.
      variational: `'full'` (Cholesky `L`) or `'mean_field'` (diagonal `L`).
      initial_variational_scale: initial diagonal of `L` (small values start inner layers of a
        deep GP near deterministic, as Salimbeni & Deisenroth).
      inducing_inputs_initializer: Keras initializer of `Z` (e.g. a `Constant` of data points),
        or `'kmeans'`: k-means centres of the layer's inputs in its first training call (a
        data-dependent initialization, as Salimbeni & Deisenroth's `kmeans2`; with a deep GP
        each layer clusters what reaches it).
      full_covariance: False returns the marginals `N(mu(x), sigma^2(x))` (independent across
        the batch); True returns the joint `q(f(X))` over the batch, per unit
        `N(mu, K_XX - A^T A + A_u^T L L^T A_u)` (a `MultivariateNormalTriL` per unit, transposed
        to `[batch, units]`), the variable a posterior program hands to a model's exact
        `GaussianProcess` (`blayers.programs`, the Cox process).
      add_kl_loss: add `scale_factor * KL[q(u) || p(u)]` to `layer.losses` on every call (the
        Keras-model ELBO). A posterior program sets False: there `log p(f) - log q(f)` carries
        the KL.
      scale_factor: multiplies the KL in `layer.losses` (default 1; `1 / N` gives the
        per-example ELBO's KL term in `model.fit`, which `blayers.set_kl_scale` sets, as it
        does for every weight's KL regularizer).
      output_name: name of the returned random variable (default: the layer's name).
      **kwargs: `GaussianProcess`'s kernel arguments (`amplitude`, `length_scale`, `jitter`,
        `cholesky_dtype`, `seed`) and `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        units,
        num_inducing=100,
        mean_fn="zero",
        covariance_fn="exponentiated_quadratic",
        whiten=True,
        variational="full",
        initial_variational_scale=1e-2,
        inducing_inputs_initializer="random_normal",
        full_covariance=False,
        add_kl_loss=True,
        scale_factor=1.0,
        **kwargs,
    ):
        super().__init__(units, mean_fn=mean_fn, covariance_fn=covariance_fn, **kwargs)
        self.full_covariance, self.add_kl_loss = bool(full_covariance), bool(add_kl_loss)
        name = f"SparseGaussianProcess ({self.name})"
        self.scale_factor = _non_negative(name, "scale_factor", scale_factor)
        if variational not in ("full", "mean_field"):
            raise ValueError(
                f"SparseGaussianProcess: variational must be 'full' or "
                f"'mean_field', got {variational!r}."
            )
        name = f"SparseGaussianProcess ({self.name})"
        if (
            not isinstance(num_inducing, (int, np.integer))
            or isinstance(num_inducing, bool)
            or num_inducing < 1
        ):
            raise ValueError(
                f"{name}: num_inducing must be a positive integer, got {num_inducing!r}."
            )
        self.num_inducing, self.whiten = int(num_inducing), bool(whiten)
        self.variational = variational
        self.initial_variational_scale = _positive(
            name, "initial_variational_scale", initial_variational_scale
        )
        self.kmeans = inducing_inputs_initializer == "kmeans"
        self.inducing_inputs_initializer = keras.initializers.get(
            "random_normal" if self.kmeans else inducing_inputs_initializer
        )

    def build(self, input_shape):
        m = self.num_inducing
        self._build_kernel_and_mean(input_shape[-1])
        self.inducing_inputs = self.add_weight(
            name="inducing_inputs",
            shape=(m, input_shape[-1]),
            initializer=self.inducing_inputs_initializer,
        )
        if self.kmeans:  # set once, from the first training batch; saved with the layer
            self.kmeans_done = self.add_weight(
                name="kmeans_done", shape=(), initializer="zeros", trainable=False
            )
        self.variational_mean = self.add_weight(
            name="variational_mean", shape=(self.units, m), initializer="zeros"
        )
        raw_diag = _softplus_inverse(self.initial_variational_scale)
        if self.variational == "full":
            init = np.zeros((self.units, m, m), "float32")
            init[:, np.arange(m), np.arange(m)] = raw_diag
            self.variational_scale = self.add_weight(
                name="variational_scale",
                shape=(self.units, m, m),
                initializer=keras.initializers.Constant(init),
            )
        else:
            self.variational_scale = self.add_weight(
                name="variational_scale",
                shape=(self.units, m),
                initializer=keras.initializers.Constant(raw_diag),
            )

    def variational_scale_tril(self, dtype=None):
        """`L` of `q`: lower-triangular `[units, M, M]` with a softplus-positive diagonal."""
        raw = tf.cast(self.variational_scale, dtype or self.compute_dtype)
        if self.variational == "mean_field":
            return tf.linalg.diag(tf.nn.softplus(raw))
        lower = tf.linalg.band_part(raw, -1, 0)
        return tf.linalg.set_diag(lower, tf.nn.softplus(tf.linalg.diag_part(raw)))

    def kl_divergence(self, chol_zz=None):
        """`sum_units KL[q(u) || p(u)]`; whitened, in closed form in O(M^2):
        `1/2 (||L||_F^2 + ||m||^2 - M) - sum log diag L` per unit."""
        dtype = self._linalg_dtype()
        scale = self.variational_scale_tril(dtype)
        mean = tf.cast(self.variational_mean, dtype)
        if self.whiten:
            m = float(self.num_inducing)
            return 0.5 * (
                tf.reduce_sum(tf.square(scale)) + tf.reduce_sum(tf.square(mean)) - m * self.units
            ) - tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(scale))))
        q = tfd.MultivariateNormalTriL(mean, scale)
        if chol_zz is None:
            z = tf.cast(self.inducing_inputs, dtype)
            chol_zz = self._cholesky(
                self.covariance(self.kernel(dtype), z, z), "inducing covariance"
            )
        prior = tfd.MultivariateNormalTriL(tf.zeros([self.num_inducing], dtype), chol_zz)
        return tf.reduce_sum(tfd.kl_divergence(q, prior))

    def predict_marginals(self, inputs):
        """`(mu, sigma^2)` of `q(f(x))`, each `[batch, units]`, and the KL."""
        mean, prior_var, explained, kl = self._predict(inputs, full_covariance=False)
        variance = prior_var[:, None] + tf.transpose(explained)
        out = self.compute_dtype
        return tf.cast(mean, out), tf.cast(tf.maximum(variance, 1e-12), out), tf.cast(kl, out)

    def predict_joint(self, inputs):
        """`(mu [batch, units], L [units, batch, batch], KL)`: the mean and the jittered
        Cholesky factor of each unit's joint covariance of `q(f(X))` over the batch."""
        mean, prior_cov, explained, kl = self._predict(inputs, full_covariance=True)
        chol = self._cholesky(prior_cov[None] + explained, "joint posterior covariance")
        out = self.compute_dtype
        return tf.cast(mean, out), tf.cast(chol, out), tf.cast(kl, out)

    def _predict(self, inputs, full_covariance):
        x = self._inputs(inputs)
        dtype = self._linalg_dtype()
        kernel = self.kernel(dtype)
        xd, z = tf.cast(x, dtype), tf.cast(self.inducing_inputs, dtype)
        chol_zz = self._cholesky(self.covariance(kernel, z, z), "inducing covariance")
        a = tf.linalg.triangular_solve(chol_zz, self.covariance(kernel, z, xd))  # [M, B]
        if not self.whiten:  # project through K_ZZ^{-1} K_Zx
            a_u = tf.linalg.triangular_solve(chol_zz, a, adjoint=True)
        else:
            a_u = a
        q_mean = tf.cast(self.variational_mean, dtype)  # [units, M]
        scale = self.variational_scale_tril(dtype)  # [units, M, M]
        mean = tf.cast(self.mean(x), dtype) + tf.transpose(tf.matmul(q_mean, a_u))
        projected = tf.matmul(scale, a_u[None], transpose_a=True)  # L^T A_u, [units, M, B]
        kl = self.kl_divergence(chol_zz)
        if full_covariance:  # K_XX - A^T A and A_u^T L L^T A_u
            prior = self.covariance(kernel, xd, xd) - tf.matmul(a, a, transpose_a=True)
            return mean, prior, tf.matmul(projected, projected, transpose_a=True), kl
        prior_var = self.covariance(kernel, xd) - tf.reduce_sum(tf.square(a), 0)
        return mean, prior_var, tf.reduce_sum(tf.square(projected), 1), kl

    def kmeans_inducing_inputs(self, inputs, iterations=10):
        """`M` k-means centres of `inputs` (Lloyd's algorithm from `M` distinct random rows, as
        `scipy.cluster.vq.kmeans2(x, M, minit='points')` in Salimbeni & Deisenroth's code); with
        fewer rows than `M`, the rows and then the current inducing inputs."""
        x = tf.convert_to_tensor(inputs, self.inducing_inputs.dtype)
        m = self.num_inducing
        rows = tf.random.experimental.stateless_shuffle(x, self.next_seed())
        current = tf.convert_to_tensor(self.inducing_inputs)
        centres = tf.concat([rows, current], 0)[:m]
        if x.shape[0] is not None and x.shape[0] < m:
            return centres
        for _ in range(iterations):
            distances = tf.reduce_sum(tf.square(x[:, None, :] - centres[None]), -1)
            assignment = tf.argmin(distances, axis=1, output_type=tf.int32)
            sums = tf.math.unsorted_segment_sum(x, assignment, m)
            counts = tf.math.unsorted_segment_sum(tf.ones_like(x[:, :1]), assignment, m)
            # An empty cluster keeps its centre.
            centres = tf.where(counts > 0, sums / tf.maximum(counts, 1.0), centres)
        return centres

    def _initialize_by_kmeans(self, inputs):
        def run():
            self.inducing_inputs.assign(self.kmeans_inducing_inputs(inputs))
            self.kmeans_done.assign(1.0)
            return tf.constant(True)

        tf.cond(self.kmeans_done > 0, lambda: tf.constant(False), run)

    def call(self, inputs, training=None):
        if self.kmeans and training:
            # A random-variable input (a deep GP's inner layer) is drawn here, outside the cond.
            self._initialize_by_kmeans(tf.convert_to_tensor(inputs, self.compute_dtype))
        if not self.full_covariance:
            mean, variance, kl = self.predict_marginals(inputs)
            if self.add_kl_loss:
                self.add_loss(tf.cast(self.scale_factor, kl.dtype) * kl)
            return rv_lib.Normal(
                loc=mean, scale=tf.sqrt(variance), seed=self.next_seed(), name=self.output_name
            )
        mean, chol, kl = self.predict_joint(inputs)
        if self.add_kl_loss:
            self.add_loss(tf.cast(self.scale_factor, kl.dtype) * kl)
        per_unit = tfd.MultivariateNormalTriL(loc=tf.transpose(mean), scale_tril=chol)
        return rv_lib.TransformedDistribution(
            distribution=tfd.Independent(per_unit, reinterpreted_batch_ndims=1),
            bijector=tfp.bijectors.Transpose(perm=[1, 0]),
            seed=self.next_seed(),
            name=self.output_name,
        )

    def get_config(self):
        return {
            **super().get_config(),
            "num_inducing": self.num_inducing,
            "whiten": self.whiten,
            "variational": self.variational,
            "initial_variational_scale": self.initial_variational_scale,
            "inducing_inputs_initializer": "kmeans"
            if self.kmeans
            else keras.initializers.serialize(self.inducing_inputs_initializer),
            "full_covariance": self.full_covariance,
            "add_kl_loss": self.add_kl_loss,
            "scale_factor": self.scale_factor,
        }


@register
class RandomFourierFeatures(NestedLayers, SeededLayer):
    """Random-feature GP approximation (Rahimi & Recht, 2007; Cutajar et al., 2017).

    `phi(x) = amplitude * sqrt(2 / D) cos(x / length_scale @ Omega + b)` with fixed frequencies
    `Omega` `[d, D]` drawn from the kernel's spectral density (Bochner's theorem) and
    `b ~ U(0, 2 pi)`, so `phi(x)^T phi(y)` approximates the stationary kernel `k(x - y)` with
    error O(1 / sqrt(D)); `f(x) = phi(x)^T w` with a Bayesian output layer (`output_layer`,
    default `DenseReparameterization` without bias) whose KL regularizes `w` toward `N(0, I)`,
    making `f` approximately `GP(0, k)` a priori.

    Args:
      units: output functions.
      num_features: random features D.
      covariance_fn: `'exponentiated_quadratic'` (`Omega ~ N(0, I)`), `'matern12'`,
        `'matern32'`, `'matern52'` (Matern-nu: multivariate Student-t with `2 nu` degrees of
        freedom), or a callable `fn(rng, shape) -> frequencies` sampling the spectral density
        of another stationary kernel with unit length scale (`rng`: a NumPy `RandomState`).
      amplitude: the kernel's amplitude (fixed).
      length_scale: initial ARD length scale (trainable unless `trainable_length_scale=False`).
      output_layer: the Bayesian linear layer on the features.
      seed: seeds the frequencies and phases.
    """

    nested_layer_args = ("output_layer",)

    def __init__(
        self,
        units,
        num_features=1024,
        covariance_fn="exponentiated_quadratic",
        amplitude=1.0,
        length_scale=1.0,
        trainable_length_scale=True,
        output_layer=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"RandomFourierFeatures ({self.name})"
        for argument, value in (("units", units), ("num_features", num_features)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: {argument} must be a positive integer, got {value!r}.")
        if isinstance(covariance_fn, dict):
            covariance_fn = keras.saving.deserialize_keras_object(covariance_fn)
        if not (callable(covariance_fn) or covariance_fn in SPECTRAL_DEGREES_OF_FREEDOM):
            raise ValueError(
                f"{name}: covariance_fn must be one of {sorted(SPECTRAL_DEGREES_OF_FREEDOM)} or a "
                f"callable sampling a spectral density, got {covariance_fn!r}."
            )
        self.covariance_fn = covariance_fn
        self.units, self.num_features = int(units), int(num_features)
        self.amplitude_init = _positive(name, "amplitude", amplitude)
        self.length_scale_init = _positive(name, "length_scale", length_scale)
        self.trainable_length_scale = trainable_length_scale
        self.output_layer = output_layer or DenseReparameterization(
            units, use_bias=False, kernel_initializer="trainable_normal"
        )

    def build(self, input_shape):
        d = input_shape[-1]
        rng = np.random.RandomState(
            self.seed if self.seed is not None else np.random.randint(2**31 - 1)
        )
        constant = keras.initializers.Constant
        self.projection = self.add_weight(
            name="projection",
            shape=(d, self.num_features),
            trainable=False,
            initializer=constant(self._frequencies(rng, (d, self.num_features))),
        )
        self.phase = self.add_weight(
            name="phase",
            shape=(self.num_features,),
            trainable=False,
            initializer=constant(rng.uniform(0, 2 * np.pi, self.num_features).astype("float32")),
        )
        self.raw_length_scale = self.add_weight(
            name="length_scale",
            shape=(d,),
            trainable=self.trainable_length_scale,
            initializer=constant(_softplus_inverse(self.length_scale_init)),
        )
        if not self.output_layer.built:
            self.output_layer.build((None, self.num_features))

    def _frequencies(self, rng, shape):
        """Draws `Omega` from the spectral density of the unit-length-scale kernel."""
        if callable(self.covariance_fn):
            return np.asarray(self.covariance_fn(rng, shape), "float32").reshape(shape)
        normal = rng.randn(*shape)
        dof = SPECTRAL_DEGREES_OF_FREEDOM[self.covariance_fn]
        if dof is None:
            return normal.astype("float32")
        # Multivariate Student-t: one chi-square draw per feature (column) scales its vector.
        chi2 = rng.chisquare(dof, size=(1, shape[1]))
        return (normal * np.sqrt(dof / chi2)).astype("float32")

    def feature_map(self, inputs):
        """`phi(x)`, `[batch, num_features]`."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype) / tf.nn.softplus(self.raw_length_scale)
        scale = self.amplitude_init * math.sqrt(2.0 / self.num_features)
        return scale * tf.cos(tf.matmul(x, self.projection) + self.phase)

    def call(self, inputs):
        return self.output_layer(self.feature_map(inputs))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "num_features": self.num_features,
            "covariance_fn": (
                self.covariance_fn
                if isinstance(self.covariance_fn, str)
                else keras.saving.serialize_keras_object(self.covariance_fn)
            ),
            "amplitude": self.amplitude_init,
            "length_scale": self.length_scale_init,
            "trainable_length_scale": self.trainable_length_scale,
            **self._nested_config(),
        }


@register
class GaussianLikelihood(NamedOutput, keras.layers.Layer):
    """`y ~ N(f, sigma^2)` with a trainable `sigma^2` (softplus, initial `noise_variance`).

    Takes function values (a tensor, or a GP layer's `RandomVariable`, whose value is a
    reparameterized draw) and returns a `RandomVariable` over `y`: `-log_prob(y)` is a one-sample
    estimate of the ELBO's expected log-likelihood, and Monte Carlo passes average into the
    predictive mixture. `variational_expectation(f, y)` is the same term in closed form.

    Args:
      noise_variance: initial `sigma^2` (positive).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, noise_variance=0.1, **kwargs):
        super().__init__(**kwargs)
        self.noise_variance_init = float(noise_variance)

    def build(self, input_shape):
        self.raw_noise_variance = self.add_weight(
            name="noise_variance",
            shape=(),
            initializer=keras.initializers.Constant(_softplus_inverse(self.noise_variance_init)),
        )

    @property
    def noise_variance(self):
        return tf.nn.softplus(self.raw_noise_variance)

    def variational_expectation(self, f, y):
        """`E_q(f)[log N(y; f, sigma^2)] = log N(y; mu, sigma^2) - s^2 / (2 sigma^2)` per entry,
        in closed form for `f` a random variable with Normal marginals `N(mu, s^2)` (an SVGP
        layer's output): the analytic ELBO term of Hensman et al. (2013), no sampling."""
        if not self.built:
            self.build(f.shape)
        mean, variance = f.distribution.mean(), f.distribution.variance()
        y = tf.cast(y, mean.dtype)
        noise = tf.cast(self.noise_variance, mean.dtype)
        return tfd.Normal(mean, tf.sqrt(noise)).log_prob(y) - variance / (2.0 * noise)

    def call(self, inputs):
        f = inputs.value if isinstance(inputs, RandomVariable) else tf.convert_to_tensor(inputs)
        return rv_lib.Normal(
            loc=f, scale=tf.sqrt(self.noise_variance) + tf.zeros_like(f), name=self.output_name
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "noise_variance": self.noise_variance_init}


def mean_field_logits(logits, variances, mean_field_factor=math.pi / 8.0):
    """`logits / sqrt(1 + lambda var)`: the mean-field approximation of the posterior-mean
    softmax `E[softmax(f)]` for `f ~ N(logits, var)` (Lu et al., 2020; `lambda = pi / 8` is the
    probit approximation). `variances`: `[B]` (or `[B, 1]`), one per example."""
    variances = tf.convert_to_tensor(variances, logits.dtype)
    if variances.shape.rank == 1:
        variances = variances[:, None]
    return logits / tf.sqrt(1.0 + mean_field_factor * variances)


@register
class RandomFeatureGaussianProcess(SeededLayer):
    """SNGP's output layer (Liu et al., 2020): a random-feature GP with a Laplace posterior.

    `f(x) = phi(x)^T beta + b`, `phi(x) = sqrt(2 / D) cos(x W / sqrt(l) + c)` with fixed
    orthogonal random features `W` (`orthogonal_random_features`), phases `c ~ U(0, 2 pi)`, and
    `beta` trained as an ordinary dense kernel (MAP with an L2 penalty). The Laplace posterior
    of `beta` has precision `P`, accumulated in training from the features:

    * `momentum > 0`: `P <- m P + (1 - m) Phi^T Phi / B` (a moving average, no reset needed);
    * `momentum <= 0`: `P <- P + Phi^T Phi`, the exact sum over the examples seen since the
      last `reset_covariance()`; the blayers trainer calls `begin_epoch()` at each epoch's
      start, which resets it, so the posterior is the last epoch's (with `model.fit`, call
      `reset_covariance()` from a callback's `on_epoch_begin`),

    with a multiplier `p (1 - p)` per example for `likelihood='binary_logistic'` (`exp(f)` for
    `'poisson'`). At prediction (`training` falsy) the predictive covariance is
    `Phi (ridge^-1 P + I)^-1 Phi^T` and, with `mean_field_factor`, the returned logits are
    `mean_field_logits(logits, diag covariance)`: the layer is a drop-in replacement of a
    classifier's last `Dense`.

    Args:
      units: outputs (classes).
      num_inducing: random features `D`.
      gp_kernel_scale: the RBF kernel's length scale `l` (inputs are divided by `sqrt(l)`).
      gp_output_bias: the output bias's value; `gp_output_bias_trainable` makes it trained.
      normalize_input: layer-normalize the inputs first (SNGP's default for Transformers).
      scale_random_features: multiply `phi` by `sqrt(2 / D)` (the kernel approximation's
        scale); without it the features are O(1) and the output layer learns `D / 2` times
        faster, with a prior `D / 2` times wider.
      gp_cov_momentum: `m` above.
      gp_cov_ridge_penalty: the prior precision `ridge` of `beta` (N(0, ridge^-1 I) ... in
        the Laplace covariance).
      gp_cov_likelihood: `'gaussian'`, `'binary_logistic'` or `'poisson'`.
      l2_regularization: L2 penalty of `beta` (added to `losses`).
      mean_field_factor: `lambda` of the mean-field logits at prediction (None: raw logits).
      return_covariance: return `(logits, covariance [B, B])` instead of the logits.
      seed: seeds the random features.
      **kwargs: `keras.layers.Layer` arguments.
    """

    _LIKELIHOODS = ("gaussian", "binary_logistic", "poisson")

    def __init__(
        self,
        units,
        num_inducing=1024,
        gp_kernel_scale=1.0,
        gp_output_bias=0.0,
        gp_output_bias_trainable=False,
        normalize_input=False,
        scale_random_features=True,
        gp_cov_momentum=0.999,
        gp_cov_ridge_penalty=1.0,
        gp_cov_likelihood="gaussian",
        l2_regularization=1e-6,
        mean_field_factor=math.pi / 8.0,
        return_covariance=False,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"RandomFeatureGaussianProcess ({self.name})"
        for argument, value in (("units", units), ("num_inducing", num_inducing)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: {argument} must be a positive integer, got {value!r}.")
        if gp_cov_likelihood not in self._LIKELIHOODS:
            raise ValueError(
                f"{name}: gp_cov_likelihood must be one of {self._LIKELIHOODS}, got "
                f"{gp_cov_likelihood!r}."
            )
        if gp_cov_likelihood != "gaussian" and units != 1:
            raise ValueError(f"{name}: gp_cov_likelihood={gp_cov_likelihood!r} needs units=1.")
        self.units, self.num_inducing = int(units), int(num_inducing)
        self.gp_kernel_scale = _positive(name, "gp_kernel_scale", gp_kernel_scale)
        self.gp_output_bias = float(gp_output_bias)
        self.gp_output_bias_trainable = gp_output_bias_trainable
        self.normalize_input = normalize_input
        self.scale_random_features = scale_random_features
        self.gp_cov_momentum = float(gp_cov_momentum)
        self.gp_cov_ridge_penalty = _positive(name, "gp_cov_ridge_penalty", gp_cov_ridge_penalty)
        self.gp_cov_likelihood = gp_cov_likelihood
        self.l2_regularization = float(l2_regularization)
        self.mean_field_factor = mean_field_factor
        self.return_covariance = return_covariance
        self.input_norm = (
            keras.layers.LayerNormalization(name="gp_input_normalization")
            if (normalize_input)
            else None
        )

    def build(self, input_shape):
        d = input_shape[-1]
        if d is None:
            raise ValueError(
                f"RandomFeatureGaussianProcess ({self.name}) needs a known input size."
            )
        if self.input_norm is not None:
            self.input_norm.build(input_shape)
        seed = self.seed if self.seed is not None else np.random.randint(2**31 - 1)
        self.random_features = self.add_weight(
            name="random_features",
            shape=(d, self.num_inducing),
            initializer=initializers_lib.OrthogonalRandomFeatures(stddev=1.0, seed=seed),
            trainable=False,
        )
        self.random_phases = self.add_weight(
            name="random_phases",
            shape=(self.num_inducing,),
            initializer=keras.initializers.RandomUniform(0.0, 2.0 * math.pi, seed=seed + 1),
            trainable=False,
        )
        self.beta = self.add_weight(
            name="output_kernel",
            shape=(self.num_inducing, self.units),
            initializer="glorot_uniform",
            regularizer=keras.regularizers.L2(self.l2_regularization)
            if self.l2_regularization
            else None,
        )
        self.bias = self.add_weight(
            name="output_bias",
            shape=(self.units,),
            initializer=keras.initializers.Constant(self.gp_output_bias),
            trainable=self.gp_output_bias_trainable,
        )
        self.precision = self.add_weight(
            name="precision_matrix",
            shape=(self.num_inducing, self.num_inducing),
            initializer="zeros",
            trainable=False,
        )

    def features(self, inputs):
        """`phi(x)`, `[B, D]`."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        x = x / math.sqrt(self.gp_kernel_scale)
        features = tf.cos(tf.matmul(x, self.random_features) + self.random_phases)
        if self.scale_random_features:
            features *= math.sqrt(2.0 / self.num_inducing)
        return features

    def reset_covariance(self):
        """Zeroes the precision (start of an epoch, with `gp_cov_momentum <= 0`)."""
        self.precision.assign(tf.zeros_like(self.precision))

    def begin_epoch(self):
        """Called by the trainer at each epoch's start: with `gp_cov_momentum <= 0` the
        precision restarts, so at the end it is the last epoch's exact sum (as in SNGP)."""
        if self.gp_cov_momentum <= 0:
            self.reset_covariance()

    def _update_precision(self, phi, logits):
        if self.gp_cov_likelihood == "binary_logistic":
            p = tf.sigmoid(logits)
            phi = phi * tf.sqrt(p * (1.0 - p))
        elif self.gp_cov_likelihood == "poisson":
            phi = phi * tf.sqrt(tf.exp(logits))
        batch = tf.matmul(phi, phi, transpose_a=True)
        if self.gp_cov_momentum > 0:
            size = tf.cast(tf.shape(phi)[0], phi.dtype)
            m = self.gp_cov_momentum
            new = m * self.precision + (1.0 - m) * batch / size
        else:
            new = self.precision + batch
        self.precision.assign(tf.stop_gradient(new))

    def feature_covariance(self):
        """`(ridge^-1 P + I)^-1`, the posterior covariance of `beta` (per output)."""
        eye = tf.eye(self.num_inducing, dtype=self.precision.dtype)
        matrix = eye + tf.convert_to_tensor(self.precision) / self.gp_cov_ridge_penalty
        return tf.linalg.cholesky_solve(tf.linalg.cholesky(matrix), eye)

    def predictive_covariance(self, phi):
        """`Phi Sigma Phi^T`, `[B, B]`."""
        return tf.matmul(phi, tf.matmul(self.feature_covariance(), phi, transpose_b=True))

    def call(self, inputs, training=None):
        phi = self.features(inputs)
        logits = tf.matmul(phi, self.beta) + self.bias
        if training:
            self._update_precision(tf.stop_gradient(phi), tf.stop_gradient(logits))
            if self.return_covariance:
                return logits, tf.zeros(tf.stack([tf.shape(phi)[0]] * 2), logits.dtype)
            return logits
        if self.return_covariance:
            return logits, self.predictive_covariance(phi)
        if self.mean_field_factor is None:
            return logits
        sigma = self.feature_covariance()
        variances = tf.reduce_sum(tf.matmul(phi, sigma) * phi, axis=-1)
        return mean_field_logits(logits, variances, self.mean_field_factor)

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape[:-1]) + (self.units,)
        return (shape, (input_shape[0], input_shape[0])) if self.return_covariance else shape

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "num_inducing": self.num_inducing,
            "gp_kernel_scale": self.gp_kernel_scale,
            "gp_output_bias": self.gp_output_bias,
            "gp_output_bias_trainable": self.gp_output_bias_trainable,
            "normalize_input": self.normalize_input,
            "scale_random_features": self.scale_random_features,
            "gp_cov_momentum": self.gp_cov_momentum,
            "gp_cov_ridge_penalty": self.gp_cov_ridge_penalty,
            "gp_cov_likelihood": self.gp_cov_likelihood,
            "l2_regularization": self.l2_regularization,
            "mean_field_factor": self.mean_field_factor,
            "return_covariance": self.return_covariance,
        }
