"""Packed-Ensembles, Masksembles and MIMO: each layer against its paper's arithmetic (grouped
maps, mask overlap, permuted inputs put back in order), member independence, and that each
ensemble learns with members that disagree."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import epochs_of

import blayers
from blayers import layers as L
from blayers.layers.masksembles import generate_masks
from blayers.layers.packed import packed_width
from tests.conftest import shuffled_digits


def _numpy_packed_dense(x, kernel, bias, members):
    """Member-major rows through per-member block-diagonal matrices (the paper's grouped map)."""
    m, groups, i, o = kernel.shape
    rows = x.reshape(m, -1, groups * i)
    out = []
    for e in range(m):
        block = np.zeros([groups * i, groups * o])
        for g in range(groups):
            block[g * i : (g + 1) * i, g * o : (g + 1) * o] = kernel[e, g]
        out.append(rows[e] @ block + bias[e])
    return np.concatenate(out)


@pytest.mark.parametrize("gamma", [1, 2])
def test_packed_dense_is_a_grouped_map_per_member(gamma):
    layer = L.PackedDense(8, alpha=2, num_estimators=4, gamma=gamma, bias_initializer="ones")
    x = np.random.RandomState(0).randn(4 * 5, 6)
    y = layer(x).numpy()
    kernel, bias = layer.kernel.numpy(), layer.bias.numpy()
    assert kernel.shape == (4, gamma, 6 // gamma, 4 // gamma)  # width = 2 * 8 / 4 = 4
    np.testing.assert_allclose(y, _numpy_packed_dense(x, kernel, bias, 4), rtol=1e-5, atol=1e-5)


def test_packed_widths_and_parameters_follow_the_paper():
    """alpha C channels over M members; alpha = M, gamma = 1 is a deep ensemble's parameter
    count; gamma divides each member's parameters by gamma."""
    assert packed_width(64, 2, 4) == 32
    assert packed_width(10, 2, 4, last=True) == 10
    assert packed_width(30, 1, 4, gamma=2) == 8  # ceil(7.5) = 8, a multiple of 2

    def count(alpha, gamma):
        model = keras.Sequential(
            [
                keras.Input((16,)),
                L.EnsembleTile(4),
                L.PackedDense(64, alpha, 4, first=True),
                L.PackedDense(64, alpha, 4, gamma=gamma),
                L.PackedDense(3, alpha, 4, last=True),
            ]
        )
        return model.count_params()

    base = 16 * 64 + 64 + 64 * 64 + 64 + 64 * 3 + 3
    assert count(4, 1) == 4 * base
    assert count(2, 1) - count(2, 2) == 4 * (32 * 32 - 2 * 16 * 16)


def test_packed_members_are_independent():
    """A member's outputs depend on its own rows and weights only."""
    model = keras.Sequential(
        [
            keras.Input((5,)),
            L.EnsembleTile(3),
            L.PackedDense(12, 3, 3, first=True, activation="relu"),
            L.PackedDense(12, 3, 3, gamma=2, activation="relu"),
            L.PackedDense(2, 3, 3, last=True),
        ]
    )
    x = tf.constant(np.random.RandomState(0).randn(4, 5), tf.float32)
    with tf.GradientTape() as tape:
        out = model(x)
        member0 = tf.reduce_sum(out[:4])
    grads = tape.gradient(member0, model.trainable_weights)
    for g in grads:
        g = g.numpy()
        assert np.any(g[0] != 0) and np.all(g[1:] == 0)


@pytest.mark.parametrize("gamma,first", [(1, True), (2, False)])
def test_packed_conv2d_is_a_grouped_convolution_per_member(gamma, first):
    layer = L.PackedConv2D(
        8, 3, alpha=2, num_estimators=2, gamma=gamma, first=first, padding="same"
    )
    x = np.random.RandomState(1).randn(2 * 3, 7, 7, 4).astype("float32")
    y = layer(x).numpy()
    kernel = layer.kernel.numpy()  # [M * gamma, 3, 3, i, o]
    per = 4 // layer.groups
    expected = []
    for e in range(2):
        rows = x[e * 3 : (e + 1) * 3]
        parts = [
            tf.nn.conv2d(
                rows[..., g * per : (g + 1) * per], kernel[e * layer.groups + g], 1, "SAME"
            ).numpy()
            for g in range(layer.groups)
        ]
        expected.append(np.concatenate(parts, -1) + layer.bias.numpy()[e])
    np.testing.assert_allclose(y, np.concatenate(expected), rtol=1e-4, atol=1e-4)
    assert y.shape == layer.compute_output_shape(x.shape)


def test_packed_layers_refuse_bad_shapes():
    with pytest.raises(ValueError, match="PackedDense .*gamma = 2"):
        L.PackedDense(8, 2, 4, gamma=2)(np.ones((8, 5), "float32"))
    with pytest.raises(ValueError, match="member-major"):
        L.PackedDense(8, 2, 4)(np.ones((6, 4), "float32"))
    with pytest.raises(ValueError, match="alpha"):
        L.PackedDense(8, 0, 4)


def test_masks_have_the_papers_structure():
    """Every mask has the same number of ones, every channel is used, the seed fixes them, and
    a larger scale gives less overlap (scale 1: identical masks)."""
    masks = generate_masks(64, 4, 2.0, seed=0)
    assert masks.shape == (4, 64)
    assert len(set(masks.sum(1))) == 1 and np.all(masks.sum(0) >= 1)
    np.testing.assert_array_equal(masks, generate_masks(64, 4, 2.0, seed=0))

    def overlap(scale):
        m = generate_masks(128, 4, scale, seed=1)
        inter = m @ m.T
        return np.mean(inter[~np.eye(4, dtype=bool)] / m.sum(1)[0])

    assert overlap(1.0) == 1.0
    assert overlap(1.5) > overlap(3.0) > overlap(5.0)
    with pytest.raises(ValueError, match="10 channels"):
        generate_masks(8, 4, 2.0)


def test_masksembles_multiplies_each_members_rows_by_its_mask(tmp_path):
    layer = L.Masksembles2D(3, 2.0, seed=0)
    x = np.random.RandomState(0).randn(3 * 2, 4, 4, 16).astype("float32")
    y = layer(x).numpy()
    masks = layer.masks.numpy()
    for e in range(3):
        np.testing.assert_array_equal(y[e * 2 : (e + 1) * 2], x[e * 2 : (e + 1) * 2] * masks[e])
    model = keras.Sequential([keras.Input((16,)), L.EnsembleTile(3), L.Masksembles1D(3, 2.0)])
    path = str(tmp_path / "m.keras")
    model.save(path)
    again = keras.models.load_model(path)
    np.testing.assert_array_equal(again.layers[-1].masks.numpy(), model.layers[-1].masks.numpy())


def _selector(members, feature=None):
    """A network from `[B, M]` (one feature a member) to `M` heads of (loc, raw scale): head m's
    loc is member m's input (or `feature`'s for every head)."""
    kernel = np.zeros([members, 2 * members], "float32")
    for m in range(members):
        kernel[m if feature is None else feature, 2 * m] = 1.0
    layer = keras.layers.Dense(2 * members, use_bias=False)
    layer.build((None, members))
    layer.kernel.assign(kernel)
    return layer


def _locs(rv):
    return rv.distribution.members.distribution.loc.numpy()[..., 0]  # [B, members]


def test_mimo_puts_each_heads_predictions_back_in_example_order():
    x = np.arange(12, dtype="float32")[:, None]
    mimo = L.MIMO(_selector(3), 3, distribution="normal", batch_repetitions=2, seed=0)
    train = _locs(mimo(x, training=True))
    assert train.shape == (12, 6)  # 3 heads x 2 repetitions
    np.testing.assert_array_equal(train, np.repeat(x, 6, axis=1))
    np.testing.assert_array_equal(_locs(mimo(x)), np.repeat(x, 3, axis=1))


@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0])
def test_mimo_input_repetition(rho):
    """Head m reads member 0's input: in example order it sees example i exactly where both
    members read the same example, a fraction rho of the rows (plus chance agreements)."""
    n = 400
    x = np.arange(n, dtype="float32")[:, None]
    mimo = L.MIMO(
        _selector(2, feature=0), 2, distribution="normal", input_repetition_probability=rho, seed=1
    )
    locs = _locs(mimo(x, training=True))
    same = np.mean(locs[:, 1] == x[:, 0])
    assert abs(same - rho) < 0.02


