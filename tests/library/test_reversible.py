import json
import os
import pathlib
import subprocess
import sys

"""Reversible layers and the vector quantizer: inverses, log-det-Jacobians against autodiff,
MADE's triangular Jacobian, a flow's density integrating to 1, RevNet gradients, VQ-VAE
straight-through gradients and losses."""


import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers.layers import (
    MADE,
    ActNorm,
    Permute,
    RealNVP,
    Reverse,
    ReversibleLayer,
    RevNetBlock,
    VectorQuantizer,
)

RNG = np.random.RandomState(0)
X = RNG.randn(6, 4).astype("float32")


def _randomize(layer, scale=0.5):
    for weight in layer.trainable_weights:
        weight.assign(scale * RNG.randn(*weight.shape).astype("float32"))
    return layer


def _layers():
    return [
        Permute(),
        Permute("random", seed=1),
        ActNorm(),
        RealNVP(MADE([16, 16]), parity=0),
        RealNVP(MADE([16], order="right-to-left"), parity=1),
        RevNetBlock(keras.layers.Dense(2, activation="tanh"), keras.layers.Dense(2)),
        Reverse(RealNVP(MADE([8]), parity=0)),
    ]


@pytest.mark.parametrize("layer", _layers(), ids=lambda layer: type(layer).__name__)
def test_reverse_inverts_call_and_log_det_matches_autodiff(layer):
    layer(X)
    _randomize(layer)
    y = layer(X)
    np.testing.assert_allclose(layer.reverse(y).numpy(), X, atol=1e-4)
    x = tf.constant(X)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer.forward(x)
    jacobian = tape.batch_jacobian(out, x).numpy().astype(np.float64)
    _, logdet = np.linalg.slogdet(jacobian)
    np.testing.assert_allclose(layer.log_det_jacobian(x).numpy(), logdet, atol=1e-4)


@pytest.mark.parametrize("order", ["left-to-right", "right-to-left", "random"])
def test_made_jacobian_is_triangular_in_its_order(order):
    made = MADE([32, 32], order=order, params=2, seed=3)
    made(X)
    _randomize(made)
    x = tf.constant(X)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = made(x)  # [batch, d, params]
    jacobian = np.abs(tape.batch_jacobian(out, x).numpy())  # [batch, d, params, d]
    jacobian = jacobian.transpose(0, 2, 1, 3)  # [batch, params, d_out, d_in]
    degrees = made.input_degrees
    allowed = degrees[None, :] < degrees[:, None]  # output i may see input j iff deg_j < deg_i
    assert np.all(jacobian[:, :, ~allowed] == 0.0)
    assert np.any(jacobian[:, :, allowed] > 0)  # and it does depend on them


def test_flow_on_random_variable_has_a_normalized_density():
    flow = keras.Sequential(
        [
            keras.Input((2,)),
            RealNVP(MADE([16, 16]), parity=0),
            RealNVP(MADE([16, 16], order="right-to-left"), parity=1),
            ActNorm(),
            RealNVP(MADE([16, 16]), parity=0),
        ]
    )
    flow(RNG.randn(256, 2).astype("float32"))  # ActNorm's data-dependent initialization
    for layer in flow.layers:
        if isinstance(layer, RealNVP):
            _randomize(layer.network, 0.3)
    base = blayers.Normal(loc=tf.zeros([1, 2]), scale=1.0)
    out = flow(base)
    assert isinstance(out, blayers.RandomVariable)
    # One chain over the base, not one nested TransformedDistribution per layer: TFP's batch
    # shape inference is exponential in the nesting depth (minutes for a 12-layer flow).
    assert out.distribution.distribution.distribution is base.distribution  # Independent(base)
    assert [b.name for b in out.distribution.bijector.bijectors] == [
        layer.name for layer in reversed(flow.layers)
    ]
    grid = np.linspace(-9, 9, 601).astype("float32")
    points = np.stack(np.meshgrid(grid, grid), -1).reshape(-1, 2)
    density = np.exp(out.distribution.log_prob(points).numpy().astype(np.float64))
    total = np.trapezoid(np.trapezoid(density.reshape(601, 601), grid), grid)
    assert total == pytest.approx(1.0, abs=5e-3)
    # log_prob = base log-prob of reverse(y) + log-det of reverse at y.
    y = out.value
    x = y
    log_det = 0.0
    for layer in reversed(flow.layers):
        x = layer.reverse(x)
        log_det -= layer.log_det_jacobian(x)
    expected = base.distribution.log_prob(x).numpy().sum(-1) + log_det.numpy()
    np.testing.assert_allclose(out.distribution.log_prob(y).numpy(), expected, rtol=1e-4)


