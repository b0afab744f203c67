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

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import constraints as constraints_lib
from blayers import fused
from blayers.random_variable import RandomVariable
from blayers.registry import ArgsDoc, Registry, configurable_function
from blayers.sampling import attached_normal_kl, flat_multivariate_normal, normal_parameters

tfd = tfp.distributions

__all__ = [
    "PRIOR",
    "RANK1_PRIOR",
    "CauchyKLDivergence",
    "DistributionPrior",
    "DistributionRegularizer",
    "HalfCauchyKLDivergence",
    "LogNormalKLDivergence",
    "LogUniformKLDivergence",
    "NormalEmpiricalBayesKLDivergence",
    "NormalKLDivergence",
    "NormalKLDivergenceWithTiedMean",
    "ScaleMixtureKLDivergence",
    "ScaledRegularizer",
    "TrainableNormalKLDivergenceStdDev",
    "UniformKLDivergence",
    "deserialize",
    "get",
    "normal_parameters",
    "prior",
    "rank1_prior",
    "serialize",
]

_REGISTRY = Registry("regularizer", "blayers.regularizers", keras.regularizers.get, "'l2'")
_register = _REGISTRY.register
_EXP_MINUS_6 = math.exp(-6.0)  # Blundell et al.'s narrow mixture component


def normal_kl_sum(loc, scale, prior_mean, prior_stddev):
    """`sum KL[N(loc, scale^2) || N(prior_mean, prior_stddev^2)]` with a hand-written gradient.

    `sum_i (r_i^2 - 1) / 2 - log r_i + (m_i - m_p)^2 / (2 s_p^2)`, `r = s / s_p`: each entry's
    KL (non-negative) summed, so no large sums cancel (a KL of zero stays zero in float32); its
    gradient, `d/dm = (m - m_p) / s_p^2` and `d/ds = s / s_p^2 - 1 / s`, takes three elementwise
    passes where autodiff of the expression takes about ten.
    """
    if fused.should_fuse(loc.shape, loc.dtype):
        return fused.normal_kl(loc, scale, prior_mean, prior_stddev)
    if not tf.executing_eagerly():  # traced once a shape and prior (`sampling._traced_normal`)
        return _traced_normal_kl_sum(loc, scale, prior_mean, prior_stddev)
    return _normal_kl_sum(loc, scale, prior_mean, prior_stddev)


def _normal_kl_sum(loc, scale, prior_mean, prior_stddev):
    inv_var = 1.0 / prior_stddev**2

    @tf.custom_gradient
    def kl(loc, scale):
        centred = loc - prior_mean if prior_mean else loc
        ratio = scale / prior_stddev
        # `l2_loss` is `sum x^2 / 2` in one pass (a dot product runs as a GEMM on a CPU).
        value = tf.reduce_sum(
            0.5 * (tf.square(ratio) - 1.0) - tf.math.log(ratio)
        ) + inv_var * tf.nn.l2_loss(centred)

        def grad(upstream):
            return upstream * inv_var * centred, upstream * (inv_var * scale - 1.0 / scale)

        return value, grad

    return kl(loc, scale)


_traced_normal_kl_sum = tf.function(_normal_kl_sum, autograph=False)


