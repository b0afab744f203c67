"""Discrete flows (Tran et al., 2019, "Discrete Flows: Invertible Generative Models of Discrete
Data"): bijections of one-hot sequences `[..., length, vocab]` by modular arithmetic,
`y = (mu + sigma * x) mod K`, with `mu`, `sigma` read off a network by a straight-through
argmax (`one_hot_argmax`: the forward pass is the hard one-hot, the gradient the softmax's at
`temperature`). A discrete bijection has no volume change, so a flow's pmf is
`p(y) = p_base(reverse(y))`: called on a `RandomVariable` over one-hot tokens, these layers return
the transformed random variable (`blayers.layers.ReversibleLayer`).

* `DiscreteAutoregressiveFlow(layer)`: `mu`, `sigma` of position `t` from positions `< t` (a
  `MADE(event_ndims=2)`); `reverse` (data -> base, the likelihood's direction) is one parallel
  pass, `forward` (sampling) one pass per position.
* `DiscreteBipartiteFlow(layer, mask)`: positions with `mask = 1` pass unchanged and condition
  `mu`, `sigma` of the others: both directions are one pass.

`sigma` is restricted to units of `Z_K` (coprime with `K`), so every transform is invertible.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from blayers.layers.base import NestedLayers, register
from blayers.layers.reversible import ReversibleLayer

__all__ = [
    "DiscreteAutoregressiveFlow",
    "DiscreteBipartiteFlow",
    "SinkhornAutoregressiveFlow",
    "hard_permutation",
    "multiplicative_inverse",
    "one_hot_add",
    "one_hot_argmax",
    "one_hot_minus",
    "one_hot_multiply",
    "sinkhorn",
]


def one_hot_argmax(logits, temperature):
    """The one-hot argmax of `logits` in the forward pass; the gradient of
    `softmax(logits / temperature)` in the backward pass (straight-through)."""
    hard = tf.one_hot(tf.argmax(logits, axis=-1), logits.shape[-1], dtype=logits.dtype)
    soft = tf.nn.softmax(logits / temperature, axis=-1)
    return soft + tf.stop_gradient(hard - soft)


def sinkhorn(logits, iterations=20):
    """Sinkhorn normalization (Mena et al., 2018): `exp(logits)` `[..., K, K]` made doubly
    stochastic by alternately normalizing rows and columns, in log space."""
    for _ in range(iterations):
        logits = logits - tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
        logits = logits - tf.reduce_logsumexp(logits, axis=-2, keepdims=True)
    return tf.exp(logits)


def hard_permutation(scores):
    """A permutation matrix from scores `[..., K, K]` by greedy matching: the largest remaining
    entry, then its row and column are taken out, `K` times. Always a permutation (a bijection
    whatever the scores), a pure TF op (graph and XLA); edward2 solves the assignment with
    scipy's Hungarian algorithm instead, which can pick another permutation."""
    vocab = scores.shape[-1]
    batch = tf.shape(scores)[:-2]
    flat = tf.reshape(scores, tf.concat([batch, [vocab * vocab]], 0))
    taken = tf.zeros_like(flat, dtype=tf.bool)
    permutation = tf.zeros_like(flat)
    lowest = tf.fill(tf.shape(flat), tf.constant(np.finfo(np.float32).min, flat.dtype))
    rows = tf.constant(np.repeat(np.arange(vocab), vocab), tf.int64)
    columns = tf.constant(np.tile(np.arange(vocab), vocab), tf.int64)
    for _ in range(vocab):
        index = tf.argmax(tf.where(taken, lowest, flat), axis=-1)
        chosen = tf.one_hot(index, vocab * vocab, dtype=flat.dtype)
        permutation += chosen
        row, column = index // vocab, index % vocab
        taken = tf.logical_or(
            taken,
            tf.logical_or(tf.equal(rows, row[..., None]), tf.equal(columns, column[..., None])),
        )
    return tf.reshape(permutation, tf.shape(scores))


def _shift_matrix(shift):
    """`M[..., i, u] = shift[..., (u - i) mod K]`."""
    vocab = shift.shape[-1]
    return tf.stack([tf.roll(shift, i, axis=-1) for i in range(vocab)], axis=-2)


def one_hot_add(inputs, shift):
    """`(inputs + shift) mod K` for one-hot (or soft one-hot: a weighted sum of shifts)
    vectors on the last axis."""
    return tf.einsum("...v,...vu->...u", inputs, _shift_matrix(tf.cast(shift, inputs.dtype)))


def one_hot_minus(inputs, shift):
    """`(inputs - shift) mod K` in one-hot space."""
    return tf.einsum("...v,...uv->...u", inputs, _shift_matrix(tf.cast(shift, inputs.dtype)))


def _multiplication_table(vocab, dtype):
    """`T[a, v, u] = [a v = u mod K]`."""
    a = np.arange(vocab)
    table = np.zeros((vocab, vocab, vocab), np.float64)
    table[a[:, None], a[None, :], (a[:, None] * a[None, :]) % vocab] = 1.0
    return tf.constant(table, dtype)


