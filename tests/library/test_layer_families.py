"""Convolutional, recurrent, attention and embedding layers: estimator maths against closed
forms, one weight draw per sequence, and Keras integration (fit, save/load, gin)."""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import check_moments, graph_draws

import blayers
from blayers import constraints
from blayers.lab import configurables  # noqa: F401 - gin names of the library
from blayers.layers import convolutional as conv_lib
from blayers.layers import recurrent as rnn_lib

RNG = np.random.RandomState(0)
SOFTPLUS = constraints.Softplus()


def _set_posterior(initializer, mean, stddev):
    initializer.mean.assign(mean)
    initializer.stddev.assign(SOFTPLUS.inverse(stddev))


_check_moments = check_moments


CONV_CASES = [
    ("Conv1D", (1, 6, 2), {}),
    ("Conv2D", (1, 5, 5, 2), {"padding": "same"}),
    ("Conv3D", (1, 4, 4, 4, 2), {}),
    ("Conv2DTranspose", (1, 3, 3, 2), {"strides": 2}),
]


@pytest.mark.parametrize("estimator", ["Reparameterization", "Flipout", "LocalReparameterization"])
@pytest.mark.parametrize("family,shape,kwargs", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_output_moments_match_closed_form(family, shape, kwargs, estimator):
    """Each output is N(conv(x, M), conv(x^2, S^2)) for every estimator: Flipout's and local
    reparameterization's per-example variance equals Reparameterization's."""
    layer = getattr(conv_lib, family + estimator)(2, 3, use_bias=False, **kwargs)
    x = RNG.randn(*shape).astype("float32")
    layer.build(x.shape)
    kernel_shape = layer.kernel_initializer.weight_shape
    mean = (0.5 * RNG.randn(*kernel_shape)).astype("float32")
    stddev = RNG.uniform(0.1, 0.5, kernel_shape).astype("float32")
    _set_posterior(layer.kernel_initializer, mean, stddev)
    closed_mean = layer._linear(tf.constant(x), tf.constant(mean)).numpy()[0]
    closed_var = layer._linear(tf.constant(x**2), tf.constant(stddev**2)).numpy()[0]
    if estimator == "LocalReparameterization":  # independent per example: one big batch
        draws = layer(np.repeat(x, 3000, axis=0)).numpy()
    else:
        draws = graph_draws(lambda: layer(x)[0], 3000)
    _check_moments(draws, closed_mean, closed_var)


def test_conv_flipout_signs_per_example_and_channel():
    layer = conv_lib.Conv2DFlipout(3, 1, use_bias=False)
    layer.build((None, 4, 4, 2))
    _set_posterior(
        layer.kernel_initializer,
        np.zeros((1, 1, 2, 3), "float32"),
        np.full((1, 1, 2, 3), 0.5, "float32"),
    )
    x = np.zeros((256, 4, 4, 2), "float32")
    x[..., 0] = 1.0  # one input channel on: output = s * dW[0, j] * r, |.| fixed per j
    out = layer(x).numpy()
    np.testing.assert_allclose(
        np.abs(out), np.broadcast_to(np.abs(out[:1, :1, :1]), out.shape), rtol=1e-6
    )
    signs = np.sign(out / out[:1, :1, :1])
    assert np.all(signs == signs[:, :1, :1])  # shared over positions
    assert set(np.unique(signs)) == {-1.0, 1.0}


def test_conv_layers_in_a_model_fit_save_and_gin(tmp_path):
    x = RNG.rand(64, 8, 8, 1).astype("float32")
    y = (x.mean((1, 2, 3)) > 0.5).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            blayers.layers.Conv2DFlipout(4, 3, padding="same", activation="relu"),
            blayers.layers.Conv2DReparameterization(4, 3, strides=2),
            blayers.layers.Conv2DTransposeLocalReparameterization(2, 3, strides=2, padding="same"),
            keras.layers.GlobalAveragePooling2D(),
            blayers.layers.DenseFlipout(2),
        ]
    )
    model.compile(
        keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(x, y, epochs=2, verbose=0)
    assert len(model.losses) == 4
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    for a, b in zip(model.trainable_weights, loaded.trainable_weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    gin.parse_config("Conv2DFlipout.filters = 5\nConv2DFlipout.kernel_size = 3")
    assert blayers.layers.Conv2DFlipout().filters == 5
    with pytest.raises(ValueError, match="channels_last"):
        blayers.layers.Conv2DFlipout(2, 3, data_format="channels_first")


# -- recurrent ---------------------------------------------------------------------------------

CELLS = [
    rnn_lib.LSTMCellReparameterization,
    rnn_lib.LSTMCellFlipout,
    rnn_lib.GRUCellReparameterization,
    rnn_lib.GRUCellFlipout,
]


def test_lstm_reuses_one_weight_draw_across_the_sequence():
    cell = rnn_lib.LSTMCellReparameterization(4, bias_initializer="trainable_normal")
    rnn = keras.layers.RNN(cell, return_sequences=True)
    x = RNG.randn(3, 7, 2).astype("float32")
    outputs = rnn(x).numpy()
    kernel, recurrent = cell.kernel.numpy(), cell.recurrent_kernel.numpy()
    bias = cell.bias.numpy()
    h, c = np.zeros((3, 4)), np.zeros((3, 4))

    def sigmoid(v):
        return 1 / (1 + np.exp(-v))

    for t in range(7):  # a deterministic LSTM with the one drawn weight set
        z = x[:, t] @ kernel + h @ recurrent + bias
        i, f, g, o = np.split(z, 4, axis=-1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        np.testing.assert_allclose(outputs[:, t], h, rtol=1e-4, atol=1e-5)
    assert cell._num_draws == 1


@pytest.mark.parametrize("cls", [rnn_lib.GRUCellFlipout, rnn_lib.GRUCellReparameterization])
def test_gru_noise_and_signs_are_fixed_per_sequence(cls):
    """Zero recurrent kernel and a constant input: if the kernel noise (and Flipout signs) are
    drawn once per sequence the gates are constant, so h_t = z h_{t-1} + (1 - z) h~ with fixed
    z, h~: then h_3 = (h_2 / h_1 - 1) h_2 + h_1 exactly."""
    cell = cls(5, recurrent_initializer="zeros")
    cell.build((None, 3))
    _set_posterior(
        cell.kernel_initializer, np.zeros((3, 15), "float32"), np.ones((3, 15), "float32")
    )
    x = np.tile(RNG.randn(64, 1, 3).astype("float32"), (1, 3, 1))
    h = keras.layers.RNN(cell, return_sequences=True)(x).numpy().astype(np.float64)
    h1, h2, h3 = h[:, 0], h[:, 1], h[:, 2]
    np.testing.assert_allclose(h3, (h2 / h1 - 1) * h2 + h1, rtol=1e-3, atol=1e-5)
    second = keras.layers.RNN(cell, return_sequences=True)(x).numpy()
    assert not np.allclose(second, h)  # a new sequence, a new draw


@pytest.mark.parametrize("cls", CELLS)
def test_hand_written_loop_as_in_figure_1(cls):
    features = RNG.randn(4, 6, 3).astype("float32")
    cell = cls(8)
    cell.build((None, 3))
    with tf.GradientTape() as tape:
        state = cell.get_initial_state(features)
        nll = 0.0
        for t in range(features.shape[1]):
            net, state = cell(features[:, t], state)
            nll += tf.reduce_sum(tf.square(net))
        kl = sum(cell.losses)
        loss = nll + kl
    assert len(cell.losses) == 2 and float(kl) > 0  # kernel and recurrent kernel
    grads = tape.gradient(loss, cell.trainable_variables)
    assert all(g is not None for g in grads)


# The fast suite fits and round-trips an LSTM and a GRU cell, one of each estimator; the other
# two combinations share their code (`_CellBase`, the estimators' mixins) and run in the slow
# suite.
FAST_CELLS = [rnn_lib.LSTMCellFlipout, rnn_lib.GRUCellReparameterization]


def _fast_or_slow(classes):
    return [c if c in FAST_CELLS else pytest.param(c, marks=pytest.mark.slow) for c in classes]


@pytest.mark.parametrize("cls", _fast_or_slow(CELLS), ids=lambda c: c.__name__)
def test_cells_fit_and_round_trip(cls, tmp_path):
    x = RNG.randn(64, 5, 2).astype("float32")
    y = x.sum((1, 2))[:, None].astype("float32")
    model = keras.Sequential(
        [keras.Input((5, 2)), keras.layers.RNN(cls(8)), blayers.layers.DenseReparameterization(1)]
    )
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    assert len(model.losses) == 3
    model.save(tmp_path / "rnn.keras")
    loaded = keras.models.load_model(tmp_path / "rnn.keras")
    for a, b in zip(model.trainable_weights, loaded.trainable_weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# -- attention and embeddings -------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls",
    [blayers.layers.MultiHeadAttentionReparameterization, blayers.layers.MultiHeadAttentionFlipout],
)
def test_attention_at_posterior_mean_equals_keras_attention(cls):
    q = RNG.randn(2, 5, 6).astype("float32")
    v = RNG.randn(2, 4, 6).astype("float32")
    mask = RNG.rand(2, 5, 4) > 0.3
    mask[1, 2] = False  # a query that may attend to no key: zero scores, as Keras
    mask[0, 0] = True
    layer = cls(num_heads=2, key_dim=3, bias_initializer="random_normal")
    layer(q, v)
    reference = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
    reference(q, v)
    for ours, theirs in (
        ("query", reference._query_dense),
        ("key", reference._key_dense),
        ("value", reference._value_dense),
        ("output", reference._output_dense),
    ):
        kernel_mean = getattr(layer, f"{ours}_kernel_initializer").mean.numpy()
        theirs.kernel.assign(kernel_mean.reshape(theirs.kernel.shape))
        bias = getattr(layer, f"{ours}_bias").numpy()
        theirs.bias.assign(bias.reshape(theirs.bias.shape))
    with blayers.posterior_mean():
        ours_out, ours_scores = layer(q, v, attention_mask=mask, return_attention_scores=True)
    theirs_out, theirs_scores = reference(q, v, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(ours_scores.numpy(), theirs_scores.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours_out.numpy(), theirs_out.numpy(), rtol=1e-4, atol=1e-5)
    out = layer(q, v, use_causal_mask=True)
    assert out.shape == (2, 5, 6) and len(layer.losses) == 4


@pytest.mark.parametrize(
    "cls",
    [blayers.layers.MultiHeadAttentionReparameterization, blayers.layers.MultiHeadAttentionFlipout],
)
def test_attention_round_trip_and_gin(cls, tmp_path):
    inputs = keras.Input((5, 6))
    model = keras.Model(inputs, cls(num_heads=2, key_dim=3)(inputs, inputs))
    x = RNG.randn(2, 5, 6).astype("float32")
    model(x)
    model.save(tmp_path / "attention.keras")
    loaded = keras.models.load_model(tmp_path / "attention.keras")
    assert len(loaded.trainable_weights) == len(model.trainable_weights) == 12
    for a, b in zip(model.trainable_weights, loaded.trainable_weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    gin.parse_config(f"{cls.__name__}.num_heads = 3\n{cls.__name__}.key_dim = 2")
    assert cls().num_heads == 3


def test_attention_flipout_query_moments():
    layer = blayers.layers.MultiHeadAttentionFlipout(num_heads=1, key_dim=2, use_bias=False)
    q = RNG.randn(1, 1, 3).astype("float32")
    layer(q, q)
    mean = (0.5 * RNG.randn(3, 2)).astype("float32")
    stddev = RNG.uniform(0.1, 0.5, (3, 2)).astype("float32")
    _set_posterior(layer.query_kernel_initializer, mean, stddev)

    def query_projection():
        layer.call_weights()
        return layer.project("query", tf.constant(q))[0, 0]

    draws = graph_draws(query_projection, 3000)
    _check_moments(draws, q[0, 0] @ mean, q[0, 0] ** 2 @ stddev**2)


def test_embedding_rows_have_posterior_moments(tmp_path):
    layer = blayers.layers.EmbeddingReparameterization(5, 3, mask_zero=True)
    ids = np.array([[0, 3, 3, 1]])
    layer(ids)
    mean = RNG.randn(5, 3).astype("float32")
    stddev = RNG.uniform(0.1, 0.5, (5, 3)).astype("float32")
    _set_posterior(layer.embeddings_initializer, mean, stddev)
    draws = graph_draws(lambda: layer(ids)[0], 3000)
    _check_moments(draws, mean[ids[0]], stddev[ids[0]] ** 2)
    np.testing.assert_array_equal(draws[:, 1], draws[:, 2])  # one table per call
    assert layer.compute_mask(ids).numpy().tolist() == [[False, True, True, True]]
    model = keras.Sequential([keras.Input((4,), dtype="int32"), layer])
    model.save(tmp_path / "e.keras")
    loaded = keras.models.load_model(tmp_path / "e.keras")
    np.testing.assert_array_equal(loaded.layers[0].embeddings_initializer.mean.numpy(), mean)


# -- contracts and defects ---------------------------------------------------------------------


def test_paper_figure_1_order_initial_state_before_any_call():
    """`lstm = LSTMCellReparameterization(512); state = lstm.get_initial_state(features)`."""
    features = tf.random.normal([3, 5, 7])
    lstm = blayers.layers.LSTMCellReparameterization(16)
    state = lstm.get_initial_state(features)
    for t in range(features.shape[1]):
        net, state = lstm(features[:, t], state)
    assert net.shape == (3, 16) and len(lstm.losses) == 2  # kernel and recurrent kernel KL
    assert lstm.kernel.shape == (7, 64)


def test_flipout_cell_keeps_one_weight_per_sequence():
    """Flipout in a cell (the shared estimator): the same signs at every step of a sequence, so
    an example's effective weight does not change within it."""
    cell = blayers.layers.LSTMCellFlipout(4, seed=1)
    x = tf.random.normal([6, 3])
    state = cell.get_initial_state(tf.zeros([6, 1, 3]))
    first, _ = cell(x, state)
    again, _ = cell(x, state)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    state = cell.get_initial_state(tf.zeros([6, 1, 3]))  # a new sequence: a new draw
    assert not np.allclose(cell(x, state)[0].numpy(), first.numpy())


# The paper's Figure 1, typed as printed (TF2: the loss under a GradientTape opened after
# `get_initial_state`), for every Bayesian cell.
FIGURE_1_CELLS = CELLS + [blayers.layers.LSTMCellRank1]


def _figure_1(lstm, output_layer, features, labels, state_inside_tape, variables=None):
    state = None if state_inside_tape else lstm.get_initial_state(features)
    with tf.GradientTape() as tape:
        if state_inside_tape:
            state = lstm.get_initial_state(features)
        nll = 0.0
        for t in range(features.shape[1]):
            net, state = lstm(features[:, t], state)
            logits = output_layer(net)
            nll += tf.reduce_mean(
                keras.losses.categorical_crossentropy(labels[:, t], logits, from_logits=True)
            )
        kl = sum(lstm.losses)
        loss = nll + kl
    return loss, tape.gradient(loss, variables or lstm.trainable_variables), nll


@pytest.mark.parametrize("cls", FIGURE_1_CELLS)
def test_figure_1_gradients_reach_every_cell_weight(cls):
    """State drawn before the tape: every variational parameter gets the gradient of the same
    draw taken inside the tape, at the first step and after an optimizer step."""
    features = tf.constant(RNG.randn(4, 5, 3), tf.float32)
    labels = tf.one_hot(RNG.randint(0, 2, (4, 5)), 2)
    lstm = cls(8, seed=3)
    output_layer = keras.layers.Dense(2)
    optimizer = keras.optimizers.Adam(0.01)
    for _ in range(2):
        seeds = [v for v in lstm.variables if "seed" in v.path]
        snapshot = [v.numpy() for v in seeds]
        loss, grads, _ = _figure_1(lstm, output_layer, features, labels, False)
        for variable, value in zip(seeds, snapshot):
            variable.assign(value)
        loss_in, grads_in, _ = _figure_1(lstm, output_layer, features, labels, True)
        names = [v.path for v in lstm.trainable_variables]
        assert any("stddev" in n for n in names) or cls is blayers.layers.LSTMCellRank1
        assert [n for n, g in zip(names, grads) if g is None] == []
        assert float(loss) == float(loss_in)
        for name, g, g_in in zip(names, grads, grads_in):
            np.testing.assert_allclose(g.numpy(), g_in.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
            assert np.any(g.numpy() != 0), name
        optimizer.apply_gradients(zip(grads, lstm.trainable_variables))


@pytest.mark.parametrize("cls", [rnn_lib.LSTMCellFlipout, blayers.layers.LSTMCellRank1])
def test_figure_1_in_a_tf_function_with_the_tape_after_the_state(cls, autograph_conversions):
    """Figure 1 traced: gradients reach every weight, and autograph converts none of blayers'
    code on the way (`get_initial_state` builds and draws: seconds of conversion a trace)."""
    features = tf.constant(RNG.randn(4, 5, 3), tf.float32)
    lstm = cls(8)

    @tf.function
    def grads():
        state = lstm.get_initial_state(features)
        with tf.GradientTape() as tape:
            out = 0.0
            for t in range(5):
                net, state = lstm(features[:, t], state)
                out += tf.reduce_sum(net)
            loss = out + sum(lstm.losses)
        return tape.gradient(loss, lstm.trainable_variables)

    grads()  # builds the cell
    assert all(g is not None for g in grads())
    assert autograph_conversions == []


# Every cell's Figure 1 gradients are checked above; training them by hand, an LSTM and a GRU
# cell (one of each estimator) in the fast suite, the other three in the slow one.
@pytest.mark.parametrize("cls", _fast_or_slow(FIGURE_1_CELLS), ids=lambda c: c.__name__)
def test_figure_1_bayesian_lstm_learns(cls):
    """The loop of Figure 1 trained by hand: the cell's own weights move and the loss falls.
    Its steps compiled (thirty eager steps of five cells took 45 s on a slow machine); the
    eager loop's gradients are the test above's."""
    # its own generator: the module's depends on which tests ran before in this process
    features = tf.constant(np.random.RandomState(0).randn(8, 4, 2), tf.float32)
    labels = tf.one_hot(tf.cast(features[..., 0] > 0, tf.int32), 2)
    lstm = cls(8, seed=0)
    output_layer = keras.layers.Dense(2)
    optimizer = keras.optimizers.Adam(0.05)
    output_layer.build((None, 8))
    lstm.get_initial_state(features)  # builds the cell, as in the figure
    before = [v.numpy() for v in lstm.trainable_variables]
    variables = lstm.trainable_variables + output_layer.trainable_variables

    @tf.function
    def step():
        _, grads, nll = _figure_1(lstm, output_layer, features, labels, False, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return nll

    losses = [float(step()) for _ in range(30)]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    for variable, value in zip(lstm.trainable_variables, before):
        assert np.abs(variable.numpy() - value).max() > 1e-3, variable.path


@pytest.mark.parametrize("cls", CELLS + [blayers.layers.LSTMCellRank1])
def test_get_initial_state_with_batch_size_before_build(cls):
    """Keras' contract: `cell.get_initial_state(batch_size=4)` works on an unbuilt cell; the
    weights are drawn at the first step."""
    cell = cls(8)
    reference = (keras.layers.GRUCell if "GRU" in cls.__name__ else keras.layers.LSTMCell)(8)
    ours, theirs = cell.get_initial_state(batch_size=4), reference.get_initial_state(batch_size=4)
    assert [tuple(s.shape) for s in ours] == [tuple(s.shape) for s in theirs]
    assert all(float(tf.reduce_max(tf.abs(s))) == 0.0 for s in ours)
    assert not cell.built
    net, _ = cell(tf.ones([4, 3]), ours)
    assert net.shape == (4, 8) and len(cell.losses) == (4 if "Rank1" in cls.__name__ else 2)


FLOAT64_LAYERS = [
    lambda: blayers.layers.DenseReparameterization(4, dtype="float64"),
    lambda: blayers.layers.DenseFlipout(4, dtype="float64"),
    lambda: blayers.layers.DenseLocalReparameterization(4, dtype="float64"),
    lambda: blayers.layers.Conv1DFlipout(4, 3, dtype="float64"),
    lambda: blayers.layers.Conv2DReparameterization(4, 3, dtype="float64"),
    lambda: blayers.layers.EmbeddingReparameterization(10, 4, dtype="float64"),
    lambda: keras.layers.RNN(blayers.layers.LSTMCellFlipout(4, dtype="float64"), dtype="float64"),
    lambda: keras.layers.RNN(
        blayers.layers.GRUCellReparameterization(4, dtype="float64"), dtype="float64"
    ),
    lambda: blayers.layers.SparseGaussianProcess(2, num_inducing=3, dtype="float64"),
    lambda: blayers.layers.Normal(3, dtype="float64"),
]
FLOAT64_INPUTS = [(2, 5), (2, 5), (2, 5), (2, 6, 3), (2, 6, 6, 3), None, (2, 4, 3), (2, 4, 3)]
FLOAT64_INPUTS += [(2, 5), (2, 5)]


@pytest.mark.parametrize("index", range(len(FLOAT64_LAYERS)))
def test_every_family_works_in_float64(index):
    layer = FLOAT64_LAYERS[index]()
    shape = FLOAT64_INPUTS[index]
    x = np.array([[1, 2, 3], [4, 5, 0]]) if shape is None else np.random.randn(*shape)
    out = tf.convert_to_tensor(layer(x))
    assert out.dtype == tf.float64 and np.all(np.isfinite(out.numpy()))
    assert all(
        w.dtype == "float64" for w in layer.weights if w.dtype != "int64" and "seed" not in w.path
    )


def test_weight_paths_survive_save_and_load(tmp_path):
    """Initializer variables live under their layer's path, before and after loading (Keras
    itself drops the enclosing Sequential's name on load, for its own Dense too)."""
    model = keras.Sequential(
        [keras.Input((3,)), blayers.layers.DenseFlipout(4, name="flip"), keras.layers.Dense(2)],
        name="net",
    )
    before = [w.path for w in model.weights]
    assert "net/flip/kernel/mean" in before
    model.save(tmp_path / "m.keras")
    after = [w.path for w in keras.models.load_model(tmp_path / "m.keras").weights]
    strip = [p.split("/", 1)[1] for p in before]  # the model-name prefix Keras drops
    assert after == strip
    assert "flip/kernel/mean" in after


def test_keras_mask_flows_through_dense_conv_and_attention():
    ids = np.array([[1, 2, 3, 0, 0], [4, 5, 0, 0, 0]])
    h = blayers.layers.EmbeddingReparameterization(10, 8, mask_zero=True)(ids)
    h = blayers.layers.DenseFlipout(8)(h)
    h = blayers.layers.Conv1DFlipout(8, 3, padding="same")(h)
    attention = blayers.layers.MultiHeadAttentionFlipout(2, 4, kernel_initializer="glorot_uniform")
    out = attention(h, h)
    np.testing.assert_array_equal(keras.src.backend.get_keras_mask(out).numpy(), ids != 0)
    # Masked keys take no part: changing the padded positions' features changes no valid output.
    padded = tf.constant((ids == 0)[..., None] * 7.0, tf.float32)
    h2 = h + padded
    keras.src.backend.set_keras_mask(h2, tf.constant(ids != 0))
    np.testing.assert_allclose(
        attention(h2, h2).numpy()[ids != 0], out.numpy()[ids != 0], atol=1e-6
    )
    # A strided convolution drops the mask (its positions no longer match).
    strided = blayers.layers.Conv1DFlipout(8, 3, strides=2, padding="same")
    assert keras.src.backend.get_keras_mask(strided(h)) is None


def test_default_prior_reaches_every_family():
    import gin

    gin.parse_config("prior.regularizer = @scale_mixture_kl_divergence()")
    try:
        made = [
            blayers.layers.DenseFlipout(2).kernel_regularizer,
            blayers.layers.Conv2DFlipout(2, 3).kernel_regularizer,
            blayers.layers.LSTMCellFlipout(2).recurrent_kernel_regularizer,
            blayers.layers.EmbeddingReparameterization(5, 2).embeddings_regularizer,
        ]
        attention = blayers.layers.MultiHeadAttentionFlipout(1, 2)
        attention.build((1, 3, 4))
        made.append(attention.output_kernel_regularizer)
    finally:
        gin.clear_config()
    assert all(isinstance(r, blayers.regularizers.ScaleMixtureKLDivergence) for r in made)
    assert isinstance(
        blayers.layers.DenseFlipout(2).kernel_regularizer, blayers.regularizers.NormalKLDivergence
    )


def test_priors_gin_file_changes_the_resnet_config():
    import gin

    from blayers.lab import config

    config.parse(["resnet50_smoke", "priors/scale_mixture"])
    from blayers.lab.models import resnet

    model = resnet((8, 8, 1), 10)
    regs = [
        getattr(layer, "kernel_regularizer", None)
        for layer in model._flatten_layers()
        if isinstance(layer, blayers.layers.BayesianLayer)
    ]
    assert regs and all(isinstance(r, blayers.regularizers.ScaleMixtureKLDivergence) for r in regs)
    gin.clear_config()
