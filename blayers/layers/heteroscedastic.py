"""Heteroscedastic classification output layers (Collier et al., 2021).

Input-dependent label noise on the logits: `u = mu(x) + V(x) eps_K + d(x) * eps_C`, a Gaussian
with a low-rank-plus-diagonal covariance `V V^T + diag(d^2)` per example (`K` factors), and the
predictive `p(y | x) = E_u[softmax(u / T)]`, estimated with `num_mc_samples` draws. The layer
returns `log p(y | x)` as logits, so a Categorical likelihood (the classification task, Keras'
`from_logits=True` losses) reads the Monte Carlo predictive directly; training maximizes the
MC estimate of the marginal likelihood, as in the paper.
"""

import keras
import numpy as np
import tensorflow as tf

from blayers.layers.base import SeededLayer, register
from blayers.sampling import standard_normal

__all__ = ["MCSoftmaxDenseFA"]


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

    def __init__(
        self, num_classes, num_factors=10, temperature=1.0, num_mc_samples=1000, seed=None, **kwargs
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"MCSoftmaxDenseFA ({self.name})"
        for argument, value, low in (
            ("num_classes", num_classes, 2),
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

    def call(self, inputs, training=None):
        del training
        loc, factors, diag = self.noise_distribution(inputs)
        s, batch = self.num_mc_samples, tf.shape(loc)[0]
        seed_c, seed_k = tf.unstack(tf.random.experimental.stateless_split(self.next_seed(), 2))
        noise = diag * standard_normal(tf.stack([s, batch, self.num_classes]), seed_c, loc.dtype)
        if factors is not None:
            eps = standard_normal(tf.stack([s, batch, self.num_factors]), seed_k, loc.dtype)
            noise += tf.einsum("bck,sbk->sbc", factors, eps)
        log_probs = tf.nn.log_softmax((loc + noise) / self.temperature, axis=-1)
        # log of the mean of the samples' probabilities, stably.
        return tf.reduce_logsumexp(log_probs, axis=0) - tf.math.log(tf.cast(s, loc.dtype))

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
