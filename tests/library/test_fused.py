"""The fused kernels of a Bayesian layer's step (`blayers.fused`) against their references:
Threefry's published answers, Box-Muller in float64, softplus and the KL with their gradients
by autodiff of the plain ops, the fused sign flips against `rademacher`, and the estimators'
closed-form output moments on a layer large enough to take the fused path."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import blayers
from blayers import constraints, fused, regularizers, sampling
from blayers.layers import DenseFlipout, DenseLocalReparameterization, DenseReparameterization
from tests.conftest import graph_draws

BIG = 1 << 16  # entries: above fused.MIN_SIZE


def test_threefry_matches_published_answers():
    """Random123's known-answer vectors of Threefry-2x32-20 (as JAX's `threefry_2x32`)."""
    cases = [  # key, counter, output
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ]
    for key, counter, expected in cases:
        x0, x1 = fused.threefry2x32(
            tf.constant(key, tf.uint32),
            tf.constant([counter[0]], tf.uint32),
            tf.constant([counter[1]], tf.uint32),
        )
        assert (int(x0[0]), int(x1[0])) == expected


def test_polynomial_log_against_float64_over_the_normal_range():
    """The draw's and the KL's `log` (exponent from the bits, a polynomial on the mantissa)
    over every binade of float32's normal numbers, near 1 (cancellation) and at the powers
    of two; a stddev below the normal range counts as the smallest normal one in the KL."""
    rng = np.random.RandomState(3)
    x = np.concatenate(
        [
            np.logspace(-37.9, 38.5, BIG),
            1.0 + rng.uniform(-1e-3, 1e-3, 1024),
            2.0 ** np.arange(-126.0, 128.0),
            rng.uniform(0.0, 1.0, BIG),
        ]
    ).astype(np.float32)
    got = tf.function(fused._log, jit_compile=True)(tf.constant(x)).numpy().astype(np.float64)
    expected = np.log(x.astype(np.float64))
    np.testing.assert_allclose(got, expected, rtol=2e-7, atol=3e-8)
    # Below the normal range the value is finite (about -88, not -inf): the KL clamps first.
    tiny = np.finfo(np.float32).tiny
    edge = fused._log(tf.constant([0.0, tiny / 4], tf.float32)).numpy()
    assert np.all(np.isfinite(edge)) and np.all(edge < np.log(tiny))
    kl = fused.normal_kl(tf.zeros([2, BIG // 2]), tf.fill([2, BIG // 2], tiny / 4), 0.0, 1.0)
    per_entry = 0.5 * (tiny**2 - 1.0) - np.log(tiny)
    assert float(kl) == pytest.approx(BIG * per_entry, rel=1e-4)  # a subnormal log: 1.6% more
    # The clamp keeps a non-finite stddev non-finite: the loss check names the layer.
    scale = np.full([BIG], 0.5, np.float32)
    scale[7] = np.nan
    assert np.isnan(float(fused.normal_kl(tf.zeros([BIG]), tf.constant(scale), 0.0, 1.0)))


def test_box_muller_matches_float64_reference():
    words = fused.random_words(BIG, tf.constant([3, 4]))
    normal = fused.box_muller(words, None, tf.TensorShape([BIG])).numpy()
    reference = fused._reference_normal(words.numpy())
    # float32 angles and radii: about 1e-6 absolute at |z| ~ 5
    np.testing.assert_allclose(normal, reference, atol=1e-5, rtol=1e-5)
    # every word pair is used: radii from the first word, angles over the full turn
    assert np.abs(normal).max() < 5.9


def test_fused_standard_normal_moments_and_tails():
    n = 1 << 20
    z = sampling.standard_normal([n], tf.constant([7, 8])).numpy().astype(np.float64)
    assert fused.should_fuse([n], tf.float32)
    se = 1.0 / math.sqrt(n)
    assert abs(z.mean()) < 5 * se
    assert abs(z.var() - 1.0) < 5 * math.sqrt(2.0) * se
    assert abs(stats.skew(z)) < 5 * math.sqrt(6.0) * se
    assert abs(stats.kurtosis(z)) < 5 * math.sqrt(24.0) * se
    tail = 2 * stats.norm.sf(3.0)
    assert abs(np.mean(np.abs(z) > 3.0) - tail) < 5 * math.sqrt(tail / n)
    assert stats.kstest(z[:200_000], "norm").pvalue > 1e-3
    # the two halves of the draw (cosines, sines) are uncorrelated
    assert abs(np.corrcoef(z[: n // 2], z[n // 2 :])[0, 1]) < 5 / math.sqrt(n // 2)


def test_fused_draws_are_seeded_and_replicas_depend_on_their_key_alone():
    seed = tf.constant([1, 2])
    a = sampling.standard_normal([BIG], seed).numpy()
    np.testing.assert_array_equal(a, sampling.standard_normal([BIG], seed).numpy())
    assert not np.allclose(a, sampling.standard_normal([BIG], tf.constant([1, 3])).numpy())
    keys = sampling.replica_keys([5, 6, 7])
    grouped = sampling.standard_normal([3, BIG], seed, keys=keys).numpy()
    for r in range(3):
        alone = sampling.standard_normal([1, BIG], seed, keys=keys[r : r + 1]).numpy()
        np.testing.assert_array_equal(alone[0], grouped[r])
    assert abs(np.corrcoef(grouped[0], grouped[1])[0, 1]) < 5 / math.sqrt(BIG)


@pytest.mark.parametrize("replicas", [None, 2])
@pytest.mark.parametrize("batch", [256, 8])  # fused, and under fused.MIN_SIZE
def test_normals_like_a_tensor_of_unknown_batch_are_the_static_shapes_draws(batch, replicas):
    """A trace that does not know the batch (Keras' `fit`) draws the same normals, fused when
    the run-time size is large, as one that does: a draw is a function of seed and shape."""
    keys = None if replicas is None else sampling.replica_keys(range(replicas))
    lead = [] if replicas is None else [replicas]
    seed = tf.constant([9, 2], tf.int64)
    x = tf.zeros(lead + [batch, 1024])
    expected = sampling.standard_normal(lead + [batch, 1024], seed, keys=keys).numpy()
    spec = tf.TensorSpec(lead + [None, 1024], tf.float32)
    traced = tf.function(lambda t: sampling.standard_normal_like(t, seed, keys), [spec])
    np.testing.assert_array_equal(traced(x).numpy(), expected)
    graph = traced.get_concrete_function().graph
    assert any(op.type == "If" or op.type == "StatelessIf" for op in graph.get_operations())
    assert fused.should_fuse(expected.shape[len(lead) :], tf.float32) == (batch == 256)


def test_local_reparameterization_draws_alike_with_and_without_a_static_batch():
    layer = DenseLocalReparameterization(1024)
    x = tf.random.stateless_normal([256, 512], [1, 2])
    layer.build(x.shape)

    def outputs(t, seed):
        layer.call_weights()  # the kernel's posterior; the noise takes `seed`
        return layer.linear_fn(layer.kernel, seed=seed)(t)

    static = tf.function(outputs)
    dynamic = tf.function(outputs, [tf.TensorSpec([None, 512]), tf.TensorSpec([2], tf.int64)])
    seed = tf.constant([4, 5], tf.int64)
    np.testing.assert_array_equal(static(x, seed).numpy(), dynamic(x, seed).numpy())


def test_softplus_value_and_gradient_against_float64():
    x = tf.constant(np.linspace(-30.0, 30.0, BIG), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fused.softplus(x)
    grad = tape.gradient(y, x).numpy()
    x64 = x.numpy().astype(np.float64)
    np.testing.assert_allclose(y.numpy(), np.logaddexp(0.0, x64), rtol=5e-7)
    np.testing.assert_allclose(grad, 1.0 / (1.0 + np.exp(-x64)), rtol=2e-6, atol=1e-30)
    small = tf.constant([-1.0, 0.0, 2.0])  # below MIN_SIZE: TF's softplus
    np.testing.assert_allclose(fused.softplus(small), tf.nn.softplus(small))


def test_softplus_and_square_values_and_both_gradients_against_float64():
    """One pass forms `(s, s^2)`; its gradient takes both upstreams at once:
    `(g_s + 2 s g_v) sigmoid(x)`."""
    x = tf.constant(np.linspace(-30.0, 30.0, BIG), tf.float32)
    rng = np.random.RandomState(2)
    g_s, g_v = (tf.constant(rng.randn(BIG).astype("float32")) for _ in range(2))
    with tf.GradientTape() as tape:
        tape.watch(x)
        s, v = fused.softplus_and_square(x)
        loss = tf.reduce_sum(g_s * s) + tf.reduce_sum(g_v * v)
    grad = tape.gradient(loss, x).numpy()
    x64 = x.numpy().astype(np.float64)
    s64 = np.logaddexp(0.0, x64)
    np.testing.assert_allclose(s.numpy(), s64, rtol=5e-7)
    np.testing.assert_allclose(v.numpy(), s64**2, rtol=2e-6)
    expected = (g_s.numpy() + 2.0 * s64 * g_v.numpy()) / (1.0 + np.exp(-x64))
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())
    small = tf.constant([-1.0, 0.0, 2.0])  # below MIN_SIZE: TF's ops
    np.testing.assert_allclose(
        fused.softplus_and_square(small)[1], tf.square(tf.nn.softplus(small))
    )


def test_local_reparameterization_reads_the_variance_formed_with_the_stddev():
    """The local-reparameterization kernel's q carries `S^2` from the same pass as `S` (equal
    to the square), Flipout's does not, and `parameters()` keeps its two entries."""
    lr = DenseLocalReparameterization(256)
    lr(tf.ones([2, 256]))
    assert lr.kernel_initializer.variance_wanted
    scale = sampling.normal_parameters(lr.kernel.distribution)[1]
    variance = sampling.normal_variance(lr.kernel.distribution)
    np.testing.assert_allclose(variance, np.square(scale), rtol=1e-6)
    assert set(lr.kernel_initializer.parameters()) == {"mean", "stddev"}
    flipout = DenseFlipout(256)
    flipout(tf.ones([2, 256]))
    assert sampling.normal_variance(flipout.kernel.distribution) is None


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("shape", [(256, 256), (16, 8)], ids=["fused", "unfused"])
def test_normal_kl_value_and_gradient(shape, traced):
    """The KL and its hand-written gradient, fused or not, eager or in a graph (where the
    unfused KL is a function traced once a shape, its gradient through the call)."""
    rng = np.random.RandomState(1)
    loc = tf.Variable(rng.randn(*shape).astype("float32"))
    scale = tf.Variable(rng.uniform(0.01, 2.0, size=shape).astype("float32"))

    def value_and_grads():
        with tf.GradientTape() as tape:
            kl = regularizers.normal_kl_sum(loc, scale, 0.5, 2.0)
        return kl, tape.gradient(kl, [loc, scale])

    kl, grads = (tf.function(value_and_grads) if traced else value_and_grads)()
    m, s = loc.numpy().astype(np.float64), scale.numpy().astype(np.float64)
    expected = np.sum(np.log(2.0 / s) + (s**2 + (m - 0.5) ** 2) / 8.0 - 0.5)
    assert float(kl) == pytest.approx(expected, rel=2e-6)
    np.testing.assert_allclose(grads[0], (m - 0.5) / 4.0, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads[1], s / 4.0 - 1.0 / s, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("square", [False, True], ids=["stddev", "variance"])
@pytest.mark.parametrize("used", ["all", "kl", "parameters"])
def test_posterior_and_kl_value_and_gradient(square, used):
    """`normal_posterior_and_kl`: the mean itself, `softplus(rho)` (or its square) and the KL,
    and the whole gradient against float64 (the chain rule by hand), also where only the KL or
    only the parameters reach the loss (the other upstreams are absent)."""
    rng = np.random.RandomState(3)
    shape = (256, 256)
    loc = tf.Variable(rng.randn(*shape).astype("float32"))
    rho = tf.Variable(rng.uniform(-9.0, 4.0, size=shape).astype("float32"))
    g_loc, g_out = (tf.constant(rng.randn(*shape).astype("float32")) for _ in range(2))

    @tf.function
    def value_and_grads():
        with tf.GradientTape() as tape:
            mean, out, kl = fused.normal_posterior_and_kl(loc, rho, 0.5, 2.0, square=square)
            loss = 0.0
            if used != "kl":
                loss += tf.reduce_sum(g_loc * mean) + tf.reduce_sum(g_out * out)
            if used != "parameters":
                loss += 3.0 * kl
        return mean, out, kl, tape.gradient(loss, [loc, rho])

    mean, out, kl, (d_loc, d_rho) = value_and_grads()
    m, r = loc.numpy().astype(np.float64), rho.numpy().astype(np.float64)
    s = np.logaddexp(0.0, r)
    np.testing.assert_array_equal(mean, loc)
    np.testing.assert_allclose(out, s**2 if square else s, rtol=2e-6)
    expected_kl = np.sum(np.log(2.0 / s) + (s**2 + (m - 0.5) ** 2) / 8.0 - 0.5)
    assert float(kl) == pytest.approx(expected_kl, rel=2e-6)
    w_kl = 0.0 if used == "parameters" else 3.0
    w_par = 0.0 if used == "kl" else 1.0
    expected_loc = w_par * g_loc.numpy() + w_kl * (m - 0.5) / 4.0
    d_s = w_par * g_out.numpy() * (2.0 * s if square else 1.0) + w_kl * (s / 4.0 - 1.0 / s)
    expected_rho = d_s / (1.0 + np.exp(-r))
    np.testing.assert_allclose(d_loc, expected_loc, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        d_rho, expected_rho, rtol=2e-5, atol=1e-6 * np.abs(expected_rho).max()
    )


@pytest.mark.parametrize(
    "estimator", [DenseReparameterization, DenseFlipout, DenseLocalReparameterization]
)
def test_layer_forms_its_kl_with_its_parameters_to_the_same_step(estimator):
    """A layer whose kernel's KL is the default Normal one forms the two together
    (`TrainableNormal.kl_prior`); the loss and every gradient of a training step are those of
    the separate kernels (the same draws), to float32 rounding. A prior of another family, or
    none, takes the separate kernels."""
    x = tf.constant(np.random.RandomState(4).randn(8, 256).astype("float32"))

    def step(layer, fused_kl):
        layer.set_kl_priors = lambda enabled=True: type(layer).set_kl_priors(
            layer, enabled and fused_kl
        )
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(x))) + tf.add_n(layer.losses)
        return loss, tape.gradient(loss, layer.trainable_variables)

    layer, twin = (
        estimator(256, kernel_initializer=blayers.initializers.TrainableNormal(seed=7), seed=5)
        for _ in range(2)
    )
    for each in (layer, twin):
        each.build((None, 256))
    twin.set_weights(layer.get_weights())  # the same parameters and seeds: the same draws
    assert layer.kernel_initializer.kl_prior is None  # set at each draw, not at build
    loss, grads = tf.function(lambda: step(layer, True))()
    plain_loss, plain_grads = tf.function(lambda: step(twin, False))()
    assert twin.kernel_initializer.kl_prior is None
    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-6)
    for grad, plain in zip(grads, plain_grads):
        np.testing.assert_allclose(grad, plain, rtol=1e-4, atol=1e-6 * np.abs(plain).max())
    layer(x)
    assert layer.kernel_initializer.kl_prior == (0.0, 1.0)
    assert sampling.attached_normal_kl(layer.kernel.distribution, (0.0, 1.0)) is not None
    assert sampling.attached_normal_kl(layer.kernel.distribution, (0.0, 2.0)) is None
    for regularizer in ("normal_kl_divergence_with_tied_mean", None):
        other = estimator(256, kernel_regularizer=regularizer)
        other(x)
        assert other.kernel_initializer.kl_prior is None
        assert not hasattr(other.kernel.distribution.distribution, "blayers_kl")


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize(
    "shape,axes,replicas",
    [((64, 1024), 1, None), ((16, 8, 8, 64), 1, None), ((3, 32, 512), 2, 3), ((4, 6), 1, None)],
)
def test_flip_signs_equal_rademacher_times_x(shape, axes, replicas, traced):
    """The flip, fused or not, is `x * rademacher(sign_shape, seed)` exactly, with the same
    signs, and so is its gradient; replicated or not, eager or in a graph (where it is a
    function traced once a shape)."""
    keys = None if replicas is None else sampling.replica_keys(range(replicas))
    x = tf.Variable(np.random.RandomState(2).randn(*shape).astype("float32"))
    seed = tf.constant([4, 9])
    sign_shape = list(shape[:axes]) + [1] * (len(shape) - 1 - axes) + [shape[-1]]

    def flip_and_grad():
        with tf.GradientTape() as tape:
            flipped = sampling.flip_signs(x, seed, axes, keys)
        return flipped, tape.gradient(flipped, x, output_gradients=tf.ones_like(x))

    flipped, grad = (tf.function(flip_and_grad) if traced else flip_and_grad)()
    signs = sampling.rademacher(sign_shape, seed, keys=keys)
    np.testing.assert_array_equal(flipped, x * signs)
    np.testing.assert_array_equal(grad, tf.broadcast_to(signs, shape))
    assert set(np.unique(signs.numpy())) == {-1.0, 1.0}


