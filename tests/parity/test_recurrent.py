"""edward2's `edward2/tensorflow/layers/recurrent_test.py`, translated. edward2's cells draw new
weights at `call_weights()` / `_sample_weights(inputs)`; blayers' draw once per sequence, a new
draw starting with `begin_sequence()` (also called by `get_initial_state`), so the
translation calls `begin_sequence()` where edward2 asks for a new draw (README)."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import layers as ed_layers

_LSTM_CASES = [
    (ed_layers.LSTMCellFlipout, "zeros", "orthogonal", "zeros", 1, True),
    (ed_layers.LSTMCellFlipout, "trainable_normal", "orthogonal", "zeros", 1, False),
    (ed_layers.LSTMCellFlipout, "zeros", "orthogonal", "trainable_normal", 1, False),
    (ed_layers.LSTMCellFlipout, "zeros", "orthogonal", "zeros", 2, True),
    (ed_layers.LSTMCellFlipout, "trainable_normal", "orthogonal", "zeros", 2, False),
    (ed_layers.LSTMCellFlipout, "zeros", "orthogonal", "trainable_normal", 2, False),
    (ed_layers.LSTMCellReparameterization, "zeros", "orthogonal", "zeros", 1, True),
    (ed_layers.LSTMCellReparameterization, "trainable_normal", "orthogonal", "zeros", 1, False),
    (ed_layers.LSTMCellReparameterization, "zeros", "trainable_normal", "zeros", 1, False),
    (ed_layers.LSTMCellReparameterization, "zeros", "orthogonal", "trainable_normal", 1, False),
    (ed_layers.LSTMCellReparameterization, "trainable_normal", "orthogonal", "zeros", 2, False),
    (
        ed_layers.LSTMCellReparameterization,
        "trainable_deterministic",
        "trainable_deterministic",
        "trainable_deterministic",
        1,
        True,
    ),
    (
        ed_layers.LSTMCellReparameterization,
        "trainable_deterministic",
        "trainable_deterministic",
        "trainable_deterministic",
        2,
        True,
    ),
]


@pytest.mark.parametrize(
    "lstm_cell,kernel_initializer,recurrent_initializer,bias_initializer,implementation,all_close",
    _LSTM_CASES,
)
def test_lstm_cell(
    lstm_cell,
    kernel_initializer,
    recurrent_initializer,
    bias_initializer,
    implementation,
    all_close,
):
    batch_size, dim, hidden_size = 5, 12, 10
    inputs = np.random.rand(batch_size, dim).astype(np.float32)
    cell = lstm_cell(
        hidden_size,
        kernel_initializer=kernel_initializer,
        recurrent_initializer=recurrent_initializer,
        bias_initializer=bias_initializer,
        implementation=implementation,
    )
    noise = np.random.rand(1, hidden_size).astype(np.float32)
    h0, c0 = cell.get_initial_state(batch_size=batch_size)
    state = (h0 + noise, c0)
    outputs1, _ = cell(inputs, state)
    outputs2, _ = cell(inputs, state)
    cell.begin_sequence(batch_size)  # edward2: cell.call_weights()
    outputs3, _ = cell(inputs, state)
    assert outputs1.shape == (batch_size, hidden_size)
    np.testing.assert_allclose(outputs1, outputs2, rtol=1e-6, atol=1e-6)
    assert np.allclose(outputs1, outputs3, rtol=1e-6, atol=1e-6) == all_close
    cell.get_config()


@pytest.mark.parametrize(
    "lstm_cell", [ed_layers.LSTMCellFlipout, ed_layers.LSTMCellReparameterization]
)
def test_lstm_cell_loss(lstm_cell):
    features = np.random.rand(5, 1, 12).astype(np.float32)
    labels = np.random.rand(5, 10).astype(np.float32)
    cell = lstm_cell(10)
    state = (tf.zeros([1, 10]), tf.zeros([1, 10]))
    for epoch in range(2):
        with tf.GradientTape(persistent=True) as tape:
            if epoch == 0:
                predictions, _ = cell(features[:, 0, :], state)  # the first call builds
                cell(features[:, 0, :], state)
            cell.get_initial_state(batch_size=5)
            predictions, _ = cell(features[:, 0, :], state)
            nll = keras.losses.mean_squared_error(labels, predictions)
            kl = sum(cell.losses)
        variables = [
            cell.kernel_initializer.mean,
            cell.kernel_initializer.stddev,
            cell.recurrent_initializer.mean,
            cell.recurrent_initializer.stddev,
        ]
        for v in variables:
            assert any(v is weight for weight in cell.weights)
        for grad in tape.gradient(nll, variables):
            assert grad is not None
        for grad in tape.gradient(kl, variables):
            assert grad is not None


def _model_then_steps(cell, inputs, hidden_size):
    model = keras.Sequential([keras.layers.RNN(cell, return_sequences=True)])
    outputs1 = model(inputs)
    outputs2 = model(inputs)
    state = (tf.zeros([1, hidden_size]), tf.zeros([1, hidden_size]))
    outputs3 = []
    for t in range(inputs.shape[1]):
        out, state = cell(inputs[:, t, :], state)
        outputs3.append(out)
    return model, outputs1, outputs2, tf.stack(outputs3, axis=1)


@pytest.mark.parametrize(
    "lstm_cell", [ed_layers.LSTMCellFlipout, ed_layers.LSTMCellReparameterization]
)
def test_lstm_cell_model(lstm_cell):
    batch_size, timesteps, dim, hidden_size = 5, 3, 12, 10
    inputs = np.random.rand(batch_size, timesteps, dim).astype(np.float32)
    model, outputs1, outputs2, outputs3 = _model_then_steps(lstm_cell(hidden_size), inputs, 10)
    assert outputs1.shape == (batch_size, timesteps, hidden_size)
    assert outputs3.shape == (batch_size, timesteps, hidden_size)
    assert not np.allclose(outputs1, outputs2)  # each sequence draws its weights
    np.testing.assert_allclose(outputs2, outputs3, rtol=1e-5, atol=1e-5)  # the same draw
    assert len(model.losses) == 2


def _rank1_cases():
    inits = [("he_normal",) * 5, ("trainable_deterministic",) * 5]
    return [
        (*init, use_bias, implementation, additive)
        for init in inits
        for use_bias, implementation, additive in itertools.product(
            (True, False), (1, 2), (True, False)
        )
    ]


def _value(weight):
    return tf.convert_to_tensor(weight)


@pytest.mark.parametrize(
    "alpha_initializer,gamma_initializer,recurrent_alpha_initializer,"
    "recurrent_gamma_initializer,bias_initializer,use_bias,implementation,"
    "use_additive_perturbation",
    _rank1_cases(),
)
def test_lstm_cell_rank1_batch_ensemble(
    alpha_initializer,
    gamma_initializer,
    recurrent_alpha_initializer,
    recurrent_gamma_initializer,
    bias_initializer,
    use_bias,
    implementation,
    use_additive_perturbation,
):
    ensemble_size, examples_per_model, input_dim, output_dim = 4, 4, 5, 5
    inputs = tf.random.normal([examples_per_model, input_dim])
    batched_inputs = tf.tile(inputs, [ensemble_size, 1])
    layer = ed_layers.LSTMCellRank1(
        output_dim,
        use_bias=use_bias,
        alpha_initializer=alpha_initializer,
        gamma_initializer=gamma_initializer,
        recurrent_alpha_initializer=recurrent_alpha_initializer,
        recurrent_gamma_initializer=recurrent_gamma_initializer,
        bias_initializer=bias_initializer,
        alpha_regularizer=None,
        gamma_regularizer=None,
        recurrent_alpha_regularizer=None,
        recurrent_gamma_regularizer=None,
        implementation=implementation,
        use_additive_perturbation=use_additive_perturbation,
        ensemble_size=ensemble_size,
    )
    h0 = tf.random.normal([examples_per_model, output_dim])
    c0 = tf.random.normal([examples_per_model, output_dim])
    h0_batched, c0_batched = tf.tile(h0, [ensemble_size, 1]), tf.tile(c0, [ensemble_size, 1])
    outputs, _ = layer(batched_inputs, (h0_batched, c0_batched), training=True)

    def compute_rank1_lstm_cell(i):
        alpha, gamma = _value(layer.alpha)[i], _value(layer.gamma)[i]
        ralpha, rgamma = _value(layer.recurrent_alpha)[i], _value(layer.recurrent_gamma)[i]
        kernel, recurrent = _value(layer.kernel), _value(layer.recurrent_kernel)
        if use_additive_perturbation:
            ifgo = tf.linalg.matmul(inputs + alpha, kernel) + gamma
            ifgo += tf.linalg.matmul(h0 + ralpha, recurrent) + rgamma
        else:
            ifgo = tf.linalg.matmul(inputs * alpha, kernel) * gamma
            ifgo += tf.linalg.matmul(h0 * ralpha, recurrent) * rgamma
        if use_bias:
            ifgo += _value(layer.bias)[i]
        i_, f, g, o = tf.split(ifgo, num_or_size_splits=4, axis=1)
        c = tf.nn.sigmoid(f) * c0 + tf.nn.sigmoid(i_) * tf.nn.tanh(g)
        return tf.nn.sigmoid(o) * tf.nn.tanh(c)

    manual_outputs = tf.concat([compute_rank1_lstm_cell(i) for i in range(ensemble_size)], 0)
    assert outputs.shape == (ensemble_size * examples_per_model, output_dim)
    np.testing.assert_allclose(outputs, manual_outputs, rtol=1e-5, atol=1e-5)
    layer2 = ed_layers.LSTMCellRank1.from_config(layer.get_config())
    layer2(batched_inputs, (h0_batched, c0_batched))  # force initialization
    layer2.set_weights(layer.get_weights())
    outputs2, _ = layer2(batched_inputs, (h0_batched, c0_batched))
    np.testing.assert_allclose(outputs, outputs2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "alpha_initializer,gamma_initializer,recurrent_alpha_initializer,"
    "recurrent_gamma_initializer,implementation,use_additive_perturbation",
    list(
        itertools.product(
            ("he_normal", "trainable_normal"),
            ("he_normal", "trainable_normal"),
            ("he_normal", "trainable_normal"),
            ("he_normal", "trainable_normal"),
            (1, 2),
            (True, False),
        )
    ),
)
def test_lstm_cell_rank1_alpha_gamma(
    alpha_initializer,
    gamma_initializer,
    recurrent_alpha_initializer,
    recurrent_gamma_initializer,
    implementation,
    use_additive_perturbation,
):
    """(edward2 builds the layer without `implementation` and the additive flag, whatever the
    parameters say; so does the translation.)"""
    ensemble_size, output_dim = 4, 4
    batch_size = 5 * ensemble_size
    inputs = np.random.rand(batch_size, 12).astype(np.float32)
    layer = ed_layers.LSTMCellRank1(
        output_dim,
        alpha_initializer=alpha_initializer,
        gamma_initializer=gamma_initializer,
        recurrent_alpha_initializer=recurrent_alpha_initializer,
        recurrent_gamma_initializer=recurrent_gamma_initializer,
        ensemble_size=ensemble_size,
    )
    h0 = tf.random.normal([batch_size, output_dim])
    c0 = tf.random.normal([batch_size, output_dim])
    outputs1, _ = layer(inputs, (h0, c0), training=True)
    layer.begin_sequence(batch_size)  # edward2: layer._sample_weights(inputs)
    outputs2, _ = layer(inputs, (h0, c0), training=True)
    assert outputs1.shape == (batch_size, output_dim)
    all_close = "trainable_normal" not in [
        alpha_initializer,
        gamma_initializer,
        recurrent_alpha_initializer,
        recurrent_gamma_initializer,
    ]
    if all_close:
        np.testing.assert_allclose(outputs1, outputs2, rtol=1e-4)
    else:
        assert not np.allclose(outputs1, outputs2)


@pytest.mark.parametrize(
    "ensemble_size,implementation,use_additive_perturbation,use_bias",
    list(itertools.product((1, 4), (1, 2), (True, False), (True, False))),
)
def test_lstm_cell_rank1_model(ensemble_size, implementation, use_additive_perturbation, use_bias):
    batch_size, timesteps, input_dim, hidden_size = 2 * ensemble_size, 3, 12, 10
    inputs = np.random.rand(batch_size, timesteps, input_dim).astype(np.float32)
    cell = ed_layers.LSTMCellRank1(
        hidden_size,
        use_bias=use_bias,
        implementation=implementation,
        use_additive_perturbation=use_additive_perturbation,
        ensemble_size=ensemble_size,
    )
    model, outputs1, outputs2, outputs3 = _model_then_steps(cell, inputs, hidden_size)
    assert outputs1.shape == (batch_size, timesteps, hidden_size)
    assert outputs3.shape == (batch_size, timesteps, hidden_size)
    assert not np.allclose(outputs1, outputs2)
    np.testing.assert_allclose(outputs2, outputs3, rtol=1e-5, atol=1e-5)
    assert len(model.losses) == 4