def normal_kl_prior(regularizer):
    """`(mean, stddev)` where `regularizer` is the analytic KL against a fixed Normal prior
    (`NormalKLDivergence`, not a subclass), else None: a trainable Normal weight then forms its
    parameters and that KL in one fused pass (`blayers.initializers.TrainableNormal`)."""
    if type(regularizer) is NormalKLDivergence:
        return (regularizer.mean, regularizer.stddev)
    return None


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
        # Formed by a trainable Normal q with its parameters (`normal_kl_prior`), if it was.
        attached = attached_normal_kl(rv.distribution, (self.mean, self.stddev))
        if attached is not None:
            return attached
        params = normal_parameters(rv.distribution)
        if params is None:
            mean, stddev = tf.cast(self.mean, rv.dtype), tf.cast(self.stddev, rv.dtype)
            flat = flat_multivariate_normal(rv.distribution)
            if flat is not None:  # a full-covariance q: analytic against the isotropic prior
                ones = tf.ones(flat.event_shape, rv.dtype)
                return tfd.kl_divergence(
                    flat, tfd.MultivariateNormalDiag(mean * ones, stddev * ones)
                )
            return self._monte_carlo(rv, tfd.Normal(mean, stddev).log_prob)
        loc, scale = params
        shape = rv.distribution.batch_shape.concatenate(rv.distribution.event_shape)
        if scale.shape != shape:
            scale = tf.broadcast_to(scale, shape)
        if loc.shape != shape:
            loc = tf.broadcast_to(loc, shape)
        return normal_kl_sum(loc, scale, self.mean, self.stddev)

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "stddev": self.stddev}


@_register("normal_kl_divergence_with_tied_mean")
class NormalKLDivergenceWithTiedMean(DistributionRegularizer):
    """`KL[q || N(m_q, stddev^2)]`: the prior's mean tied to the posterior's (edward2's
    regularizer of that name), so only the spread is penalized; analytic for a Normal q,

    `sum log(stddev / s_q) + s_q^2 / (2 stddev^2) - 1/2`,
    and Monte Carlo against `N(mean(q), stddev^2)` for any other q.
    """

    def __init__(self, stddev=1.0, scale_factor=1.0):
        super().__init__(scale_factor)
        if not stddev > 0:
            raise ValueError(f"normal_kl_divergence_with_tied_mean needs stddev > 0, got {stddev}.")
        self.stddev = float(stddev)

    def divergence(self, rv):
        params = normal_parameters(rv.distribution)
        if params is None:
            mean = rv.distribution.mean()
            prior = tfd.Normal(mean, tf.cast(self.stddev, rv.dtype))
            return self._monte_carlo(rv, prior.log_prob)
        _, scale = params
        shape = rv.distribution.batch_shape.concatenate(rv.distribution.event_shape)
        if scale.shape != shape:
            scale = tf.broadcast_to(scale, shape)
        return normal_kl_sum(tf.zeros_like(scale), scale, 0.0, self.stddev)

    def get_config(self):
        return {**super().get_config(), "stddev": self.stddev}


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


@_register("cauchy_kl_divergence")
class CauchyKLDivergence(DistributionRegularizer):
    """Monte Carlo `KL[q || Cauchy(loc, scale)]` (heavy-tailed prior on real weights)."""

    def __init__(self, loc=0.0, scale=1.0, scale_factor=1.0):
        super().__init__(scale_factor)
        if not scale > 0:
            raise ValueError(f"cauchy_kl_divergence needs scale > 0, got {scale}.")
        self.loc, self.scale = float(loc), float(scale)

    def divergence(self, rv):
        prior = tfd.Cauchy(tf.cast(self.loc, rv.dtype), tf.cast(self.scale, rv.dtype))
        return self._monte_carlo(rv, prior.log_prob)

    def get_config(self):
        return {**super().get_config(), "loc": self.loc, "scale": self.scale}


def _log_normal_parameters(distribution):
    while isinstance(distribution, tfd.Independent):
        distribution = distribution.distribution
    if type(distribution) is tfd.LogNormal:
        return distribution.loc, distribution.scale
    return None


