"""Fast, exact sampling primitives shared by random variables and estimators.

Weight noise is the largest cost of a Bayesian layer's training step on CPU after its matmuls
and the optimizer. TF's `stateless_normal` takes about 8.5 ms for 1M values on a 2-core CPU, the
inverse CDF `ndtri(u)` of a uniform about 7 ms, Box-Muller on TF's Philox words and TF's
trigonometry 3.4 ms, and the fused path here (Threefry words, then Box-Muller with polynomial
sines, each one XLA pass; `blayers.fused`) 1.7 ms. Draws of at least `blayers.fused.MIN_SIZE`
float32 values take the fused path, smaller ones and float64 the TF ops; both are exact
Box-Muller, with other words. Every estimator draws Normal noise through `standard_normal`.

Replicas (many independent models as one, a layer's leading replica axis): with `keys` (one
`uint32` key a replica, `replica_keys`), `uniform`, `standard_normal`, `rademacher` and `sample`
draw `[R, ...]` whose slice `r` depends on the seed and `keys[r]` alone, so a replica draws the
same noise in any group, alone included. One Philox draw of a replica's shape is shared, and each
replica's words are that draw under its own bijective mix (MurmurHash3's 32-bit finalizer of the
word XOR the key): the cost of one draw of the whole `[R, ...]` shape, where a stateless op per
replica costs about 1.5 times as much at 240 replicas.
"""

import contextlib
import math
import threading

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import fused

tfd = tfp.distributions

__all__ = [
    "flat_multivariate_normal",
    "flip_signs",
    "normal_parameters",
    "rademacher",
    "replica_keys",
    "reuse_draws",
    "reusing_draws",
    "sample",
    "standard_normal",
    "standard_normal_like",
    "uniform",
    "xla_is_fast",
]


class _Memo(threading.local):
    cache = None


_MEMO = _Memo()


@contextlib.contextmanager
def reuse_draws(cache):
    """Inside, eager `standard_normal` and `rademacher` draws are looked up in `cache` (a dict)
    by kind, shape, seed and dtype before they are drawn. A draw is a function of its seed
    alone, so the result is the same; a recurrent cell that forms its sequence's weights again at
    every eager step thus pays for the noise once per sequence. Graph code is left alone."""
    previous, _MEMO.cache = _MEMO.cache, cache
    try:
        yield
    finally:
        _MEMO.cache = previous


def reusing_draws():
    """Whether eager draws are being reused (inside `reuse_draws`): fused draws, which the
    cache does not see, are then left aside."""
    return _MEMO.cache is not None and tf.executing_eagerly()


def _memoized(kind, draw, shape, seed, dtype):
    cache = _MEMO.cache
    if cache is None or not tf.executing_eagerly():
        return draw(shape, seed, dtype)
    key = (
        kind,
        tuple(tf.convert_to_tensor(shape, tf.int32).numpy().ravel().tolist()),
        tuple(np.asarray(seed).ravel().tolist()),
        tf.as_dtype(dtype).name,
    )
    if key not in cache:
        cache[key] = draw(shape, seed, dtype)
    return cache[key]


def xla_is_fast():
    """Whether Keras' automatic XLA compilation should be allowed for random layers.

    XLA's CPU random-number kernels are slow: measured here, a 1024 x 1024 Bayesian dense step
    takes 17-58x a Dense step under XLA against 2.6-3.9x without (benchmarks/dense_estimators.py
    --xla). Keras' `jit_compile='auto'` turns XLA on whenever every layer supports it, so random
    layers report no XLA support unless a GPU or TPU is present. `jit_compile=True` still forces it.
    """
    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def replica_keys(replica_seeds):
    """`uint32 [R]`: the keys of replicas with these integer seeds (one a replica), each a
    function of its own seed alone (NumPy's `SeedSequence`, so nearby seeds get unrelated keys)."""
    return np.array(
        [np.random.SeedSequence(int(s)).generate_state(1, np.uint32)[0] for s in replica_seeds],
        np.uint32,
    )


