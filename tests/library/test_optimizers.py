"""blayers.optimizers: Keras' Adam and AdamW with each variable's update one fused kernel."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import optimizers
from blayers.layers import DenseFlipout


def _train(optimizer, steps=25, graph=True, sparse=False):
    """A Bayesian dense layer (and an embedding, whose gradient is sparse) trained `steps`
    steps from fixed weights on fixed data: the variables' values."""
    keras.utils.set_random_seed(0)
    layer = DenseFlipout(6, seed=1)
    layer.build((None, 5))
    embedding = keras.layers.Embedding(7, 5)
    embedding.build((None,))
    variables = layer.trainable_variables + (embedding.trainable_variables if sparse else [])
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(32, 5)), tf.float32)
    ids = tf.constant(rng.integers(0, 7, 32))

    def step():
        with tf.GradientTape() as tape:
            inputs = x + embedding(ids) if sparse else x
            loss = tf.reduce_mean(tf.square(layer(inputs) - 1.0)) + 1e-3 * sum(layer.losses)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))

    step = tf.function(step, autograph=False) if graph else step
    for _ in range(steps):
        step()
    return [v.numpy() for v in variables], optimizer


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("Adam", {}),
        ("Adam", {"clipnorm": 0.5, "epsilon": 1e-3}),
        ("AdamW", {"weight_decay": 0.05}),
    ],
)
@pytest.mark.parametrize("graph", [True, False], ids=["traced", "eager"])
def test_the_fused_update_is_keras_update(name, kwargs, graph):
    """25 steps of a schedule's learning rate: the weights and both moments equal Keras' own
    optimizer's to float32 rounding, traced and eager."""
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, 10, 0.5)
    ours, fused = _train(getattr(optimizers, name)(schedule, **kwargs), graph=graph)
    theirs, keras_opt = _train(getattr(keras.optimizers, name)(schedule, **kwargs), graph=graph)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(ours, _train(None, 0)[0]))
    assert moved > 0.1  # the weights moved
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    assert len(fused.variables) == len(keras_opt.variables)
    for a, b in zip(fused.variables, keras_opt.variables):  # same slots, same values
        assert a.shape == b.shape
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-5, atol=2e-6)


def test_amsgrad_and_sparse_gradients_take_keras_update():
    for kwargs, sparse in (({"amsgrad": True}, False), ({}, True)):
        ours, _ = _train(optimizers.Adam(0.05, **kwargs), steps=10, sparse=sparse)
        theirs, _ = _train(keras.optimizers.Adam(0.05, **kwargs), steps=10, sparse=sparse)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_a_step_is_one_kernel_a_variable():
    layer = DenseFlipout(4)
    layer.build((None, 3))
    optimizer = optimizers.Adam(0.01)
    optimizer.build(layer.trainable_variables)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x)) + sum(layer.losses)
        optimizer.apply_gradients(
            zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
        )

    graph = step.get_concrete_function(tf.TensorSpec((2, 3))).graph
    kinds = [op.type for op in graph.get_operations()]
    assert kinds.count("ResourceApplyAdam") == len(layer.trainable_variables) == 3  # M, S, bias


def test_checkpoints_and_configs_are_interchangeable_with_keras():
    """A checkpoint of Keras' Adam restores into blayers' (the same slots), and blayers' Adam
    serializes and loads as itself."""
    _, keras_opt = _train(keras.optimizers.Adam(0.05), steps=3)
    _, fused = _train(optimizers.Adam(0.05), steps=0)
    fused.build(keras_opt._trainable_variables)
    for a, b in zip(fused.variables, keras_opt.variables):
        a.assign(b)
    assert int(fused.iterations) == 3
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizers.AdamW(0.01)))
    assert type(restored) is optimizers.AdamW and restored.get_config()["weight_decay"] == 0.004