def test_fused_and_plain_rademacher_are_the_same_signs(monkeypatch):
    seed = tf.constant([11, 12])
    keys = sampling.replica_keys([0, 1])
    fused_signs = sampling.rademacher([BIG], seed).numpy()
    fused_replicas = sampling.rademacher([2, BIG], seed, keys=keys).numpy()
    monkeypatch.setattr(fused, "MIN_SIZE", 1 << 40)
    np.testing.assert_array_equal(fused_signs, sampling.rademacher([BIG], seed))
    np.testing.assert_array_equal(fused_replicas, sampling.rademacher([2, BIG], seed, keys=keys))
    assert abs(fused_signs.mean()) < 5 / math.sqrt(BIG)


def _big_posterior(layer, rng):
    layer.build((None, 256))
    layer.kernel_initializer.mean.assign(0.3 * rng.randn(256, 256).astype("float32"))
    sigma = rng.uniform(0.05, 0.4, size=(256, 256)).astype("float32")
    layer.kernel_initializer.stddev.assign(constraints.Softplus().inverse(sigma))
    return layer, sigma


@pytest.mark.parametrize(
    "cls", [DenseReparameterization, DenseFlipout, DenseLocalReparameterization]
)
def test_fused_estimators_match_closed_form_moments(cls):
    """On a 256 x 256 kernel (the fused path: softplus terms, fused noise and sign flips),
    each output is N(x @ mu, x^2 @ sigma^2)."""
    rng = np.random.RandomState(3)
    layer, sigma = _big_posterior(cls(256, use_bias=False), rng)
    x = rng.randn(2, 256).astype("float32")
    n = 3000
    if cls is DenseLocalReparameterization:
        draws = layer(np.tile(x, (n, 1))).numpy().reshape(n, 2, 256)
    else:  # a fresh weight draw (and signs) each call: one call a draw
        draws = graph_draws(lambda: layer(x), n)
    mu = layer.kernel_initializer.mean.numpy()
    mean, var = x @ mu, np.square(x) @ np.square(sigma)
    draws = draws.astype(np.float64)
    assert np.all(np.abs(draws.mean(0) - mean) < 5 * np.sqrt(var / n))
    se_var = var * math.sqrt(2.0 / (n - 1))
    # 512 outputs at 5 sigma: a false alarm has probability below 3e-4
    assert np.all(np.abs(draws.var(0, ddof=1) - var) < 5 * se_var)


