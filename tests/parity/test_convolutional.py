"""edward2's `edward2/tensorflow/layers/convolutional_test.py`, translated (README: the learning
phase is `training=True`; a BatchEnsemble layer's parent call is the convolution written out,
and `ensemble_bias` is blayers' per-member `bias`)."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import layers as ed_layers

_INITS = (("zeros", "zeros"), ("trainable_normal", "zeros"), ("zeros", "trainable_normal"))


def _kernel_cases(layers):
    return [(layer, k, b, k == b == "zeros") for layer in layers for k, b in _INITS]


def _check_twice(model, inputs, shape, all_close, nonnegative=True):
    outputs1 = tf.convert_to_tensor(model(inputs, training=True))
    outputs2 = tf.convert_to_tensor(model(inputs, training=True))
    assert outputs1.shape == shape
    if nonnegative:
        assert np.all(outputs1.numpy() >= 0.0)
    assert np.allclose(outputs1, outputs2, rtol=1e-6, atol=1e-6) == all_close
    model.get_config()


@pytest.mark.parametrize(
    "layer,kernel_initializer,bias_initializer,all_close",
    _kernel_cases(
        [
            ed_layers.Conv2DFlipout,
            ed_layers.Conv2DHierarchical,
            ed_layers.Conv2DReparameterization,
            ed_layers.Conv2DVariationalDropout,
        ]
    ),
)
def test_conv2d_kernel(layer, kernel_initializer, bias_initializer, all_close):
    inputs = np.random.rand(5, 4, 4, 12).astype(np.float32)
    model = layer(
        4,
        kernel_size=2,
        kernel_initializer=kernel_initializer,
        bias_initializer=bias_initializer,
        activation="relu",
    )
    _check_twice(model, inputs, (5, 3, 3, 4), all_close)


@pytest.mark.parametrize(
    "layer",
    [
        ed_layers.Conv2DFlipout,
        ed_layers.Conv2DHierarchical,
        ed_layers.Conv2DReparameterization,
        ed_layers.Conv2DVariationalDropout,
        ed_layers.Conv2DRank1,
    ],
)
def test_conv2d_model(layer):
    inputs = np.random.rand(3, 4, 4, 1).astype(np.float32)
    model = keras.Sequential(
        [
            layer(3, kernel_size=2, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(2, activation=None),
        ]
    )
    outputs = model(inputs, training=True)
    assert outputs.shape == (3, 2)
    expected = {ed_layers.Conv2DHierarchical: 3, ed_layers.Conv2DRank1: 2}.get(layer, 1)
    assert len(model.losses) == expected


@pytest.mark.parametrize(
    "layer,kernel_initializer,bias_initializer,all_close",
    _kernel_cases([ed_layers.Conv1DFlipout, ed_layers.Conv1DReparameterization]),
)
def test_conv1d_kernel(layer, kernel_initializer, bias_initializer, all_close):
    inputs = np.random.rand(5, 4, 12).astype(np.float32)
    model = layer(
        4,
        kernel_size=2,
        kernel_initializer=kernel_initializer,
        bias_initializer=bias_initializer,
        activation="relu",
    )
    _check_twice(model, inputs, (5, 3, 4), all_close)


@pytest.mark.parametrize(
    "layer", [ed_layers.Conv1DFlipout, ed_layers.Conv1DReparameterization, ed_layers.Conv1DRank1]
)
def test_conv1d_model(layer):
    inputs = np.random.rand(3, 4, 1).astype(np.float32)
    model = keras.Sequential(
        [
            layer(3, kernel_size=2, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(2, activation=None),
        ]
    )
    outputs = model(inputs, training=True)
    assert outputs.shape == (3, 2)
    assert len(model.losses) == (2 if layer == ed_layers.Conv1DRank1 else 1)


def _value(weight):
    return tf.convert_to_tensor(weight)


def _loop(layer, inputs, ensemble_size, op):
    """edward2's loop over members: the parent's call on `inputs * alpha_m`, times `gamma_m`,
    plus the member's bias."""
    alpha, gamma, bias = _value(layer.alpha), _value(layer.gamma), _value(layer.bias)
    return tf.concat(
        [op(inputs * alpha[i]) * gamma[i] + bias[i] for i in range(ensemble_size)], axis=0
    )


