"""BatchEnsemble, rank-1 layers, the ensemble layout, Hyper-BatchEnsemble and CondDense: the
members' maths against materialized kernels, then Keras integration."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from conftest import check_moments, epochs_of, graph_draws

import blayers
from blayers.lab import configurables  # noqa: F401 - gin names of the library
from blayers.layers import (
    CondDense,
    Conv2DBatchEnsemble,
    Conv2DRank1,
    DenseBatchEnsemble,
    DenseHyperBatchEnsemble,
    DenseRank1,
    EnsembleOutput,
    EnsembleTile,
    LSTMCellRank1,
)
from blayers.objectives import training_log_prob

tfd = tfp.distributions
RNG = np.random.RandomState(0)
E = 3


@pytest.mark.parametrize("cls", [DenseBatchEnsemble, DenseRank1])
def test_dense_members_use_their_rank_one_kernels(cls):
    x = RNG.randn(4, 5).astype("float32")
    layer = cls(6, ensemble_size=E, activation="relu")
    y = layer(EnsembleTile(E)(x)).numpy()
    kernels, bias = layer.member_kernels().numpy(), np.asarray(layer.bias)
    expected = np.concatenate([np.maximum(x @ kernels[m] + bias[m], 0) for m in range(E)])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [Conv2DBatchEnsemble, Conv2DRank1])
def test_conv_members_use_their_rank_one_kernels(cls):
    x = RNG.randn(2, 6, 6, 3).astype("float32")
    layer = cls(4, 3, ensemble_size=E, padding="same")
    y = layer(EnsembleTile(E)(x)).numpy()
    kernels, bias = layer.member_kernels().numpy(), np.asarray(layer.bias)
    expected = np.concatenate(
        [tf.nn.conv2d(x, kernels[m], 1, "SAME").numpy() + bias[m] for m in range(E)]
    )
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cls", [blayers.layers.Conv1DBatchEnsemble, blayers.layers.Conv1DRank1])
def test_conv1d_members_use_their_rank_one_kernels(cls):
    x = RNG.randn(2, 7, 3).astype("float32")
    layer = cls(4, 3, ensemble_size=E, padding="same")
    y = layer(EnsembleTile(E)(x)).numpy()
    kernels, bias = layer.member_kernels().numpy(), np.asarray(layer.bias)
    expected = np.concatenate(
        [tf.nn.conv1d(x, kernels[m], 1, "SAME").numpy() + bias[m] for m in range(E)]
    )
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    assert len(layer.losses) == (2 if cls is blayers.layers.Conv1DRank1 else 0)


def test_additive_rank1_perturbations():
    """`use_additive_perturbation`: member m computes `(x + r_m) W + s_m + b_m` (dense, conv)
    and its LSTM projections `(x + r_m) W + s_m`; factors start near 0 with the N(0, 1) KL."""
    x = RNG.randn(2, 5).astype("float32")
    tiled = EnsembleTile(E)(x)
    dense = DenseRank1(4, ensemble_size=E, use_additive_perturbation=True)
    with blayers.posterior_mean():
        y = dense(tiled).numpy()
    alpha = dense.alpha_initializer.mean.numpy()
    gamma = dense.gamma_initializer.mean.numpy()
    w, b = np.asarray(dense.kernel), np.asarray(dense.bias)
    expected = np.concatenate([(x + alpha[m]) @ w + gamma[m] + b[m] for m in range(E)])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert abs(alpha.mean()) < 0.5 and dense.alpha_regularizer.mean == 0.0
    assert DenseRank1.from_config(dense.get_config()).use_additive_perturbation
    with pytest.raises(ValueError, match="no per-member kernel"):
        dense.member_kernels()
    conv = Conv2DRank1(2, 3, ensemble_size=E, padding="same", use_additive_perturbation=True)
    images = RNG.randn(2, 4, 4, 3).astype("float32")
    with blayers.posterior_mean():
        out = conv(EnsembleTile(E)(images)).numpy()
    alpha = conv.alpha_initializer.mean.numpy()
    gamma = conv.gamma_initializer.mean.numpy()
    kernel, bias = np.asarray(conv.kernel), np.asarray(conv.bias)
    for m in range(E):
        ref = tf.nn.conv2d(images + alpha[m], kernel, 1, "SAME").numpy() + gamma[m] + bias[m]
        np.testing.assert_allclose(out[2 * m : 2 * m + 2], ref, rtol=1e-4, atol=1e-4)
    cell = LSTMCellRank1(3, ensemble_size=E, use_additive_perturbation=True)
    with blayers.posterior_mean():
        state = cell.get_initial_state(tiled)
        h, _ = cell(tiled, state)
        means = {
            f: getattr(cell, f"{f}_initializer").parameters()["mean"].numpy() for f in cell._FACTORS
        }
    w, b = np.asarray(cell.kernel), np.asarray(cell.bias)
    ref = keras.layers.LSTMCell(3)
    ref.build((None, 5))
    for m in range(E):
        # With h_0 = 0 the recurrent projection is (0 + r'_m) U + s'_m: the bias it adds.
        recurrent = means["recurrent_alpha"][m] @ np.asarray(cell.recurrent_kernel)
        ref.kernel.assign(w)
        ref.recurrent_kernel.assign(np.zeros_like(np.asarray(cell.recurrent_kernel)))
        ref.bias.assign(b[m] + means["gamma"][m] + recurrent + means["recurrent_gamma"][m])
        expected, _ = ref(x + means["alpha"][m], ref.get_initial_state(2))
        np.testing.assert_allclose(h[2 * m : 2 * m + 2], expected, rtol=1e-4, atol=1e-5)
    assert LSTMCellRank1.from_config(cell.get_config()).use_additive_perturbation


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: DenseBatchEnsemble(2, ensemble_size=3), [4, 2]),
        (lambda: DenseRank1(2, ensemble_size=3), [4, 2]),
        (lambda: Conv2DRank1(2, 3, ensemble_size=3), [4, 5, 5, 2]),  # edward2's test shapes
        (lambda: Conv2DBatchEnsemble(2, 3, ensemble_size=3), [4, 5, 5, 2]),
    ],
)
def test_batch_must_hold_whole_members(make, shape):
    """The error names the layer, the batch's actual size and the fix (EnsembleTile), eagerly
    and in a graph whose batch size is unknown."""
    layer = make()
    with pytest.raises(
        ValueError, match=r"the batch \(4 rows\) must hold ensemble_size = 3"
    ) as info:
        layer(tf.ones(shape))
    assert "{" not in str(info.value) and "EnsembleTile" in str(info.value)
    assert layer.name in str(info.value)
    layer(tf.ones([6, *shape[1:]]))  # whole members
    graph = tf.function(layer, input_signature=[tf.TensorSpec([None, *shape[1:]])])
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"must hold ensemble_size = 3"
    ) as info:
        graph(tf.ones(shape))
    assert "must hold" in info.value.message and "{batch}" not in info.value.message


def test_batch_ensemble_members_differ_and_are_deterministic():
    layer = DenseBatchEnsemble(3, ensemble_size=E)
    x = EnsembleTile(E)(tf.ones([1, 4]))
    y1, y2 = layer(x).numpy(), layer(x).numpy()
    np.testing.assert_array_equal(y1, y2)
    assert not np.allclose(y1[0], y1[1])  # N(1, 0.5^2) fast weights: members start apart
    assert layer.losses == []


def test_rank1_kl_is_the_closed_form_toward_the_rank1_prior():
    layer = DenseRank1(3, ensemble_size=E)
    layer(EnsembleTile(E)(tf.ones([2, 4])))
    expected = 0.0
    for name in ("alpha", "gamma"):
        params = getattr(layer, f"{name}_initializer").parameters()
        q = tfd.Normal(params["mean"], params["stddev"])
        expected += float(tf.reduce_sum(q.kl_divergence(tfd.Normal(1.0, 1.0))))
    np.testing.assert_allclose(float(tf.add_n(layer.losses)), expected, rtol=1e-5)


def test_rank1_factors_are_drawn_from_their_posterior():
    layer = DenseRank1(2, ensemble_size=E, use_bias=False)
    x = EnsembleTile(E)(tf.ones([1, 1]))
    layer(x)
    alpha = layer.alpha_initializer.parameters()
    gamma = layer.gamma_initializer.parameters()
    kernel = np.asarray(layer.kernel)
    draws = graph_draws(lambda: layer(x), 2000)  # one draw of the factors each: [n, E, 2]
    # y_m = a_m W g_m with independent Normal factors: mean and variance in closed form.
    am, av = alpha["mean"].numpy()[:, 0], alpha["stddev"].numpy()[:, 0] ** 2
    gm, gv = gamma["mean"].numpy(), gamma["stddev"].numpy() ** 2
    mean = am[:, None] * kernel[0] * gm
    second = (am**2 + av)[:, None] * kernel[0] ** 2 * (gm**2 + gv)
    check_moments(draws, mean, second - mean**2)


def test_ensemble_output_mixture_and_member_training_loss():
    logits = RNG.randn(E * 2, 4).astype("float32")
    out = EnsembleOutput(E)(logits)
    members = logits.reshape(E, 2, 4).transpose(1, 0, 2)
    member_lp = tf.nn.log_softmax(members).numpy()
    y = np.array([1, 3])
    expected_members = member_lp[np.arange(2), :, y]
    np.testing.assert_allclose(out.distribution.member_log_prob(y), expected_members, rtol=1e-5)
    mixture = np.log(np.exp(expected_members).mean(-1))
    np.testing.assert_allclose(out.distribution.log_prob(y), mixture, rtol=1e-5)
    np.testing.assert_allclose(
        training_log_prob(out.distribution, y), expected_members.mean(-1), rtol=1e-5
    )
    np.testing.assert_allclose(
        out.distribution.probs_parameter(), np.exp(member_lp).mean(1), rtol=1e-5
    )
    normal = EnsembleOutput(2, distribution="normal")(RNG.randn(4, 2).astype("float32"))
    assert normal.distribution.member_log_prob(np.zeros([2, 1], "float32")).shape == (2, 2)


def test_ensemble_trains_with_fit_and_round_trips(tmp_path):
    x = RNG.randn(64, 5).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((5,)),
            EnsembleTile(E),
            DenseRank1(16, ensemble_size=E, activation="relu"),
            DenseBatchEnsemble(2, ensemble_size=E),
            EnsembleOutput(E),
        ]
    )
    model.compile(keras.optimizers.Adam(0.05), blayers.objectives.NegativeLogLikelihood())
    model.fit(epochs_of(x, y, 30, batch_size=32), verbose=0)
    with blayers.posterior_mean():
        probs = model(x).distribution.probs_parameter().numpy()
    assert (probs.argmax(-1) == y).mean() > 0.9
    path = tmp_path / "ensemble.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    with blayers.posterior_mean():
        np.testing.assert_allclose(
            loaded(x).distribution.probs_parameter(), probs, rtol=1e-5, atol=1e-6
        )


def test_lstm_cell_rank1_members_and_round_trip(tmp_path):
    cell = LSTMCellRank1(4, ensemble_size=2)
    model = keras.Sequential([keras.Input((5, 3)), EnsembleTile(2), keras.layers.RNN(cell)])
    x = RNG.randn(3, 5, 3).astype("float32")
    with blayers.posterior_mean():
        y = model(x).numpy()
    assert y.shape == (6, 4) and not np.allclose(y[:3], y[3:])
    assert len(model.losses) == 4  # the four factors' KL terms
    # Member m is an LSTM with kernels W * outer(r_m, s_m), U * outer(r'_m, s'_m).
    with blayers.posterior_mean():
        cell.begin_sequence(6)
        means = {
            f: getattr(cell, f"{f}_initializer").parameters()["mean"].numpy() for f in cell._FACTORS
        }
    w, u, b = np.asarray(cell.kernel), np.asarray(cell.recurrent_kernel), np.asarray(cell.bias)
    for m in range(2):
        ref = keras.layers.LSTMCell(4)
        ref.build((None, 3))
        ref.kernel.assign(w * np.outer(means["alpha"][m], means["gamma"][m]))
        ref.recurrent_kernel.assign(
            u * np.outer(means["recurrent_alpha"][m], means["recurrent_gamma"][m])
        )
        ref.bias.assign(b[m])
        np.testing.assert_allclose(keras.layers.RNN(ref)(x), y[3 * m : 3 * m + 3], atol=1e-5)
    path = tmp_path / "rank1_lstm.keras"
    model.save(path)
    with blayers.posterior_mean():
        np.testing.assert_allclose(keras.models.load_model(path)(x), y, atol=1e-6)


def test_hyper_batch_ensemble_formula_and_l2_penalty():
    x = RNG.randn(E * 2, 4).astype("float32")
    lambdas = RNG.randn(E * 2, 2).astype("float32")
    layer = DenseHyperBatchEnsemble(3, ensemble_size=E, l2_index=0)
    y = layer([x, lambdas]).numpy()
    emb = np.asarray(layer.embedding)
    e1, e2 = np.split(lambdas @ emb, 2, axis=-1)
    member = np.repeat(np.arange(E), 2)

    def kernels(prefix):
        k, a, g = (np.asarray(getattr(layer, f"{prefix}{n}")) for n in ("kernel", "alpha", "gamma"))
        return k[None] * a[:, :, None] * g[:, None, :]

    k, dk = kernels(""), kernels("delta_")
    expected = np.stack(
        [
            x[i] @ k[member[i]]
            + e1[i] * (x[i] @ dk[member[i]])
            + np.asarray(layer.ensemble_bias)[member[i]]
            + e2[i] * np.asarray(layer.bias)[member[i]]
            for i in range(len(x))
        ]
    )
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    penalty = np.mean(
        [
            lambdas[i, 0] * np.sum((k[member[i]] + dk[member[i]] * e1[i][None, :]) ** 2)
            for i in range(len(x))
        ]
    )
    np.testing.assert_allclose(float(layer.losses[0]), penalty, rtol=1e-4)


def test_conv2d_hyper_batch_ensemble_formula_penalty_and_edward2_order(tmp_path):
    """Member m convolves with `K_m + e1(lambda) D_m` (the fast weights scaling input channels
    and filters) plus `b_m + e2 b'_m`; the penalty is that kernel's squared norm weighted by the
    L2 column; edward2's argument order builds the same layer."""
    x = RNG.randn(E * 2, 5, 5, 3).astype("float32")
    lambdas = RNG.randn(E * 2, 2).astype("float32")
    layer = blayers.layers.Conv2DHyperBatchEnsemble(
        4, 3, ensemble_size=E, l2_index=1, padding="same"
    )
    y = layer([x, lambdas]).numpy()
    e1, e2 = np.split(lambdas @ np.asarray(layer.embedding), 2, axis=-1)
    member = np.repeat(np.arange(E), 2)

    def kernels(prefix):
        k, a, g = (np.asarray(getattr(layer, f"{prefix}{n}")) for n in ("kernel", "alpha", "gamma"))
        return k[None] * a[:, None, None, :, None] * g[:, None, None, None, :]

    k, dk = kernels(""), kernels("delta_")
    for i in range(len(x)):
        m = member[i]
        kernel = k[m] + dk[m] * e1[i]
        bias = np.asarray(layer.ensemble_bias)[m] + e2[i] * np.asarray(layer.bias)[m]
        expected = tf.nn.conv2d(x[i : i + 1], kernel, 1, "SAME").numpy()[0] + bias
        np.testing.assert_allclose(y[i], expected, rtol=1e-4, atol=1e-4)
    penalty = np.mean(
        [lambdas[i, 1] * np.sum((k[member[i]] + dk[member[i]] * e1[i]) ** 2) for i in range(len(x))]
    )
    np.testing.assert_allclose(float(layer.losses[0]), penalty, rtol=1e-4)
    edward2 = blayers.layers.Conv2DHyperBatchEnsemble(
        {"hyper_conv_l2_kernel": 1}, 4, 3, ensemble_size=E, padding="same", name="hyper_conv"
    )
    assert (edward2.filters, edward2.kernel_size, edward2.l2_index) == (4, (3, 3), 1)
    inputs = [keras.Input((5, 5, 3)), keras.Input((2,))]
    model = keras.Model(inputs, layer(inputs))
    model.save(tmp_path / "hyper_conv.keras")
    loaded = keras.models.load_model(tmp_path / "hyper_conv.keras")
    np.testing.assert_allclose(loaded([x, lambdas]), y, rtol=1e-5, atol=1e-5)