def one_hot_multiply(inputs, scale):
    """`(inputs * scale) mod K` in one-hot space."""
    table = _multiplication_table(inputs.shape[-1], inputs.dtype)
    return tf.einsum("...a,...v,avu->...u", tf.cast(scale, inputs.dtype), inputs, table)


def _inverses(vocab):
    """`inv[a]`: the inverse of `a` modulo `K`, or -1 where none exists (`gcd(a, K) > 1`)."""
    return np.array([pow(a, -1, vocab) if math.gcd(a, vocab) == 1 else -1 for a in range(vocab)])


def multiplicative_inverse(scale):
    """The one-hot inverse modulo `K` of one-hot `scale` (entries without an inverse map to 0)."""
    vocab = scale.shape[-1]
    inverses = _inverses(vocab)
    table = np.zeros((vocab, vocab), np.float64)
    valid = inverses >= 0
    table[np.arange(vocab)[valid], inverses[valid]] = 1.0
    return tf.einsum("...a,au->...u", scale, tf.constant(table, scale.dtype))


class _DiscreteFlow(NestedLayers, ReversibleLayer):
    nested_layer_args = ("layer",)

    def __init__(self, layer, temperature=0.1, **kwargs):
        super().__init__(**kwargs)
        if not temperature > 0:
            raise ValueError(f"{type(self).__name__} ({self.name}): temperature must be > 0.")
        if not isinstance(layer, keras.layers.Layer):
            if not callable(layer):
                raise TypeError(
                    f"{type(self).__name__} ({self.name}): layer must be a Keras layer or a "
                    f"function of the inputs, got {layer!r}."
                )
            # edward2's form, `layer=lambda inputs, **kwargs: ...`: a function becomes a Lambda
            # layer (saved by reference, as Keras saves any Lambda).
            layer = keras.layers.Lambda(layer)
        self.layer, self.temperature = layer, float(temperature)

    def build(self, input_shape):
        vocab = input_shape[-1]
        if vocab is None or input_shape[-2] is None:
            raise ValueError(
                f"{type(self).__name__} ({self.name}) needs known length and vocabulary sizes, "
                f"got {input_shape}."
            )
        self.vocab_size = int(vocab)
        # -inf on the scales without an inverse modulo K keeps every transform bijective.
        units = _inverses(self.vocab_size) >= 0
        self._scale_mask = tf.constant(np.where(units, 0.0, -1e9), self.compute_dtype)
        if not self.layer.built:
            self.layer.build(input_shape)

    def _loc_scale(self, net, dtype):
        """`(mu, sigma)` one-hots from the network's `[..., K]` (location only, sigma = 1) or
        `[..., 2K]` outputs."""
        k = self.vocab_size
        if net.shape[-1] == k:
            return one_hot_argmax(tf.cast(net, dtype), self.temperature), None
        if net.shape[-1] != 2 * k:
            raise ValueError(
                f"{type(self).__name__} ({self.name}): the network returns {net.shape[-1]} "
                f"values per position; expected vocab_size = {k} (location) or {2 * k} "
                "(location and scale)."
            )
        loc, scale = tf.split(tf.cast(net, dtype), 2, axis=-1)
        scale = one_hot_argmax(scale + tf.cast(self._scale_mask, dtype), self.temperature)
        return one_hot_argmax(loc, self.temperature), scale

    def forward(self, x):
        return self._exact(self._forward, x)

    def reverse(self, y):
        return self._exact(self._reverse, y)

    def _exact(self, transform, inputs):
        """`transform` in the compute dtype; integer one-hots (TFP's `OneHotCategorical`
        default) come back as integers, exactly."""
        inputs = tf.convert_to_tensor(inputs)
        outputs = transform(tf.cast(inputs, self.compute_dtype))
        if inputs.dtype.is_integer:
            return tf.cast(tf.round(outputs), inputs.dtype)
        return tf.cast(outputs, inputs.dtype)

    def _network(self, inputs):
        net = self.layer(inputs)
        if net.shape.rank == inputs.shape.rank + 1:  # MADE's [..., length, params]
            net = tf.reshape(net, tf.concat([tf.shape(net)[:-2], [-1]], 0))
        return net

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature, **self._nested_config()}


