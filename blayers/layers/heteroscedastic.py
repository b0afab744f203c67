"""Heteroscedastic classification output layers (Collier et al., 2021).

Input-dependent label noise on the logits: `u = mu(x) + V(x) eps_K + d(x) * eps_C`, a Gaussian
with a low-rank-plus-diagonal covariance `V V^T + diag(d^2)` per example (`K` factors), and the
predictive `p(y | x) = E_u[softmax(u / T)]` (`MCSoftmaxDenseFA`) or, for binary and multilabel
outputs, `E_u[sigmoid(u / T)]` (`MCSigmoidDenseFA`), estimated with `num_mc_samples` draws. With
a diagonal covariance the binary predictive is exact, `P(u > 0) = F(mu / d)` for the noise's CDF
`F` (`ExactSigmoidDense`, no sampling).

Each layer returns logits of its predictive: `log p(y | x)` for the softmax layer (a Categorical
likelihood, Keras' `from_logits=True` losses), `log p - log(1 - p)` for the sigmoid layers (a
Bernoulli likelihood, `sigmoid_cross_entropy_with_logits`); training maximizes the (MC estimate
of the) marginal likelihood, as in the paper. edward2's layers return a tuple `(logits,
log_probs, probs[, variance])` unless `logits_only=True`; these return the logits, from which
the others follow (`log_softmax` / `softmax`, `log_sigmoid` / `sigmoid`).
"""

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
    "MCSigmoidDenseFA",
    "MCSoftmaxDenseFA",
    "MultiHeadMCSoftmaxDenseFA",
]