def test_hyper_batch_ensemble_takes_edward2s_arguments_and_gin():
    """`DenseHyperBatchEnsemble(units, lambda_key_to_index, ensemble_size=...)` as edward2
    writes it, `[x, lambdas, e]` inputs, and gin bindings of its arguments."""
    import gin

    x = RNG.randn(E * 2, 4).astype("float32")
    lambdas = RNG.uniform(-1, 1, (E * 2, 2)).astype("float32")
    mapping = {"hyper_dense_l2_kernel": 1, "other_l2_kernel": 0}
    layer = DenseHyperBatchEnsemble(3, mapping, rank=1, ensemble_size=E, name="hyper_dense")
    assert layer.l2_index == 1 and layer.ensemble_size == E
    ours = DenseHyperBatchEnsemble(3, ensemble_size=E, l2_index=1)
    y = ours([x, lambdas])
    e = tf.matmul(lambdas, ours.embedding)
    y_given = layer([x, lambdas, e])
    layer.set_weights(ours.get_weights()[:-1])  # everything but the embedding
    np.testing.assert_allclose(layer([x, lambdas, e]), y, rtol=1e-5, atol=1e-6)
    assert y_given.shape == y.shape and layer.embedding is None and len(layer.losses) == 1
    with pytest.raises(ValueError, match="no 'unnamed_l2_kernel'"):
        DenseHyperBatchEnsemble(3, {"x_l2_kernel": 0}, name="unnamed")
    with pytest.raises(TypeError, match="pass ensemble_size as a keyword"):
        DenseHyperBatchEnsemble(3, 4)
    gin.parse_config(  # the conftest fixture clears it
        "DenseHyperBatchEnsemble.ensemble_size = 2\nDenseHyperBatchEnsemble.l2_index = 0"
    )
    bound = DenseHyperBatchEnsemble(5)
    assert (bound.ensemble_size, bound.l2_index) == (2, 0)
    assert bound([x[:4], lambdas[:4]]).shape == (4, 5)


