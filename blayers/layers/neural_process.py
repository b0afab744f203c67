"""(Attentive) neural processes (Garnelo et al., 2018; Kim et al., 2019; edward2's
`NeuralProcess`): a distribution over functions learned from many small data sets.

Given a context `(x_c, y_c)` and target inputs `x_t`, the model predicts

    p(y_t | x_t, x_c, y_c) = int p(y_t | x_t, r_t, z) q(z | x_c, y_c) dz

with a global latent `z` (the latent path: a mean-pooled MLP encoding of the pairs, `N(mu,
0.1 + 0.9 sigmoid(s))`), an optional deterministic path `r_t` (an MLP encoding of the pairs,
aggregated for each target by attention over the contexts: uniform, Laplace, dot-product or
multi-head), and a decoder `N(mu(x_t, r_t, z), 0.1 + 0.9 softplus(s))`. Trained on the ELBO:
with targets, `z` is drawn from `q(z | x_t, y_t)` and `KL[q(z | targets) || q(z | context)]`
joins the layer's losses (a per-task average, a local loss).
"""

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import distributions as rv_lib
from blayers.layers.base import LocalLosses, NamedOutput, SeededLayer, register

tfd = tfp.distributions

__all__ = [
    "Attention",
    "NeuralProcess",
    "dot_product_attention",
    "laplace_attention",
    "uniform_attention",
]

_ATTENTION = ("uniform", "laplace", "dot_product", "multihead")


def uniform_attention(q, v):
    """Every target gets the contexts' mean value: `[B, m, d_v]` (the neural process's)."""
    return tf.tile(tf.reduce_mean(v, axis=1, keepdims=True), [1, tf.shape(q)[1], 1])


def laplace_attention(q, k, v, scale=1.0, normalise=True):
    """Weights `softmax_j(-|q_i - k_j|_1 / scale)` (or `1 + tanh` unnormalised) over values."""
    logits = -tf.reduce_sum(tf.abs((k[:, None] - q[:, :, None]) / scale), axis=-1)
    weights = tf.nn.softmax(logits) if normalise else 1.0 + tf.tanh(logits)
    return tf.einsum("bik,bkj->bij", weights, v)


def dot_product_attention(q, k, v, normalise=True):
    """Weights `softmax_j(q_i . k_j / sqrt(d_k))` (or the sigmoid unnormalised) over values."""
    logits = tf.einsum("bjk,bik->bij", k, q) / tf.sqrt(tf.cast(tf.shape(q)[-1], q.dtype))
    weights = tf.nn.softmax(logits) if normalise else tf.sigmoid(logits)
    return tf.einsum("bik,bkj->bij", weights, v)


def _mlp(sizes, name, dtype):
    layers = [
        keras.layers.Dense(size, activation="relu", name=f"{name}_{i}", dtype=dtype)
        for i, size in enumerate(sizes[:-1])
    ]
    layers.append(keras.layers.Dense(sizes[-1], name=f"{name}_{len(sizes) - 1}", dtype=dtype))
    return keras.Sequential(layers, name=name)