def test_mimo_learns_with_heads_that_disagree():
    x, y = shuffled_digits()
    blayers.set_seed(0)
    network = keras.Sequential(
        [keras.Input((3 * 64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(30)]
    )
    model = keras.Sequential([keras.Input((64,)), L.MIMO(network, 3, batch_repetitions=2, seed=0)])
    model.compile(keras.optimizers.Adam(3e-3), loss=blayers.objectives.NegativeLogLikelihood())
    model.fit(epochs_of(x[:1400], y[:1400], 20, batch_size=64), verbose=0)
    mixture = model(x[1400:]).distribution
    probs = mixture.members.probs_parameter().numpy()  # [B, 3, 10]
    assert np.mean(np.argmax(probs.mean(1), -1) == y[1400:]) > 0.9
    for m in range(3):
        assert np.mean(np.argmax(probs[:, m], -1) == y[1400:]) > 0.85
    assert np.mean(np.abs(probs[:, 0] - probs[:, 1])) > 1e-3


def test_packed_ensemble_learns_and_members_disagree():
    x, y = shuffled_digits()
    blayers.set_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            L.EnsembleTile(4),
            L.PackedDense(64, 2, 4, first=True, activation="relu"),
            L.Masksembles1D(4, 2.0, seed=0),
            L.PackedDense(64, 2, 4, gamma=2, activation="relu"),
            L.PackedDense(10, 2, 4, last=True),
            L.EnsembleOutput(4),
        ]
    )
    model.compile(keras.optimizers.Adam(3e-3), loss=blayers.objectives.NegativeLogLikelihood())
    model.fit(epochs_of(x[:1400], y[:1400], 20, batch_size=64), verbose=0)
    probs = model(x[1400:]).distribution.members.probs_parameter().numpy()
    assert np.mean(np.argmax(probs.mean(1), -1) == y[1400:]) > 0.9
    assert np.mean(np.abs(probs[:, 0] - probs[:, 1])) > 1e-3
