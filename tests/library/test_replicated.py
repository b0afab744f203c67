"""Replicated layers: replica `r` is the lone layer seeded `seeds[r]` (weights, outputs, weight
decay), replicas never mix (outputs, masks and training alone or in a group are the same), and
the dropout masks keep each unit with probability `1 - rate` (to 5 standard errors)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers.layers import MCDropout, ReplicatedDense, ReplicatedMCDropout
from blayers.layers.replicated import replica_seeds


def test_each_replica_is_the_lone_dense_layer_with_its_seed():
    seeds = replica_seeds([0, 1, 2])
    x = np.random.default_rng(0).normal(size=(3, 7, 5)).astype("float32")
    layer = ReplicatedDense(4, seeds, activation="relu", kernel_decay=[0.1, 0.2, 0.3])
    outputs = layer(x)
    decay = 0.0
    for r, seed in enumerate(seeds):
        lone = keras.layers.Dense(
            4, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed=seed)
        )
        np.testing.assert_array_equal(outputs[r], lone(x[r]))
        decay += [0.1, 0.2, 0.3][r] * np.sum(np.square(lone.kernel.numpy()))
    np.testing.assert_allclose(float(sum(layer.losses)), decay, rtol=1e-6)
    assert not set(replica_seeds([0, 1, 2], salt=1)) & set(seeds)  # other layers, other seeds
    assert replica_seeds([1])[0] == seeds[1]  # a replica's seed is its own, in any group


def test_replicas_do_not_mix_and_masks_do_not_depend_on_the_group():
    seeds = replica_seeds([3, 4, 5])
    x = np.random.default_rng(1).normal(size=(3, 6, 5)).astype("float32")
    group_dense = ReplicatedDense(8, seeds)
    group_drop = ReplicatedMCDropout([0.1, 0.3, 0.5], seeds)
    alone = [
        (ReplicatedDense(8, [s]), ReplicatedMCDropout([rate], [s]))
        for s, rate in zip(seeds, [0.1, 0.3, 0.5])
    ]
    for _ in range(3):  # the masks of successive calls match too
        together = group_drop(group_dense(x))
        for r, (dense, drop) in enumerate(alone):
            np.testing.assert_array_equal(together[r], drop(dense(x[r : r + 1]))[0])


def test_dropout_keeps_each_unit_with_probability_one_minus_rate_and_is_unbiased():
    rates = [0.05, 0.3, 0.6]
    layer = ReplicatedMCDropout(rates, replica_seeds([6, 7, 8]))
    x = tf.ones((3, 200, 100))
    outputs = np.stack([layer(x).numpy() for _ in range(10)])  # 200,000 units per replica
    for r, rate in enumerate(rates):
        kept = np.mean(outputs[:, r] != 0)
        se = np.sqrt(rate * (1 - rate) / outputs[:, r].size)
        assert abs(kept - (1 - rate)) < 5 * se
        assert abs(outputs[:, r].mean() - 1.0) < 5 * se / (1 - rate)  # E[y] = x
        np.testing.assert_allclose(outputs[:, r][outputs[:, r] != 0], 1 / (1 - rate), rtol=1e-6)
    # Prediction draws masks too (MC dropout): two calls differ.
    assert not np.array_equal(layer(x)[1], layer(x)[1])


def _train(seeds, rates, decays, xs, ys, steps):
    """Adam on the sum of the replicas' losses; each replica sees its own examples."""
    model = keras.Sequential(
        [
            keras.Input((None, xs.shape[-1])),
            ReplicatedMCDropout(rates, seeds),
            ReplicatedDense(16, seeds, activation="relu", kernel_decay=decays),
            ReplicatedMCDropout(rates, [s + 1 for s in seeds]),
            ReplicatedDense(1, [s + 2 for s in seeds], kernel_decay=decays),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-2)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.reduce_mean(tf.square(model(x) - y), [1, 2]))
            loss += tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    for t in range(steps):
        rows = slice(8 * (t % 4), 8 * (t % 4) + 8)
        step(xs[:, rows], ys[:, rows])
    return [v.numpy() for v in model.trainable_variables]


def test_training_in_a_group_follows_each_replica_s_lone_trajectory():
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(3, 32, 4)).astype("float32")
    ys = (np.sin(xs.sum(-1, keepdims=True)) + rng.normal(size=(3, 32, 1)) * 0.1).astype("float32")
    seeds, rates, decays = [11, 22, 33], [0.05, 0.2, 0.0], [1e-3, 1e-2, 0.0]
    group = _train(seeds, rates, decays, xs, ys, steps=40)
    for r in range(3):
        alone = _train([seeds[r]], [rates[r]], [decays[r]], xs[r : r + 1], ys[r : r + 1], 40)
        for together, lone in zip(group, alone):
            np.testing.assert_allclose(together[r : r + 1], lone, rtol=1e-5, atol=1e-6)
        assert not np.allclose(group[0][r], group[0][(r + 1) % 3])  # replicas did differ


def test_config_round_trip_and_errors_name_the_layer():
    layer = ReplicatedDense(3, [1, 2], activation="tanh", kernel_decay=0.5, name="rd")
    clone = ReplicatedDense.from_config(layer.get_config())
    x = np.ones((2, 4, 5), "float32")
    np.testing.assert_array_equal(layer(x), clone(x))
    assert clone.kernel_decay == [0.5, 0.5]
    drop = ReplicatedMCDropout.from_config(ReplicatedMCDropout(0.2, [1, 2]).get_config())
    assert drop.rates == [0.2, 0.2]
    with pytest.raises(ValueError, match=r"rd: inputs must be \[replicas=2"):
        layer(np.ones((3, 4, 5), "float32"))
    with pytest.raises(ValueError, match=r"every rate must be in \[0, 1\)"):
        ReplicatedMCDropout([0.2, 1.0], [1, 2])
    with pytest.raises(ValueError, match="seeds must be a non-empty list of ints"):
        ReplicatedDense(3, seeds=5)
    with pytest.raises(ValueError, match="kernel_decay needs one value or 2"):
        ReplicatedDense(3, [1, 2], kernel_decay=[1.0, 2.0, 3.0])
    assert MCDropout(0.1)  # the lone layer this one replicates