@register
class Attention(keras.layers.Layer):
    """The deterministic path's attention (edward2's `Attention`): called on `(context_x,
    target_x, values)` (`[B, n_c, d_x]`, `[B, n_t, d_x]`, `[B, n_c, d_v]`), returns each
    target's aggregate of the values, `[B, n_t, d_v]`.

    Args:
      rep: `'identity'` (keys and queries are the inputs) or `'mlp'` (an MLP of
        `output_sizes` each).
      output_sizes: that MLP's sizes (default `[32, 32]`).
      att_type: `'uniform'` (a neural process), `'laplace'`, `'dot_product'` or `'multihead'`
        (an attentive one).
      scale, normalise: the Laplace scale and whether weights sum to one.
      num_heads: heads of `'multihead'` (they split the values' size).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        rep="identity",
        output_sizes=None,
        att_type="uniform",
        scale=1.0,
        normalise=True,
        num_heads=8,
        **kwargs,
    ):
        super().__init__(**kwargs)
        name = f"Attention ({self.name})"
        if att_type not in _ATTENTION:
            raise ValueError(f"{name}: att_type must be one of {_ATTENTION}, got {att_type!r}.")
        if rep not in ("identity", "mlp"):
            raise ValueError(f"{name}: rep must be 'identity' or 'mlp', got {rep!r}.")
        self.rep, self.att_type = rep, att_type
        self.output_sizes = [int(size) for size in (output_sizes or [32, 32])]
        self.scale, self.normalise, self.num_heads = float(scale), bool(normalise), int(num_heads)
        if rep == "mlp":
            self.key_mlp = _mlp(self.output_sizes, "keys", self.dtype_policy)
            self.query_mlp = _mlp(self.output_sizes, "queries", self.dtype_policy)
        self.multihead = None

    def build(self, input_shapes):
        context_shape, target_shape, values_shape = input_shapes
        if self.rep == "mlp":
            self.key_mlp.build(context_shape)
            self.query_mlp.build(target_shape)
        if self.att_type == "multihead":
            size = values_shape[-1]
            self.multihead = keras.layers.MultiHeadAttention(
                self.num_heads,
                max(size // self.num_heads, 1),
                output_shape=size,
                name="multihead",
                dtype=self.dtype_policy,
            )
            keys = self.output_sizes[-1] if self.rep == "mlp" else context_shape[-1]
            queries = self.output_sizes[-1] if self.rep == "mlp" else target_shape[-1]
            self.multihead.build((None, None, queries), (None, None, size), (None, None, keys))

    def call(self, inputs):
        context_x, target_x, values = inputs
        keys, queries = context_x, target_x
        if self.rep == "mlp":
            keys, queries = self.key_mlp(context_x), self.query_mlp(target_x)
        if self.att_type == "uniform":
            return uniform_attention(queries, values)
        if self.att_type == "laplace":
            return laplace_attention(queries, keys, values, self.scale, self.normalise)
        if self.att_type == "dot_product":
            return dot_product_attention(queries, keys, values, self.normalise)
        return self.multihead(queries, values, key=keys)

    def compute_output_shape(self, input_shapes):
        return tuple(input_shapes[1][:-1]) + (input_shapes[2][-1],)

    def get_config(self):
        return {
            **super().get_config(),
            "rep": self.rep,
            "output_sizes": self.output_sizes,
            "att_type": self.att_type,
            "scale": self.scale,
            "normalise": self.normalise,
            "num_heads": self.num_heads,
        }


@register
class NeuralProcess(LocalLosses, NamedOutput, SeededLayer):
    """An (attentive) neural process (module docstring), called on `((context_x, context_y),
    target_x)` (each `[B, n, d]`), with `target_y` in training; returns a `RandomVariable` over
    `y_t`, independent Normals of shape `[B, n_t, d_y]` (event `[d_y]`).

    Args:
      latent_encoder_sizes: hidden sizes of the latent path's MLP.
      num_latents: size of `z`.
      decoder_sizes: hidden sizes of the decoder's MLP; its last is `2 d_y` (means and raw
        scales).
      use_deterministic_path: also the deterministic, attention-aggregated path.
      deterministic_encoder_sizes: hidden sizes of its MLP (default: the latent path's).
      attention_type: `'uniform'` (a neural process), `'laplace'`, `'dot_product'` or
        `'multihead'` (an attentive one).
      attention_rep: `'identity'` (keys and queries are the inputs) or `'mlp'` (an MLP of
        `attention_sizes` each).
      attention_sizes: that MLP's sizes (default `[32, 32]`).
      attention_scale, attention_normalise: the Laplace scale and whether weights sum to one.
      num_heads: heads of `'multihead'` (they split the representation's size).
      attention_wrapper: an `Attention` layer instead (edward2's argument; the `attention_*`
        arguments are then not used).
      seed: seeds the latent's and the output's draws.
      output_name: the returned random variable's name (default: the layer's).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        latent_encoder_sizes,
        num_latents,
        decoder_sizes,
        use_deterministic_path=True,
        deterministic_encoder_sizes=None,
        attention_type="uniform",
        attention_rep="identity",
        attention_sizes=None,
        attention_scale=1.0,
        attention_normalise=True,
        num_heads=8,
        attention_wrapper=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        name = f"NeuralProcess ({self.name})"
        if attention_wrapper is None:
            attention_wrapper = Attention(
                rep=attention_rep,
                output_sizes=attention_sizes,
                att_type=attention_type,
                scale=attention_scale,
                normalise=attention_normalise,
                num_heads=num_heads,
                name="attention",
                dtype=self.dtype_policy,
            )
        elif isinstance(attention_wrapper, dict):
            attention_wrapper = keras.saving.deserialize_keras_object(attention_wrapper)
        if not isinstance(attention_wrapper, Attention):
            raise TypeError(
                f"{name}: attention_wrapper must be a blayers Attention layer, got "
                f"{attention_wrapper!r}."
            )
        self.attention = attention_wrapper
        if decoder_sizes[-1] % 2:
            raise ValueError(
                f"{name}: the decoder's last size holds means and scales (2 d_y), got "
                f"{decoder_sizes[-1]}."
            )
        self.latent_encoder_sizes = [int(s) for s in latent_encoder_sizes]
        self.num_latents = int(num_latents)
        self.decoder_sizes = [int(s) for s in decoder_sizes]
        self.use_deterministic_path = bool(use_deterministic_path)
        self.deterministic_encoder_sizes = [
            int(s) for s in (deterministic_encoder_sizes or latent_encoder_sizes)
        ]
        dtype = self.dtype_policy
        self.latent_mlp = _mlp(self.latent_encoder_sizes, "latent_encoder", dtype)
        self.latent_hidden = keras.layers.Dense(
            (self.latent_encoder_sizes[-1] + self.num_latents) // 2,
            activation="relu",
            name="latent_hidden",
            dtype=dtype,
        )
        self.latent_loc = keras.layers.Dense(self.num_latents, name="latent_loc", dtype=dtype)
        self.latent_scale = keras.layers.Dense(self.num_latents, name="latent_scale", dtype=dtype)
        self.decoder_mlp = _mlp(self.decoder_sizes, "decoder", dtype)
        if self.use_deterministic_path:
            self.deterministic_mlp = _mlp(
                self.deterministic_encoder_sizes, "deterministic_encoder", dtype
            )

    def latent_distribution(self, x, y):
        """`q(z | x, y)`: `N(mu, diag(0.1 + 0.9 sigmoid(s)))` `[B, num_latents]` of the pairs'
        mean-pooled encoding."""
        embedding = tf.reduce_mean(self.latent_mlp(tf.concat([x, y], axis=-1)), axis=1)
        hidden = self.latent_hidden(embedding)
        scale = 0.1 + 0.9 * tf.sigmoid(self.latent_scale(hidden))
        return tfd.MultivariateNormalDiag(loc=self.latent_loc(hidden), scale_diag=scale)

    @property
    def attention_type(self):
        """The deterministic path's attention (`self.attention.att_type`)."""
        return self.attention.att_type

    def latent_encoder(self, x, y):
        """`q(z | x, y)` as a random variable (edward2's `latent_encoder`)."""
        return rv_lib.RandomVariable(self.latent_distribution(x, y), seed=self.next_seed())

    def deterministic_encoder(self, context_x, context_y, target_x):
        """The deterministic path's representation of each target, `[B, n_t, d]`."""
        values = self.deterministic_mlp(tf.concat([context_x, context_y], axis=-1))
        return self.attention((context_x, target_x, values))

    def call(self, inputs, target_y=None, training=None):
        (context_x, context_y), target_x = inputs
        context_x, context_y, target_x = (
            tf.convert_to_tensor(t, self.compute_dtype) for t in (context_x, context_y, target_x)
        )
        prior = self.latent_distribution(context_x, context_y)
        latent = prior
        if target_y is not None:
            target_y = tf.convert_to_tensor(target_y, self.compute_dtype)
            latent = self.latent_distribution(target_x, target_y)
            # KL[q(z | targets) || q(z | context)], averaged over the batch's tasks.
            self.add_loss(tf.reduce_mean(latent.kl_divergence(prior)))
        z = latent.sample(seed=self.next_seed())
        num_targets = tf.shape(target_x)[1]
        representation = tf.tile(z[:, None, :], [1, num_targets, 1])
        if self.use_deterministic_path:
            deterministic = self.deterministic_encoder(context_x, context_y, target_x)
            representation = tf.concat([deterministic, representation], axis=-1)
        hidden = self.decoder_mlp(tf.concat([representation, target_x], axis=-1))
        loc, raw = tf.split(hidden, 2, axis=-1)
        return rv_lib.MultivariateNormalDiag(
            loc=loc,
            scale_diag=0.1 + 0.9 * tf.nn.softplus(raw),
            seed=self.next_seed(),
            name=self.output_name,
        )

    def get_config(self):
        return {
            **super().get_config(),
            "latent_encoder_sizes": self.latent_encoder_sizes,
            "num_latents": self.num_latents,
            "decoder_sizes": self.decoder_sizes,
            "use_deterministic_path": self.use_deterministic_path,
            "deterministic_encoder_sizes": self.deterministic_encoder_sizes,
            "attention_wrapper": keras.saving.serialize_keras_object(self.attention),
        }