def test_dense_multihead_heads_and_member_major_rows(tmp_path):
    """edward2's `DenseMultihead`: head m of `[B, E, units]` is `x W[:, m] + b[m]`; the
    member-major form feeds `EnsembleOutput`, whose mixture averages the heads."""
    x = RNG.randn(5, 4).astype("float32")
    layer = blayers.layers.DenseMultihead(3, ensemble_size=E)
    y = layer(x).numpy()
    w, b = np.asarray(layer.kernel), np.asarray(layer.bias)
    assert y.shape == (5, E, 3) and not layer.losses
    for m in range(E):
        np.testing.assert_allclose(
            y[:, m], x @ w[:, 3 * m : 3 * m + 3] + b[3 * m : 3 * m + 3], rtol=1e-5, atol=1e-6
        )
    rows = blayers.layers.DenseMultihead(3, ensemble_size=E, member_major=True)
    model = keras.Sequential([keras.Input((4,)), rows, EnsembleOutput(E)])
    rows.set_weights(layer.get_weights())
    probs = model(x).distribution.probs_parameter().numpy()
    np.testing.assert_allclose(probs, tf.nn.softmax(y).numpy().mean(1), rtol=1e-5, atol=1e-6)
    model.save(tmp_path / "multihead.keras")
    loaded = keras.models.load_model(tmp_path / "multihead.keras")
    np.testing.assert_allclose(loaded(x).distribution.probs_parameter(), probs, rtol=1e-6)
    bayesian = blayers.layers.DenseMultihead(
        3, ensemble_size=2, kernel_initializer="trainable_normal"
    )
    bayesian(x)
    assert len(bayesian.losses) == 1