def test_transformed_random_variable_is_the_change_of_variables():
    """edward2's constructor: `log p(y) = log p_x(f^-1(y)) - log |det J_f(f^-1(y))|`, value
    `f(x)`, the name seen by `blayers.tape`, an explicit value kept."""
    layer = _randomize(RealNVP(MADE([8]), parity=0), 0.3)
    layer(X[:, :2])
    base = blayers.Normal(loc=tf.zeros([3, 2]), scale=1.0, seed=[0, 1])
    with blayers.tape() as recorded:
        y = blayers.TransformedRandomVariable(base, layer, name="y")
    assert list(recorded) == ["y"] and recorded["y"] is y
    np.testing.assert_allclose(y.value.numpy(), layer.forward(base.value).numpy(), rtol=1e-6)
    points = RNG.randn(3, 2).astype("float32")
    x = layer.reverse(points)
    expected = tf.reduce_sum(base.distribution.log_prob(x), -1) - layer.log_det_jacobian(x)
    np.testing.assert_allclose(y.log_prob(points).numpy(), expected.numpy(), rtol=1e-5)
    fixed = blayers.TransformedRandomVariable(base, layer, value=points)
    np.testing.assert_array_equal(fixed.value.numpy(), points)
    with pytest.raises(TypeError, match="ReversibleLayer"):
        blayers.TransformedRandomVariable(base, keras.layers.Dense(2))


def test_revnet_gradients_equal_plain_implementation():
    f, g = keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(3, activation="relu")
    block = RevNetBlock(f, g)
    x = tf.constant(RNG.randn(5, 6).astype("float32"))
    block(x)
    _randomize(block)
    variables = block.trainable_variables
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours = tf.reduce_sum(tf.sin(block(x)))
        x1, x2 = tf.split(x, 2, axis=-1)
        y1 = x1 + f(x2)
        plain = tf.reduce_sum(tf.sin(tf.concat([y1, x2 + g(y1)], -1)))
    np.testing.assert_allclose(ours.numpy(), plain.numpy(), rtol=1e-6)
    for a, b in zip(tape.gradient(ours, [x, *variables]), tape.gradient(plain, [x, *variables])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


class _ForwardOnly(ReversibleLayer):
    def forward(self, x):
        return 2.0 * x


def test_reverse_swaps_directions_and_raises_only_on_the_missing_one():
    reverse = Reverse(_ForwardOnly())
    np.testing.assert_allclose(reverse.reverse(tf.constant(X)).numpy(), 2 * X)
    with pytest.raises(NotImplementedError, match="no reverse direction"):
        reverse(X)
    model = keras.Sequential([keras.Input((4,)), Reverse(Permute())])
    np.testing.assert_allclose(model(X).numpy(), X[:, ::-1])


def test_actnorm_data_dependent_initialization():
    data = (3.0 + 2.0 * RNG.randn(500, 4)).astype("float32")
    layer = ActNorm()
    out = layer(data).numpy()
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(0), 1.0, atol=1e-3)
    np.testing.assert_allclose(layer(data).numpy(), out)  # initialized once


def test_flow_round_trip(tmp_path):
    flow = keras.Sequential(
        [
            keras.Input((4,)),
            RealNVP(MADE([8]), parity=0),
            Permute(),
            ActNorm(),
            RevNetBlock(keras.layers.Dense(2), keras.layers.Dense(2)),
        ]
    )
    flow(X)
    _randomize(flow)
    flow.save(tmp_path / "flow.keras")
    loaded = keras.models.load_model(tmp_path / "flow.keras")
    np.testing.assert_allclose(loaded(X).numpy(), flow(X).numpy(), rtol=1e-5, atol=1e-6)


