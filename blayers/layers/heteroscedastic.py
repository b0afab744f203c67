"""Heteroscedastic classification output layers (Collier et al., 2021).

Input-dependent label noise on the logits: `u = mu(x) + V(x) eps_K + d(x) * eps_C`, a Gaussian
with a low-rank-plus-diagonal covariance `V V^T + diag(d^2)` per example (`K` factors), and the
predictive `p(y | x) = E_u[softmax(u / T)]` (`MCSoftmaxDenseFA`) or, for binary and multilabel
outputs, `E_u[sigmoid(u / T)]` (`MCSigmoidDenseFA`), estimated with `num_mc_samples` draws. With
a diagonal covariance the binary predictive is exact, `P(u > 0) = F(mu / d)` for the noise's CDF
`F` (`ExactSigmoidDense`, no sampling).

Each layer returns logits of its predictive: `log p(y | x)` for the softmax layers (a
Categorical likelihood, Keras' `from_logits=True` losses), `log p - log(1 - p)` for the sigmoid
layers (a Bernoulli likelihood, `sigmoid_cross_entropy_with_logits`); training maximizes the (MC
estimate of the) marginal likelihood, as in the paper. With `logits_only=False` they return
edward2's tuple `(logits, log_probs, probs, variance)` instead (edward2's default; a Keras layer
that returns one tensor fits `Sequential` and the trainers). Every edward2 argument is here:
separate training and test sample counts, a tuned temperature, the parameter-efficient factors,
the per-class predictive variance, the per-draw logits.
"""

import types

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.layers.base import NestedLayers, SeededLayer, register
from blayers.sampling import standard_normal

tfd = tfp.distributions

__all__ = [
    "EnsembleHeteroscedasticOutputs",
    "ExactSigmoidDense",
    "HeteroscedasticSNGPLayer",
    "MCOutputLayer",
    "MCSigmoidDenseFA",
    "MCSoftmaxDense",
    "MCSoftmaxDenseFA",
    "MCSoftmaxDenseFACustomLayers",
    "MCSoftmaxDenseFASegmentation",
    "MultiHeadMCSoftmaxDenseFA",
    "compute_temperature",
]


TEMPERATURE_LOWER_BOUND = 0.3
TEMPERATURE_UPPER_BOUND = 3.0
MIN_SCALE_MONTE_CARLO = 1e-3

_NOISES = {tfd.Normal: "normal", tfd.Logistic: "logistic", tfd.Gumbel: "gumbel"}


def compute_temperature(pre_sigmoid_temperature, lower=None, upper=None):
    """A tuned temperature in `(lower, upper)`: `lower + (upper - lower) sigmoid(t)` (edward2's
    parametrization; bounds default to `0.3` and `3.0`)."""
    lower = TEMPERATURE_LOWER_BOUND if lower is None else lower
    upper = TEMPERATURE_UPPER_BOUND if upper is None else upper
    return (upper - lower) * tf.math.sigmoid(pre_sigmoid_temperature) + lower


def _standard_noise(kind, shape, seed, dtype):
    """Standard location-scale noise by its inverse CDF (normal: exact Box-Muller)."""
    if kind == "normal":
        return standard_normal(shape, seed, dtype)
    tiny = np.finfo(dtype.as_numpy_dtype).tiny
    u = tf.random.stateless_uniform(shape, seed, minval=tiny, maxval=1.0, dtype=dtype)
    if kind == "logistic":
        return tf.math.log(u) - tf.math.log1p(-u)
    return -tf.math.log(-tf.math.log(u))  # gumbel


def _log_mean(log_values):
    """`log mean_s exp(log_values[s])` over the first axis, stably."""
    count = tf.cast(tf.shape(log_values)[0], log_values.dtype)
    return tf.reduce_logsumexp(log_values, axis=0) - tf.math.log(count)


def _positive_int(name, argument, value, low):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}: {argument} must be an integer >= {low}, got {value!r}.")
    return int(value)