def test_depthwise_conv2d_batch_ensemble():
    ensemble_size, examples_per_model, channels = 2, 3, 5
    inputs = tf.random.normal([examples_per_model, 4, 4, channels])
    layer = ed_layers.DepthwiseConv2DBatchEnsemble(
        kernel_size=2, ensemble_size=ensemble_size, activation=None
    )
    batch_outputs = layer(tf.tile(inputs, [ensemble_size, 1, 1, 1]))

    def depthwise(x):
        return tf.nn.depthwise_conv2d(x, layer.depthwise_kernel, [1, 1, 1, 1], "VALID")

    loop_outputs = _loop(layer, inputs, ensemble_size, depthwise)
    assert batch_outputs.shape == (ensemble_size * examples_per_model, 3, 3, channels)
    np.testing.assert_allclose(batch_outputs, loop_outputs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", [1, 2])
def test_conv_batch_ensemble(rank):
    """testConv1DBatchEnsemble and testConv2DBatchEnsemble."""
    ensemble_size, examples_per_model, channels = 2, 3, 5
    spatial = (4, 4)[:rank]
    inputs = tf.random.normal([examples_per_model, *spatial, channels])
    cls = ed_layers.Conv2DBatchEnsemble if rank == 2 else ed_layers.Conv1DBatchEnsemble
    layer = cls(filters=channels, kernel_size=2, ensemble_size=ensemble_size, activation=None)
    batch_outputs = layer(tf.tile(inputs, [ensemble_size] + [1] * (rank + 1)))

    def conv(x):
        return tf.nn.convolution(x, layer.kernel, padding="VALID")

    loop_outputs = _loop(layer, inputs, ensemble_size, conv)
    assert batch_outputs.shape == (ensemble_size * examples_per_model, *(3,) * rank, channels)
    np.testing.assert_allclose(batch_outputs, loop_outputs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize(
    "alpha_initializer,gamma_initializer",
    [("he_normal", "he_normal"), ("trainable_deterministic", "trainable_deterministic")],
)
def test_conv_rank1_batch_ensemble(rank, alpha_initializer, gamma_initializer):
    """testConv1DRank1BatchEnsemble and testConv2DRank1BatchEnsemble."""
    ensemble_size, examples_per_model, input_dim, output_dim = 3, 4, 5, 5
    spatial = (4, 4)[:rank]
    inputs = tf.random.normal([examples_per_model, *spatial, input_dim])
    cls = ed_layers.Conv2DRank1 if rank == 2 else ed_layers.Conv1DRank1
    layer = cls(
        output_dim,
        kernel_size=2,
        padding="same",
        alpha_initializer=alpha_initializer,
        gamma_initializer=gamma_initializer,
        alpha_regularizer=None,
        gamma_regularizer=None,
        activation=None,
        ensemble_size=ensemble_size,
    )
    output = layer(tf.tile(inputs, [ensemble_size] + [1] * (rank + 1)), training=True)

    def conv(x):
        return tf.nn.convolution(x, _value(layer.kernel), padding="SAME")

    manual_output = _loop(layer, inputs, ensemble_size, conv)
    assert output.shape == (ensemble_size * examples_per_model, *spatial, output_dim)
    np.testing.assert_allclose(output, manual_output, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "use_bias,regularize_fast_weights,fast_weights_eq_constraint",
    list(itertools.product([True, False], [True, False], [True, False])),
)
def test_conv2d_hyper_batch_ensemble(use_bias, regularize_fast_weights, fast_weights_eq_constraint):
    lambda_key_to_index = {"self_conv2d_l2_kernel": 0, "self_conv2d_l2_bias": 1}
    tf.random.set_seed(1)
    n, ens_size, in_channels, filters = 8, 3, 3, 6
    x_dim = (4, 5, in_channels)
    e = tf.random.normal((n * ens_size, filters * 2))
    lambdas = tf.random.uniform((n * ens_size, 2))
    x = tf.random.normal((n,) + x_dim)
    layer = ed_layers.Conv2DHyperBatchEnsemble(
        lambda_key_to_index,
        filters=filters,
        ensemble_size=ens_size,
        kernel_size=3,
        strides=1,
        use_bias=use_bias,
        padding="same",
        name="self_conv2d",
        bias_initializer="glorot_uniform",
        alpha_initializer="glorot_uniform",
        gamma_initializer="glorot_uniform",
        regularize_fast_weights=regularize_fast_weights,
        fast_weights_eq_contraint=fast_weights_eq_constraint,
    )
    outputs = layer([tf.tile(x, [ens_size, 1, 1, 1]), lambdas, e])
    kernel, delta_kernel = _value(layer.conv2d.kernel), _value(layer.delta_conv2d.kernel)

    def fast(k):
        r_k = tf.reshape(_value(layer.conv2d.alpha)[k, :], (1, 1, in_channels, 1))
        s_k = tf.reshape(_value(layer.conv2d.gamma)[k, :], (1, 1, 1, filters))
        u_k = tf.reshape(_value(layer.delta_conv2d.alpha)[k, :], (1, 1, in_channels, 1))
        v_k = tf.reshape(_value(layer.delta_conv2d.gamma)[k, :], (1, 1, 1, filters))
        return r_k, s_k, u_k, v_k

    expected_outputs = []
    for k, ek in zip(range(ens_size), tf.split(e, ens_size)):
        r_k, s_k, u_k, v_k = fast(k)
        if fast_weights_eq_constraint:
            np.testing.assert_allclose(r_k, u_k)
            np.testing.assert_allclose(s_k, v_k)
        for i in range(n):
            x_i = tf.reshape(x[i, ::], (1,) + x_dim)
            e1_i = tf.reshape(ek[i, :filters], (1, 1, 1, filters))
            e2_i = tf.reshape(ek[i, filters:], (filters,))
            kernel_i = kernel * r_k * s_k + delta_kernel * u_k * v_k * e1_i
            out_i = tf.nn.conv2d(x_i, kernel_i, strides=1, padding="SAME")
            if use_bias:
                bias_i = _value(layer.conv2d.ensemble_bias)[k, :] + _value(layer.bias)[k, :] * e2_i
                out_i = tf.nn.bias_add(out_i, bias_i)
            expected_outputs.append(out_i)
    np.testing.assert_allclose(outputs, tf.concat(expected_outputs, 0), rtol=1e-4, atol=1e-4)

    mean_l2_regularizer = 0.0
    for k, ek, lambdask in zip(range(ens_size), tf.split(e, ens_size), tf.split(lambdas, ens_size)):
        r_k, s_k, u_k, v_k = fast(k)
        for i in range(n):
            l2_kernel, l2_bias = lambdask[i, 0], lambdask[i, 1]
            e1_i = tf.reshape(ek[i, :filters], (1, 1, 1, filters))
            e2_i = tf.reshape(ek[i, filters:], (filters,))
            if regularize_fast_weights:
                kernel_i = kernel * r_k * s_k + delta_kernel * u_k * v_k * e1_i
            else:
                kernel_i = kernel + delta_kernel * e1_i
            mean_l2_regularizer += l2_kernel * tf.reduce_sum(tf.square(kernel_i))
            if use_bias:
                bias_i = _value(layer.conv2d.ensemble_bias)[k, :] + _value(layer.bias)[k, :] * e2_i
                mean_l2_regularizer += l2_bias * tf.reduce_sum(tf.square(bias_i))
    mean_l2_regularizer *= 1.0 / (n * ens_size)
    np.testing.assert_allclose(float(mean_l2_regularizer), float(layer.losses[0]), rtol=1e-4)


_ALPHA_GAMMA = [
    ("he_normal", "he_normal", True, False, 1),
    ("he_normal", "he_normal", True, True, 1),
    ("he_normal", "he_normal", True, False, 4),
    ("he_normal", "he_normal", True, True, 4),
    ("zeros", "zeros", True, False, 1),
    ("trainable_normal", "zeros", True, False, 1),
    ("trainable_normal", "zeros", True, True, 4),
    ("zeros", "trainable_normal", True, True, 1),
    ("zeros", "trainable_normal", True, False, 4),
    ("trainable_normal", "trainable_normal", False, False, 1),
    ("trainable_normal", "trainable_normal", False, True, 1),
    ("trainable_normal", "trainable_normal", False, False, 4),
    ("trainable_normal", "trainable_normal", False, True, 4),
]


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize(
    "alpha_initializer,gamma_initializer,all_close,use_additive_perturbation,ensemble_size",
    _ALPHA_GAMMA,
)
def test_conv_rank1_alpha_gamma(
    rank, alpha_initializer, gamma_initializer, all_close, use_additive_perturbation, ensemble_size
):
    """testConv1DRank1AlphaGamma and testConv2DRank1AlphaGamma (edward2 builds the layer
    with its default ensemble size and additive flag, whatever the parameters say)."""
    spatial = (4, 4)[:rank]
    inputs = np.random.rand(5 * ensemble_size, *spatial, 12).astype(np.float32)
    cls = ed_layers.Conv2DRank1 if rank == 2 else ed_layers.Conv1DRank1
    model = cls(
        4,
        kernel_size=2,
        alpha_initializer=alpha_initializer,
        gamma_initializer=gamma_initializer,
        activation=None,
    )
    _check_twice(model, inputs, (5 * ensemble_size, *(3,) * rank, 4), all_close, nonnegative=False)