@pytest.mark.parametrize(
    "cls", [DenseReparameterization, DenseFlipout, DenseLocalReparameterization]
)
def test_a_large_layer_learns_through_the_fused_path(cls):
    """Gradients reach both variational parameters of a 256 x 256 kernel (the fused noise,
    softplus, KL and flips) and Adam fits a linear map with them."""
    blayers.set_seed(1)
    rng = np.random.RandomState(5)
    x = tf.constant(rng.randn(128, 256).astype("float32"))
    target = tf.constant((0.1 * rng.randn(256, 256)).astype("float32"))
    y = x @ target
    layer = cls(256, use_bias=False)
    layer.build((None, 256))
    optimizer = keras.optimizers.Adam(1e-2)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            data = tf.reduce_mean(tf.square(layer(x) - y))
            loss = data + tf.add_n(layer.losses) / 1e6
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply(grads, layer.trainable_variables)
        return data, [tf.norm(g) for g in grads]

    first, norms = step()
    assert all(float(n) > 0 and np.isfinite(float(n)) for n in norms)  # mean and rho
    for _ in range(150):
        last, _ = step()
    assert float(last) < 0.2 * float(first)


def test_wide_vectors_are_asked_for_on_avx512_only_and_a_user_width_wins(tmp_path):
    from blayers import xla_cpu

    avx512, avx2 = tmp_path / "avx512", tmp_path / "avx2"
    avx512.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n\n")
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n\n")
    assert xla_cpu.has_avx512(avx512) and not xla_cpu.has_avx512(avx2)
    assert not xla_cpu.has_avx512(tmp_path / "missing")  # not Linux: XLA's default stays
    environ = {}
    assert xla_cpu.prefer_wide_vectors(environ, avx512)
    assert environ == {"XLA_FLAGS": "--xla_cpu_prefer_vector_width=512"}
    environ = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}  # other flags are kept
    assert xla_cpu.prefer_wide_vectors(environ, avx512)
    assert environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_cpu_prefer_vector_width=512"
    user = {"XLA_FLAGS": "--xla_cpu_prefer_vector_width=256"}
    assert not xla_cpu.prefer_wide_vectors(user, avx512)
    assert user == {"XLA_FLAGS": "--xla_cpu_prefer_vector_width=256"}
    environ = {}
    assert not xla_cpu.prefer_wide_vectors(environ, avx2) and environ == {}