@register
class DiscreteAutoregressiveFlow(_DiscreteFlow):
    """Autoregressive discrete flow: `y_t = (mu_t + sigma_t x_t) mod K` with `mu_t`, `sigma_t`
    functions of `y_{<t}` (the network is causal over positions, e.g.
    `MADE([64], params=2 * vocab, event_ndims=2)`; `params = vocab` for location only).

    As in edward2: `reverse(y) = (mu(y) + sigma(y) y) mod K` (the likelihood's direction, one
    parallel pass) and `forward(x)` its inverse, `(x - mu) sigma^-1 mod K` computed position by
    position (sampling).

    Args:
      layer: the causal network, `[..., length, K]` -> `[..., length, K or 2K]` (a MADE's
        `[..., length, K, 1]` / `[..., length, 1, 2K]` outputs are flattened per position): a
        Keras layer or a function of the inputs (edward2's `layer=lambda inputs, **kwargs:`).
      temperature: of the straight-through softmax.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def _reverse(self, y):
        loc, scale = self._loc_scale(self._network(y), y.dtype)
        scaled = y if scale is None else one_hot_multiply(y, scale)
        return one_hot_add(scaled, loc)

    def _forward(self, x):
        length = x.shape[-2]
        outputs = tf.zeros_like(x)
        position = tf.range(length)
        for t in range(length):
            # Positions > t of `outputs` are zeros; the causal network ignores them for t.
            loc, scale = self._loc_scale(self._network(outputs), x.dtype)
            new = one_hot_minus(x, loc)
            if scale is not None:
                new = one_hot_multiply(new, multiplicative_inverse(scale))
            keep = tf.cast(position == t, x.dtype)[:, None]
            outputs = outputs * (1.0 - keep) + new * keep
        return outputs


@register
class DiscreteBipartiteFlow(_DiscreteFlow):
    """Bipartite (coupling) discrete flow: positions with `mask = 1` pass unchanged; the others
    become `(mu + sigma x) mod K` (`reverse`) with `mu`, `sigma` from the network on the masked
    inputs. Both directions are one pass.

    Args:
      layer: the network, `[..., length, K]` -> `[..., length, K or 2K]`: a Keras layer or a
        function of the inputs.
      mask: `[length]` 0/1 (list or array): the conditioning positions.
      temperature: of the straight-through softmax.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, layer, mask, temperature=0.1, **kwargs):
        super().__init__(layer, temperature=temperature, **kwargs)
        mask = np.asarray(mask, np.float32).reshape(-1)
        if not np.all((mask == 0) | (mask == 1)):
            raise ValueError(f"DiscreteBipartiteFlow ({self.name}): mask must be 0/1, got {mask}.")
        self.mask = mask

    def build(self, input_shape):
        if input_shape[-2] != len(self.mask):
            raise ValueError(
                f"DiscreteBipartiteFlow ({self.name}): mask has {len(self.mask)} positions, the "
                f"inputs {input_shape[-2]}."
            )
        super().build(input_shape)

    def _parts(self, inputs):
        mask = tf.constant(self.mask[:, None], inputs.dtype)
        loc, scale = self._loc_scale(self._network(inputs * mask), inputs.dtype)
        return mask, loc, scale

    def _reverse(self, y):
        mask, loc, scale = self._parts(y)
        scaled = y if scale is None else one_hot_multiply(y, scale)
        return mask * y + (1.0 - mask) * one_hot_add(scaled, loc)

    def _forward(self, x):
        mask, loc, scale = self._parts(x)
        new = one_hot_minus(x, loc)
        if scale is not None:
            new = one_hot_multiply(new, multiplicative_inverse(scale))
        return mask * x + (1.0 - mask) * new

    def get_config(self):
        return {**super().get_config(), "mask": self.mask.astype(int).tolist()}


@register
class SinkhornAutoregressiveFlow(_DiscreteFlow):
    """Autoregressive discrete flow by permutations (edward2's `SinkhornAutoregressiveFlow`):
    position `t`'s token is permuted, `y_t = P_t x_t`, by a permutation matrix `P_t` read off
    the causal network's `K x K` outputs for `y_{<t}` (Sinkhorn normalization at `temperature`,
    then a hard permutation with the Sinkhorn matrix's gradient, straight-through). A
    permutation has no volume change, so `p(y) = p_base(reverse(y))`.

    `reverse(y) = y P_t` (the likelihood's direction, one parallel pass); `forward(x)` (sampling)
    one pass per position.

    Args:
      layer: the causal network, `[..., length, K]` -> `[..., length, K * K]` (e.g.
        `MADE([64], params=K * K, event_ndims=2)`): a Keras layer or a function of the inputs.
      temperature: of the Sinkhorn normalization (the gradient's bias).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def _permutations(self, net):
        k = self.vocab_size
        if net.shape[-1] != k * k:
            raise ValueError(
                f"SinkhornAutoregressiveFlow ({self.name}): the network returns {net.shape[-1]} "
                f"values per position; expected vocab_size ** 2 = {k * k}."
            )
        logits = tf.reshape(net, tf.concat([tf.shape(net)[:-1], [k, k]], 0))
        soft = sinkhorn(logits / self.temperature)
        return soft + tf.stop_gradient(hard_permutation(soft) - soft)

    def _reverse(self, y):
        permutations = self._permutations(tf.cast(self._network(y), y.dtype))
        return tf.einsum("...j,...jk->...k", y, permutations)

    def _forward(self, x):
        outputs = tf.zeros_like(x)
        position = tf.range(x.shape[-2])
        for t in range(x.shape[-2]):
            # Positions > t of `outputs` are zeros; the causal network ignores them for t.
            permutations = self._permutations(tf.cast(self._network(outputs), x.dtype))
            new = tf.einsum("...k,...jk->...j", x, permutations)
            keep = tf.cast(position == t, x.dtype)[:, None]
            outputs = outputs * (1.0 - keep) + new * keep
        return outputs
