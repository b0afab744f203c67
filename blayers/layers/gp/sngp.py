"""SNGP's output layer (Liu et al., 2020): `RandomFeatureGaussianProcess`, a random-feature GP
with a Laplace posterior, and `mean_field_logits`.
"""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import initializers as initializers_lib
from blayers.layers.base import SeededLayer, register

tfd = tfp.distributions
psd = tfp.math.psd_kernels
from blayers.layers.gp.kernels import positive_number

__all__ = [
    "LaplaceRandomFeatureCovariance",
    "RandomFeatureGaussianProcess",
    "mean_field_logits",
]


def mean_field_logits(
    logits, variances=None, mean_field_factor=math.pi / 8.0, likelihood="logistic"
):
    """The mean-field approximation of the posterior-mean predictive for logits `f ~ N(logits,
    var)` (Lu et al., 2020): `logits / sqrt(1 + lambda var)` for a softmax or sigmoid
    (`likelihood='logistic'` or `'binary_logistic'`; `lambda = pi / 8` is the probit
    approximation), `logits + lambda var / 2` in log-rate space for `'poisson'` (edward2's
    `logits * exp(lambda var / 2)`, its scaling of the logits).

    Args:
      logits: `[B, C]` (or `[B]`).
      variances: one variance per example, `[B]` or `[B, 1]`, or a covariance `[B, B]`
        (edward2's `covmat`: its diagonal is used); None: 1 for every example (then a
        temperature `sqrt(1 + lambda)`).
      mean_field_factor: `lambda`; negative: the logits unchanged.
      likelihood: `'logistic'`, `'binary_logistic'` or `'poisson'`.
    """
    if likelihood not in ("logistic", "binary_logistic", "poisson"):
        raise ValueError(
            "mean_field_logits: likelihood must be 'logistic', 'binary_logistic' or 'poisson', "
            f"got {likelihood!r}."
        )
    logits = tf.convert_to_tensor(logits)
    if mean_field_factor < 0:
        return logits
    if variances is None:
        variances = tf.ones([], logits.dtype)
    else:
        variances = tf.cast(tf.convert_to_tensor(variances), logits.dtype)
        shape = variances.shape
        if shape.rank == 2 and shape[-1] != 1 and shape[-1] == shape[-2]:
            variances = tf.linalg.diag_part(variances)  # a covariance
        elif shape.rank == 2:
            variances = variances[:, 0]
        if logits.shape.rank > 1:
            variances = variances[:, None]
    if likelihood == "poisson":
        return logits * tf.exp(variances * mean_field_factor / 2.0)
    return logits / tf.sqrt(1.0 + mean_field_factor * variances)