@pytest.mark.parametrize("depthwise", [False, True])
def test_cond_conv_mixes_expert_kernels(depthwise, tmp_path):
    """CondConv2D / DepthwiseCondConv2D: example i is convolved with `sum_k r_ik W_k` and gets
    `sum_k r_ik b_k`, against that kernel materialized per example."""
    x = RNG.randn(3, 6, 6, 2).astype("float32")
    routing = tf.nn.softmax(RNG.randn(3, 4).astype("float32")).numpy()
    if depthwise:
        layer = blayers.layers.DepthwiseCondConv2D(
            3, num_experts=4, depth_multiplier=2, padding="same", bias_initializer="random_normal"
        )
    else:
        layer = blayers.layers.CondConv2D(
            5, 3, num_experts=4, padding="same", bias_initializer="random_normal"
        )
    y = layer(x, routing).numpy()
    kernel, bias = np.asarray(layer.kernel), np.asarray(layer.bias)
    for i in range(3):
        mixed = np.tensordot(routing[i], kernel, 1)
        conv = tf.nn.depthwise_conv2d if depthwise else tf.nn.conv2d
        strides = [1, 1, 1, 1] if depthwise else 1
        expected = conv(x[i : i + 1], mixed, strides, "SAME").numpy()[0] + routing[i] @ bias
        np.testing.assert_allclose(y[i], expected, rtol=1e-4, atol=1e-4)
    assert (
        y.shape
        == layer.compute_output_shape(x.shape)
        == ((3, 6, 6, 4) if depthwise else (3, 6, 6, 5))
    )
    inputs = [keras.Input((6, 6, 2)), keras.Input((4,))]
    model = keras.Model(inputs, layer(*inputs))
    model.save(tmp_path / "cond.keras")
    np.testing.assert_allclose(
        keras.models.load_model(tmp_path / "cond.keras")([x, routing]), y, rtol=1e-5, atol=1e-5
    )