@register
class MCSoftmaxDenseFA(SeededLayer):
    """Heteroscedastic softmax output with a factor-analysis covariance (Collier et al., 2021).

    Args:
      num_classes: classes `C`.
      num_factors: rank `K` of the covariance's low-rank part (0: diagonal only).
      temperature: the softmax temperature `T` (smaller: closer to the argmax likelihood).
      num_mc_samples: Monte Carlo draws of the noisy logits per example.
      seed: seeds the draws.
      **kwargs: `keras.layers.Layer` arguments.
    """

    min_classes = 2

    def __init__(
        self, num_classes, num_factors=10, temperature=1.0, num_mc_samples=1000, seed=None, **kwargs
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"{type(self).__name__} ({self.name})"
        for argument, value, low in (
            ("num_classes", num_classes, self.min_classes),
            ("num_factors", num_factors, 0),
            ("num_mc_samples", num_mc_samples, 1),
        ):
            if not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name}: {argument} must be an integer >= {low}, got {value!r}.")
        if not temperature > 0:
            raise ValueError(f"{name}: temperature must be > 0, got {temperature}.")
        self.num_classes, self.num_factors = int(num_classes), int(num_factors)
        self.temperature, self.num_mc_samples = float(temperature), int(num_mc_samples)
        policy = self.dtype_policy
        self.loc_layer = keras.layers.Dense(self.num_classes, name="loc", dtype=policy)
        self.diag_layer = keras.layers.Dense(
            self.num_classes, activation="softplus", name="diag", dtype=policy
        )
        self.factor_layer = (
            keras.layers.Dense(self.num_classes * self.num_factors, name="factors", dtype=policy)
            if self.num_factors
            else None
        )

    def build(self, input_shape):
        for layer in (self.loc_layer, self.diag_layer, self.factor_layer):
            if layer is not None:
                layer.build(input_shape)

    def noise_distribution(self, inputs):
        """`(loc [B, C], factors [B, C, K] or None, diag [B, C])` of the noisy logits."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        loc, diag = self.loc_layer(x), self.diag_layer(x) + 1e-6
        factors = None
        if self.factor_layer is not None:
            factors = tf.reshape(self.factor_layer(x), [-1, self.num_classes, self.num_factors])
        return loc, factors, diag

    def noisy_logits(self, inputs):
        """`[num_mc_samples, B, C]` draws of `u / T`."""
        return self._draw(*self.noise_distribution(inputs))

    def _draw(self, loc, factors, diag):
        s, batch = self.num_mc_samples, tf.shape(loc)[0]
        seed_c, seed_k = tf.unstack(tf.random.experimental.stateless_split(self.next_seed(), 2))
        noise = diag * standard_normal(tf.stack([s, batch, self.num_classes]), seed_c, loc.dtype)
        if factors is not None:
            eps = standard_normal(tf.stack([s, batch, self.num_factors]), seed_k, loc.dtype)
            noise += tf.einsum("bck,sbk->sbc", factors, eps)
        return (loc + noise) / self.temperature

    def call(self, inputs, training=None):
        del training
        u = self.noisy_logits(inputs)
        log_probs = tf.nn.log_softmax(u, axis=-1)
        # log of the mean of the samples' probabilities, stably.
        return _log_mean(log_probs)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_classes,)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "num_factors": self.num_factors,
            "temperature": self.temperature,
            "num_mc_samples": self.num_mc_samples,
        }


def _log_mean(log_values):
    """`log mean_s exp(log_values[s])` over the first axis, stably."""
    count = tf.cast(tf.shape(log_values)[0], log_values.dtype)
    return tf.reduce_logsumexp(log_values, axis=0) - tf.math.log(count)


@register
class MCSigmoidDenseFA(MCSoftmaxDenseFA):
    """Heteroscedastic sigmoid output for binary (`num_classes=1`) and multilabel outputs, with a
    factor-analysis covariance (Collier et al., 2021; edward2's `MCSigmoidDenseFA`): `p = E_u[
    sigmoid(u / T)]` by Monte Carlo; returns the Bernoulli logits `log p - log(1 - p)`.

    Args:
      num_classes: outputs (1 for binary classification, the labels for multilabel).
      num_factors: rank `K` of the covariance's low-rank part (0: diagonal only).
      temperature: the sigmoid temperature `T`.
      num_mc_samples: Monte Carlo draws of the noisy logits per example.
      seed: seeds the draws.
      **kwargs: `keras.layers.Layer` arguments.
    """

    min_classes = 1

    def call(self, inputs, training=None):
        del training
        u = self.noisy_logits(inputs)
        return _log_mean(tf.math.log_sigmoid(u)) - _log_mean(tf.math.log_sigmoid(-u))


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
      temperature: the softmax temperature `T`.
      num_mc_samples: Monte Carlo draws of the noisy logits per example.
      member_major: return `[E * B, C]` member-major rows.
      seed: seeds the draws.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        num_classes,
        num_factors=10,
        ensemble_size=1,
        temperature=1.0,
        num_mc_samples=1000,
        member_major=False,
        seed=None,
        **kwargs,
    ):
        name = f"MultiHeadMCSoftmaxDenseFA ({kwargs.get('name', 'multi_head')})"
        if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
            raise ValueError(f"{name}: num_classes must be an integer >= 2, got {num_classes!r}.")
        if not isinstance(ensemble_size, (int, np.integer)) or ensemble_size < 1:
            raise ValueError(
                f"{name}: ensemble_size must be a positive integer, got {ensemble_size!r}."
            )
        self.head_classes, self.ensemble_size = int(num_classes), int(ensemble_size)
        self.member_major = bool(member_major)
        super().__init__(
            self.head_classes * self.ensemble_size,
            num_factors=num_factors,
            temperature=temperature,
            num_mc_samples=num_mc_samples,
            seed=seed,
            **kwargs,
        )

    def call(self, inputs, training=None):
        del training
        u = self.noisy_logits(inputs)  # [S, B, E C]
        u = tf.reshape(u, tf.concat([tf.shape(u)[:2], [self.ensemble_size, self.head_classes]], 0))
        log_probs = _log_mean(tf.nn.log_softmax(u, axis=-1))  # [B, E, C]
        if self.member_major:
            return tf.reshape(tf.transpose(log_probs, [1, 0, 2]), [-1, self.head_classes])
        return log_probs

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
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, num_outputs, logit_noise="normal", min_scale=1e-2, **kwargs):
        super().__init__(**kwargs)
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
            return z
        standard = tfd.Normal(tf.zeros([], z.dtype), tf.ones([], z.dtype))
        return standard.log_cdf(z) - standard.log_cdf(-z)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_outputs,)

    def get_config(self):
        return {
            **super().get_config(),
            "num_outputs": self.num_outputs,
            "logit_noise": self.logit_noise,
            "min_scale": self.min_scale,
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
        **kwargs,
    ):
        super().__init__(**kwargs)
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
        logits = [tf.convert_to_tensor(layer(x, training=training)) for layer in self.layers]
        weights = [tf.cast(w, x.dtype) for w in self.ensemble_weighting]
        if self.averaging == "gibbs_cross_ent" and training:
            return tf.add_n([w * l for w, l in zip(weights, logits)])
        log_probs = tf.stack(
            [tf.math.log(w) + self._log_probs(l) for w, l in zip(weights, logits)], axis=-1
        )
        return self._logits(tf.exp(tf.reduce_logsumexp(log_probs, axis=-1)))

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
      temperature: the softmax temperature.
      num_mc_samples: Monte Carlo draws per example.
      sngp_var_weight, het_var_weight: the two variances' weights at prediction.
      num_inducing, gp_kernel_scale, gp_cov_momentum, gp_cov_ridge_penalty, normalize_input,
        l2_regularization: the SNGP head's (`RandomFeatureGaussianProcess`); edward2's
        default `gp_cov_momentum=-1` (the exact precision over an epoch).
      seed: seeds the draws.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        num_classes,
        num_factors=10,
        temperature=1.0,
        num_mc_samples=1000,
        sngp_var_weight=1.0,
        het_var_weight=1.0,
        num_inducing=1024,
        gp_kernel_scale=1.0,
        gp_cov_momentum=-1.0,
        gp_cov_ridge_penalty=1.0,
        normalize_input=False,
        l2_regularization=1e-6,
        seed=None,
        **kwargs,
    ):
        from blayers.layers.gp.sngp import RandomFeatureGaussianProcess

        super().__init__(
            num_classes,
            num_factors=num_factors,
            temperature=temperature,
            num_mc_samples=num_mc_samples,
            seed=seed,
            **kwargs,
        )
        self.sngp_var_weight, self.het_var_weight = float(sngp_var_weight), float(het_var_weight)
        self.gp_settings = {
            "num_inducing": int(num_inducing),
            "gp_kernel_scale": float(gp_kernel_scale),
            "gp_cov_momentum": float(gp_cov_momentum),
            "gp_cov_ridge_penalty": float(gp_cov_ridge_penalty),
            "normalize_input": bool(normalize_input),
            "l2_regularization": float(l2_regularization),
        }
        self.loc_layer = None  # the SNGP head gives the location
        self.sngp_layer = RandomFeatureGaussianProcess(
            self.num_classes,
            return_covariance=True,
            name="sngp",
            dtype=self.dtype_policy,
            seed=seed,
            **self.gp_settings,
        )

    def build(self, input_shape):
        for layer in (self.diag_layer, self.factor_layer, self.sngp_layer):
            if layer is not None:
                layer.build(input_shape)

    def begin_epoch(self):
        """The SNGP head's precision restarts with each epoch (`gp_cov_momentum < 0`)."""
        self.sngp_layer.begin_epoch()

    def noise_distribution(self, inputs, training=None):
        """`(loc, factors, diag)` with the SNGP head's logits as `loc` and, at prediction, its
        predictive variance added to the diagonal."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        loc, covariance = self.sngp_layer(x, training=training)
        diag = self.diag_layer(x) + 1e-6
        factors = None
        if self.factor_layer is not None:
            factors = tf.reshape(self.factor_layer(x), [-1, self.num_classes, self.num_factors])
        if not training:
            variance = tf.linalg.diag_part(covariance)[:, None]  # [B, 1], shared by classes
            diag = tf.sqrt(self.het_var_weight * tf.square(diag) + self.sngp_var_weight * variance)
        return loc, factors, diag

    def noisy_logits(self, inputs, training=None):
        loc, factors, diag = self.noise_distribution(inputs, training)
        return self._draw(loc, factors, diag)

    def call(self, inputs, training=None):
        u = self.noisy_logits(inputs, training)
        return _log_mean(tf.nn.log_softmax(u, axis=-1))

    def get_config(self):
        return {
            **super().get_config(),
            "sngp_var_weight": self.sngp_var_weight,
            "het_var_weight": self.het_var_weight,
            **self.gp_settings,
        }