# The mix is seven integer passes over `[R, ...]`; compiled, XLA fuses them (and the conversion
# to a uniform) into one, exactly (integer arithmetic and an exact float conversion): a
# replicated dropout mask of MC dropout's kin8nm grid ([240, 128, 58]) took 2.8 ms unfused and
# 1.0 ms fused on a 2-core CPU. Philox itself stays outside XLA, whose CPU generators are slow.
_fused_mix = tf.function(
    fused.replica_mix, jit_compile=True, reduce_retracing=True, autograph=False
)


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _fused_uniform(words, keys):
    return fused.unit_uniform(fused.replica_mix(words, keys))


def _philox_and_keys(shape, seed, keys):
    shape = tf.convert_to_tensor(shape, tf.int32)
    words = tf.random.stateless_uniform(shape[1:], seed, minval=None, maxval=None, dtype=tf.uint32)
    keys = tf.reshape(
        tf.convert_to_tensor(keys, tf.uint32), tf.concat([[-1], tf.ones_like(shape[1:])], 0)
    )
    return words, keys


def _replica_words(shape, seed, keys):
    """`uint32 [R, *shape[1:]]`: one Philox draw of a replica's shape, mixed with each key."""
    return _fused_mix(*_philox_and_keys(shape, seed, keys))


def _check_keys(shape, keys):
    """The replica count of `shape` must be the number of keys."""
    static = tf.get_static_value(tf.convert_to_tensor(shape, tf.int32))
    if static is not None and len(static) and static[0] != len(keys):
        raise ValueError(
            f"A draw of shape {list(static)} for {len(keys)} replicas: its leading axis must be "
            "the replica axis."
        )


def uniform(shape, seed, dtype=tf.float32, keys=None):
    """`U(0, 1)` draws of `shape` from a stateless `seed`, in `(0, 1)` (never 0 or 1).

    With `keys` (`replica_keys`), `shape` leads with the replica axis and slice `r` depends on
    `seed` and `keys[r]` alone (24 bits of resolution, every value `(k + 1/2) 2^-24`)."""
    dtype = tf.as_dtype(dtype)
    if keys is None:
        tiny = 0.5 * float(np.finfo(dtype.as_numpy_dtype).eps)
        return tf.random.stateless_uniform(shape, seed, minval=tiny, maxval=1.0, dtype=dtype)
    _check_keys(shape, keys)
    return tf.cast(_fused_uniform(*_philox_and_keys(shape, seed, keys)), dtype)


def standard_normal(shape, seed, dtype=tf.float32, keys=None):
    """`N(0, 1)` draws of `shape` from a stateless `seed` (Box-Muller on both outputs).

    `z1, z2 = sqrt(-2 log u1) (cos, sin)(2 pi u2)` with `u1` in `[eps/2, 1)` (the fused path:
    `u1 = (k + 1/2) 2^-24`), so every draw is finite (|z| < 5.9 in float32, as with TF's own
    sampler, which also cuts at the uniform's resolution). With `keys` (`replica_keys`), `shape`
    leads with the replica axis and slice `r` depends on `seed` and `keys[r]` alone. Large
    float32 draws with a static shape are one fused pass (`blayers.fused.box_muller`).
    """
    if keys is not None:
        _check_keys(shape, keys)
        return _standard_normal(shape, seed, dtype, keys)
    return _memoized("normal", _standard_normal, shape, seed, dtype)