@_register("log_normal_kl_divergence")
class LogNormalKLDivergence(DistributionRegularizer):
    """`KL[q || LogNormal(loc, scale)]` for positive weights (scales, precisions). For a
    LogNormal q it is the KL of the underlying Normals (KL is invariant under the bijection
    `exp`), analytic; Monte Carlo for any other q."""

    def __init__(self, loc=0.0, scale=1.0, scale_factor=1.0):
        super().__init__(scale_factor)
        if not scale > 0:
            raise ValueError(f"log_normal_kl_divergence needs scale > 0, got {scale}.")
        self.loc, self.scale = float(loc), float(scale)

    def divergence(self, rv):
        params = _log_normal_parameters(rv.distribution)
        if params is None:
            prior = tfd.LogNormal(tf.cast(self.loc, rv.dtype), tf.cast(self.scale, rv.dtype))
            return self._monte_carlo(rv, prior.log_prob)
        loc, scale = (tf.broadcast_to(p, rv.shape) for p in params)
        return normal_kl_sum(loc, scale, self.loc, self.scale)

    def get_config(self):
        return {**super().get_config(), "loc": self.loc, "scale": self.scale}


@_register("uniform_kl_divergence")
class UniformKLDivergence(DistributionRegularizer):
    """`KL[q || Uniform(low, high)] = -H[q] + n log(high - low)` (n entries), exact when q's
    support lies in `[low, high]` (a sigmoid- or tanh-squashed q); for a q with wider support,
    such as a Normal, it is the KL to the improper flat prior up to a constant, as in edward2
    (whose constant is 0: `low=0, high=1`). Uses q's analytic entropy where TFP has one."""

    def __init__(self, low=0.0, high=1.0, scale_factor=1.0):
        super().__init__(scale_factor)
        if not high > low:
            raise ValueError(f"uniform_kl_divergence needs high > low, got [{low}, {high}].")
        self.low, self.high = float(low), float(high)

    def divergence(self, rv):
        size = float(rv.shape.num_elements())
        try:
            entropy = tf.reduce_sum(rv.distribution.entropy())
        except NotImplementedError:
            entropy = -tf.reduce_sum(rv.distribution.log_prob(rv.value))
        return size * math.log(self.high - self.low) - entropy

    def get_config(self):
        return {**super().get_config(), "low": self.low, "high": self.high}


@_register("normal_empirical_bayes_kl_divergence")
class NormalEmpiricalBayesKLDivergence(DistributionRegularizer):
    """Normal prior whose variance is set by empirical Bayes under an inverse-gamma hyperprior
    (Wu et al., 2019): `p(v) = InvGamma(variance_concentration, variance_scale)`,
    `p(w_i | v) = N(mean, v)`.

    The regularizer is `KL[q(w) || N(mean, v*)] - log p(v*)` at the optimal variance
    `v* = (sum_i (s_i^2 + (m_i - mean)^2) + 2 b) / (n + 2 a + 2)` (`a`, `b`: the concentration
    and scale), the minimizer of that expression given q (closed form for a Normal q; other q
    use TFP's moments).
    """

    def __init__(
        self, mean=0.0, variance_concentration=2.01, variance_scale=0.101, scale_factor=1.0
    ):
        super().__init__(scale_factor)
        if not (variance_concentration > 0 and variance_scale > 0):
            raise ValueError(
                "normal_empirical_bayes_kl_divergence needs a positive variance_concentration "
                f"and variance_scale, got {variance_concentration} and {variance_scale}."
            )
        self.mean = float(mean)
        self.variance_concentration = float(variance_concentration)
        self.variance_scale = float(variance_scale)

    def optimal_variance(self, rv):
        """`v*` for the variable's current q."""
        params = normal_parameters(rv.distribution)
        if params is None:
            loc, variance = rv.distribution.mean(), rv.distribution.variance()
        else:
            loc, variance = params[0], tf.square(params[1])
        loc = tf.broadcast_to(loc, rv.shape)
        variance = tf.broadcast_to(variance, rv.shape)
        n = float(rv.shape.num_elements())
        second = tf.reduce_sum(variance) + tf.reduce_sum(tf.square(loc - self.mean))
        return (second + 2.0 * self.variance_scale) / (n + 2.0 * self.variance_concentration + 2.0)

    def divergence(self, rv):
        variance = self.optimal_variance(rv)
        prior = tfd.Normal(tf.cast(self.mean, rv.dtype), tf.sqrt(variance))
        hyperprior = tfd.InverseGamma(
            tf.cast(self.variance_concentration, rv.dtype), tf.cast(self.variance_scale, rv.dtype)
        )
        params = normal_parameters(rv.distribution)
        if params is None:
            kl = self._monte_carlo(rv, prior.log_prob)
        else:
            loc, scale = (tf.broadcast_to(p, rv.shape) for p in params)
            kl = tf.reduce_sum(tfd.Normal(loc, scale).kl_divergence(prior))
        return kl - hyperprior.log_prob(variance)

    def get_config(self):
        return {
            **super().get_config(),
            "mean": self.mean,
            "variance_concentration": self.variance_concentration,
            "variance_scale": self.variance_scale,
        }


