"""Variational dropout (Kingma et al., 2015) in the additive parameterization of Molchanov et
al. (2017), with sparsification.

Each weight is `w ~ N(theta, sigma^2)` with the log-uniform prior `p(|w|) ~ 1 / |w|`; its
dropout rate is `alpha = sigma^2 / theta^2` (multiplicative Gaussian noise `w = theta (1 +
sqrt(alpha) eps)`), learned per weight. Parameterizing `theta` and `sigma` directly (additive
noise) rather than `theta` and `alpha` keeps the gradient's variance low as `alpha` grows.

* Training (`training=True`): local reparameterization, the pre-activations sampled from
  `N(op(x, theta), op(x^2, alpha theta^2))` with `log alpha` clipped to [-8, 8] (Molchanov et
  al.'s numerical guard); the KL to the log-uniform prior, Molchanov et al.'s approximation
  (`log_uniform_kl_divergence`), in `layer.losses`.
* Prediction (`training` falsy): the deterministic layer with the means, weights whose
  `log alpha >= threshold` (default 3, i.e. alpha > 20: the weight is mostly noise) set to zero;
  `layer.sparsity()` reports the fraction removed.
"""

import tensorflow as tf

from blayers.layers.base import is_fixed, register
from blayers.layers.convolutional import _Conv2D
from blayers.layers.dense import _DenseBase
from blayers.layers.estimators import LocalReparameterizationEstimator, kernel_moments
from blayers.sampling import standard_normal_like

__all__ = ["Conv2DVariationalDropout", "DenseVariationalDropout", "VariationalDropout"]

LOG_ALPHA_CLIP = 8.0
_EPS = 1e-8


VD_ARGS = """      threshold: `log alpha` at or above which a weight is dropped at prediction (default 3).
    Defaults differ from the family's: kernel `'trainable_glorot_normal'` (means must start away
    from zero), kernel regularizer `'log_uniform_kl_divergence'`.
"""


class VariationalDropout(LocalReparameterizationEstimator):
    """Mixin of a `BayesianLayer` family: the sparse variational dropout forward pass.

    Its argument besides the family's: `threshold`, the `log alpha` at or above which a weight
    is dropped at prediction (default 3). Defaults: kernel `'trainable_glorot_normal'`, kernel
    regularizer `'log_uniform_kl_divergence'`.
    """

    _variance_weights = ()  # its variance is `alpha theta^2`, not the stddev's square

    def __init__(
        self,
        *args,
        threshold=3.0,
        kernel_initializer="trainable_glorot_normal",
        kernel_regularizer="log_uniform_kl_divergence",
        **kwargs,
    ):
        # Means start Glorot-normal: with near-zero means every weight would begin with a huge
        # alpha, i.e. dropped.
        super().__init__(
            *args,
            kernel_initializer=kernel_initializer,
            kernel_regularizer=kernel_regularizer,
            **kwargs,
        )
        self.threshold = float(threshold)

    def log_alpha(self, kernel=None):
        """`log(sigma^2 / theta^2)` per weight, clipped to [-8, 8] (the current draw's q)."""
        kernel = self.kernel if kernel is None else kernel
        mean, stddev = kernel_moments(kernel)
        log_alpha = 2.0 * tf.math.log(stddev) - tf.math.log(tf.square(mean) + _EPS)
        return tf.clip_by_value(
            tf.broadcast_to(log_alpha, kernel.shape), -LOG_ALPHA_CLIP, LOG_ALPHA_CLIP
        )

    def sparsity(self):
        """Fraction of kernel weights dropped at prediction (`log alpha >= threshold`)."""
        kernel = self.kernel_initializer(self._bayesian_weights["kernel"], self.dtype)
        dropped = tf.cast(self.log_alpha(kernel) >= self.threshold, tf.float32)
        return float(tf.reduce_mean(dropped))

    def call(self, inputs, training=None, mask=None):
        del mask
        self.call_weights()
        inputs = tf.convert_to_tensor(inputs, dtype=self.compute_dtype)
        kernel = self.kernel
        if is_fixed(kernel):  # deterministic twin, or a value fixed by an interceptor
            return self.add_bias_and_activate(self._linear(inputs, tf.convert_to_tensor(kernel)))
        mean, _ = kernel_moments(kernel)
        mean = tf.broadcast_to(mean, kernel.shape)
        log_alpha = self.log_alpha(kernel)
        if training:
            variance = tf.exp(log_alpha) * tf.square(mean)
            loc = self._linear(inputs, mean)
            scale = tf.sqrt(self._linear(tf.square(inputs), variance) + _EPS)
            outputs = loc + scale * standard_normal_like(loc, self.next_seed())
        else:
            kept = tf.cast(log_alpha < self.threshold, mean.dtype)
            outputs = self._linear(inputs, mean * kept)
        return self.add_bias_and_activate(outputs)

    def get_config(self):
        return {**super().get_config(), "threshold": self.threshold}


@register
class DenseVariationalDropout(VariationalDropout, _DenseBase):
    """Dense layer with sparse variational dropout (Molchanov et al., 2017): per-weight dropout
    rates learned under a log-uniform prior; weights with `log alpha >= threshold` are pruned at
    prediction. Default kernel regularizer `'log_uniform_kl_divergence'`."""

    _args_doc = _DenseBase._args_doc + VD_ARGS


@register
class Conv2DVariationalDropout(VariationalDropout, _Conv2D):
    """2-D convolution with sparse variational dropout (Molchanov et al., 2017), per kernel
    entry; the local reparameterization samples each output position's pre-activation."""

    _args_doc = _Conv2D._args_doc + VD_ARGS