def standard_normal_like(x, seed, keys=None):
    """`standard_normal(tf.shape(x), seed, x.dtype, keys)`: the same draws, also fused when
    only `x`'s batch axis (the first, or the second after the replica axis) is unknown while
    tracing, as in Keras' `fit`, whose steps trace with a `None` batch. Whether they are fused
    is then decided by the size at run time, as `standard_normal` decides it for a static shape,
    so a draw is the same function of its seed and its shape whether or not the trace knew the
    batch (a local reparameterization layer's per-example noise, for one).

    Args:
      x: a tensor whose shape (and dtype) the draws take.
      seed: a stateless seed (`[2]` integers).
      keys: replica keys (`replica_keys`), when `x` leads with the replica axis.
    """
    shape, dtype = x.shape, tf.as_dtype(x.dtype)
    lead = int(keys is not None)
    if (
        shape.is_fully_defined()
        or shape.rank is None
        or not shape[lead + 1 :].is_fully_defined()
        or not shape[:lead].is_fully_defined()
        or dtype != tf.float32
    ):
        return standard_normal(tf.shape(x), seed, dtype, keys)
    if keys is not None:
        _check_keys(shape[:1].as_list(), keys)
    dynamic = tf.shape(x)
    return tf.cond(
        tf.reduce_prod(dynamic[lead:]) >= fused.MIN_SIZE,
        lambda: _fused_standard_normal(dynamic, seed, keys),
        lambda: _standard_normal(dynamic, seed, dtype, keys),
    )


def _standard_normal(shape, seed, dtype, keys=None):
    dtype = tf.as_dtype(dtype)
    static = tf.TensorShape(tf.get_static_value(tf.convert_to_tensor(shape, tf.int32)))
    if fused.should_fuse(static[1:] if keys is not None else static, dtype):
        return _fused_standard_normal(static, seed, keys)
    if keys is None and static.is_fully_defined() and not tf.executing_eagerly():
        return _traced_normal(tuple(static.as_list()), tf.convert_to_tensor(seed), dtype.name)
    return _box_muller(shape, seed, dtype, keys)


def _box_muller(shape, seed, dtype, keys=None):
    dtype = tf.as_dtype(dtype)
    shape = tf.convert_to_tensor(shape, tf.int32)
    lead = shape[:1] if keys is not None else shape[:0]
    size = tf.reduce_prod(shape[tf.size(lead) :])
    half = (size + 1) // 2
    draws = uniform(tf.concat([lead, [2, half]], 0), seed, dtype, keys)
    first, second = draws[..., 0, :], draws[..., 1, :]
    radius = tf.sqrt(-2.0 * tf.math.log(first))
    angle = (2.0 * math.pi) * second
    normal = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], -1)
    return tf.reshape(normal[..., :size], shape)


# In a graph, traced once a process per shape and dtype, then one call op a draw: a network's
# trace forms dozens of small draws, each two dozen ops to trace (seconds in a large model) where
# a call is one. The same ops, so the same numbers; eager draws run the ops themselves.
_traced_normal = tf.function(_box_muller, autograph=False)


def _fused_standard_normal(shape, seed, keys):
    """float32 Box-Muller on Threefry words, each one fused pass (`blayers.fused`); `shape` a
    static `TensorShape` or a shape tensor (XLA then compiles once per run-time size)."""
    lead = int(keys is not None)
    if isinstance(shape, tf.TensorShape):
        count = shape[lead:].num_elements()
    else:
        count = tf.reduce_prod(shape[lead:])
    column = None if keys is None else _key_column(keys, 2)
    return fused.box_muller(fused.random_words(count, seed), column, shape)


_BIT_SHIFTS = tuple(range(32))


def rademacher(shape, seed, dtype=tf.float32, keys=None):
    """Random signs, exactly -1 or +1 with probability 1/2 each: the 32 bits of each random
    word give 32 signs (Philox's words are uniform, so their bits are independent fair coins),
    a 32nd of the random numbers one draw per sign would cost (Flipout's signs are about a
    tenth of a dense step's time otherwise). With `keys` (`replica_keys`), `shape` leads with
    the replica axis and slice `r` depends on `seed` and `keys[r]` alone."""
    if keys is not None:
        _check_keys(shape, keys)
        return _rademacher(shape, seed, dtype, keys)
    return _memoized("signs", _rademacher, shape, seed, dtype)


