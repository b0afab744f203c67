"""Distribution regularizers: callables taking a weight's `RandomVariable`, returning a scalar.

The variational objective penalizes `KL[q(w) || p(w)]` (Tran et al., 2019, Sec. 2.1). Bayesian
layers call their `kernel_regularizer` on the kernel random variable every forward pass and add
the result to `layer.losses`. Every regularizer multiplies its divergence by `scale_factor`, so
`scale_factor = 1 / num_train_examples` gives the per-example ELBO's KL term.

The divergence is analytic where a closed form exists and Monte Carlo otherwise,
`log q(w) - log p(w)` at the variable's current value (its single draw: unbiased, and shared
with the forward pass for the reparameterization estimator). For a point mass q
(`trainable_deterministic`) the Monte Carlo form is `-log p(w)`: MAP with prior p.
"""

import math

import gin
import keras
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.random_variable import RandomVariable
from blayers.registry import ArgsDoc, Registry
from blayers.sampling import normal_parameters

tfd = tfp.distributions

__all__ = [
    "PRIOR",
    "DistributionRegularizer",
    "HalfCauchyKLDivergence",
    "LogUniformKLDivergence",
    "NormalKLDivergence",
    "ScaleMixtureKLDivergence",
    "deserialize",
    "get",
    "normal_parameters",
    "prior",
    "serialize",
]

_REGISTRY = Registry("regularizer", "blayers.regularizers", keras.regularizers.get, "'l2'")
_register = _REGISTRY.register
_EXP_MINUS_6 = math.exp(-6.0)  # Blundell et al.'s narrow mixture component


def normal_kl_sum(loc, scale, prior_mean, prior_stddev):
    """`sum KL[N(loc, scale^2) || N(prior_mean, prior_stddev^2)]` with a hand-written gradient.

    `n (log s_p - 1/2) - sum log s + (sum s^2 + sum (m - m_p)^2) / (2 s_p^2)`; its gradient,
    `d/dm = (m - m_p) / s_p^2` and `d/ds = s / s_p^2 - 1 / s`, takes three elementwise passes where
    autodiff of the expression takes about ten (it materializes the broadcasts of the sums).
    """
    inv_var = 1.0 / prior_stddev**2
    size = float(loc.shape.num_elements())

    @tf.custom_gradient
    def kl(loc, scale):
        centred = loc - prior_mean if prior_mean else loc
        flat_c, flat_s = tf.reshape(centred, [-1]), tf.reshape(scale, [-1])
        value = (
            size * (math.log(prior_stddev) - 0.5)
            - tf.reduce_sum(tf.math.log(scale))
            + 0.5 * inv_var * (tf.tensordot(flat_s, flat_s, 1) + tf.tensordot(flat_c, flat_c, 1))
        )

        def grad(upstream):
            return upstream * inv_var * centred, upstream * (inv_var * scale - 1.0 / scale)

        return value, grad

    return kl(loc, scale)


class DistributionRegularizer(ArgsDoc, keras.regularizers.Regularizer):
    """Base: `scale_factor * divergence(rv)` for a weight random variable `rv`.

    Args:
      scale_factor: multiplies the divergence (`1 / N` gives the per-example ELBO's KL term;
        `blayers.set_kl_scale` sets it for `model.fit`).
    """

    _args_doc = """    Args:
      scale_factor: multiplies the divergence (`1 / N` gives the per-example ELBO's KL term).
      The prior's parameters are named in the first paragraph (all floats).
"""

    def __init__(self, scale_factor=1.0):
        self.scale_factor = scale_factor

    def __call__(self, x):
        if not isinstance(x, RandomVariable):
            raise TypeError(
                f"{type(self).__name__} takes the weight's RandomVariable (a distribution "
                f"initializer's output), got {type(x).__name__}. Deterministic weights take Keras "
                "regularizers such as 'l2'."
            )
        divergence = self.divergence(x)
        return tf.cast(self.scale_factor, divergence.dtype) * divergence

    def divergence(self, rv):
        raise NotImplementedError  # abstract; intentional

    def _monte_carlo(self, rv, prior_log_prob):
        """`log q(w) - log p(w)` summed over all entries, at the variable's value."""
        value = rv.value
        log_q = rv.distribution.log_prob(value)
        return tf.reduce_sum(log_q) - tf.reduce_sum(prior_log_prob(value))

    def get_config(self):
        return {"scale_factor": self.scale_factor}


@_register("normal_kl_divergence")
class NormalKLDivergence(DistributionRegularizer):
    """`KL[q || N(mean, stddev^2)]` summed over entries; analytic for a Normal q,

    `sum log(s_p / s_q) + (s_q^2 + (m_q - m_p)^2) / (2 s_p^2) - 1/2`,
    and Monte Carlo for any other q. The default prior N(0, 1) is the paper's default.
    """

    def __init__(self, mean=0.0, stddev=1.0, scale_factor=1.0):
        super().__init__(scale_factor)
        if not stddev > 0:
            raise ValueError(f"normal_kl_divergence needs stddev > 0, got {stddev}.")
        self.mean = float(mean)
        self.stddev = float(stddev)

    def divergence(self, rv):
        params = normal_parameters(rv.distribution)
        if params is None:
            prior = tfd.Normal(tf.cast(self.mean, rv.dtype), tf.cast(self.stddev, rv.dtype))
            return self._monte_carlo(rv, prior.log_prob)
        loc, scale = params
        shape = rv.distribution.batch_shape.concatenate(rv.distribution.event_shape)
        if scale.shape != shape:
            scale = tf.broadcast_to(scale, shape)
        if loc.shape != shape:
            loc = tf.broadcast_to(loc, shape)
        return normal_kl_sum(loc, scale, self.mean, self.stddev)

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "stddev": self.stddev}


