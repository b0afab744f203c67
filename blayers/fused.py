"""XLA-fused elementwise kernels of a Bayesian layer's step: the weight noise, Flipout's sign
flips, the softplus of the standard deviations and the KL against a Normal prior.

A Bayesian layer's step is a handful of elementwise passes over arrays the size of its kernel
(the draw, the softplus, the KL and their gradients) around the matmuls it shares with a
deterministic layer; TF runs each op as its own pass, and some of its kernels (softplus, the
bit twiddling of random signs, sines) are slow on a CPU. Compiled with XLA, each group here is
one loop: 1M normals in 1.7 ms instead of 3.4 (Threefry words, then Box-Muller with polynomial
sines and cosines, which XLA's CPU backend vectorizes where it does not vectorize its own), a
softplus in 0.7 ms instead of 1.7 (its `log1p` a polynomial), the sign flips without forming
the signs (`benchmarks/dense_estimators.py` prints the step's breakdown).

A trainable Normal weight whose layer adds the default Normal KL forms its standard deviation
(or variance), and that KL, in one pass (`normal_posterior_and_kl`), and its backward pass adds
the KL's closed-form gradient to the layer's while it forms both parameters' gradients: no
separate KL-gradient arrays and no sums of them (local reparameterization's step 2.23x -> 2.15x
`Dense` here, Flipout's 2.31x -> 2.29x, measured interleaved).

The words come from Threefry-2x32-20 written in XLA's integer ops (`threefry2x32`), about half
the time of TF's Philox kernel (XLA's own CPU random-number kernels are slow, and a Philox
written in XLA, with its 32 x 32 -> 64-bit multiplies, ran 3x slower than TF's). Fusing more
did not pay here: one pass forming a weight's draw, softplus and KL together ran slower than
these kernels apart (XLA's CPU backend splits a reduction from its elementwise producers and
forms Box-Muller's pairs once per output), and so did forming local reparameterization's
pre-activations with their noise.

Compiling costs about 60 ms a shape, so tensors smaller than `MIN_SIZE` entries take the plain
TF ops. Every kernel is the same maths as the unfused ops (the tests compare them), to float32
rounding.
"""

import math

import numpy as np
import tensorflow as tf

__all__ = [
    "MIN_SIZE",
    "box_muller",
    "box_muller_words",
    "flip",
    "normal_kl",
    "normal_posterior_and_kl",
    "random_words",
    "replica_mix",
    "seed_key",
    "should_fuse",
    "signs",
    "softplus",
    "softplus_and_square",
    "threefry2x32",
    "unit_uniform",
]

MIN_SIZE = 1 << 15  # entries; smaller tensors take the plain TF ops
_TINY = float(np.finfo(np.float32).tiny)


def should_fuse(shape, dtype):
    """Whether a tensor of `shape` (static) and `dtype` takes the fused kernels: float32, at
    least `MIN_SIZE` entries. Other dtypes keep TF's ops (the kernels' polynomials are
    float32-accurate, and half precision sums badly)."""
    shape = tf.TensorShape(shape)
    return (
        tf.as_dtype(dtype) == tf.float32
        and shape.is_fully_defined()
        and shape.num_elements() >= MIN_SIZE
    )


# -- random words ---------------------------------------------------------------------------------
_INV_2_24 = 1.0 / (1 << 24)
_MIX_1, _MIX_2 = 0x85EBCA6B, 0xC2B2AE35
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def _rotate_left(x, bits):
    return tf.bitwise.bitwise_or(
        tf.bitwise.left_shift(x, tf.constant(bits, tf.uint32)),
        tf.bitwise.right_shift(x, tf.constant(32 - bits, tf.uint32)),
    )


def threefry2x32(key, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al., 2011, "Parallel random numbers: as easy as
    1, 2, 3"; JAX's generator): the keyed bijection of the counter pair `(x0, x1)` (uint32
    tensors) under `key` (uint32 `[2]`). Additions, rotations and XORs of 32-bit words only,
    which XLA vectorizes: a million words in about half the time of TF's Philox kernel here."""
    k0, k1 = key[0], key[1]
    keys = (k0, k1, tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(k0, k1), _PARITY))
    x0, x1 = x0 + keys[0], x1 + keys[1]
    for block in range(5):
        for bits in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = tf.bitwise.bitwise_xor(_rotate_left(x1, bits), x0)
        x0 = x0 + keys[(block + 1) % 3]
        x1 = x1 + keys[(block + 2) % 3] + tf.constant(block + 1, tf.uint32)
    return x0, x1