@register
class LaplaceRandomFeatureCovariance(keras.layers.Layer):
    """The Laplace posterior covariance of a random-feature GP's output weights (edward2's
    `LaplaceRandomFeatureCovariance`, SNGP's covariance). In training (`training` truthy) each
    call updates the precision `P` from the features `Phi` `[B, D]`:

    * `momentum > 0`: `P <- m P + (1 - m) Phi^T W Phi / B`, a moving average;
    * `momentum <= 0`: `P <- P + Phi^T W Phi`, the exact sum since `reset_precision_matrix()`,

    with `W = diag(p (1 - p))` for `likelihood='binary_logistic'` (the logits' `p`),
    `diag(exp(f))` for `'poisson'`, and `I` for `'gaussian'`; it returns `I_B` (a placeholder).
    At prediction it returns the predictive covariance `ridge Phi (ridge I + P)^-1 Phi^T`,
    `[B, B]`, inverting `P` only after it changed (the inverse is kept in
    `covariance_matrix`; `if_update_covariance` says it is stale).

    Args:
      momentum: `m` above.
      ridge_penalty: the prior precision `ridge` of the weights.
      likelihood: `'gaussian'`, `'binary_logistic'` or `'poisson'` (one output).
      **kwargs: `keras.layers.Layer` arguments.
    """

    LIKELIHOODS = ("gaussian", "binary_logistic", "poisson")

    def __init__(self, momentum=0.999, ridge_penalty=1e-6, likelihood="gaussian", **kwargs):
        super().__init__(**kwargs)
        name = f"LaplaceRandomFeatureCovariance ({self.name})"
        if likelihood not in self.LIKELIHOODS:
            raise ValueError(
                f"{name}: likelihood must be one of {self.LIKELIHOODS}, got {likelihood!r}."
            )
        if not ridge_penalty >= 0:
            raise ValueError(f"{name}: ridge_penalty must be >= 0, got {ridge_penalty!r}.")
        self.momentum, self.ridge_penalty = float(momentum), float(ridge_penalty)
        self.likelihood = likelihood

    def build(self, input_shape):
        d = input_shape[-1]
        self.precision_matrix = self.add_weight(
            name="gp_precision_matrix", shape=(d, d), initializer="zeros", trainable=False
        )
        self.covariance_matrix = self.add_weight(
            name="gp_covariance_matrix", shape=(d, d), initializer="zeros", trainable=False
        )
        # Stale until the first inverse (then after each update).
        self.if_update_covariance = self.add_weight(
            name="update_gp_covariance",
            shape=(),
            dtype="bool",
            initializer="ones",
            trainable=False,
        )

    def update_feature_precision_matrix(self, gp_feature, logits=None):
        """The precision after this batch of features (not assigned)."""
        if self.likelihood != "gaussian":
            if logits is None:
                raise ValueError(
                    f"LaplaceRandomFeatureCovariance ({self.name}): likelihood="
                    f"{self.likelihood!r} needs the logits."
                )
            if self.likelihood == "binary_logistic":
                p = tf.sigmoid(logits)
                gp_feature = gp_feature * tf.sqrt(p * (1.0 - p))
            else:
                gp_feature = gp_feature * tf.sqrt(tf.exp(logits))
        batch = tf.matmul(gp_feature, gp_feature, transpose_a=True)
        precision = tf.convert_to_tensor(self.precision_matrix)
        if self.momentum > 0:
            size = tf.cast(tf.shape(gp_feature)[0], batch.dtype)
            return self.momentum * precision + (1.0 - self.momentum) * batch / size
        return precision + batch

    def update(self, gp_feature, logits=None):
        """Adds a batch of features to the precision; the inverse becomes stale."""
        new = self.update_feature_precision_matrix(gp_feature, logits)
        self.precision_matrix.assign(tf.stop_gradient(new))
        self.if_update_covariance.assign(True)

    def reset_precision_matrix(self):
        """Zeroes the precision (an epoch's start, with `momentum <= 0`)."""
        self.precision_matrix.assign(tf.zeros_like(self.precision_matrix))
        self.if_update_covariance.assign(True)

    def update_feature_covariance_matrix(self):
        """`(ridge I + P)^-1`, inverted again only if `P` changed since the last inverse;
        the result is kept in `covariance_matrix`."""

        def invert():
            precision = tf.convert_to_tensor(self.precision_matrix)
            eye = tf.eye(tf.shape(precision)[0], dtype=precision.dtype)
            matrix = self.ridge_penalty * eye + precision
            return tf.linalg.cholesky_solve(tf.linalg.cholesky(matrix), eye)

        covariance = tf.cond(
            tf.convert_to_tensor(self.if_update_covariance),
            invert,
            lambda: tf.convert_to_tensor(self.covariance_matrix),
        )
        self.covariance_matrix.assign(covariance)
        self.if_update_covariance.assign(False)
        return covariance

    def compute_predictive_covariance(self, gp_feature):
        """`ridge Phi (ridge I + P)^-1 Phi^T`, `[B, B]` (the cached inverse)."""
        product = tf.matmul(self.covariance_matrix, gp_feature, transpose_b=True)
        return tf.matmul(gp_feature, product) * self.ridge_penalty

    def call(self, inputs, logits=None, training=None):
        if training:
            self.update(
                tf.stop_gradient(inputs), None if logits is None else tf.stop_gradient(logits)
            )
            return tf.eye(tf.shape(inputs)[0], dtype=inputs.dtype)
        self.update_feature_covariance_matrix()
        return self.compute_predictive_covariance(inputs)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[0])

    def get_config(self):
        return {
            **super().get_config(),
            "momentum": self.momentum,
            "ridge_penalty": self.ridge_penalty,
            "likelihood": self.likelihood,
        }


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
      gp_kernel_type: `'gaussian'` (the RBF kernel's random Fourier features, above) or
        `'linear'` (`phi(x) = x`, Bayesian linear regression on the inputs; `D` is then the
        input size and `num_inducing` is not used).
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
      return_covariance: return `(logits, covariance [B, B])` instead of the logits
        (`return_gp_cov` is edward2's name for it).
      return_random_features: also return `phi(x)` (last in the tuple).
      seed: seeds the random features.
      **kwargs: `keras.layers.Layer` arguments.
    """

    _LIKELIHOODS = LaplaceRandomFeatureCovariance.LIKELIHOODS

    def __init__(
        self,
        units,
        num_inducing=1024,
        gp_kernel_type="gaussian",
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
        return_random_features=False,
        seed=None,
        return_gp_cov=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"RandomFeatureGaussianProcess ({self.name})"
        if return_gp_cov is not None:  # edward2's name
            return_covariance = return_gp_cov
        if gp_kernel_type not in ("gaussian", "linear"):
            raise ValueError(
                f"{name}: gp_kernel_type must be 'gaussian' or 'linear', got {gp_kernel_type!r}."
            )
        self.gp_kernel_type = gp_kernel_type
        self.return_random_features = bool(return_random_features)
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
        self.gp_kernel_scale = positive_number(name, "gp_kernel_scale", gp_kernel_scale)
        self.gp_output_bias = float(gp_output_bias)
        self.gp_output_bias_trainable = gp_output_bias_trainable
        self.normalize_input = normalize_input
        self.scale_random_features = scale_random_features
        self.gp_cov_momentum = float(gp_cov_momentum)
        self.gp_cov_ridge_penalty = positive_number(
            name, "gp_cov_ridge_penalty", gp_cov_ridge_penalty
        )
        self.gp_cov_likelihood = gp_cov_likelihood
        self.l2_regularization = float(l2_regularization)
        self.mean_field_factor = mean_field_factor
        self.return_covariance = return_covariance
        self.gp_cov_layer = LaplaceRandomFeatureCovariance(
            momentum=self.gp_cov_momentum,
            ridge_penalty=self.gp_cov_ridge_penalty,
            likelihood=gp_cov_likelihood,
            dtype=self.dtype_policy,
            name="gp_covariance",
        )
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
        if self.gp_kernel_type == "linear":
            self.num_inducing = int(d)
        else:
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
        self.gp_cov_layer.build((None, self.num_inducing))

    @property
    def precision(self):
        """The Laplace posterior's precision `P` of `beta` (`gp_cov_layer`'s)."""
        return self.gp_cov_layer.precision_matrix

    def features(self, inputs):
        """`phi(x)`, `[B, D]`."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.gp_kernel_type == "linear":
            features = x
        else:
            x = x / math.sqrt(self.gp_kernel_scale)
            features = tf.cos(tf.matmul(x, self.random_features) + self.random_phases)
        if self.scale_random_features:
            features *= math.sqrt(2.0 / self.num_inducing)
        return features

    def reset_covariance(self):
        """Zeroes the precision (start of an epoch, with `gp_cov_momentum <= 0`)."""
        self.gp_cov_layer.reset_precision_matrix()

    def reset_covariance_matrix(self):
        """edward2's name for `reset_covariance`."""
        self.reset_covariance()

    def begin_epoch(self):
        """Called by the trainer at each epoch's start: with `gp_cov_momentum <= 0` the
        precision restarts, so at the end it is the last epoch's exact sum (as in SNGP)."""
        if self.gp_cov_momentum <= 0:
            self.reset_covariance()

    def _update_precision(self, phi, logits):
        self.gp_cov_layer.update(phi, logits)

    def feature_covariance(self):
        """`(ridge^-1 P + I)^-1`, the posterior covariance of `beta` (per output); inverted
        again only after the precision changed."""
        return self.gp_cov_layer.update_feature_covariance_matrix() * self.gp_cov_ridge_penalty

    def predictive_covariance(self, phi):
        """`Phi Sigma Phi^T`, `[B, B]` (`gp_cov_layer`'s, with its cached inverse)."""
        self.gp_cov_layer.update_feature_covariance_matrix()
        return self.gp_cov_layer.compute_predictive_covariance(phi)

    def call(self, inputs, training=None):
        phi = self.features(inputs)
        logits = tf.matmul(phi, self.beta) + self.bias
        if training:
            self._update_precision(tf.stop_gradient(phi), tf.stop_gradient(logits))
            covariance = tf.eye(tf.shape(phi)[0], dtype=logits.dtype)  # edward2's placeholder
        elif self.return_covariance:
            covariance = self.predictive_covariance(phi)
        elif self.mean_field_factor is not None:
            sigma = self.feature_covariance()
            variances = tf.reduce_sum(tf.matmul(phi, sigma) * phi, axis=-1)
            logits = mean_field_logits(logits, variances, self.mean_field_factor)
        outputs = (logits,)
        if self.return_covariance:
            outputs += (covariance,)
        if self.return_random_features:
            outputs += (phi,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape[:-1]) + (self.units,)
        outputs = (shape,)
        if self.return_covariance:
            outputs += ((input_shape[0], input_shape[0]),)
        if self.return_random_features:
            width = input_shape[-1] if self.gp_kernel_type == "linear" else self.num_inducing
            outputs += (tuple(input_shape[:-1]) + (width,),)
        return outputs[0] if len(outputs) == 1 else outputs

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "num_inducing": self.num_inducing,
            "gp_kernel_type": self.gp_kernel_type,
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
            "return_random_features": self.return_random_features,
        }
