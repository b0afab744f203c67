"""The Bayesian Transformer in Mesh TensorFlow's core (paper Section 3.1, Figure 9): the
encoder-decoder of `blayers.lab.models.transformer` written in `mtf` ops, so that a layout splits
its heads, feed-forward width and vocabulary over a `model` mesh dimension and its batch over a
`batch` dimension (or its decoder-only language model: `source=None`). Attention projections use Flipout and feed-forward layers local
reparameterization (`blayers.lab.mesh.layers.bayesian_dense`), as in the paper; embeddings and the
output layer are deterministic. Token id 0 is padding.

`transformer_loss(mesh, source, target_in, target_out, hparams)` returns the mtf scalars
`(nll, kl, tokens)`: the summed target NLL of the batch, the weights' KL and the count of
non-padded target tokens.
"""

import dataclasses
import math

import gin
import tensorflow as tf

from blayers.lab.mesh.layers import bayesian_dense, mtf
from blayers.layers.embeddings import sinusoid_table

__all__ = ["TransformerHParams", "target_terms", "transformer_logits", "transformer_loss"]


@gin.configurable(module="blayers.lab.mesh")
@dataclasses.dataclass
class TransformerHParams:
    """Sizes and switches of the mtf Transformer.

    Attributes:
      vocab_size: the shared vocabulary (None: the data's, set by `MeshLearner`).
      d_model, d_ff, num_heads, num_layers: as `blayers.lab.models.transformer`.
      attention_estimator, ffn_estimator: `bayesian_dense` estimators (None: deterministic).
      prior_stddev: the weights' N(0, prior_stddev^2) prior.
    """

    vocab_size: int | None = None
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    num_layers: int = 6
    attention_estimator: str | None = "flipout"
    ffn_estimator: str | None = "local_reparameterization"
    prior_stddev: float = 1.0