class MCOutputLayer(SeededLayer):
    """Base of the Monte Carlo heteroscedastic outputs (Collier et al., 2021): logits
    `u = mu(x) + noise(x)` drawn `S` times, the predictive `p = mean_s softmax(u_s / T)` (or
    the sigmoid, `binary`), returned as logits. Subclasses give `noise_distribution(x)`, the
    `(loc [..., C], factors [..., C, K] or None, diag [..., C])` of the noise.

    Args:
      temperature: the softmax (sigmoid) temperature `T` (smaller: closer to the argmax).
      num_mc_samples: Monte Carlo draws per example, in training and prediction alike.
      train_mc_samples, test_mc_samples: edward2's separate counts (None: `num_mc_samples`).
      compute_pred_variance: also estimate `Var_s[p_s]`, each class's variance of the sampled
        probabilities (the fourth element of the tuple output).
      share_samples_across_batch: one noise draw for every example of the batch (the
        examples' noises stay independent of their parameters, only the standard draws are
        shared; saves drawing `B` times).
      logits_only: return the logits alone (default, a Keras layer's one tensor); False:
        edward2's tuple `(logits, log_probs, probs, variance)` (`variance` None unless
        `compute_pred_variance`).
      eps: the floor of the tuple's probabilities (`[eps, 1]`, `[eps, 1 - eps]` for sigmoid).
      return_unaveraged_logits: also return the per-draw logits `[B, S, ..., C]`: the tuple
        `(logits, unaveraged)`, or `(logits, unaveraged, log_probs, probs, variance)`.
      tune_temperature: learn `T` in `(temperature_lower_bound, temperature_upper_bound)`
        (defaults 0.3 and 3.0) as `compute_temperature(pre_sigmoid_temperature, ...)`,
        starting at the interval's midpoint.
      kernel_regularizer, bias_regularizer: of the layer's `Dense` maps.
      seed: seeds the draws (a call's `seed=` fixes that call's draw).
      **kwargs: `keras.layers.Layer` arguments.
    """

    binary = False
    noise = "normal"

    def __init__(
        self,
        temperature=1.0,
        num_mc_samples=1000,
        train_mc_samples=None,
        test_mc_samples=None,
        compute_pred_variance=False,
        share_samples_across_batch=False,
        logits_only=True,
        eps=1e-7,
        return_unaveraged_logits=False,
        tune_temperature=False,
        temperature_lower_bound=None,
        temperature_upper_bound=None,
        kernel_regularizer=None,
        bias_regularizer=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"{type(self).__name__} ({self.name})"
        self.num_mc_samples = _positive_int(name, "num_mc_samples", num_mc_samples, 1)
        self.train_mc_samples = _positive_int(
            name, "train_mc_samples", train_mc_samples or self.num_mc_samples, 1
        )
        self.test_mc_samples = _positive_int(
            name, "test_mc_samples", test_mc_samples or self.num_mc_samples, 1
        )
        if not temperature > 0:
            raise ValueError(f"{name}: temperature must be > 0, got {temperature}.")
        if not 0 < eps < 0.5:
            raise ValueError(f"{name}: eps must be in (0, 0.5), got {eps}.")
        self.temperature, self.eps = float(temperature), float(eps)
        self.compute_pred_variance = bool(compute_pred_variance)
        self.share_samples_across_batch = bool(share_samples_across_batch)
        self.logits_only = bool(logits_only)
        self.return_unaveraged_logits = bool(return_unaveraged_logits)
        self.tune_temperature = bool(tune_temperature)
        self.temperature_lower_bound = temperature_lower_bound
        self.temperature_upper_bound = temperature_upper_bound
        if tune_temperature:
            lower = (
                TEMPERATURE_LOWER_BOUND
                if temperature_lower_bound is None
                else float(temperature_lower_bound)
            )
            upper = (
                TEMPERATURE_UPPER_BOUND
                if temperature_upper_bound is None
                else float(temperature_upper_bound)
            )
            if not 0 < lower < upper:
                raise ValueError(
                    f"{name}: the tuned temperature's bounds must satisfy 0 < lower < upper, "
                    f"got ({lower}, {upper})."
                )
            # Zero starts at the interval's midpoint.
            self.pre_sigmoid_temperature = self.add_weight(
                name="pre_sigmoid_temperature", shape=(), initializer="zeros"
            )
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)

    def _dense(self, units, name, activation=None, use_bias=True):
        return keras.layers.Dense(
            units,
            activation=activation,
            use_bias=use_bias,
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer if use_bias else None,
            name=name,
            dtype=self.dtype_policy,
        )

    def current_temperature(self):
        """`T`: the fixed temperature, or the tuned one."""
        if not self.tune_temperature:
            return self.temperature
        return compute_temperature(
            self.pre_sigmoid_temperature,
            self.temperature_lower_bound,
            self.temperature_upper_bound,
        )

    def noise_distribution(self, inputs, training=None):
        raise NotImplementedError

    def noisy_logits(self, inputs, training=None, seed=None):
        """`[S, ..., C]` draws of `u / T` (`S` the training or test sample count)."""
        loc, factors, diag = self.noise_distribution(inputs, training=training)
        samples = self.train_mc_samples if training else self.test_mc_samples
        return self._draw(loc, factors, diag, samples, seed)

    def _draw(self, loc, factors, diag, samples=None, seed=None):
        samples = self.test_mc_samples if samples is None else samples
        if seed is None:
            seed = self.next_seed()
        else:
            seed = tf.stack([tf.cast(seed, tf.int32), tf.constant(0, tf.int32)])
        seed_c, seed_k = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        shape = tf.shape(diag)
        if self.share_samples_across_batch:
            shape = tf.tensor_scatter_nd_update(shape, [[0]], [1])
        noise = diag * _standard_noise(
            self.noise, tf.concat([[samples], shape], 0), seed_c, loc.dtype
        )
        if factors is not None:
            lead, classes, k = tf.shape(diag)[:-1], tf.shape(factors)[-2], tf.shape(factors)[-1]
            eps = standard_normal(tf.concat([[samples], shape[:-1], [k]], 0), seed_k, loc.dtype)
            eps = tf.broadcast_to(eps, tf.concat([[samples], lead, [k]], 0))
            flat = tf.einsum(
                "nck,snk->snc",
                tf.reshape(factors, [-1, classes, k]),
                tf.reshape(eps, [samples, -1, k]),
            )
            noise += tf.reshape(flat, tf.concat([[samples], lead, [classes]], 0))
        temperature = tf.cast(self.current_temperature(), loc.dtype)
        return (loc + noise) / temperature

    def call(self, inputs, training=None, seed=None):
        return self._outputs(self.noisy_logits(inputs, training=training, seed=seed))

    def _outputs(self, u, transform=None):
        """The layer's output from the draws `u` `[S, ..., C]`; `transform` reshapes each."""
        if self.binary:
            log_p = _log_mean(tf.math.log_sigmoid(u))
            logits = log_p - _log_mean(tf.math.log_sigmoid(-u))
        else:
            log_p = _log_mean(tf.nn.log_softmax(u, axis=-1))
            logits = log_p
        transform = transform or (lambda t: t)
        if self.logits_only and not self.return_unaveraged_logits:
            return transform(logits)
        high = 1.0 - self.eps if self.binary else 1.0
        probs = tf.clip_by_value(tf.exp(log_p), self.eps, high)
        variance = None
        if self.compute_pred_variance:
            sampled = tf.sigmoid(u) if self.binary else tf.nn.softmax(u, axis=-1)
            variance = transform(tf.reduce_mean(tf.square(sampled - probs), axis=0))
        outputs = (transform(logits), transform(tf.math.log(probs)), transform(probs), variance)
        if not self.return_unaveraged_logits:
            return outputs
        per_draw = u if self.binary else tf.nn.log_softmax(u, axis=-1)
        unaveraged = tf.experimental.numpy.moveaxis(per_draw, 0, 1)  # [B, S, ..., C]
        if self.logits_only:
            return outputs[0], unaveraged
        return (outputs[0], unaveraged) + outputs[1:]

    def get_config(self):
        return {
            **super().get_config(),
            "temperature": self.temperature,
            "num_mc_samples": self.num_mc_samples,
            "train_mc_samples": self.train_mc_samples,
            "test_mc_samples": self.test_mc_samples,
            "compute_pred_variance": self.compute_pred_variance,
            "share_samples_across_batch": self.share_samples_across_batch,
            "logits_only": self.logits_only,
            "eps": self.eps,
            "return_unaveraged_logits": self.return_unaveraged_logits,
            "tune_temperature": self.tune_temperature,
            "temperature_lower_bound": self.temperature_lower_bound,
            "temperature_upper_bound": self.temperature_upper_bound,
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
        }


