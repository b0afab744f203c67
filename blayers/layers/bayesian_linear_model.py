"""The Bayesian linear model with a standard-normal prior over its coefficients, fitted in closed
form (edward2's `BayesianLinearModel`).

`y = x^T w + eps`, `w ~ N(0, I)`, `eps ~ N(0, sigma^2)`: after `fit(x, y)` the posterior is
`N(w | m, S)` with `S^-1 = x^T x / sigma^2 + I` and `m = S x^T y / sigma^2`, and a forward pass
returns a `RandomVariable` over `x_new^T w`, `N(x_new^T m, x_new^T S x_new)` (the prior's `N(0,
|x_new|^2)` before a fit), as edward2's: the predictive of the mean function, without the
noise (add `noise_variance` for that of a new `y`).
"""

import keras
import tensorflow as tf

from blayers import distributions as rv_lib
from blayers.layers.base import NamedOutput, register

__all__ = ["BayesianLinearModel"]


@register
class BayesianLinearModel(NamedOutput, keras.layers.Layer):
    """Exact Bayesian linear regression (module docstring); `fit(x, y)` replaces any earlier
    fit (no sequential updating, as edward2's).

    The posterior's mean and the Cholesky factor of its precision are (non-trainable) weights,
    so a saved model keeps its fit.

    Args:
      noise_variance: `sigma^2`, the observation noise's variance.
      output_name: the returned random variable's name (default: the layer's).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, noise_variance, **kwargs):
        super().__init__(**kwargs)
        if not noise_variance > 0:
            raise ValueError(
                f"BayesianLinearModel ({self.name}): noise_variance must be > 0, got "
                f"{noise_variance!r}."
            )
        self.noise_variance = float(noise_variance)

    def build(self, input_shape):
        dim = input_shape[-1]
        self.coeffs_mean = self.add_weight(
            name="coeffs_mean", shape=(dim,), initializer="zeros", trainable=False
        )
        # The prior's precision I: its Cholesky factor is I.
        self.precision_tril = self.add_weight(
            name="precision_tril", shape=(dim, dim), initializer="identity", trainable=False
        )

    def fit(self, x, y):
        """The posterior given inputs `x [N, d]` and targets `y [N]`."""
        x = tf.convert_to_tensor(x, self.compute_dtype)
        y = tf.reshape(tf.convert_to_tensor(y, self.compute_dtype), [-1])
        if not self.built:
            self.build(x.shape)
        precision = tf.matmul(x, x, transpose_a=True) / self.noise_variance
        precision = tf.linalg.set_diag(precision, tf.linalg.diag_part(precision) + 1.0)
        tril = tf.linalg.cholesky(precision)
        rhs = tf.linalg.matvec(x, y, transpose_a=True) / self.noise_variance
        mean = tf.linalg.cholesky_solve(tril, rhs[:, None])[:, 0]
        self.precision_tril.assign(tril)
        self.coeffs_mean.assign(mean)
        return self

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        tril = tf.cast(self.precision_tril, x.dtype)
        # x S x^T's diagonal: |L^-1 x|^2 per row, S = (L L^T)^-1.
        half = tf.linalg.triangular_solve(tril, tf.transpose(x), lower=True)
        variance = tf.reduce_sum(tf.square(half), axis=0)
        mean = tf.linalg.matvec(x, tf.cast(self.coeffs_mean, x.dtype))
        return rv_lib.Normal(loc=mean, scale=tf.sqrt(variance), name=self.output_name)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1])

    def get_config(self):
        return {**super().get_config(), "noise_variance": self.noise_variance}