class _Dims:
    def __init__(self, hparams, batch, source_length, target_length):
        self.batch = mtf.Dimension("batch", batch)
        self.source = mtf.Dimension("source_length", source_length)
        self.target = mtf.Dimension("length", target_length)
        self.memory = mtf.Dimension("memory_length", max(source_length, target_length))
        self.model = mtf.Dimension("d_model", hparams.d_model)
        self.heads = mtf.Dimension("heads", hparams.num_heads)
        self.key = mtf.Dimension("d_k", hparams.d_model // hparams.num_heads)
        self.ff = mtf.Dimension("d_ff", hparams.d_ff)
        self.vocab = mtf.Dimension("vocab", hparams.vocab_size)


def _positions(mesh, length_dim, model_dim, dtype):
    table = sinusoid_table(length_dim.size, model_dim.size)
    return mtf.import_tf_tensor(mesh, tf.constant(table, dtype), mtf.Shape([length_dim, model_dim]))


class _Builder:
    def __init__(self, hparams, dims, noise):
        self.h, self.d, self.noise = hparams, dims, noise
        self.kl_terms = []

    def dense(self, x, new_dims, name, estimator, **kwargs):
        y, kl = bayesian_dense(
            x,
            new_dims,
            name,
            estimator=estimator,
            prior_stddev=self.h.prior_stddev,
            noise=self.noise,
            **kwargs,
        )
        if estimator is not None:
            self.kl_terms.append(kl)
        return y

    def attention(self, x, memory, memory_dim, bias, name):
        """Multi-head attention of `x` [batch, length, d_model] over `memory` [batch,
        memory_length, d_model]; `bias` broadcasts to [batch, heads, length, memory_length]."""
        d, est = self.d, self.h.attention_estimator
        q = self.dense(x, [d.heads, d.key], f"{name}/query", est)
        k = self.dense(memory, [d.heads, d.key], f"{name}/key", est)
        v = self.dense(memory, [d.heads, d.key], f"{name}/value", est)
        length = x.shape.dims[1]
        logits = mtf.einsum(
            [q, k], output_shape=mtf.Shape([d.batch, d.heads, length, memory_dim])
        ) * (d.key.size**-0.5)
        weights = mtf.softmax(logits + bias, memory_dim)
        attended = mtf.einsum(
            [weights, v], output_shape=mtf.Shape([d.batch, length, d.heads, d.key])
        )
        return self.dense(attended, d.model, f"{name}/output", est, reduced_dims=[d.heads, d.key])

    def block(self, x, y):
        return mtf.layers.layer_norm(x + y, self.d.model)

    def feed_forward(self, x, name):
        d, est = self.d, self.h.ffn_estimator
        h = self.dense(x, d.ff, f"{name}/ffn_1", est, activation=mtf.relu)
        return self.dense(h, d.model, f"{name}/ffn_2", est)

    def embed(self, ids, length_dim, name):
        d = self.d
        table = mtf.get_variable(
            ids.mesh,
            f"{name}_embedding",
            mtf.Shape([d.vocab, d.model]),
            initializer=tf.compat.v1.random_normal_initializer(stddev=d.model.size**-0.5),
        )
        x = mtf.gather(table, ids, d.vocab) * math.sqrt(d.model.size)
        return x + _positions(ids.mesh, length_dim, d.model, x.dtype)


def _padding_bias(ids, length_dim, memory_dim):
    """-1e9 where the memory position is padding, as [batch, memory_length]."""
    keep = mtf.cast(mtf.not_equal(ids, 0), tf.float32)
    return mtf.rename_dimension((keep - 1.0) * 1e9, length_dim.name, memory_dim.name)


def transformer_logits(mesh, source, target_in, hparams, noise=None):
    """Next-token logits [batch, length, vocab], the list of the weights' KL terms and the
    model's dimensions; `noise` is the Bayesian layers' `NoiseSource` (default: the graph's).
    With `source=None`, the decoder-only language model (no encoder, no cross-attention)."""
    batch, target_length = target_in.shape.dims
    source_size = target_length.size if source is None else source.shape.dims[1].size
    d = _Dims(hparams, batch.size, source_size, target_length.size)
    builder = _Builder(hparams, d, noise)
    encoded = None
    if source is not None:
        source_length = source.shape.dims[1]
        source_memory = mtf.Dimension("source_memory", source_length.size)
        source_bias = _padding_bias(source, source_length, source_memory)
        x = builder.embed(source, source_length, "source")
        for i in range(hparams.num_layers):
            memory = mtf.rename_dimension(x, source_length.name, source_memory.name)
            x = builder.block(
                x, builder.attention(x, memory, source_memory, source_bias, f"enc{i}")
            )
            x = builder.block(x, builder.feed_forward(x, f"enc{i}"))
        encoded = mtf.rename_dimension(x, source_length.name, source_memory.name)
    target_memory = mtf.Dimension("target_memory", target_length.size)
    query_positions = mtf.range(mesh, target_length, tf.int32)
    key_positions = mtf.range(mesh, target_memory, tf.int32)
    causal = mtf.cast(mtf.less(query_positions, key_positions), tf.float32) * -1e9
    y = builder.embed(target_in, target_length, "target")
    for i in range(hparams.num_layers):
        memory = mtf.rename_dimension(y, target_length.name, target_memory.name)
        y = builder.block(y, builder.attention(y, memory, target_memory, causal, f"dec{i}/self"))
        if encoded is not None:
            y = builder.block(
                y, builder.attention(y, encoded, source_memory, source_bias, f"dec{i}/cross")
            )
        y = builder.block(y, builder.feed_forward(y, f"dec{i}"))
    logits = mtf.layers.dense(y, d.vocab, reduced_dims=[d.model], name="logits")
    return logits, builder.kl_terms, d


def target_terms(logits, target_out, vocab_dim):
    """`(token_nll, weights)`: each target token's NLL under `logits` and its weight (0 at
    padding, id 0), both [batch, length]."""
    weights = mtf.cast(mtf.not_equal(target_out, 0), logits.dtype)
    token_nll = mtf.layers.softmax_cross_entropy_with_logits(
        logits, mtf.one_hot(target_out, vocab_dim, dtype=logits.dtype), vocab_dim
    )
    return token_nll, weights


def transformer_loss(mesh, source, target_in, target_out, hparams, noise=None):
    """`(nll, kl, tokens)`: the batch's summed target NLL over non-padded tokens, the summed KL
    of every Bayesian weight, and the number of non-padded target tokens (mtf scalars)."""
    logits, kl_terms, d = transformer_logits(mesh, source, target_in, hparams, noise)
    token_nll, weights = target_terms(logits, target_out, d.vocab)
    kl = mtf.add_n(kl_terms) if kl_terms else mtf.zeros(mesh, mtf.Shape([]))
    return mtf.reduce_sum(token_nll * weights), kl, mtf.reduce_sum(weights)