def _sign_words(size, seed, keys):
    """The random words of `size` signs a replica (32 a word): int32, or, replicated, uint32
    words to be mixed with each replica's key."""
    count = tf.reshape((size + 31) // 32, [1])
    dtype = tf.int32 if keys is None else tf.uint32
    return tf.random.stateless_uniform(count, seed, minval=None, maxval=None, dtype=dtype)


def _key_column(keys, rank=1):
    """Replica `keys` as `uint32 [R, 1, ...]` (`rank` ones), to broadcast against words."""
    return tf.reshape(tf.convert_to_tensor(keys, tf.uint32), [-1] + [1] * rank)


def _rademacher(shape, seed, dtype, keys=None):
    static = tf.TensorShape(tf.get_static_value(tf.convert_to_tensor(shape, tf.int32)))
    if fused.should_fuse(static, dtype):
        size = static[1:].num_elements() if keys is not None else static.num_elements()
        words = _sign_words(size, seed, keys)
        column = None if keys is None else _key_column(keys)
        return tf.cast(fused.signs(words, column, static), dtype)
    traced = keys is None and static.is_fully_defined() and not tf.executing_eagerly()
    if traced:  # traced once a shape, as `_traced_normal`
        shape = tuple(static.as_list())
        return _traced_signs(shape, tf.convert_to_tensor(seed), tf.as_dtype(dtype).name)
    return _signs_from_bits(shape, seed, dtype, keys)


def _signs_from_bits(shape, seed, dtype, keys=None):
    shape = tf.convert_to_tensor(shape, tf.int32)
    if keys is None:
        size = tf.reduce_prod(shape)
        words = _sign_words(size, seed, keys)
    else:
        size = tf.reduce_prod(shape[1:])
        words = _replica_words(tf.stack([shape[0], (size + 31) // 32]), seed, keys)
        words = tf.bitcast(words, tf.int32)
    shifts = tf.constant(_BIT_SHIFTS, tf.int32)
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(words[..., None], shifts), 1)
    bits = tf.reshape(bits, tf.concat([tf.shape(words)[:-1], [-1]], 0))[..., :size]
    return tf.reshape(tf.cast(2 * tf.cast(bits, tf.int32) - 1, dtype), shape)


_traced_signs = tf.function(_signs_from_bits, autograph=False)


def flip_signs(x, seed, example_axes=1, keys=None):
    """`x * rademacher(sign_shape, seed, keys=keys)`, Flipout's sign flip, with one sign a
    channel of an example: `sign_shape` is `[examples..., 1, ..., 1, channels]`, the first
    `example_axes` axes of `x` being examples. Large float32 inputs take one fused pass
    (`blayers.fused.flip`, the same signs, never formed)."""
    if keys is None and not tf.executing_eagerly():  # traced once a shape (`_traced_normal`)
        return _traced_flip(x, tf.convert_to_tensor(seed), example_axes)
    return _flip_signs(x, seed, example_axes, keys)


def _flip_signs(x, seed, example_axes, keys=None):
    shape = x.shape
    inner = shape[example_axes:]
    batch = shape[:example_axes].num_elements() if shape[:example_axes].is_fully_defined() else 256
    dynamic = tf.shape(x)
    if (
        inner.is_fully_defined()
        and fused.should_fuse([batch * inner.num_elements()], x.dtype)
        and not reusing_draws()
    ):
        size = tf.reduce_prod(dynamic[int(keys is not None) : example_axes]) * shape[-1]
        column = None if keys is None else _key_column(keys)
        return fused.flip(x, _sign_words(size, seed, keys), column, example_axes)
    sign_shape = tf.concat(
        [dynamic[:example_axes], tf.ones([shape.rank - 1 - example_axes], tf.int32), dynamic[-1:]],
        0,
    )
    return x * rademacher(sign_shape, seed, x.dtype, keys)


_traced_flip = tf.function(_flip_signs, autograph=False)


def normal_parameters(distribution):
    """`(loc, scale)` if `distribution` is a Normal or an `Independent` Normal, else None.

    Estimators and regularizers use it to work on the parameters directly (one stddev tensor per
    call, shared by the sample and the KL) instead of TFP's generic `mean()`/`stddev()`, which
    broadcast and copy.
    """
    distribution = _elementwise(distribution)
    if type(distribution) is tfd.Normal:
        return distribution.loc, distribution.scale
    return None


def _elementwise(distribution):
    """`distribution` without its `Independent` wrappers."""
    while isinstance(distribution, tfd.Independent):
        distribution = distribution.distribution
    return distribution


def normal_variance(distribution):
    """The variance a trainable Normal formed with its standard deviation in one pass
    (`TrainableNormal` for a layer that reads it), or None."""
    return getattr(_elementwise(distribution), "blayers_variance", None)


def attached_normal_kl(distribution, prior):
    """`sum KL[q || N(prior)]`, `prior = (mean, stddev)`, where a trainable Normal formed it
    with its parameters (`TrainableNormal` with a `kl_prior`, the same prior), or None."""
    attached = getattr(_elementwise(distribution), "blayers_kl", None)
    if attached is None or tuple(attached[0]) != tuple(prior):
        return None
    return attached[1]


def flat_multivariate_normal(distribution, diagonal=False):
    """The multivariate Normal over a weight's flattened entries: the full-covariance q of
    `trainable_multivariate_normal` (a `MultivariateNormalTriL` reshaped to the weight), and with
    `diagonal` a mean-field Normal as `MultivariateNormalDiag`; None for anything else."""
    if isinstance(distribution, tfd.TransformedDistribution) and isinstance(
        distribution.bijector, tfp.bijectors.Reshape
    ):
        base = distribution.distribution
        if isinstance(base, tfd.MultivariateNormalLinearOperator):
            return base
    if diagonal:
        params = normal_parameters(distribution)
        if params is not None:
            shape = distribution.batch_shape.concatenate(distribution.event_shape)
            loc, scale = (tf.reshape(tf.broadcast_to(p, shape), [-1]) for p in params)
            return tfd.MultivariateNormalDiag(loc, scale)
    return None


def sample(distribution, sample_shape, seed, keys=None):
    """`distribution.sample(sample_shape, seed)`, with a fast path for (Independent) Normals.

    With `keys` (`replica_keys`; no sample shape), the distribution's leading batch axis is the
    replica axis and slice `r` of the draw depends on `seed` and `keys[r]` alone: for (Independent)
    Normals and Bernoullis, the distributions a replicated layer draws."""
    if keys is not None:
        return _replica_sample(distribution, sample_shape, seed, keys)
    params = normal_parameters(distribution)
    if params is None or seed is None:
        return distribution.sample(sample_shape, seed=seed)
    loc, scale = params
    shape = tf.TensorShape(sample_shape).concatenate(
        distribution.batch_shape.concatenate(distribution.event_shape)
    )
    if not shape.is_fully_defined():
        return distribution.sample(sample_shape, seed=seed)
    if isinstance(seed, int):
        seed = tf.constant([seed, 0], tf.int32)
    return loc + scale * standard_normal(shape, seed, distribution.dtype)


def _replica_sample(distribution, sample_shape, seed, keys):
    if seed is None:  # an unseeded draw (a likelihood's) is not reproducible, replicated or not
        return distribution.sample(sample_shape)
    if tf.TensorShape(sample_shape).rank:
        raise ValueError(
            f"A replicated draw of {distribution.name} is one draw (no sample shape); got "
            f"sample_shape={sample_shape}."
        )
    shape = distribution.batch_shape.concatenate(distribution.event_shape)
    if not shape.is_fully_defined():
        shape = tf.concat([distribution.batch_shape_tensor(), distribution.event_shape_tensor()], 0)
    if isinstance(seed, int):
        seed = tf.constant([seed, 0], tf.int32)
    params = normal_parameters(distribution)
    if params is not None:
        loc, scale = params
        return loc + scale * standard_normal(shape, seed, distribution.dtype, keys)
    base = distribution
    while isinstance(base, tfd.Independent):
        base = base.distribution
    if type(base) is tfd.Bernoulli:
        probs = tf.broadcast_to(base.probs_parameter(), shape)
        draws = uniform(shape, seed, probs.dtype, keys) < probs
        return tf.cast(draws, distribution.dtype)
    raise ValueError(
        f"{type(base).__name__} has no replicated draw (Normal and Bernoulli do): a replica's "
        "draw would depend on the group it trains in."
    )