def test_depthwise_batch_ensemble_members_use_their_kernels():
    x = RNG.randn(2, 5, 5, 3).astype("float32")
    layer = blayers.layers.DepthwiseConv2DBatchEnsemble(
        3, ensemble_size=E, depth_multiplier=2, padding="same", bias_initializer="random_normal"
    )
    y = layer(EnsembleTile(E)(x)).numpy()
    kernels, bias = layer.member_kernels().numpy(), np.asarray(layer.bias)
    expected = np.concatenate(
        [
            tf.nn.depthwise_conv2d(x, kernels[m], [1, 1, 1, 1], "SAME").numpy() + bias[m]
            for m in range(E)
        ]
    )
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    assert y.shape == (E * 2, 5, 5, 6)
    with pytest.raises(ValueError, match="EnsembleTile"):
        layer(tf.ones([4, 5, 5, 3]))


def test_cond_dense_mixes_expert_kernels():
    x = RNG.randn(5, 4).astype("float32")
    routing = np.abs(RNG.randn(5, 3)).astype("float32")
    layer = CondDense(2, num_experts=3)
    y = layer(x, routing).numpy()
    kernel, bias = np.asarray(layer.kernel), np.asarray(layer.bias)
    expected = np.stack(
        [x[i] @ np.tensordot(routing[i], kernel, 1) + routing[i] @ bias for i in range(5)]
    )
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(kernel[0], kernel[1])  # experts initialized independently