@_register("trainable_normal_kl_divergence_stddev")
class TrainableNormalKLDivergenceStdDev(DistributionRegularizer, keras.layers.Layer):
    """`KL[q || N(mean, sigma^2)]` with the prior's standard deviation `sigma` trained with the
    network (type-II maximum likelihood of the prior scale, one `sigma` per weight tensor, or
    per entry with `per_entry=True`).

    It is a Keras layer: the layer whose weight it regularizes tracks it, so `sigma` trains,
    saves and loads with that layer (`BayesianLayer` builds it with the weight). Analytic for a
    Normal q, Monte Carlo otherwise.

    Args:
      mean: the prior's mean.
      stddev_initializer: Keras initializer of the unconstrained `sigma` (default: softplus^-1
        of 1 with a little noise, as in edward2).
      stddev_constraint: maps the variable to `sigma` (default softplus).
      per_entry: one `sigma` per entry of the weight instead of one per tensor.
      scale_factor: multiplies the divergence.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        mean=0.0,
        stddev_initializer=None,
        stddev_constraint="softplus",
        per_entry=False,
        scale_factor=1.0,
        **kwargs,
    ):
        keras.layers.Layer.__init__(self, **kwargs)
        self.scale_factor = scale_factor
        self.mean = float(mean)
        self.stddev_initializer = keras.initializers.get(
            stddev_initializer
            or keras.initializers.TruncatedNormal(mean=0.5413248, stddev=0.1)  # softplus^-1(1)
        )
        self.stddev_constraint = constraints_lib.get(stddev_constraint)
        self.per_entry = per_entry

    def build(self, input_shape):
        self.stddev = self.add_weight(
            name="prior_stddev",
            shape=tuple(input_shape) if self.per_entry else (),
            initializer=self.stddev_initializer,
        )
        self.built = True

    def prior_stddev(self):
        """The prior's current `sigma`."""
        stddev = tf.convert_to_tensor(self.stddev)
        return self.stddev_constraint(stddev) if self.stddev_constraint else stddev

    def __call__(self, x):  # a regularizer's call, not Keras' layer call
        return DistributionRegularizer.__call__(self, x)

    def divergence(self, rv):
        if not self.built:
            self.build(rv.shape)
        stddev = tf.cast(self.prior_stddev(), rv.dtype)
        prior = tfd.Normal(tf.cast(self.mean, rv.dtype), stddev)
        params = normal_parameters(rv.distribution)
        if params is None:
            return self._monte_carlo(rv, prior.log_prob)
        loc, scale = (tf.broadcast_to(p, rv.shape) for p in params)
        return tf.reduce_sum(tfd.Normal(loc, scale).kl_divergence(prior))

    def get_config(self):
        return {
            "mean": self.mean,
            "stddev_initializer": keras.initializers.serialize(self.stddev_initializer),
            "stddev_constraint": _REGISTRY.serialize(self.stddev_constraint),
            "per_entry": self.per_entry,
            "scale_factor": self.scale_factor,
        }


