"""Bayesian multi-head attention: distributions over the query, key, value and output
projections (the paper's Bayesian Transformer replaces attention by its Flipout counterpart).

`MultiHeadAttentionReparameterization` and `MultiHeadAttentionFlipout` take the constructor and
call arguments of `keras.layers.MultiHeadAttention` (`num_heads`, `key_dim`, `value_dim`,
`dropout`, `use_bias`, `output_shape`; `call(query, value, key=None, attention_mask=None,
return_attention_scores=False, training=None, use_causal_mask=False)`) for inputs of shape
`[batch, length, features]`. The four projections are the layer's own Bayesian weights
(`query_kernel`, `key_kernel`, `value_kernel`, `output_kernel` and their biases), applied by the
same estimators as every other family (`blayers.layers.estimators`); their KL terms land in
`layer.losses`. The attention itself is Vaswani et al.'s scaled dot product.
"""

import math

import keras
import tensorflow as tf

from blayers.layers.base import BayesianLayer, register
from blayers.layers.dense import dense_matmul
from blayers.layers.estimators import FlipoutEstimator, ReparameterizationEstimator

__all__ = ["MultiHeadAttentionFlipout", "MultiHeadAttentionReparameterization"]

PROJECTIONS = ("query", "key", "value", "output")


def fresh_identifier(identifier):
    """An initializer or regularizer identifier that gives a new object per projection: an
    instance is copied through its config (a distribution initializer serves one weight)."""
    if identifier is None or isinstance(identifier, (str, dict)):
        return identifier
    return keras.saving.serialize_keras_object(identifier)