def seed_key(seed):
    """A stateless seed (int32 or int64 `[2]`) as a Threefry key (uint32 `[2]`); an int64 seed's
    high words are folded into its low ones."""
    seed = tf.convert_to_tensor(seed)
    if seed.dtype == tf.int64:
        halves = tf.bitcast(seed, tf.uint32)  # [2, 2]
        return tf.bitwise.bitwise_xor(halves[:, 0], halves[:, 1] * tf.constant(_MIX_1, tf.uint32))
    return tf.bitcast(tf.cast(seed, tf.int32), tf.uint32)


def _words(key, count):
    counter = tf.cast(tf.range((count + 1) // 2), tf.uint32)
    return tf.stack(threefry2x32(key, counter, tf.zeros_like(counter)))


_threefry_words = tf.function(_words, jit_compile=True, reduce_retracing=True, autograph=False)


def random_words(count, seed):
    """`uint32 [2, ceil(count / 2)]`: the random words of `count` normals (a pair of words
    makes two), Threefry-2x32 of the counters `(i, 0)` under the seed's key, one fused pass."""
    return _threefry_words(seed_key(seed), count)


def replica_mix(words, keys):
    """Each word under its replica's bijective mix: MurmurHash3's 32-bit finalizer of the word
    XOR the key (`keys` broadcast against `words[None]`). Integer arithmetic, exact under XLA."""
    h = tf.bitwise.bitwise_xor(words[None], keys)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))
    h = h * tf.constant(_MIX_1, tf.uint32)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(13, tf.uint32)))
    h = h * tf.constant(_MIX_2, tf.uint32)
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))


# -- Normal noise ---------------------------------------------------------------------------------
def unit_uniform(words):
    """`(k + 1/2) 2^-24` from the top 24 bits `k` of each uint32 word: uniform on (0, 1),
    never 0 or 1, exact in float32."""
    high = tf.bitwise.right_shift(words, tf.constant(8, tf.uint32))
    return (tf.cast(high, tf.float32) + 0.5) * _INV_2_24


# `log1p(f) - f + f^2 / 2` over `f^3` on `[sqrt(1/2) - 1, sqrt(2) - 1]` (Cephes' `logf`).
_LOG_POLY = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)


def _log(x):
    """`log x` for positive normal float32 `x` (Cephes' `logf`: the exponent from the bits, a
    polynomial on the mantissa; error 8e-8 relative here): a third less time than XLA's CPU
    `log`, which the draw and the KL take a million times a step. Zero and subnormal inputs
    give finite values near -88, not `log`'s: callers clamp them first."""
    bits = tf.bitcast(x, tf.int32)
    exponent = tf.bitwise.right_shift(bits, 23) - 126
    mantissa = tf.bitcast(  # in [1/2, 1)
        tf.bitwise.bitwise_or(tf.bitwise.bitwise_and(bits, 0x007FFFFF), 0x3F000000), tf.float32
    )
    low = mantissa < 0.70710677
    exponent = tf.cast(tf.where(low, exponent - 1, exponent), tf.float32)
    f = tf.where(low, mantissa + mantissa, mantissa) - 1.0
    f2 = f * f
    poly = tf.constant(_LOG_POLY[0], tf.float32)
    for coefficient in _LOG_POLY[1:]:
        poly = poly * f + coefficient
    # ln 2 = 0.693359375 - 2.12194440e-4, the first part exact in float32.
    return f + (poly * f * f2 - 2.12194440e-4 * exponent - 0.5 * f2) + 0.693359375 * exponent


def _sin_cos(t):
    """`(sin t, cos t)` for `|t| <= pi / 4` by their Taylor polynomials (degree 9 and 10; error
    below 1e-9, under float32's rounding): no trigonometric call, which XLA's CPU backend does
    not vectorize (a cosine took 4 ms a million there, 0.9 ms in TF)."""
    t2 = t * t
    sin = t * (1.0 + t2 * (-1 / 6 + t2 * (1 / 120 + t2 * (-1 / 5040 + t2 * (1 / 362880)))))
    cos = 1.0 + t2 * (
        -1 / 2 + t2 * (1 / 24 + t2 * (-1 / 720 + t2 * (1 / 40320 + t2 * (-1 / 3628800))))
    )
    return sin, cos


