"""The Bayesian Transformer (paper Section 3.1; Vaswani et al., 2017) as Keras models.

`transformer` is the encoder-decoder for sequence-to-sequence tasks (inputs
`{'source': ids, 'target_in': ids}`, teacher forcing) and `transformer_lm` the decoder-only
language model (inputs: ids). Token id 0 is padding: the embeddings' Keras masks keep padded
positions out of every attention, through the Bayesian layers.

Each part is switchable, as in the paper's experiment (Bayesian attention and feed-forward
layers, the rest deterministic by default):

* `bayesian_attention`: `MultiHeadAttentionFlipout` (else `keras.layers.MultiHeadAttention`);
* `bayesian_ffn`: `DenseLocalReparameterization` feed-forward layers (else `Dense`);
* `bayesian_embeddings`: `EmbeddingReparameterization` (else `Embedding`).

With all three off the model is the deterministic Transformer. Post-layer-norm blocks,
sinusoidal positions, ReLU feed-forward, dropout on every sub-layer output.
"""

import gin
import keras
import tensorflow as tf

from blayers import layers as blayers_layers
from blayers.layers.embeddings import PositionalEncoding

__all__ = [
    "TransformerSchedule",
    "transformer",
    "transformer_lm",
    "transformer_schedule",
]


@keras.saving.register_keras_serializable("blayers.lab.models")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)` (Vaswani et al., 2017).

    Args:
      d_model: model width.
      warmup_steps: steps of linear warm-up.
      scale: multiplies the rate.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        self.d_model, self.warmup_steps, self.scale = d_model, warmup_steps, scale

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        rate = tf.minimum(tf.math.rsqrt(step), step * float(self.warmup_steps) ** -1.5)
        return self.scale * float(self.d_model) ** -0.5 * rate

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


@gin.configurable(module="blayers.lab.models")
def transformer_schedule(learning_rate, d_model=512, warmup_steps=4000):
    """`make_optimizer.schedule = @transformer_schedule`: the warm-up schedule, with
    `make_optimizer.learning_rate` as its scale."""
    return TransformerSchedule(d_model, warmup_steps, learning_rate)


class _Parts:
    """The layer classes of one Transformer, by the gin switches."""

    def __init__(self, bayesian_attention, bayesian_ffn, bayesian_embeddings, dropout, seed):
        self.attention_cls = (
            blayers_layers.MultiHeadAttentionFlipout
            if bayesian_attention
            else keras.layers.MultiHeadAttention
        )
        self.dense_cls = (
            blayers_layers.DenseLocalReparameterization if bayesian_ffn else keras.layers.Dense
        )
        self.embedding_cls = (
            blayers_layers.EmbeddingReparameterization
            if bayesian_embeddings
            else keras.layers.Embedding
        )
        self.dropout, self.seed = dropout, seed
        self._count = 0

    def _seed(self):
        self._count += 1
        return None if self.seed is None else self.seed + self._count

    def attention(self, num_heads, d_model, name):
        kwargs = (
            {"seed": self._seed()}
            if self.attention_cls is not keras.layers.MultiHeadAttention
            else {}
        )
        return self.attention_cls(num_heads, d_model // num_heads, name=name, **kwargs)

    def dense(self, units, name, activation=None):
        kwargs = {"seed": self._seed()} if self.dense_cls is not keras.layers.Dense else {}
        return self.dense_cls(units, activation=activation, name=name, **kwargs)

    def embed(self, ids, vocab_size, d_model, name):
        x = self.embedding_cls(vocab_size, d_model, mask_zero=True, name=name)(ids)
        return keras.layers.Dropout(self.dropout)(PositionalEncoding(name=f"{name}_positions")(x))

    def sublayer(self, x, y):
        """Post-norm residual: `LayerNorm(x + Dropout(y))`."""
        y = keras.layers.Dropout(self.dropout)(y)
        return keras.layers.LayerNormalization(epsilon=1e-6)(keras.layers.Add()([x, y]))

    def feed_forward(self, x, d_ff, d_model, name):
        h = self.dense(d_ff, f"{name}_ffn_1", activation="relu")(x)
        return self.sublayer(x, self.dense(d_model, f"{name}_ffn_2")(h))


def _check(name, d_model, num_heads):
    if d_model % num_heads:
        raise ValueError(f"{name}: d_model={d_model} must be divisible by num_heads={num_heads}.")


@gin.configurable(module="blayers.lab.models")
def transformer(
    input_shape,
    num_outputs,
    source_vocab_size=None,
    num_layers=6,
    d_model=512,
    d_ff=2048,
    num_heads=8,
    dropout=0.1,
    bayesian_attention=True,
    bayesian_ffn=True,
    bayesian_embeddings=False,
    seed=None,
    name="bayesian_transformer",
):
    """Encoder-decoder Transformer: `{'source', 'target_in'}` ids -> next-token logits
    `[batch, target_length, num_outputs]`.

    Args:
      input_shape: `{'source': (source_length,), 'target_in': (target_length,)}` (lengths may
        be None).
      num_outputs: the target vocabulary.
      source_vocab_size: the source vocabulary (default `num_outputs`, a shared vocabulary).
      num_layers: encoder and decoder layers each.
      d_model, d_ff, num_heads: widths and heads.
      dropout: on embeddings and every sub-layer output.
      bayesian_attention, bayesian_ffn, bayesian_embeddings: which parts are Bayesian.
      seed: seeds the Bayesian layers' noise.
    """
    _check("transformer", d_model, num_heads)
    parts = _Parts(bayesian_attention, bayesian_ffn, bayesian_embeddings, dropout, seed)
    source = keras.Input(tuple(input_shape["source"]), dtype="int32", name="source")
    target_in = keras.Input(tuple(input_shape["target_in"]), dtype="int32", name="target_in")
    x = parts.embed(source, source_vocab_size or num_outputs, d_model, "source_embedding")
    for i in range(num_layers):
        attention = parts.attention(num_heads, d_model, f"encoder_{i}_self_attention")
        x = parts.sublayer(x, attention(x, x))
        x = parts.feed_forward(x, d_ff, d_model, f"encoder_{i}")
    memory = x
    y = parts.embed(target_in, num_outputs, d_model, "target_embedding")
    for i in range(num_layers):
        attention = parts.attention(num_heads, d_model, f"decoder_{i}_self_attention")
        y = parts.sublayer(y, attention(y, y, use_causal_mask=True))
        cross = parts.attention(num_heads, d_model, f"decoder_{i}_cross_attention")
        y = parts.sublayer(y, cross(y, memory))
        y = parts.feed_forward(y, d_ff, d_model, f"decoder_{i}")
    logits = keras.layers.Dense(num_outputs, name="logits")(y)
    return keras.Model({"source": source, "target_in": target_in}, logits, name=name)


@gin.configurable(module="blayers.lab.models")
def transformer_lm(
    input_shape,
    num_outputs,
    num_layers=6,
    d_model=512,
    d_ff=2048,
    num_heads=8,
    dropout=0.1,
    bayesian_attention=True,
    bayesian_ffn=True,
    bayesian_embeddings=False,
    seed=None,
    name="bayesian_transformer_lm",
):
    """Decoder-only Transformer language model: ids `[batch, length]` -> next-token logits
    `[batch, length, num_outputs]` (causal self-attention).

    Args:
      input_shape: `(length,)`.
      num_outputs: the vocabulary.
      num_layers, d_model, d_ff, num_heads, dropout: as `transformer`.
      bayesian_attention, bayesian_ffn, bayesian_embeddings: which parts are Bayesian.
      seed: seeds the Bayesian layers' noise.
    """
    _check("transformer_lm", d_model, num_heads)
    parts = _Parts(bayesian_attention, bayesian_ffn, bayesian_embeddings, dropout, seed)
    ids = keras.Input(tuple(input_shape), dtype="int32", name="ids")
    y = parts.embed(ids, num_outputs, d_model, "embedding")
    for i in range(num_layers):
        attention = parts.attention(num_heads, d_model, f"decoder_{i}_self_attention")
        y = parts.sublayer(y, attention(y, y, use_causal_mask=True))
        y = parts.feed_forward(y, d_ff, d_model, f"decoder_{i}")
    logits = keras.layers.Dense(num_outputs, name="logits")(y)
    return keras.Model(ids, logits, name=name)