def test_the_fused_passes_and_sampling_trace_without_autograph(autograph_conversions):
    """blayers' compiled passes (and the draws, KL and Box-Muller around them) have no
    tensor-valued Python control flow: traced as written, never converted by autograph, whose
    conversion took seconds a process (a third of the Transformer smoke run's tracing)."""
    x = tf.random.stateless_normal([256, 512], [0, 1])
    for layer in (
        DenseReparameterization(256),
        DenseFlipout(256),
        DenseLocalReparameterization(256),
    ):
        layer.build(x.shape)

        @tf.function(autograph=False)  # what is converted is then blayers' own choice
        def step(x, layer=layer):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(x, training=True)) + tf.add_n(layer.losses)
            return tape.gradient(loss, layer.trainable_variables)

        grads = step(x)
        assert all(g is not None and bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)
    draw = lambda: sampling.standard_normal([3, BIG], tf.constant([1, 2]))
    normals = tf.function(draw, autograph=False)()
    assert normals.shape == (3, BIG)
    assert autograph_conversions == []


@pytest.mark.parametrize(
    "name", ["DenseFlipout", "DenseReparameterization", "DenseLocalReparameterization"]
)
def test_a_layer_traced_again_reuses_every_fused_kernel(name):
    """The fused kernels' static shapes key their traces by value: a layer traced again (the
    training step, then the evaluation's pass, then the feature pass) reuses each kernel's
    trace and XLA compilation instead of tracing and compiling it anew a trace (a
    `TensorShape` argument keyed them by identity)."""
    from blayers import sampling

    layer = getattr(blayers.layers, name)(512)
    layer.build((64, 256))

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x)) + sum(layer.losses)
        return tape.gradient(loss, layer.trainable_variables)

    kernels = {
        f"{module.__name__}.{n}": getattr(module, n)
        for module in (fused, sampling)
        for n in dir(module)
        if hasattr(getattr(module, n), "experimental_get_tracing_count")
    }
    counts = []
    for _ in range(3):
        tf.function(step, autograph=False).get_concrete_function(tf.TensorSpec((64, 256)))
        counts.append({k: f.experimental_get_tracing_count() for k, f in kernels.items()})
    assert any(counts[0].values())  # the step takes fused kernels
    assert counts[2] == counts[0]
