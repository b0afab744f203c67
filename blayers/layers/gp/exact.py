"""Exact GP regression layers: `GaussianProcess` (the prior, or the exact posterior given
conditional inputs and outputs) and `GaussianLikelihood` (`y ~ N(f, sigma^2)`, its output layer).
"""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import distributions as rv_lib
from blayers import replicas as replicas_lib
from blayers import sampling
from blayers.layers.base import NamedOutput, register
from blayers.random_variable import RandomVariable
from blayers.sampling import normal_parameters

tfd = tfp.distributions
psd = tfp.math.psd_kernels
from blayers.layers.gp.base import GaussianProcessBase
from blayers.layers.gp.kernels import (
    float_softplus_inverse,
    positive_number,
)

__all__ = ["GaussianLikelihood", "GaussianProcess"]


@register
class GaussianProcess(GaussianProcessBase):
    """Exact GP layer: `f ~ GP(m, k)` at the batch inputs, optionally conditioned on data.

    With `conditional_inputs` X `[N, d]` and `conditional_outputs` Y `[N, units]` observed with
    Gaussian noise (trainable `observation_noise_variance`), the output is the exact posterior
    `N(m(x) + K_xX (K_XX + s^2 I)^{-1} (Y - m(X)), K_xx - K_xX (K_XX + s^2 I)^{-1} K_Xx)`.
    The output is a `RandomVariable` over a `MatrixNormalLinearOperator` (event `[batch, units]`:
    rows share the covariance, units are independent).

    Args:
      units: independent output functions.
      mean_fn: `'zero'`, `'constant'` (trainable per unit), `'linear'` (trainable, identity
        start) or `'identity'` (fixed `x @ eye(d, units)`: needs `units >= d`).
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
        self.noise_init = positive_number(
            name, "observation_noise_variance", observation_noise_variance
        )

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
            initializer=keras.initializers.Constant(float_softplus_inverse(self.noise_init)),
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
class GaussianLikelihood(NamedOutput, keras.layers.Layer):
    """`y ~ N(f, sigma^2)` with a trainable `sigma^2` (softplus, initial `noise_variance`).

    Takes function values (a tensor, or a GP layer's `RandomVariable`, whose value is a
    reparameterized draw) and returns a `RandomVariable` over `y`: `-log_prob(y)` is a one-sample
    estimate of the ELBO's expected log-likelihood, and Monte Carlo passes average into the
    predictive mixture. `variational_expectation(f, y)` is the same term in closed form.

    With `replicas=R` (`blayers.replicas`) it is `R` independent likelihoods on `[R, batch, ...]`
    inputs, each with its own `sigma_r^2` (`noise_variance` one value or `R`).

    Given a random variable with Normal marginals (a sparse GP layer's), the output's `function`
    attribute is that variable, so a learner can take the expected log-likelihood in closed
    form (`variational_expectation`) instead of through the draw.

    Args:
      noise_variance: initial `sigma^2` (positive); with replicas, one or one a replica.
      replicas, replica_seeds: see `blayers.replicas` (default: an ordinary layer).
      **kwargs: `keras.layers.Layer` arguments (`trainable=False` keeps `sigma^2` fixed).
    """

    def __init__(self, noise_variance=0.1, replicas=None, replica_seeds=None, **kwargs):
        super().__init__(**kwargs)
        self.replicas, self.replica_seeds = replicas_lib.check_replicas(
            self, replicas, replica_seeds, supported=True
        )
        self.replica_keys = (
            None if self.replicas is None else sampling.replica_keys(self.replica_seeds)
        )
        self.noise_variance_init = replicas_lib.per_replica(
            self, "noise_variance", noise_variance, self.replicas
        )
        initial = np.atleast_1d(self.noise_variance_init)
        if not np.all(initial > 0):
            raise ValueError(
                f"GaussianLikelihood ({self.name}): noise_variance must be positive, got "
                f"{noise_variance!r}."
            )

    def build(self, input_shape):
        if self.replicas is not None:
            replicas_lib.check_replica_inputs(self, input_shape, min_rank=2)
        initial = self.noise_variance_init
        raw = (
            float_softplus_inverse(initial)
            if self.replicas is None
            else [float_softplus_inverse(v) for v in initial]
        )
        self.raw_noise_variance = self.add_weight(
            name="noise_variance",
            shape=np.shape(initial),
            initializer=keras.initializers.Constant(raw),
        )

    @property
    def noise_variance(self):
        """`sigma^2`; with replicas, `[R]`."""
        return tf.nn.softplus(self.raw_noise_variance)

    def _noise_variance_like(self, f):
        """`sigma^2` broadcast against `f` (a replicated likelihood's `[R, 1, ..., 1]`)."""
        noise = tf.cast(self.noise_variance, f.dtype)
        if self.replicas is None:
            return noise
        return tf.reshape(noise, [self.replicas] + [1] * (f.shape.rank - 1))

    def variational_expectation(self, f, y):
        """`E_q(f)[log N(y; f, sigma^2)] = log N(y; mu, sigma^2) - s^2 / (2 sigma^2)` per entry,
        in closed form for `f` a random variable with Normal marginals `N(mu, s^2)` (an SVGP
        layer's output): the analytic ELBO term of Hensman et al. (2013), no sampling."""
        if not self.built:
            self.build(f.shape)
        mean, variance = f.distribution.mean(), f.distribution.variance()
        y = tf.cast(y, mean.dtype)
        noise = self._noise_variance_like(mean)
        return tfd.Normal(mean, tf.sqrt(noise)).log_prob(y) - variance / (2.0 * noise)

    def call(self, inputs):
        f = inputs.value if isinstance(inputs, RandomVariable) else tf.convert_to_tensor(inputs)
        y = rv_lib.Normal(
            loc=f,
            scale=tf.sqrt(self._noise_variance_like(f)) + tf.zeros_like(f),
            name=self.output_name,
            replica_keys=self.replica_keys,
        )
        if isinstance(inputs, RandomVariable) and normal_parameters(inputs.distribution):
            y.function = inputs
        return y

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {**super().get_config(), "noise_variance": self.noise_variance_init}
        if self.replicas is not None:
            config.update(replicas=self.replicas, replica_seeds=self.replica_seeds)
        return config
