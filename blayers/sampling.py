"""Fast, exact sampling primitives shared by random variables and estimators.

Weight noise is the largest cost of a Bayesian layer's training step on CPU. TF's
`stateless_normal` takes about 8.5 ms for 1M values here; the inverse CDF `ndtri(u)` of a
uniform about 7 ms, and Box-Muller using both outputs of each uniform pair about 5.5 ms
(`benchmarks/dense_estimators.py`). Every estimator draws Normal noise through `standard_normal`.
"""

import contextlib
import math
import threading

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

tfd = tfp.distributions

__all__ = [
    "flat_multivariate_normal",
    "normal_parameters",
    "rademacher",
    "reuse_draws",
    "sample",
    "standard_normal",
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


def standard_normal(shape, seed, dtype=tf.float32):
    """`N(0, 1)` draws of `shape` from a stateless `seed` (Box-Muller on both outputs).

    `z1, z2 = sqrt(-2 log u1) (cos, sin)(2 pi u2)` with `u1` in `[eps/2, 1)`, so every draw is
    finite (|z| < 5.8 in float32, as with TF's own sampler, which also cuts at the uniform's
    resolution).
    """
    return _memoized("normal", _standard_normal, shape, seed, dtype)


def _standard_normal(shape, seed, dtype):
    dtype = tf.as_dtype(dtype)
    shape = tf.convert_to_tensor(shape, tf.int32)
    size = tf.reduce_prod(shape)
    half = (size + 1) // 2
    tiny = 0.5 * float(np.finfo(dtype.as_numpy_dtype).eps)
    uniform = tf.random.stateless_uniform(
        tf.stack([2, half]), seed, minval=tiny, maxval=1.0, dtype=dtype
    )
    radius = tf.sqrt(-2.0 * tf.math.log(uniform[0]))
    angle = (2.0 * math.pi) * uniform[1]
    normal = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], 0)
    return tf.reshape(normal[:size], shape)


_BIT_SHIFTS = tuple(range(32))


def rademacher(shape, seed, dtype=tf.float32):
    """Random signs, exactly -1 or +1 with probability 1/2 each: the 32 bits of each random
    word give 32 signs (Philox's words are uniform, so their bits are independent fair coins),
    a 32nd of the random numbers one draw per sign would cost (Flipout's signs are about a
    tenth of a dense step's time otherwise)."""
    return _memoized("signs", _rademacher, shape, seed, dtype)


def _rademacher(shape, seed, dtype):
    shape = tf.convert_to_tensor(shape, tf.int32)
    size = tf.reduce_prod(shape)
    words = tf.random.stateless_uniform(
        tf.reshape((size + 31) // 32, [1]), seed, minval=None, maxval=None, dtype=tf.int32
    )
    bits = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(words[:, None], tf.constant(_BIT_SHIFTS, tf.int32)), 1
    )
    signs = tf.cast(2 * tf.reshape(bits, [-1])[:size] - 1, dtype)
    return tf.reshape(signs, shape)


def normal_parameters(distribution):
    """`(loc, scale)` if `distribution` is a Normal or an `Independent` Normal, else None.

    Estimators and regularizers use it to work on the parameters directly (one stddev tensor per
    call, shared by the sample and the KL) instead of TFP's generic `mean()`/`stddev()`, which
    broadcast and copy.
    """
    while isinstance(distribution, tfd.Independent):
        distribution = distribution.distribution
    if type(distribution) is tfd.Normal:
        return distribution.loc, distribution.scale
    return None


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


def sample(distribution, sample_shape, seed):
    """`distribution.sample(sample_shape, seed)`, with a fast path for (Independent) Normals."""
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