def box_muller_words(words):
    """Standard normals from uint32 `words [..., 2, n]`: `[..., 2 n]`, float32.

    Box-Muller: a pair `(u1, w)` gives `r (cos a, sin a)`, `r = sqrt(-2 log u1)` with `u1` from
    the top 24 bits of the first word (`|z| < 5.9`), and the angle `a = q pi / 2 + t` uniform on
    a full turn: the quarter `q` from the second word's top two bits, `t` in `[-pi/4, pi/4)` from
    the next 24, so that `(cos a, sin a)` is `(cos t, sin t)` turned by `q` quarters."""
    first, second = words[..., 0, :], words[..., 1, :]
    radius = tf.sqrt(-2.0 * _log(unit_uniform(first)))  # u1 >= 2^-25: normal
    quarter = tf.bitwise.right_shift(second, tf.constant(30, tf.uint32))
    t = (unit_uniform(tf.bitwise.left_shift(second, tf.constant(2, tf.uint32))) - 0.5) * (
        math.pi / 2
    )
    sin, cos = _sin_cos(t)
    odd = tf.equal(tf.bitwise.bitwise_and(quarter, tf.constant(1, tf.uint32)), 1)
    x, y = tf.where(odd, -sin, cos), tf.where(odd, cos, sin)
    sign = tf.where(quarter >= 2, -1.0, 1.0)
    return tf.concat([radius * sign * x, radius * sign * y], -1)


def _normal_noise(words, keys, shape):
    """`float32 shape`: the standard normals of `words` (mixed with replica `keys` when given,
    `shape`, static or a shape tensor, then leading with the replica axis)."""
    if keys is not None:
        words = replica_mix(words, keys)
    normal = box_muller_words(words)
    shape = tf.convert_to_tensor(shape, tf.int32)
    size = tf.reduce_prod(shape[1:] if keys is not None else shape)
    return tf.reshape(normal[..., :size], shape)


_box_muller = tf.function(_normal_noise, jit_compile=True, reduce_retracing=True, autograph=False)


def _static(shape):
    """A static shape as a tuple of ints: a `tf.function` keys a `TensorShape` argument by the
    object's identity (a new trace, and a new XLA compilation, at every call of a layer's
    trace), a tuple by its value."""
    return tuple(shape.as_list()) if isinstance(shape, tf.TensorShape) else shape


def box_muller(words, keys, shape):
    """`float32 shape` standard normals from random `words` (`random_words`), one fused pass;
    with replica `keys` (`uint32 [R, 1, 1]`) each replica's words mixed with its key first."""
    return _box_muller(words, keys, _static(shape))


# -- random signs ---------------------------------------------------------------------------------
def _sign_bits(words, keys, count):
    """The first `count` bits of `words` (`[..., n]` int32 or uint32, 32 bits a word; mixed with
    replica `keys` first when given), as `[..., count]` signs (float32): a set bit is +1, a
    clear one -1."""
    words = tf.bitcast(words, tf.uint32) if words.dtype == tf.int32 else words
    if keys is not None:
        words = replica_mix(words, keys)
    shifts = tf.constant(np.arange(32, dtype=np.uint32))
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(words[..., None], shifts), 1)
    bits = tf.reshape(bits, tf.concat([tf.shape(words)[:-1], [-1]], 0))[..., :count]
    return 2.0 * tf.cast(bits, tf.float32) - 1.0


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _signs(words, keys, shape):
    count = math.prod(shape[1:] if keys is not None else shape)
    return tf.reshape(_sign_bits(words, keys, count), shape)


def signs(words, keys, shape):
    """`float32 shape` signs from the bits of `words` (`keys`: replica keys `[R, 1]`, `shape`,
    static, then leading with the replica axis), one fused pass."""
    return _signs(words, keys, _static(tf.TensorShape(shape)))


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _flip(x, words, keys, example_axes, rank):
    shape = tf.shape(x)  # XLA compiles each concrete shape: these are constants to it
    sign_shape = tf.concat(
        [shape[:example_axes], tf.ones([rank - 1 - example_axes], tf.int32), shape[-1:]], 0
    )
    count = tf.reduce_prod(sign_shape[1:] if keys is not None else sign_shape)
    return x * tf.cast(tf.reshape(_sign_bits(words, keys, count), sign_shape), x.dtype)


def flip(x, words, keys=None, example_axes=1):
    """`x * s` with random signs `s` of shape `[examples..., 1, ..., 1, channels]` (one a
    channel of an example, the first `example_axes` axes being examples) from the bits of
    `words` (as `signs`), without forming `s`: one pass forward, one back (`d/dx = s`)."""

    @tf.custom_gradient
    def flipped(x):
        rank = x.shape.rank
        flip_back = lambda up: _flip(up, words, keys, example_axes, rank)
        return _flip(x, words, keys, example_axes, rank), flip_back

    return flipped(x)