@register
class MCSoftmaxDense(MCOutputLayer):
    """Heteroscedastic softmax output with a diagonal noise (Collier et al., 2020; edward2's
        `MCSoftmaxDense`): `u = mu(x) + sigma(x) * eps`, `eps` standard normal, logistic or Gumbel,
        `p = E_eps[softmax(u / T)]`. With `num_classes=2`, as in edward2, one logit and the sigmoid:
        the output is the Bernoulli logits `log p - log(1 - p)` of shape `[..., 1]`.

        Args:
          num_classes: classes `C` (2: one sigmoid output).
          logit_noise: `'normal'` (default), `'logistic'` or `'gumbel'` (or the TFP classes).
    {base}
    """

    def __init__(self, num_classes, logit_noise="normal", **kwargs):
        super().__init__(**kwargs)
        name = f"MCSoftmaxDense ({self.name})"
        self.num_classes = _positive_int(name, "num_classes", num_classes, 2)
        logit_noise = _NOISES.get(logit_noise, logit_noise)
        if logit_noise not in ("normal", "logistic", "gumbel"):
            raise ValueError(
                f"{name}: logit_noise must be 'normal', 'logistic' or 'gumbel' (or the TFP "
                f"class), got {logit_noise!r}."
            )
        self.noise, self.binary = logit_noise, self.num_classes == 2
        outputs = 1 if self.binary else self.num_classes
        self.loc_layer = self._dense(outputs, "loc_layer")
        self.scale_layer = self._dense(outputs, "scale_layer", activation="softplus")

    def build(self, input_shape):
        self.loc_layer.build(input_shape)
        self.scale_layer.build(input_shape)

    def noise_distribution(self, inputs, training=None):
        """`(loc, None, scale)` of the noisy logits."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        return self.loc_layer(x), None, self.scale_layer(x) + MIN_SCALE_MONTE_CARLO

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (1 if self.binary else self.num_classes,)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "logit_noise": self.noise}


@register
class MCSoftmaxDenseFA(MCOutputLayer):
    """Heteroscedastic softmax output with a factor-analysis covariance (Collier et al., 2021;
        edward2's `MCSoftmaxDenseFA`): `u = mu(x) + V(x) eps_K + d(x) * eps_C`, a Gaussian with
        covariance `V V^T + diag(d^2)` per example (`K` factors), `p = E_u[softmax(u / T)]`.
        Inputs of any rank (`[B, D]`, or `[B, H, W, D]` for segmentation): the noise is per
        position.

        Args:
          num_classes: classes `C`.
          num_factors: rank `K` of the covariance's low-rank part (0: diagonal only).
          parameter_efficient: `V(x) = diag(v(x)) V`, one input-independent `V` (`C x K`) scaled
            per class by `v(x)` (the paper's parameter-efficient form) instead of a `Dense` map to
            all `C K` entries.
    {base}
    """

    min_classes = 2

    def __init__(self, num_classes, num_factors=10, parameter_efficient=False, **kwargs):
        given = kwargs.pop("_noise_layers", None)  # (loc, diag, scale): the user's layers
        super().__init__(**kwargs)
        name = f"{type(self).__name__} ({self.name})"
        self.num_classes = _positive_int(name, "num_classes", num_classes, self.min_classes)
        self.num_factors = _positive_int(name, "num_factors", num_factors, 0)
        self.parameter_efficient = bool(parameter_efficient)
        c, k = self.num_classes, self.num_factors
        if given is None:
            scale = None
            if k:
                scale = (
                    self._dense(c, "scale_layer_heteroscedastic")
                    if self.parameter_efficient
                    else self._dense(c * k, "factors")
                )
            given = (
                self._dense(c, "loc"),
                self._dense(c, "diag", activation="softplus"),
                scale,
            )
        self.loc_layer, self.diag_layer = given[0], given[1]
        self.factor_layer = self.scale_layer_homoscedastic = None
        self.scale_layer_heteroscedastic = None
        if k and self.parameter_efficient:
            # No bias: a bias of `V eps` would be a shift of the location, not noise.
            self.scale_layer_homoscedastic = self._dense(
                c, "scale_layer_homoscedastic", use_bias=False
            )
            self.scale_layer_heteroscedastic = given[2]
        elif k:
            self.factor_layer = given[2]

    def _sublayers(self):
        return (
            self.loc_layer,
            self.diag_layer,
            self.factor_layer,
            self.scale_layer_heteroscedastic,
        )

    def build(self, input_shape):
        for layer in self._sublayers():
            # The user's layers may come built (a loaded model's).
            if layer is not None and not getattr(layer, "built", True):
                layer.build(input_shape)
        if self.scale_layer_homoscedastic is not None:
            self.scale_layer_homoscedastic.build((None, self.num_factors))

    def factor_loadings(self, x):
        """`V(x)`, `[..., C, K]`, or None without factors."""
        c, k = self.num_classes, self.num_factors
        if not k:
            return None
        lead = tf.shape(x)[:-1]
        if self.parameter_efficient:
            v = self.scale_layer_heteroscedastic(x)[..., None]  # [..., C, 1]
            return v * tf.transpose(self.scale_layer_homoscedastic.kernel)  # [..., C, K]
        return tf.reshape(self.factor_layer(x), tf.concat([lead, [c, k]], 0))

    def noise_distribution(self, inputs, training=None):
        """`(loc [..., C], factors [..., C, K] or None, diag [..., C])` of the noisy logits."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        # `convert_to_tensor`: a user's layers (`MCSoftmaxDenseFACustomLayers`) may return others.
        return (
            tf.convert_to_tensor(self.loc_layer(x)),
            self.factor_loadings(x),
            tf.convert_to_tensor(self.diag_layer(x)) + MIN_SCALE_MONTE_CARLO,
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_classes,)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "num_factors": self.num_factors,
            "parameter_efficient": self.parameter_efficient,
        }


@register
class MCSoftmaxDenseFASegmentation(MCSoftmaxDenseFA):
    """`MCSoftmaxDenseFA` for `[B, H, W, D]` inputs (edward2's `MCSoftmaxDenseFASegmentation`):
        an independent noisy softmax per pixel, `[B, H, W, C]` logits.

        Args:
          num_classes: classes `C`.
          num_factors: rank `K` of each pixel's covariance's low-rank part.
    {rest}
    """

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"MCSoftmaxDenseFASegmentation ({self.name}) reads [batch, height, width, "
                f"channels] inputs, got shape {tuple(input_shape)}."
            )
        super().build(input_shape)