@_register("scale_mixture_kl_divergence")
class ScaleMixtureKLDivergence(DistributionRegularizer):
    """Monte Carlo `KL[q || p]` with Blundell et al.'s (2015) scale-mixture prior

    `p(w) = pi N(w; 0, stddev1^2) + (1 - pi) N(w; 0, stddev2^2)`, defaults pi=0.5,
    stddev1=1, stddev2=exp(-6) (their grid: stddev1 in e^{0,-1,-2}, stddev2 in e^{-6,-7,-8}).
    """

    def __init__(self, pi=0.5, stddev1=1.0, stddev2=_EXP_MINUS_6, scale_factor=1.0):
        super().__init__(scale_factor)
        if not 0.0 <= pi <= 1.0:
            raise ValueError(f"scale_mixture_kl_divergence needs 0 <= pi <= 1, got {pi}.")
        self.pi, self.stddev1, self.stddev2 = float(pi), float(stddev1), float(stddev2)

    def prior(self, dtype=tf.float32):
        return tfd.MixtureSameFamily(
            tfd.Categorical(probs=tf.constant([self.pi, 1.0 - self.pi], dtype)),
            tfd.Normal(
                loc=tf.zeros([2], dtype), scale=tf.constant([self.stddev1, self.stddev2], dtype)
            ),
        )

    def divergence(self, rv):
        return self._monte_carlo(rv, self.prior(rv.dtype).log_prob)

    def get_config(self):
        return {
            **super().get_config(),
            "pi": self.pi,
            "stddev1": self.stddev1,
            "stddev2": self.stddev2,
        }


@_register("log_uniform_kl_divergence")
class LogUniformKLDivergence(DistributionRegularizer):
    """`KL[N(m, s^2) || log-uniform]` of variational dropout, in Molchanov et al.'s (2017)
    approximation with `alpha = s^2 / m^2`:

    `-KL ~ k1 sigmoid(k2 + k3 log alpha) - 0.5 log1p(1 / alpha) - k1`,
    k1 = 0.63576, k2 = 1.87320, k3 = 1.48695. Requires a Normal q.
    """

    def divergence(self, rv):
        params = normal_parameters(rv.distribution)
        if params is None:
            raise ValueError(
                "log_uniform_kl_divergence needs a Normal weight distribution, got "
                f"{rv.distribution.name}."
            )
        loc, scale = params
        log_alpha = 2.0 * tf.math.log(scale) - tf.math.log(tf.square(loc) + 1e-16)
        log_alpha = tf.broadcast_to(log_alpha, rv.shape)
        k1, k2, k3 = 0.63576, 1.87320, 1.48695
        neg_kl = k1 * tf.sigmoid(k2 + k3 * log_alpha) - 0.5 * tf.math.softplus(-log_alpha) - k1
        return -tf.reduce_sum(neg_kl)


@_register("half_cauchy_kl_divergence")
class HalfCauchyKLDivergence(DistributionRegularizer):
    """Monte Carlo `KL[q || HalfCauchy(loc, scale)]`, for positive weights (horseshoe scales)."""

    def __init__(self, loc=0.0, scale=1.0, scale_factor=1.0):
        super().__init__(scale_factor)
        self.loc, self.scale = float(loc), float(scale)

    def divergence(self, rv):
        prior = tfd.HalfCauchy(tf.cast(self.loc, rv.dtype), tf.cast(self.scale, rv.dtype))
        return self._monte_carlo(rv, prior.log_prob)

    def get_config(self):
        return {**super().get_config(), "loc": self.loc, "scale": self.scale}


PRIOR = "prior"


@gin.configurable("prior", module="blayers.regularizers")
def prior(regularizer=None):
    """The default prior of every Bayesian layer family: the regularizer a layer gets for the
    name `'prior'`, its default `kernel_regularizer` (dense, convolutional, recurrent kernels,
    embeddings, attention projections). `None` is `normal_kl_divergence()`, the KL to N(0, 1).

    One gin binding swaps it everywhere (`configs/priors/*.gin`):

        prior.regularizer = @scale_mixture_kl_divergence()
    """
    return regularizer if regularizer is not None else NormalKLDivergence()


def get(identifier):
    """A regularizer from None, a name (`'prior'`: the configured default prior; a blayers or
    Keras regularizer name), a config dict, or an instance."""
    if identifier == PRIOR:
        return prior()
    return _REGISTRY.get(identifier)


serialize = _REGISTRY.serialize
deserialize = _REGISTRY.deserialize
