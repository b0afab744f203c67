"""`bayesianize`: every convertible layer becomes its twin, MOPED starts the posterior at the
trained weights (so a near-zero delta reproduces the trained network), other layers keep their
weights, and the converted model trains, saves and loads."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import epochs_of

import blayers
from blayers import bayesianize
from blayers.layers import (
    Conv2DFlipout,
    DenseFlipout,
    DenseLocalReparameterization,
    DenseReparameterization,
    EmbeddingReparameterization,
    GRUCellFlipout,
    LSTMCellFlipout,
    MultiHeadAttentionFlipout,
)


def _mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dropout(0.1),
            keras.layers.Dense(3, name="logits"),
        ]
    )


def _kernel_posterior(layer, name="kernel"):
    init = getattr(layer, f"{name}_initializer")
    params = init.parameters()
    return np.asarray(params["mean"]), np.asarray(params["stddev"])


def test_sequential_mlp_with_moped_keeps_the_trained_function():
    model = _mlp()
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    converted = bayesianize(model, moped_delta=0.1)
    hidden, logits = converted.get_layer("hidden"), converted.get_layer("logits")
    assert isinstance(hidden, DenseFlipout) and isinstance(logits, DenseFlipout)
    assert isinstance(converted.layers[1], keras.layers.Dropout)
    kernel = np.asarray(model.get_layer("hidden").kernel)
    mean, stddev = _kernel_posterior(hidden)
    np.testing.assert_allclose(mean, kernel, rtol=1e-6)
    np.testing.assert_allclose(stddev, np.maximum(0.1 * np.abs(kernel), 1e-8), rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(
        np.asarray(hidden.bias), np.asarray(model.get_layer("hidden").bias)
    )
    # One KL term per Bayesian kernel; the original model is untouched.
    converted(x)
    assert len(converted.losses) == 2 and all(float(v) > 0 for v in converted.losses)
    assert type(model.get_layer("hidden")) is keras.layers.Dense
    # A tiny delta reproduces the trained network.
    tiny = bayesianize(model, moped_delta=1e-6, estimator="reparameterization")
    assert isinstance(tiny.get_layer("logits"), DenseReparameterization)
    np.testing.assert_allclose(
        np.asarray(tiny(x, training=False)), np.asarray(model(x, training=False)), atol=1e-4
    )
    # The stddev makes draws differ, by about delta times the weights' effect.
    draws = np.stack([np.asarray(converted(x)) for _ in range(20)])
    assert draws.std(0).mean() > 1e-3


def test_functional_cnn_copies_batch_norm_and_converts_convolutions():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(2, name="head")(h)
    model = keras.Model(inputs, outputs)
    bn = model.get_layer("bn")
    bn.moving_mean.assign(np.arange(4, dtype="float32"))
    bn.gamma.assign(np.full(4, 2.0, "float32"))
    x = np.random.default_rng(1).normal(size=(5, 8, 8, 1)).astype("float32")
    converted = bayesianize(model, moped_delta=1e-6)
    assert isinstance(converted.get_layer("conv"), Conv2DFlipout)
    np.testing.assert_array_equal(np.asarray(converted.get_layer("bn").moving_mean), np.arange(4))
    np.testing.assert_array_equal(np.asarray(converted.get_layer("bn").gamma), np.full(4, 2.0))
    np.testing.assert_allclose(
        np.asarray(converted(x, training=False)), np.asarray(model(x, training=False)), atol=1e-4
    )


def test_recurrent_embedding_and_attention_twins_compute_what_keras_computes():
    keras.utils.set_random_seed(2)
    ids = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(20, 8, name="embed")(ids)
    h = keras.layers.MultiHeadAttention(2, 4, name="attention")(h, h)
    h = keras.layers.LSTM(5, return_sequences=True, name="lstm")(h)
    h = keras.layers.GRU(3, name="gru")(h)
    model = keras.Model(ids, keras.layers.Dense(2, name="head")(h))
    x = np.random.default_rng(2).integers(0, 20, size=(4, 6)).astype("int32")
    converted = bayesianize(model, moped_delta=1e-6)
    assert isinstance(converted.get_layer("embed"), EmbeddingReparameterization)
    assert isinstance(converted.get_layer("attention"), MultiHeadAttentionFlipout)
    assert isinstance(converted.get_layer("lstm").cell, LSTMCellFlipout)
    assert isinstance(converted.get_layer("gru").cell, GRUCellFlipout)
    # Gate order, the GRU's reset-after biases and the attention's head layout all match.
    np.testing.assert_allclose(
        np.asarray(converted(x, training=False)), np.asarray(model(x, training=False)), atol=1e-4
    )
    converted(x)
    # embeddings, 4 attention kernels, 2 + 2 recurrent kernels, head
    assert len(converted.losses) == 10


def test_include_exclude_estimators_and_clear_errors():
    model = _mlp()
    only_head = bayesianize(model, include="logits")
    assert type(only_head.get_layer("hidden")) is keras.layers.Dense
    np.testing.assert_array_equal(
        np.asarray(only_head.get_layer("hidden").kernel),
        np.asarray(model.get_layer("hidden").kernel),
    )
    assert isinstance(only_head.get_layer("logits"), DenseFlipout)
    no_head = bayesianize(model, exclude=["logits"], estimator="local_reparameterization")
    assert isinstance(no_head.get_layer("hidden"), DenseLocalReparameterization)
    assert type(no_head.get_layer("logits")) is keras.layers.Dense
    by_class = bayesianize(model, exclude=keras.layers.Dense)
    assert all(type(layer) is not DenseFlipout for layer in by_class.layers)
    with pytest.raises(ValueError, match="no layer named 'logit'"):
        bayesianize(model, include="logit")
    with pytest.raises(ValueError, match="estimator 'mc'"):
        bayesianize(model, estimator="mc")
    rnn = keras.Sequential([keras.Input((3, 2)), keras.layers.LSTM(4, name="lstm")])
    with pytest.raises(ValueError, match="LSTM 'lstm' has no 'local_reparameterization' twin"):
        bayesianize(rnn, estimator="local_reparameterization")
    with pytest.raises(ValueError, match="moped_delta needs a Normal posterior"):
        bayesianize(model, posterior="trainable_log_normal", moped_delta=0.1)

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.body = keras.layers.Dense(4, name="body")

        def call(self, x):
            return self.body(x)

    subclassed = Subclassed()
    subclassed(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="subclassed model.*'body'"):
        bayesianize(subclassed)


def test_a_converted_model_learns_and_round_trips_through_a_keras_file(tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    model.fit(epochs_of(x[:1400], y[:1400], 15, batch_size=64), verbose=0)
    _, map_accuracy = model.evaluate(x[1400:], y[1400:], verbose=0)
    converted = bayesianize(model, moped_delta=0.05, prior="normal_kl_divergence")
    assert blayers.set_kl_scale(converted, 1400) == 2

    converted.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    head = converted.layers[-1]
    rho = head.kernel_initializer.stddev
    before = np.array(rho)
    converted.fit(x[:1400], y[:1400], epochs=3, batch_size=64, verbose=0)
    assert not np.allclose(before, np.array(rho))  # the gradient reaches the stddevs
    _, accuracy = converted.evaluate(x[1400:], y[1400:], verbose=0)
    # Starting at the trained solution, the variational fit keeps its accuracy (397 examples:
    # 0.03 is about 2 standard errors).
    assert map_accuracy > 0.8 and accuracy > map_accuracy - 0.03
    path = tmp_path / "converted.keras"
    converted.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(
        np.array(loaded.layers[-1].kernel_initializer.stddev), np.array(rho)
    )
    mean_out = tf.reduce_mean([loaded(x[1400:1450]) for _ in range(10)], 0)
    with blayers.posterior_mean():
        np.testing.assert_allclose(
            np.asarray(loaded(x[1400:1450])), np.asarray(converted(x[1400:1450])), atol=1e-5
        )
    assert np.mean(np.argmax(mean_out, -1) == y[1400:1450]) > 0.8