@register
class MCSoftmaxDenseFACustomLayers(NestedLayers, MCSoftmaxDenseFA):
    """`MCSoftmaxDenseFA` with the user's layers for the noise's parameters (edward2's
        `MCSoftmaxDenseFACustomLayers`): `loc_layer(x)` gives `mu` (`[..., C]`), `diag_layer(x)`
        the diagonal scale (it must be positive: end the layer with a softplus; `1e-3` is added,
        as in every layer here and in edward2), `scale_layer(x)` the `C * K` factor loadings (or, with
        `parameter_efficient`, the `C` per-class scales of a learned `C x K` matrix).

        Args:
          num_classes: classes `C`.
          num_factors: rank `K`.
          scale_layer, loc_layer, diag_layer: Keras layers (or callables wrapped in `Lambda`).
    {rest}
    """

    nested_layer_args = ("scale_layer", "loc_layer", "diag_layer")

    def __init__(self, num_classes, num_factors, scale_layer, loc_layer, diag_layer, **kwargs):
        layers = (loc_layer, diag_layer, scale_layer)
        super().__init__(num_classes, num_factors=num_factors, _noise_layers=layers, **kwargs)

    @property
    def scale_layer(self):
        return self.scale_layer_heteroscedastic if self.parameter_efficient else self.factor_layer

    def get_config(self):
        return {**super().get_config(), **self._nested_config()}