class _MultiHeadAttentionBase(BayesianLayer):
    """Multi-head attention whose four projections are random weights.

    Keras masks of `query`, `value` and `key` (e.g. from `Embedding(mask_zero=True)`) mask the
    attention as in `keras.layers.MultiHeadAttention`; the output keeps the query's mask.
    """

    # Appended to every subclass's docstring by `ArgsDoc`.
    _args_doc = """    Args:
      num_heads: attention heads.
      key_dim: size of each head's queries and keys.
      value_dim: size of each head's values (default `key_dim`).
      dropout: dropout rate on the attention probabilities.
      use_bias: biases in the projections.
      output_shape: size of the output's last axis (default the query's).
      attention_axes: None only (attention over the length axis).
      kernel_initializer, bias_initializer: of every projection (default `'trainable_normal'`
        and `'zeros'`); a distribution initializer makes the projection random.
      kernel_regularizer, bias_regularizer: of every projection (default `'prior'`, None).
      seed: seeds the projections' noise and the dropout.
      **kwargs: `keras.layers.Layer` arguments.

    Keras masks of `query`, `value` and `key` mask the attention as in Keras' own layer.
"""

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
        super().__init__(seed=seed, **kwargs)
        self.supports_masking = True
        name = type(self).__name__
        if attention_axes is not None:
            raise ValueError(f"{name} attends over the length axis only (attention_axes=None).")
        for argument, value in (("num_heads", num_heads), ("key_dim", key_dim)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: {argument} must be a positive integer, got {value!r}.")
        self.num_heads, self.key_dim = num_heads, key_dim
        self.value_dim = int(value_dim or key_dim)
        self.dropout, self.use_bias = float(dropout), use_bias
        self._output_dim = output_shape
        kernel_args = (
            fresh_identifier(kernel_initializer),
            fresh_identifier(kernel_regularizer),
            None,
        )
        bias_args = (fresh_identifier(bias_initializer), fresh_identifier(bias_regularizer), None)
        for projection in PROJECTIONS:
            self._configure_weight(f"{projection}_kernel", *kernel_args)
            self._configure_weight(f"{projection}_bias", *bias_args)
        self.dropout_layer = keras.layers.Dropout(self.dropout, seed=seed)

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        output_dim = self._output_dim or query_shape[-1]
        heads_k, heads_v = self.num_heads * self.key_dim, self.num_heads * self.value_dim
        for projection, fan_in, fan_out in (
            ("query", query_shape[-1], heads_k),
            ("key", key_shape[-1], heads_k),
            ("value", value_shape[-1], heads_v),
            ("output", heads_v, output_dim),
        ):
            self.add_bayesian_weight(f"{projection}_kernel", (fan_in, fan_out))
            if self.use_bias:
                self.add_bayesian_weight(f"{projection}_bias", (fan_out,))
            else:
                setattr(self, f"{projection}_bias", None)

    def _linear(self, inputs, kernel):
        return dense_matmul(inputs, kernel)

    def project(self, projection, inputs):
        """`inputs @ W + b` for one of `PROJECTIONS`, with this call's weight draws."""
        outputs = self.kernel_fn(f"{projection}_kernel")(inputs)
        bias = getattr(self, f"{projection}_bias")
        return outputs if bias is None else outputs + tf.convert_to_tensor(bias)

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
        self.call_weights()
        key_given = key is not None and key is not value
        key = value if key is None else key
        dtype = self.compute_dtype
        query, value, key = (tf.convert_to_tensor(t, dtype) for t in (query, value, key))
        # Keras masks of the inputs (e.g. from `Embedding(mask_zero=True)`), as Keras' own
        # MultiHeadAttention: padded queries and keys take no part in the attention.
        masks = []
        if query_mask is not None:
            masks.append(tf.cast(query_mask, tf.bool)[:, :, None])  # [B, T, 1]
        if value_mask is not None:
            masks.append(tf.cast(value_mask, tf.bool)[:, None, :])  # [B, 1, S]
        if key_mask is not None and key_given:
            masks.append(tf.cast(key_mask, tf.bool)[:, None, :])
        q = self._split_heads(self.project("query", query), self.key_dim)
        k = self._split_heads(self.project("key", key), self.key_dim)
        v = self._split_heads(self.project("value", value), self.value_dim)
        logits = tf.matmul(q, k, transpose_b=True) / math.sqrt(self.key_dim)
        if attention_mask is not None:
            masks.append(tf.cast(attention_mask, tf.bool))
        if use_causal_mask:
            length_q, length_k = tf.shape(logits)[-2], tf.shape(logits)[-1]
            masks.append(tf.linalg.band_part(tf.ones([length_q, length_k], tf.bool), -1, 0))
        mask = None
        for part in masks:
            mask = part if mask is None else tf.logical_and(mask, part)
        if mask is not None:
            mask = mask[:, None] if mask.shape.rank == 3 else mask  # broadcast over heads
            logits = tf.where(mask, logits, tf.constant(-1e9, logits.dtype))
        scores = tf.nn.softmax(logits, axis=-1)
        if mask is not None:
            # A query whose every key is masked attends to nothing (zeros), as in Keras'
            # Softmax, not uniformly to the masked keys.
            scores = tf.where(mask, scores, tf.zeros([], scores.dtype))
        attended = tf.matmul(self.dropout_layer(scores, training=training), v)
        attended = tf.transpose(attended, [0, 2, 1, 3])
        shape = tf.shape(attended)
        attended = tf.reshape(
            attended, tf.concat([shape[:2], [self.num_heads * self.value_dim]], 0)
        )
        output = self.project("output", attended)
        return (output, scores) if return_attention_scores else output

    def compute_mask(self, query, mask=None, *args, **kwargs):
        """The output keeps the query's mask (as in Keras' MultiHeadAttention); Keras passes
        the first input and its mask."""
        return mask

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self._output_dim or query_shape[-1],)

    def get_config(self):
        # The projections share one configuration: the query's, as resolved (so a saved model
        # keeps its prior whatever `prior.regularizer` is bound to when it is loaded).
        query = self._weight_config("query_kernel", "kernel")
        bias = self._weight_config("query_bias", "bias")
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "output_shape": self._output_dim,
            "kernel_initializer": query["kernel_initializer"],
            "bias_initializer": bias["bias_initializer"],
            "kernel_regularizer": query["kernel_regularizer"],
            "bias_regularizer": bias["bias_regularizer"],
        }


@register
class MultiHeadAttentionReparameterization(ReparameterizationEstimator, _MultiHeadAttentionBase):
    """Multi-head attention whose projections draw their weights once per call."""


@register
class MultiHeadAttentionFlipout(FlipoutEstimator, _MultiHeadAttentionBase):
    """Multi-head attention whose projections use Flipout (signs per example and feature)."""