@_register("scaled_regularizer")
class ScaledRegularizer(DistributionRegularizer):
    """`scale_factor * regularizer(rv)` for any callable `regularizer` of a weight's random
    variable (an edward2-style `kernel_regularizer=lambda rv: ...`), so that its KL can be put
    on the per-example scale like the named regularizers' (`blayers.set_kl_scale` wraps such
    callables in it).

    Args:
      regularizer: a callable `fn(rv) -> scalar` (Keras-serializable to save the model).
      scale_factor: multiplies it.
    """

    def __init__(self, regularizer, scale_factor=1.0):
        super().__init__(scale_factor)
        if isinstance(regularizer, dict):
            regularizer = keras.saving.deserialize_keras_object(regularizer)
        if not callable(regularizer):
            raise TypeError(f"ScaledRegularizer needs a callable, got {regularizer!r}.")
        self.regularizer = regularizer

    def divergence(self, rv):
        return tf.convert_to_tensor(self.regularizer(rv), rv.dtype)

    def get_config(self):
        return {
            "regularizer": keras.saving.serialize_keras_object(self.regularizer),
            "scale_factor": self.scale_factor,
        }


@tfd.RegisterKL(tfd.Independent, tfd.Distribution)
def _kl_independent_to_scalar(q, p, name=None):
    """`KL[Independent(q_i) || p]` for a scalar (or batch-broadcast) `p` read as i.i.d. over
    the reinterpreted dimensions: `sum_i KL[q_i || p]`. It lets `tfd.kl_divergence(rv.distribution,
    tfd.Normal(0., 1.))` work on a weight's mean-field q, as `tfp.layers`' `kernel_divergence_fn`
    users write it (TFP registers only Independent against Independent)."""
    del name
    if p.event_shape.rank != 0 or q.distribution.event_shape.rank != 0:
        raise NotImplementedError(
            f"No KL divergence from {type(q).__name__} to {type(p).__name__} with event shape "
            f"{p.event_shape}: only a scalar prior is read as i.i.d. over the entries."
        )
    kl = tfd.kl_divergence(q.distribution, p)
    kl = tf.broadcast_to(
        kl, tf.broadcast_dynamic_shape(tf.shape(kl), q.distribution.batch_shape_tensor())
    )
    ndims = tf.get_static_value(q.reinterpreted_batch_ndims)
    return tf.reduce_sum(kl, axis=list(range(-int(ndims), 0))) if ndims else kl


def _distribution_config(distribution):
    """A distribution as `{'class_name', 'parameters'}` of plain values (nested distributions
    included), or a `ValueError` naming what cannot be saved."""
    parameters = {}
    for key, value in distribution.parameters.items():
        if value is None or isinstance(value, (bool, int, float, str)):
            parameters[key] = value
        elif isinstance(value, tfd.Distribution):
            parameters[key] = _distribution_config(value)
        elif tf.is_tensor(value) or hasattr(value, "__array__"):
            array = tf.convert_to_tensor(value).numpy()
            parameters[key] = {"array": array.tolist(), "dtype": array.dtype.name}
        else:
            raise ValueError(
                f"DistributionPrior: parameter {key!r} of {type(distribution).__name__} "
                f"({type(value).__name__}) cannot be saved; give the prior as "
                "prior_fn(shape, dtype) instead."
            )
    return {"class_name": type(distribution).__name__, "parameters": parameters}


def _distribution_from_config(config):
    parameters = {}
    for key, value in config["parameters"].items():
        if isinstance(value, dict) and "class_name" in value:
            value = _distribution_from_config(value)
        elif isinstance(value, dict) and "array" in value:
            value = tf.constant(value["array"], value["dtype"])
        parameters[key] = value
    return getattr(tfd, config["class_name"])(**parameters)