@register
class MCSigmoidDenseFA(MCSoftmaxDenseFA):
    """Heteroscedastic sigmoid output for binary (`num_outputs=1`) and multilabel outputs, with
        a factor-analysis covariance (Collier et al., 2021; edward2's `MCSigmoidDenseFA`): `p =
        E_u[sigmoid(u / T)]` by Monte Carlo; returns the Bernoulli logits `log p - log(1 - p)`.

        Args:
          num_outputs: outputs (1 for binary classification, the labels for multilabel).
          num_factors: rank `K` of the covariance's low-rank part (0, the default: diagonal).
          parameter_efficient: as `MCSoftmaxDenseFA`'s.
    {base}
    """

    min_classes = 1
    binary = True

    def __init__(self, num_outputs, num_factors=0, parameter_efficient=False, **kwargs):
        super().__init__(num_outputs, num_factors, parameter_efficient, **kwargs)
        self.num_outputs = self.num_classes

    def get_config(self):
        config = super().get_config()
        config["num_outputs"] = config.pop("num_classes")
        return config


@register
class MultiHeadMCSoftmaxDenseFA(MCSoftmaxDenseFA):
    """Heteroscedastic softmax heads with one shared latent noise (edward2's
        `MultiHeadMCSoftmaxDenseFA`): the logits of all `E` heads, `u` in `R^{E C}`, are one
        Gaussian with a factor-analysis covariance (the factors correlate the heads), and head `e`
        predicts `E_u[softmax(u_e / T)]`. Returns each head's `log p`: `[B, E, C]`, or with
        `member_major=True` `[E * B, C]` rows for `EnsembleOutput`.

        Args:
          num_classes: classes `C` per head.
          num_factors: rank `K` of the shared covariance's low-rank part.
          ensemble_size: heads `E`.
          member_major: return `[E * B, C]` member-major rows.
          parameter_efficient: as `MCSoftmaxDenseFA`'s.
    {base}
    """

    def __init__(self, num_classes, num_factors=10, ensemble_size=1, member_major=False, **kwargs):
        name = f"MultiHeadMCSoftmaxDenseFA ({kwargs.get('name', 'multi_head')})"
        self.head_classes = _positive_int(name, "num_classes", num_classes, 2)
        self.ensemble_size = _positive_int(name, "ensemble_size", ensemble_size, 1)
        self.member_major = bool(member_major)
        super().__init__(self.head_classes * self.ensemble_size, num_factors, **kwargs)

    def call(self, inputs, training=None, seed=None):
        u = self.noisy_logits(inputs, training=training, seed=seed)  # [S, B, E C]
        u = tf.reshape(u, tf.concat([tf.shape(u)[:2], [self.ensemble_size, self.head_classes]], 0))
        return self._outputs(u, self._member_major if self.member_major else None)

    def _member_major(self, t):
        return tf.reshape(tf.transpose(t, [1, 0, 2]), [-1, self.head_classes])

    def compute_output_shape(self, input_shape):
        batch = input_shape[0]
        if self.member_major:
            return (None if batch is None else batch * self.ensemble_size, self.head_classes)
        return (batch, self.ensemble_size, self.head_classes)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.head_classes,
            "ensemble_size": self.ensemble_size,
            "member_major": self.member_major,
        }