def test_vector_quantizer_codes_losses_and_straight_through_gradient():
    vq = VectorQuantizer(5, commitment_cost=0.25)
    z = tf.constant(RNG.randn(3, 7, 2).astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(z)
        out = vq(z)
        total = tf.reduce_sum(out * tf.constant(RNG.randn(3, 7, 2).astype("float32")))
    codebook = vq.codebook.numpy()
    flat = z.numpy().reshape(-1, 2)
    nearest = np.argmin(((flat[:, None] - codebook[None]) ** 2).sum(-1), 1)
    np.testing.assert_allclose(out.numpy().reshape(-1, 2), codebook[nearest], atol=1e-6)
    np.testing.assert_array_equal(vq.codes.numpy().reshape(-1), nearest)
    mse = np.mean((flat - codebook[nearest]) ** 2)
    assert float(vq.losses[0]) == pytest.approx(1.25 * mse, rel=1e-5)
    grad = tape.gradient(total, z)
    assert grad is not None and grad.shape == z.shape  # straight through: identity
    usage = np.bincount(nearest, minlength=5) / len(nearest)
    entropy = -np.sum(usage[usage > 0] * np.log(usage[usage > 0]))
    assert float(vq.perplexity) == pytest.approx(np.exp(entropy), rel=1e-4)


def test_revnet_stack_gradients_equal_plain_stack_and_it_inverts():
    from blayers.layers import RevNetStack

    blocks = [
        RevNetBlock(keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(3))
        for _ in range(3)
    ]
    stack = RevNetStack(blocks)
    x = tf.constant(RNG.randn(5, 6).astype("float32"))
    stack(x)
    _randomize(stack)
    np.testing.assert_allclose(stack.reverse(stack(x)).numpy(), x.numpy(), atol=1e-4)

    @tf.function  # the training setting
    def both(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            ours = tf.reduce_sum(tf.sin(stack(x)))
            h = x
            for block in blocks:
                h = RevNetStack._plain(block, h)
            plain = tf.reduce_sum(tf.sin(h))
        variables = stack.trainable_variables
        return tape.gradient(ours, [x, *variables]), tape.gradient(plain, [x, *variables])

    for a, b in zip(*both(x)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
    assert len(stack.trainable_variables) == 12


def test_revnet_stack_activation_memory_is_flat_in_depth(tmp_path):
    """The plain stack keeps about 0.9 MB of activations per block here (0.25 MB per stored
    [512, 128] tensor); the RevNet stack rebuilds them in the backward pass (0.1-0.3 MB more
    at depth 8 than at 2, also beside a busy process). Measured by the benchmark script in a
    process of its own, which sets up TF's CPU memory accounting itself (nothing set by hand),
    each point the least peak of its three steps."""
    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "revnet.json"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "revnet_memory.py"),
            "--batch=512",
            "--width=128",
            "--depths",
            "2",
            "8",
            "--kinds",
            "revnet_stack",
            "plain",
            f"--out={out}",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    activation = json.loads(out.read_text())["activation_mb"]
    plain = activation["plain"]["8"] - activation["plain"]["2"]
    reversible = activation["revnet_stack"]["8"] - activation["revnet_stack"]["2"]
    assert plain > 3.0  # 6 more blocks
    assert reversible < 1.0, (reversible, plain)


def test_edward2_style_reversible_callable_gives_the_change_of_variables():
    """A Keras layer with edward2's `reverse` and `log_det_jacobian` (the reverse map's, at the
    output): `exp` of a standard normal is the standard log-normal, elementwise or per event."""
    import tensorflow_probability as tfp

    class Exp(keras.layers.Layer):
        def call(self, inputs):
            return tf.exp(inputs)

        def reverse(self, inputs):
            return tf.math.log(inputs)

        def log_det_jacobian(self, inputs):
            return -tf.math.log(inputs)

    class ExpVector(Exp):
        def log_det_jacobian(self, inputs):
            return -tf.reduce_sum(tf.math.log(inputs), -1)

    y_values = np.array([[0.3, 1.0, 2.5], [4.0, 0.1, 1.7]], "float32")
    log_normal = tfp.distributions.LogNormal(0.0, 1.0)
    scalar = blayers.TransformedRandomVariable(blayers.Normal(tf.zeros([2, 3]), 1.0), Exp())
    np.testing.assert_allclose(
        scalar.distribution.log_prob(y_values), log_normal.log_prob(y_values), rtol=1e-5
    )
    base = blayers.Independent(
        tfp.distributions.Normal(tf.zeros([2, 3]), 1.0), reinterpreted_batch_ndims=1
    )
    vector = blayers.TransformedRandomVariable(base, ExpVector())
    np.testing.assert_allclose(
        vector.distribution.log_prob(y_values),
        log_normal.log_prob(y_values).numpy().sum(-1),
        rtol=1e-5,
    )
    assert np.all(scalar.value.numpy() > 0)