# -- softplus -------------------------------------------------------------------------------------
# `log1p(e) / e` on [0, 1]: least squares in the Chebyshev basis, degree 9 (error 1.3e-8;
# `np.polynomial.Chebyshev.fit` on 20,001 even points, in the monomial basis here).
_LOG1P_RATIO = (
    0.9999999869915309,
    -0.4999985092780577,
    0.33329100871073086,
    -0.24947821331481534,
    0.19651539221610648,
    -0.15251556739321356,
    0.10533368892180575,
    -0.056436126024916246,
    0.01964962372667975,
    -0.0032141133176678454,
)


def _softplus(x):
    return _softplus_and_exp(x)[0]


def _softplus_and_exp(x):
    # max(x, 0) + log1p(e), e = exp(-|x|) in (0, 1], with log1p by a polynomial: one
    # transcendental, where XLA's CPU log1p costs three times the exp (relative error 1.6e-7
    # against float64, TF's own softplus 4.6e-7). `e` also gives the sigmoid (`_sigmoid_of`).
    e = tf.exp(-tf.abs(x))
    ratio = tf.constant(_LOG1P_RATIO[-1], x.dtype)
    for coefficient in _LOG1P_RATIO[-2::-1]:
        ratio = ratio * e + coefficient
    return tf.maximum(x, 0.0) + e * ratio, e


def _sigmoid_of(x, e):
    # sigmoid(x) from `e = exp(-|x|)`: `1 / (1 + e)` for x >= 0, `e / (1 + e)` below.
    return tf.where(x >= 0.0, tf.ones_like(e), e) / (1.0 + e)


_softplus_xla = tf.function(_softplus, jit_compile=True, reduce_retracing=True, autograph=False)


def _sigmoid(x):
    # `1 / (1 + exp(-x))`: one exp, which XLA's CPU backend vectorizes (its `expm1`, the form
    # `1 - exp(-softplus(x))` would need for accuracy, ran 1.7x slower), and accurate to a few
    # ulps over the whole line (0 where `exp(-x)` overflows, x < -88, where sigmoid is below
    # float32's normal range).
    return 1.0 / (1.0 + tf.exp(-x))


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _softplus_grad(upstream, x):
    return upstream * _sigmoid(x)


@tf.custom_gradient
def _softplus_fused(x):
    value = _softplus_xla(x)
    return value, lambda upstream: _softplus_grad(upstream, x)


def softplus(x):
    """`log(1 + exp(x))` and its gradient `sigmoid(x)`, each one fused pass for large float32
    tensors (`should_fuse`), TF's `softplus` otherwise."""
    x = tf.convert_to_tensor(x)
    if not should_fuse(x.shape, x.dtype):
        return tf.nn.softplus(x)
    return _softplus_fused(x)


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _softplus_and_square_xla(x):
    value = _softplus(x)
    return value, value * value


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _softplus_and_square_grad(upstream, upstream_square, x, value):
    # d/dx of (s, s^2) against both upstreams: (g_s + 2 s g_v) sigmoid(x), one pass (0.50 ms
    # a million here; with sigmoid as `-expm1(-s)` from the output alone, 0.65).
    return (upstream + 2.0 * value * upstream_square) * _sigmoid(x)


@tf.custom_gradient
def _softplus_and_square_fused(x):
    value, square = _softplus_and_square_xla(x)

    def grad(upstream, upstream_square):
        return _softplus_and_square_grad(upstream, upstream_square, x, value)

    return (value, square), grad


def softplus_and_square(x):
    """`(softplus(x), softplus(x)^2)`: a standard deviation and its variance (local
    reparameterization needs both) in one fused pass, and one backward pass for both
    gradients instead of the square's, their sum's and the softplus' (large float32 tensors;
    TF's ops otherwise)."""
    x = tf.convert_to_tensor(x)
    if not should_fuse(x.shape, x.dtype):
        value = tf.nn.softplus(x)
        return value, tf.square(value)
    return _softplus_and_square_fused(x)


# -- KL[N(m, s^2) || N(m_p, s_p^2)] ---------------------------------------------------------------
@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _normal_kl_terms(loc, scale, prior_mean, inv_var):
    return _normal_kl_sum(loc, scale, prior_mean, inv_var)


