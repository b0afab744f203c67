"""Bayesian multi-head attention: distributions over the query, key, value and output
projections (the paper's Bayesian Transformer replaces attention by its Flipout counterpart).

`MultiHeadAttentionReparameterization` and `MultiHeadAttentionFlipout` take the constructor and
call arguments of `keras.layers.MultiHeadAttention` (`num_heads`, `key_dim`, `value_dim`,
`dropout`, `use_bias`, `output_shape`; `call(query, value, key=None, attention_mask=None,
return_attention_scores=False, training=None, use_causal_mask=False)`) for inputs of shape
`[batch, length, features]`. Each projection is a Bayesian dense layer of the same estimator, so
its KL lands in `layer.losses`; the attention itself is Vaswani et al.'s scaled dot product.
"""

import math

import keras
import tensorflow as tf

from blayers.layers.base import register
from blayers.layers.dense import DenseFlipout, DenseReparameterization

__all__ = ["MultiHeadAttentionFlipout", "MultiHeadAttentionReparameterization"]


class _MultiHeadAttentionBase(keras.layers.Layer):
    """Multi-head attention whose projections are Bayesian dense layers of `dense_class`.

    Args:
      num_heads: attention heads.
      key_dim: size of each head's queries and keys.
      value_dim: size of each head's values (default `key_dim`).
      dropout: dropout rate on the attention probabilities.
      use_bias: biases in the projections.
      output_shape: size of the output's last axis (default the query's).
      attention_axes: None only (attention over the length axis).
      kernel_initializer, bias_initializer: of every projection (default `'trainable_normal'`
        and `'zeros'`).
      kernel_regularizer, bias_regularizer: of every projection (default `'prior'`, None).
      seed: seeds the projections' noise and the dropout.
      **kwargs: `keras.layers.Layer` arguments.

    Keras masks of `query`, `value` and `key` (e.g. from `Embedding(mask_zero=True)`) mask the
    attention as in `keras.layers.MultiHeadAttention`; the output keeps the query's mask.
    """

    dense_class = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "Args:" not in (cls.__doc__ or ""):
            base_doc = _MultiHeadAttentionBase.__doc__.split("\n\n", 1)[1]
            cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n    " + base_doc.lstrip()

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        kernel_initializer="trainable_normal",
        bias_initializer="zeros",
        kernel_regularizer="prior",
        bias_regularizer=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.supports_masking = True
        if attention_axes is not None:
            raise ValueError(
                f"{type(self).__name__} attends over the length axis only (attention_axes=None)."
            )
        self.num_heads, self.key_dim = int(num_heads), int(key_dim)
        self.value_dim = int(value_dim or key_dim)
        self.dropout, self.use_bias = float(dropout), use_bias
        self._output_dim = output_shape
        self.seed = seed
        self._dense_kwargs = {
            "use_bias": use_bias,
            "kernel_initializer": kernel_initializer,
            "bias_initializer": bias_initializer,
            "kernel_regularizer": kernel_regularizer,
            "bias_regularizer": bias_regularizer,
        }
        self._config_kwargs = dict(self._dense_kwargs)
        self.dropout_layer = keras.layers.Dropout(self.dropout, seed=seed)

    def _dense(self, units, name, offset):
        seed = None if self.seed is None else self.seed + offset
        kwargs = {
            k: (keras.saving.deserialize_keras_object(v) if isinstance(v, dict) else v)
            for k, v in self._dense_kwargs.items()
        }
        return self.dense_class(units, name=name, seed=seed, **kwargs)

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        output_dim = self._output_dim or query_shape[-1]
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query", 1)
        self.key_dense = self._dense(self.num_heads * self.key_dim, "key", 2)
        self.value_dense = self._dense(self.num_heads * self.value_dim, "value", 3)
        self.output_dense = self._dense(output_dim, "attention_output", 4)
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))

    def _split_heads(self, x, depth):
        shape = tf.shape(x)
        x = tf.reshape(x, tf.concat([shape[:2], [self.num_heads, depth]], 0))
        return tf.transpose(x, [0, 2, 1, 3])  # [batch, heads, length, depth]

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
    ):
        key_given = key is not None and key is not value
        key = value if key is None else key
        # Keras masks of the inputs (e.g. from `Embedding(mask_zero=True)`), as Keras' own
        # MultiHeadAttention: padded queries and keys take no part in the attention.
        masks = []
        if query_mask is not None:
            masks.append(tf.cast(query_mask, tf.bool)[:, :, None])  # [B, T, 1]
        if value_mask is not None:
            masks.append(tf.cast(value_mask, tf.bool)[:, None, :])  # [B, 1, S]
        if key_mask is not None and key_given:
            masks.append(tf.cast(key_mask, tf.bool)[:, None, :])
        q = self._split_heads(self.query_dense(query), self.key_dim)
        k = self._split_heads(self.key_dense(key), self.key_dim)
        v = self._split_heads(self.value_dense(value), self.value_dim)
        logits = tf.matmul(q, k, transpose_b=True) / math.sqrt(self.key_dim)
        if attention_mask is not None:
            masks.append(tf.cast(attention_mask, tf.bool))
        mask = None
        for part in masks:
            mask = part if mask is None else tf.logical_and(mask, part)
        if mask is not None:
            mask = mask[:, None]  # broadcast over heads
        if use_causal_mask:
            length_q, length_k = tf.shape(logits)[-2], tf.shape(logits)[-1]
            causal = tf.linalg.band_part(tf.ones([length_q, length_k], tf.bool), -1, 0)
            mask = causal if mask is None else tf.logical_and(mask, causal)
        if mask is not None:
            logits = tf.where(mask, logits, tf.constant(-1e9, logits.dtype))
        scores = tf.nn.softmax(logits, axis=-1)
        attended = tf.matmul(self.dropout_layer(scores, training=training), v)
        attended = tf.transpose(attended, [0, 2, 1, 3])
        shape = tf.shape(attended)
        attended = tf.reshape(
            attended, tf.concat([shape[:2], [self.num_heads * self.value_dim]], 0)
        )
        output = self.output_dense(attended)
        return (output, scores) if return_attention_scores else output

    def compute_mask(self, query, mask=None, *args, **kwargs):
        """The output keeps the query's mask (as in Keras' MultiHeadAttention); Keras passes
        the first input and its mask."""
        return mask

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self._output_dim or query_shape[-1],)

    def get_config(self):
        serialize = keras.saving.serialize_keras_object
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "output_shape": self._output_dim,
            "seed": self.seed,
            **{
                k: (v if isinstance(v, (str, type(None))) else serialize(v))
                for k, v in self._config_kwargs.items()
                if k != "use_bias"
            },
        }


@register
class MultiHeadAttentionReparameterization(_MultiHeadAttentionBase):
    """Multi-head attention whose projections draw their weights once per call."""

    dense_class = DenseReparameterization


@register
class MultiHeadAttentionFlipout(_MultiHeadAttentionBase):
    """Multi-head attention whose projections use Flipout (signs per example and feature)."""

    dense_class = DenseFlipout