def _fill_args(cls):
    shared = MCOutputLayer.__doc__.split("Args:\n", 1)[1].rstrip("\n ")
    fa = "      parameter_efficient: as `MCSoftmaxDenseFA`'s.\n"
    cls.__doc__ = cls.__doc__.replace("{base}", shared).replace("{rest}", fa + shared)


for _cls in (
    MCSoftmaxDense,
    MCSoftmaxDenseFA,
    MCSoftmaxDenseFASegmentation,
    MCSoftmaxDenseFACustomLayers,
    MCSigmoidDenseFA,
    MultiHeadMCSoftmaxDenseFA,
):
    _fill_args(_cls)


@register
class ExactSigmoidDense(keras.layers.Layer):
    """Exact heteroscedastic sigmoid output with a diagonal covariance (edward2's
    `ExactSigmoidDense`): `u ~ N(mu(x), d(x)^2)` (or a logistic of that location and scale),
    `mu = Dense(x)`, `d = softplus(Dense(x)) + min_scale`, and the label is 1 when `u > 0`:
    `p = F(mu / d)` exactly, `F` the standard noise's CDF (`Phi` for `'normal'`, the sigmoid
    for `'logistic'`). Returns the Bernoulli logits `log F(mu / d) - log F(-mu / d)`.

    Args:
      num_outputs: outputs (1 for binary classification, the labels for multilabel).
      logit_noise: `'normal'` (default) or `'logistic'` (edward2 takes the TFP class).
      min_scale: the smallest scale `d` (numerical stability).
      logits_only: return the logits alone (default); False: edward2's tuple `(logits,
        log_probs, probs)`.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self, num_outputs, logit_noise="normal", min_scale=1e-2, logits_only=True, **kwargs
    ):
        super().__init__(**kwargs)
        self.logits_only = bool(logits_only)
        name = f"ExactSigmoidDense ({self.name})"
        if logit_noise in (tfd.Normal, tfd.Logistic):  # edward2's spelling
            logit_noise = logit_noise.__name__.lower()
        if logit_noise not in ("normal", "logistic"):
            raise ValueError(
                f"{name}: logit_noise must be 'normal' or 'logistic', got {logit_noise!r}."
            )
        if not isinstance(num_outputs, (int, np.integer)) or num_outputs < 1:
            raise ValueError(
                f"{name}: num_outputs must be a positive integer, got {num_outputs!r}."
            )
        if not min_scale > 0:
            raise ValueError(f"{name}: min_scale must be > 0, got {min_scale!r}.")
        self.num_outputs, self.logit_noise = int(num_outputs), logit_noise
        self.min_scale = float(min_scale)
        policy = self.dtype_policy
        self.loc_layer = keras.layers.Dense(self.num_outputs, name="loc", dtype=policy)
        self.diag_layer = keras.layers.Dense(
            self.num_outputs, activation="softplus", name="diag", dtype=policy
        )

    def build(self, input_shape):
        self.loc_layer.build(input_shape)
        self.diag_layer.build(input_shape)

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        z = self.loc_layer(x) / (self.diag_layer(x) + self.min_scale)
        if self.logit_noise == "logistic":
            log_probs, logits = tf.math.log_sigmoid(z), z
        else:
            standard = tfd.Normal(tf.zeros([], z.dtype), tf.ones([], z.dtype))
            log_probs = standard.log_cdf(z)
            logits = log_probs - standard.log_cdf(-z)
        if self.logits_only:
            return logits
        return logits, log_probs, tf.exp(log_probs)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_outputs,)

    def get_config(self):
        return {
            **super().get_config(),
            "num_outputs": self.num_outputs,
            "logit_noise": self.logit_noise,
            "min_scale": self.min_scale,
            "logits_only": self.logits_only,
        }


@register
class EnsembleHeteroscedasticOutputs(NestedLayers, keras.layers.Layer):
    """A weighted ensemble of heteroscedastic output layers (edward2's
    `EnsembleHeteroscedasticOutputs`), e.g. an `ExactSigmoidDense` with normal and one with
    logistic noise. With `averaging='ensemble_cross_ent'` the predictive is the mixture
    `p = sum_i w_i p_i` (trained knowing it is ensembled: `-log sum_i w_i p_i`); with
    `'gibbs_cross_ent'` the training logits are `sum_i w_i logits_i` (a loss `-sum_i w_i log
    p_i` in spirit, which can promote diversity) and the prediction is the mixture.

    Returns logits: `log p` (`num_classes > 2`) or the Bernoulli logits `log p - log(1 - p)`
    (`num_classes == 2`, sigmoid members), probabilities clipped to `[eps, 1 - eps]`.

    Args:
      num_classes: classes (2: binary members with sigmoid outputs).
      layers: the member output layers (their outputs are logits, as blayers' are).
      ensemble_weighting: one weight a member, a probability distribution.
      averaging: `'ensemble_cross_ent'` (default) or `'gibbs_cross_ent'`.
      eps: the probabilities' clip.
      logits_only: return the logits alone (default); False: edward2's tuple `(logits,
        log_probs, probs)`. Members may return either (a tuple's first element is its logits).
      **kwargs: `keras.layers.Layer` arguments.
    """

    nested_layer_args = ("layers",)

    def __init__(
        self,
        num_classes,
        layers,
        ensemble_weighting,
        averaging="ensemble_cross_ent",
        eps=1e-7,
        logits_only=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.logits_only = bool(logits_only)
        name = f"EnsembleHeteroscedasticOutputs ({self.name})"
        weights = [float(w) for w in ensemble_weighting]
        if len(weights) != len(layers) or abs(sum(weights) - 1.0) > 1e-5 or min(weights) < 0:
            raise ValueError(
                f"{name}: ensemble_weighting must be a probability distribution with one weight "
                f"a layer ({len(layers)}), got {ensemble_weighting!r}."
            )
        if averaging not in ("ensemble_cross_ent", "gibbs_cross_ent"):
            raise ValueError(
                f"{name}: averaging must be 'ensemble_cross_ent' or 'gibbs_cross_ent', got "
                f"{averaging!r}."
            )
        self.num_classes, self.layers = int(num_classes), list(layers)
        self.ensemble_weighting, self.averaging, self.eps = weights, averaging, float(eps)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layers"] = [keras.saving.deserialize_keras_object(c) for c in config["layers"]]
        return cls(**config)

    def build(self, input_shape):
        for layer in self.layers:
            if not layer.built:
                layer.build(input_shape)

    def _log_probs(self, logits):
        if self.num_classes == 2:
            return tf.math.log_sigmoid(logits)
        return tf.nn.log_softmax(logits, axis=-1)

    def _logits(self, probs):
        probs = tf.clip_by_value(probs, self.eps, 1.0 - self.eps)
        if self.num_classes == 2:
            return tf.math.log(probs) - tf.math.log(1.0 - probs)
        return tf.math.log(probs)

    def call(self, inputs, training=None):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        logits = []
        for layer in self.layers:
            out = layer(x, training=training)
            logits.append(tf.convert_to_tensor(out[0] if isinstance(out, (tuple, list)) else out))
        weights = [tf.cast(w, x.dtype) for w in self.ensemble_weighting]
        if self.averaging == "gibbs_cross_ent" and training:
            mixed = tf.add_n([w * l for w, l in zip(weights, logits)])
            probs = tf.add_n([w * tf.exp(self._log_probs(l)) for w, l in zip(weights, logits)])
        else:
            log_probs = tf.stack(
                [tf.math.log(w) + self._log_probs(l) for w, l in zip(weights, logits)], axis=-1
            )
            probs = tf.exp(tf.reduce_logsumexp(log_probs, axis=-1))
            mixed = self._logits(probs)
        if self.logits_only:
            return mixed
        probs = tf.clip_by_value(probs, self.eps, 1.0 - self.eps)
        return mixed, tf.math.log(probs), probs

    def compute_output_shape(self, input_shape):
        return self.layers[0].compute_output_shape(input_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "layers": [keras.saving.serialize_keras_object(layer) for layer in self.layers],
            "ensemble_weighting": self.ensemble_weighting,
            "averaging": self.averaging,
            "eps": self.eps,
            "logits_only": self.logits_only,
        }


@register
class HeteroscedasticSNGPLayer(MCSoftmaxDenseFA):
    """Heteroscedastic SNGP (Fortuin et al., 2022; edward2's `HeteroscedasticSNGPLayer`): the
        logits' location is an SNGP head (`RandomFeatureGaussianProcess`) and their noise the
        factor-analysis Gaussian of `MCSoftmaxDenseFA`; at prediction the noise's diagonal also
        carries the GP's predictive variance, `d^2 <- het_var_weight d^2 + sngp_var_weight
        Var_GP(x)`, so the softmax averages over both the label noise and the function's
        uncertainty. Returns `log p(y | x)` as logits.

        Args:
          num_classes: classes `C`.
          num_factors: rank `K` of the noise covariance's low-rank part.
          sngp_var_weight, het_var_weight: the two variances' weights at prediction.
          num_inducing, gp_kernel_type, gp_kernel_scale, gp_output_bias, gp_output_bias_trainable,
            gp_cov_momentum, gp_cov_ridge_penalty, gp_cov_likelihood, normalize_input,
            scale_random_features, l2_regularization: the SNGP head's
            (`RandomFeatureGaussianProcess`); edward2's default `gp_cov_momentum=-1` (the exact
            precision over an epoch).
          parameter_efficient: as `MCSoftmaxDenseFA`'s.
    {base}
    """

    _GP_DEFAULTS = types.MappingProxyType(
        {
            "num_inducing": 1024,
            "gp_kernel_type": "gaussian",
            "gp_kernel_scale": 1.0,
            "gp_output_bias": 0.0,
            "gp_output_bias_trainable": False,
            "gp_cov_momentum": -1.0,
            "gp_cov_ridge_penalty": 1.0,
            "gp_cov_likelihood": "gaussian",
            "normalize_input": False,
            "scale_random_features": True,
            "l2_regularization": 1e-6,
        }
    )

    def __init__(
        self, num_classes, num_factors=10, sngp_var_weight=1.0, het_var_weight=1.0, **kwargs
    ):
        from blayers.layers.gp.sngp import RandomFeatureGaussianProcess

        self.gp_settings = {
            key: kwargs.pop(key, default) for key, default in self._GP_DEFAULTS.items()
        }
        super().__init__(num_classes, num_factors=num_factors, **kwargs)
        self.sngp_var_weight, self.het_var_weight = float(sngp_var_weight), float(het_var_weight)
        self.loc_layer = None  # the SNGP head gives the location
        self.sngp_layer = RandomFeatureGaussianProcess(
            self.num_classes,
            return_covariance=True,
            name="sngp",
            dtype=self.dtype_policy,
            seed=self.seed,
            **self.gp_settings,
        )

    def build(self, input_shape):
        super().build(input_shape)
        self.sngp_layer.build(input_shape)

    def begin_epoch(self):
        """The SNGP head's precision restarts with each epoch (`gp_cov_momentum < 0`)."""
        self.sngp_layer.begin_epoch()

    def reset_covariance_matrix(self):
        """edward2's name: restarts the SNGP head's precision."""
        self.sngp_layer.reset_covariance()

    def noise_distribution(self, inputs, training=None):
        """`(loc, factors, diag)` with the SNGP head's logits as `loc` and, at prediction, its
        predictive variance added to the diagonal."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        loc, covariance = self.sngp_layer(x, training=training)
        diag = self.diag_layer(x) + MIN_SCALE_MONTE_CARLO
        if not training:
            variance = tf.linalg.diag_part(covariance)[:, None]  # [B, 1], shared by classes
            diag = tf.sqrt(self.het_var_weight * tf.square(diag) + self.sngp_var_weight * variance)
        return loc, self.factor_loadings(x), diag

    def get_config(self):
        return {
            **super().get_config(),
            "sngp_var_weight": self.sngp_var_weight,
            "het_var_weight": self.het_var_weight,
            **self.gp_settings,
        }


_fill_args(HeteroscedasticSNGPLayer)