def _normal_kl_sum(loc, scale, prior_mean, inv_var):
    centred = loc - prior_mean
    ratio = scale * tf.sqrt(inv_var)  # s / s_p
    # Each entry's KL, `(r^2 - 1) / 2 - log r + c^2 / (2 s_p^2) >= 0`, summed: no cancellation
    # between large sums (a KL of zero stays zero, not minus n times the rounding).
    # A ratio below float32's normal range (a stddev under 1e-38) counts as that bound.
    ratio = tf.maximum(ratio, _TINY)
    terms = 0.5 * (tf.square(ratio) - 1.0) - _log(ratio) + 0.5 * inv_var * tf.square(centred)
    # XLA sums large reductions as a tree (relative error 8e-7 for a million terms here).
    return tf.reduce_sum(terms)


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _normal_kl_grads(upstream, loc, scale, prior_mean, inv_var):
    return upstream * inv_var * (loc - prior_mean), upstream * (inv_var * scale - 1.0 / scale)


def normal_kl(loc, scale, prior_mean, prior_stddev):
    """`sum KL[N(loc, scale^2) || N(prior_mean, prior_stddev^2)]` and its closed-form gradient
    (`d/dm = (m - m_p) / s_p^2`, `d/ds = s / s_p^2 - 1 / s`), one fused pass each."""
    dtype = loc.dtype
    inv_var = tf.constant(1.0 / prior_stddev**2, dtype)
    mean = tf.constant(prior_mean, dtype)

    @tf.custom_gradient
    def kl(loc, scale):
        value = _normal_kl_terms(loc, scale, mean, inv_var)

        def grad(upstream):
            return _normal_kl_grads(upstream, loc, scale, mean, inv_var)

        return value, grad

    return kl(loc, scale)


# -- a Normal posterior's parameters and its KL, together ------------------------------------------
@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _posterior_and_kl(loc, rho, prior_mean, inv_var, square):
    scale = _softplus(rho)
    return scale * scale if square else scale, _normal_kl_sum(loc, scale, prior_mean, inv_var)


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _posterior_and_kl_grads(d_loc, d_out, d_kl, loc, rho, prior_mean, inv_var, square):
    # The softplus again from `rho` (one exp, shared with the sigmoid): cheaper than reading a
    # stored copy back.
    scale, e = _softplus_and_exp(rho)
    d_scale = 2.0 * scale * d_out if square else d_out
    d_scale += d_kl * (inv_var * scale - 1.0 / scale)
    return d_loc + d_kl * inv_var * (loc - prior_mean), d_scale * _sigmoid_of(rho, e)


def normal_posterior_and_kl(loc, rho, prior_mean, prior_stddev, square=False):
    """`(loc, s, KL)` of a mean-field Normal `q = N(loc, s^2)`, `s = softplus(rho)`, with
    `KL = sum KL[q || N(prior_mean, prior_stddev^2)]` (`normal_kl`), or `(loc, s^2, KL)` with
    `square`: one fused pass forward, and one backward pass forming both parameters' whole
    gradients (the KL's, `normal_kl`'s closed form, added to what reaches `loc` and `s` from
    the layer) where the separate kernels take four passes and two sums. `loc` comes back as
    itself (no copy), so that every use of the mean sends its gradient through that one pass.
    Large float32 tensors of one shape (`should_fuse`)."""
    dtype = loc.dtype
    inv_var = tf.constant(1.0 / prior_stddev**2, dtype)
    mean = tf.constant(prior_mean, dtype)
    zero = tf.zeros([], dtype)

    @tf.custom_gradient
    def joint(loc, rho):
        out, kl = _posterior_and_kl(loc, rho, mean, inv_var, square)

        def grad(d_loc, d_out, d_kl):
            # An output nothing used sends no gradient (None in graphs): it counts as zero.
            d_loc, d_out, d_kl = (zero if d is None else d for d in (d_loc, d_out, d_kl))
            return _posterior_and_kl_grads(d_loc, d_out, d_kl, loc, rho, mean, inv_var, square)

        return (tf.identity(loc), out, kl), grad

    return joint(loc, rho)


def _reference_normal(words):
    """NumPy twin of `box_muller_words` in float64, for tests."""
    words = np.asarray(words, np.uint64)
    u1 = ((words[..., 0, :] >> 8).astype(np.float64) + 0.5) * _INV_2_24
    quarter = words[..., 1, :] >> 30
    t = ((((words[..., 1, :] << 2) & 0xFFFFFFFF) >> 8) + 0.5) * _INV_2_24
    angle = quarter * (math.pi / 2) + (t - 0.5) * (math.pi / 2)
    radius = np.sqrt(-2.0 * np.log(u1))
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], -1)