@pytest.mark.parametrize("cls", [DenseBatchEnsemble, DenseRank1])
def test_float64_and_gin(cls):
    layer = cls(3, ensemble_size=2, dtype="float64")
    y = layer(tf.ones([2, 4], tf.float64))
    assert y.dtype == tf.float64 and all(w.dtype == "float64" for w in layer.weights)
    import gin

    gin.parse_config(f"{cls.__name__}.ensemble_size = 5")
    assert cls(3).ensemble_size == 5


@pytest.mark.parametrize("distribution", ["categorical", "normal"])
def test_task_metrics_see_the_members_mutual_information(distribution):
    """The tasks' predictive draws of an ensemble are its members: mutual information is
    `H[mean_m p_m] - mean_m H[p_m]` over members (and passes), not 0 from an average taken
    first; the predictive (accuracy, NLL) is the same mixture."""
    from blayers.lab.data import Data
    from blayers.metrics import entropy, mutual_information

    x = 3 * RNG.randn(20, 5).astype("float32")
    if distribution == "categorical":
        y = RNG.randint(0, 3, 20).astype("int32")
        data = Data(
            "toy",
            "classification",
            *[tf.data.Dataset.from_tensor_slices((x, y))] * 2,
            20,
            20,
            (5,),
            num_classes=3,
        )
        units = 3
    else:
        y = RNG.randn(20, 1).astype("float32")
        data = Data(
            "toy",
            "regression",
            *[tf.data.Dataset.from_tensor_slices((x, y))] * 2,
            20,
            20,
            (5,),
            target_dim=1,
        )
        units = 2
    model = keras.Sequential(
        [
            keras.Input((5,)),
            EnsembleTile(4),
            DenseBatchEnsemble(
                units,
                ensemble_size=4,
                alpha_initializer=keras.initializers.RandomNormal(stddev=1.0, seed=1),
                gamma_initializer=keras.initializers.RandomNormal(stddev=1.0, seed=2),
            ),
            EnsembleOutput(4, distribution=distribution),
        ]
    )
    member_outputs = model.layers[1](EnsembleTile(4)(x)).numpy().reshape(4, 20, units)
    result, arrays = data.task.evaluate(model, data, num_samples=2, batch_size=7)
    if distribution == "categorical":
        member_probs = tf.nn.softmax(member_outputs).numpy()
        assert arrays["probs"].shape == (8, 20, 3)
        np.testing.assert_allclose(arrays["probs"][:4], member_probs, rtol=1e-5, atol=1e-6)
        expected = mutual_information(member_probs)
        assert expected.mean() > 0.05  # the members disagree
        np.testing.assert_allclose(result["mutual_information"], expected.mean(), rtol=1e-5)
        np.testing.assert_allclose(result["entropy"], entropy(member_probs).mean(), rtol=1e-5)
        mixture = model(x).distribution
        np.testing.assert_allclose(result["nll"], -np.mean(mixture.log_prob(y).numpy()), rtol=1e-4)
    else:
        assert arrays["means"].shape == (8, 20, 1)
        np.testing.assert_allclose(arrays["means"][:4], member_outputs[..., :1], rtol=1e-5)
        mixture = model(x).distribution
        np.testing.assert_allclose(
            -result["test_log_likelihood"], -np.mean(mixture.log_prob(y).numpy()), rtol=1e-4
        )