@_register("distribution_prior")
class DistributionPrior(DistributionRegularizer, keras.layers.Layer):
    """`KL[q || p]` for a prior `p` given as a `tfp.distributions.Distribution`, or made by
    `prior_fn(shape, dtype) -> Distribution` when the layer builds the weight (the way
    `tfp.layers.DenseVariational`'s `make_prior_fn` works).

    `p` may be scalar (i.i.d. over the entries, e.g. `tfd.Laplace(0., 1.)`), have the weight's
    shape as its batch shape or as its event shape, or be a distribution over the flattened
    weight (e.g. a `MultivariateNormalTriL` of size `kernel.size`). The KL is analytic where TFP
    knows it (and for a scalar prior against a mean-field q, summed over entries) and Monte
    Carlo, `log q(w) - log p(w)` at the weight's draw, otherwise.

    Variables `prior_fn` creates (`tf.Variable`, `tfp.util.TransformedVariable`) become this
    layer's Keras weights: they train with the network (empirical Bayes) and save and load with
    the model. A fixed distribution is saved by its class and parameters; `prior_fn` is saved as
    a Keras-serializable function (`keras.saving.register_keras_serializable`).

    Args:
      distribution: a fixed prior (a `tfd.Distribution` without variables).
      prior_fn: `fn(shape, dtype) -> tfd.Distribution`, called once when the weight is built.
      scale_factor: multiplies the divergence.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, distribution=None, prior_fn=None, scale_factor=1.0, **kwargs):
        keras.layers.Layer.__init__(self, **kwargs)
        self.scale_factor = scale_factor
        if isinstance(distribution, dict):
            distribution = _distribution_from_config(distribution)
        if isinstance(prior_fn, dict):
            prior_fn = keras.saving.deserialize_keras_object(prior_fn)
        if (distribution is None) == (prior_fn is None):
            raise ValueError("DistributionPrior takes one of distribution and prior_fn.")
        if distribution is not None:
            if not isinstance(distribution, tfd.Distribution):
                raise TypeError(
                    f"DistributionPrior: distribution must be a tfp.distributions.Distribution, "
                    f"got {type(distribution).__name__}."
                )
            if distribution.trainable_variables:
                raise ValueError(
                    "DistributionPrior: the prior holds variables that Keras cannot track; "
                    "create them in prior_fn(shape, dtype) so that they are the layer's weights."
                )
        elif not callable(prior_fn):
            raise TypeError(f"DistributionPrior: prior_fn must be callable, got {prior_fn!r}.")
        self.distribution, self.prior_fn = distribution, prior_fn
        self.prior = distribution
        self._making_weight = False

    def build(self, input_shape):
        if self.prior_fn is not None:
            self.prior = self._call_prior_fn(tuple(int(d) for d in input_shape))
            if not isinstance(self.prior, tfd.Distribution):
                raise TypeError(
                    f"DistributionPrior: prior_fn returned {type(self.prior).__name__}, not a "
                    "tfp.distributions.Distribution."
                )
        self.built = True

    def _call_prior_fn(self, shape):
        """`prior_fn(shape, dtype)`, each `tf.Variable` it creates made a Keras weight of this
        layer (the distribution holds the weight's own `tf.Variable`)."""

        def creator(next_creator, **kwargs):
            if self._making_weight:  # the Keras weight's own variable
                return next_creator(**kwargs)
            initial = kwargs["initial_value"]
            initial = tf.convert_to_tensor(initial() if callable(initial) else initial)
            self._making_weight = True
            try:
                weight = self.add_weight(
                    name=(kwargs.get("name") or "prior").split(":")[0],
                    shape=tuple(initial.shape),
                    dtype=kwargs.get("dtype") or initial.dtype,
                    initializer=lambda shape, dtype=None: tf.cast(initial, dtype),
                    trainable=kwargs.get("trainable") is not False,  # None means trainable
                )
            finally:
                self._making_weight = False
            return weight.value

        with tf.variable_creator_scope(creator):
            return self.prior_fn(shape, self.variable_dtype)

    def __call__(self, x):  # a regularizer's call, not Keras' layer call
        return DistributionRegularizer.__call__(self, x)

    def divergence(self, rv):
        if not self.built:
            self.build(rv.shape)
        prior, q, shape = self.prior, rv.distribution, rv.shape
        event = prior.event_shape
        if event.rank == 0:
            try:
                kl = tfd.kl_divergence(q, prior)
                return tf.reduce_sum(tf.cast(kl, rv.dtype))
            except NotImplementedError:
                return self._monte_carlo(
                    rv, lambda w: tf.broadcast_to(prior.log_prob(w), tf.shape(w))
                )
        if event == shape:
            try:
                return tf.reduce_sum(tfd.kl_divergence(q, prior))
            except NotImplementedError:
                return self._monte_carlo(rv, prior.log_prob)
        if event.rank == 1 and event[0] == shape.num_elements():
            flat = flat_multivariate_normal(q, diagonal=True)
            if flat is not None:
                try:
                    return tf.reduce_sum(tfd.kl_divergence(flat, prior))
                except NotImplementedError:
                    pass
            return self._monte_carlo(rv, lambda w: prior.log_prob(tf.reshape(w, [-1])))
        raise ValueError(
            f"DistributionPrior: a prior of batch shape {prior.batch_shape} and event shape "
            f"{event} does not fit a weight of shape {shape}: give a scalar prior, one with the "
            "weight's shape, or one over its flattened entries."
        )

    def get_config(self):
        config = {"scale_factor": self.scale_factor, "name": self.name}
        if self.prior_fn is not None:
            config["prior_fn"] = keras.saving.serialize_keras_object(self.prior_fn)
        else:
            config["distribution"] = _distribution_config(self.distribution)
        return config


PRIOR = "prior"
RANK1_PRIOR = "rank1_prior"


@configurable_function("prior", "blayers.regularizers")
def prior(regularizer=None):
    """The default prior of every Bayesian layer family: the regularizer a layer gets for the
    name `'prior'`, its default `kernel_regularizer` (dense, convolutional, recurrent kernels,
    embeddings, attention projections). `None` is `normal_kl_divergence()`, the KL to N(0, 1).

    One gin binding swaps it everywhere (`configs/priors/*.gin`):

        prior.regularizer = @scale_mixture_kl_divergence()
    """
    return regularizer if regularizer is not None else NormalKLDivergence()


@configurable_function("rank1_prior", "blayers.regularizers")
def rank1_prior(regularizer=None):
    """The default prior of rank-1 factors (`DenseRank1`'s `alpha` and `gamma`), the regularizer
    for the name `'rank1_prior'`. `None` is `normal_kl_divergence(mean=1, stddev=1)`: centred on
    the identity perturbation (Dusenberry et al., 2020). One binding swaps it:

        rank1_prior.regularizer = @normal_kl_divergence()
        normal_kl_divergence.mean = 1.0
        normal_kl_divergence.stddev = 0.1
    """
    return regularizer if regularizer is not None else NormalKLDivergence(mean=1.0, stddev=1.0)


def get(identifier):
    """A regularizer from None, a name (`'prior'`: the configured default prior; `'rank1_prior'`
    the rank-1 factors'; a blayers or Keras regularizer name), a config dict, an instance, or a
    `tfp.distributions.Distribution` (the prior of a `DistributionPrior`); `''` is None, as
    in edward2 (a gin binding that turns a regularizer off)."""
    if isinstance(identifier, str) and not identifier:
        return None
    if isinstance(identifier, tfd.Distribution):
        return DistributionPrior(identifier)
    if identifier == PRIOR:
        return prior()
    if identifier == RANK1_PRIOR:
        return rank1_prior()
    return _REGISTRY.get(identifier)


serialize = _REGISTRY.serialize
deserialize = _REGISTRY.deserialize
