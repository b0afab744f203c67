"""Replicated layers: replica `r` is the lone layer seeded `seeds[r]` (weights, outputs, weight
decay), replicas never mix (outputs, masks and training alone or in a group are the same), and
the dropout masks keep each unit with probability `1 - rate` (to 5 standard errors); Flipout's
outputs have the posterior's moments and its KL the closed form."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.layers import (
    DenseFlipout,
    MCDropout,
    ReplicatedDense,
    ReplicatedDenseFlipout,
    ReplicatedMCDropout,
    ReplicatedNoise,
    ReplicatedSparseGaussianProcess,
)
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
        # Equal to float32 rounding: a batched matmul may sum in another order than Dense's
        # matmul (it does on some CPUs).
        np.testing.assert_allclose(outputs[r], lone(x[r]), rtol=1e-6, atol=1e-6)
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
            # Rounding apart (one replica's matmul and three's may sum in other orders), and the
            # same masks: a dropped unit is exactly 0 in both.
            lone = drop(dense(x[r : r + 1]))[0]
            np.testing.assert_array_equal(together[r] == 0, lone == 0)
            np.testing.assert_allclose(together[r], lone, rtol=1e-6, atol=1e-6)


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


def _flipout(seeds, **kwargs):
    # Posterior stddevs near 0.3 and means of order 1, so the noise is far from negligible.
    return ReplicatedDenseFlipout(
        4,
        seeds,
        kernel_initializer=keras.initializers.RandomNormal(stddev=1.0),
        stddev_initializer=keras.initializers.RandomUniform(-1.5, -0.5),
        bias_initializer=keras.initializers.RandomNormal(stddev=1.0),
        **kwargs,
    )


def test_flipout_replicas_do_not_mix_and_their_kl_is_the_closed_form():
    seeds = replica_seeds([1, 2, 3])
    x = np.random.default_rng(2).normal(size=(3, 6, 5)).astype("float32")
    group = _flipout(seeds, prior_stddev=[1.0, 0.5, 2.0], kl_weight=[0.1, 0.2, 0.3])
    alone = [
        _flipout([s], prior_stddev=[p], kl_weight=[w])
        for s, p, w in zip(seeds, [1.0, 0.5, 2.0], [0.1, 0.2, 0.3])
    ]
    for _ in range(3):  # the perturbations and signs of successive calls match too
        together = group(x)
        for r, lone in enumerate(alone):
            # Equal up to the batched matmul's rounding (the draws themselves are identical).
            np.testing.assert_allclose(together[r], lone(x[r : r + 1])[0], rtol=1e-5, atol=1e-6)
    expected = 0.0
    for r, prior in enumerate([1.0, 0.5, 2.0]):
        q = tfp.distributions.Normal(group.kernel[r], group.kernel_stddev[r])
        kl = tfp.distributions.kl_divergence(q, tfp.distributions.Normal(0.0, prior))
        np.testing.assert_allclose(group.kl_divergence()[r], np.sum(kl), rtol=1e-5)
        expected += [0.1, 0.2, 0.3][r] * np.sum(kl)
    np.testing.assert_allclose(float(group.losses[-1]), expected, rtol=1e-5)


def test_flipout_outputs_have_the_posterior_s_mean_and_variance():
    # Given x, each output is x @ W + b with W ~ q: mean x @ M + b, variance x^2 @ S^2; each row
    # is a valid draw (Flipout's signs), so rows of one call and calls both sample it.
    layer = _flipout(replica_seeds([4, 5]))
    x = np.tile(np.random.default_rng(5).normal(size=(2, 1, 5)).astype("float32"), (1, 20, 1))
    call = tf.function(layer)
    calls = 1000
    draws = np.concatenate([call(x).numpy() for _ in range(calls)], axis=1)  # [2, 20,000, 4]
    mean = np.einsum("ri,rio->ro", x[:, 0], layer.kernel.numpy()) + layer.bias.numpy()
    variance = np.einsum("ri,rio->ro", x[:, 0] ** 2, layer.kernel_stddev.numpy() ** 2)
    # Rows within a call share |dW|: the standard errors count calls, not rows (conservative);
    # a sample variance's relative standard error is at most sqrt(2 / calls).
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * np.sqrt(variance / calls))
    np.testing.assert_allclose(draws.var(1), variance, rtol=5 * np.sqrt(2 / calls))
    assert variance.min() > 0.05


def test_flipout_training_in_a_group_follows_each_replica_s_lone_trajectory():
    rng = np.random.default_rng(4)
    xs = rng.normal(size=(3, 16, 4)).astype("float32")
    ys = np.sin(xs.sum(-1, keepdims=True)).astype("float32")

    def train(seeds, priors, x, y):
        model = keras.Sequential(
            [
                keras.Input((None, 4)),
                ReplicatedDenseFlipout(
                    8, seeds, activation="relu", prior_stddev=priors, kl_weight=1 / 16
                ),
                ReplicatedDenseFlipout(1, [s + 7 for s in seeds], kl_weight=1 / 16),
                ReplicatedNoise(0.1, len(seeds), trainable=True),
            ]
        )
        optimizer = keras.optimizers.Adam(1e-2)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                out = model(x)
                nll = 0.5 * (out[..., 1:] + tf.square(y - out[..., :1]) * tf.exp(-out[..., 1:]))
                loss = tf.reduce_sum(tf.reduce_mean(nll, [1, 2])) + tf.add_n(model.losses)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        for _ in range(30):
            step()
        return [v.numpy() for v in model.trainable_variables]

    seeds, priors = [5, 6, 7], [1.0, 0.3, 3.0]
    group = train(seeds, priors, xs, ys)
    for r in range(3):
        alone = train([seeds[r]], [priors[r]], xs[r : r + 1], ys[r : r + 1])
        for together, lone in zip(group, alone):
            np.testing.assert_allclose(together[r : r + 1], lone, rtol=1e-5, atol=1e-6)
    assert not np.allclose(group[-1][0], group[-1][1])  # each learned its own noise


def test_flipout_config_round_trip_and_defaults_are_dense_flipout_s():
    layer = ReplicatedDenseFlipout(3, [1, 2], prior_stddev=0.5, kl_weight=0.1, name="rf")
    x = np.ones((2, 4, 5), "float32")
    layer(x)
    clone = ReplicatedDenseFlipout.from_config(layer.get_config())
    clone(x)
    for a, b in zip(layer.weights, clone.weights):
        np.testing.assert_array_equal(a, b)
    assert clone.prior_stddev == [0.5, 0.5] and clone.kl_weight == [0.1, 0.1]
    # DenseFlipout's default posterior: means of order 1e-5, stddevs in [1e-3, 5e-2].
    assert np.abs(layer.kernel.numpy()).max() < 1e-4
    stddev = layer.kernel_stddev.numpy()
    assert stddev.min() >= 1e-3 - 1e-7 and stddev.max() <= 5e-2 + 1e-7
    assert DenseFlipout(3)  # the lone layer this one replicates
    with pytest.raises(ValueError, match="kernel_decay does not apply"):
        ReplicatedDenseFlipout(3, [1, 2], kernel_decay=0.1)
    with pytest.raises(ValueError, match="rf2: prior_stddev must be positive"):
        ReplicatedDenseFlipout(3, [1, 2], prior_stddev=[1.0, 0.0], name="rf2")


def _svgp(seeds, inducing, **kwargs):
    return ReplicatedSparseGaussianProcess(2, inducing, seeds, **kwargs)


def _perturb(layer, rng):
    """Parameters away from their initial values, so that every term of the maths counts."""
    for variable in layer.trainable_variables:
        variable.assign(variable + rng.normal(size=variable.shape).astype("float32") * 0.3)


def test_svgp_replicas_are_the_lone_sparse_gp_with_the_same_parameters():
    from blayers.layers.gp import SparseGaussianProcess

    rng = np.random.default_rng(6)
    inducing = rng.normal(size=(3, 7, 4)).astype("float32")
    x = rng.normal(size=(3, 9, 4)).astype("float32")
    layer = _svgp(replica_seeds([1, 2, 3]), inducing, mean_fn="linear", kl_weight=[0.1, 0.2, 0.3])
    layer(x)
    _perturb(layer, rng)
    weights = rng.normal(size=(3, 9, 4)).astype("float32")  # an objective of every output
    with tf.GradientTape() as tape:
        outputs = layer(x)
        objective = tf.reduce_sum(outputs * weights) + layer.losses[-1]
    gradients = tape.gradient(objective, layer.trainable_variables)
    outputs = outputs.numpy()
    expected_loss = 0.0
    for r in range(3):
        lone = SparseGaussianProcess(
            2, num_inducing=7, mean_fn="linear", cholesky_dtype="float64", jitter=1e-6
        )
        lone(x[r])
        lone.inducing_inputs.assign(layer.inducing_inputs[r])
        lone.raw_amplitude.assign(layer.raw_amplitude[r])
        lone.raw_length_scale.assign(layer.raw_length_scale[r])
        lone.mean_kernel.assign(layer.mean_kernel[r])
        lone.mean_bias.assign(layer.mean_bias[r])
        lone.variational_mean.assign(layer.variational_mean[r])
        lone.variational_scale.assign(layer.variational_scale[r])
        with tf.GradientTape() as tape:
            mean, variance, kl = lone.predict_marginals(x[r])
            objective = (
                tf.reduce_sum(mean * weights[r, :, :2])
                + tf.reduce_sum(variance * weights[r, :, 2:])
                + [0.1, 0.2, 0.3][r] * kl
            )
        # The hand-written gradient of the variances (`explained_variances`) is autodiff's.
        names = [v.name for v in layer.trainable_variables]
        for name, lone_gradient in zip(
            [v.name for v in lone.trainable_variables],
            tape.gradient(objective, lone.trainable_variables),
        ):
            np.testing.assert_allclose(
                gradients[names.index(name)][r], lone_gradient, rtol=2e-3, atol=2e-4, err_msg=name
            )
        np.testing.assert_allclose(outputs[r, :, :2], mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(outputs[r, :, 2:], variance, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(layer.kl_divergence()[r], kl, rtol=1e-5)
        expected_loss += [0.1, 0.2, 0.3][r] * float(kl)
    np.testing.assert_allclose(float(layer.losses[-1]), expected_loss, rtol=1e-5)
    alone = _svgp(replica_seeds([2]), inducing[1:2], mean_fn="linear")
    alone(x[1:2])
    for mine, theirs in zip(alone.trainable_variables, layer.trainable_variables):
        mine.assign(theirs[1:2])
    np.testing.assert_allclose(alone(x[1:2])[0], outputs[1], rtol=1e-6)  # no mixing


def test_the_identity_mean_is_fixed_and_the_lone_layer_s():
    """`mean_fn='identity'` (Salimbeni & Deisenroth's inner mean) adds the inputs, padded, to
    each replica's GP, as the lone layer's does, and trains nothing; `mean_projection` swaps in
    a fixed map for inputs wider than the units."""
    from blayers.layers.gp import SparseGaussianProcess

    rng = np.random.default_rng(11)
    inducing = rng.normal(size=(2, 6, 3)).astype("float32")
    x = rng.normal(size=(2, 8, 3)).astype("float32")
    layer = ReplicatedSparseGaussianProcess(4, inducing, [1, 2], mean_fn="identity")
    layer(x)
    _perturb(layer, rng)
    assert not {"mean_kernel", "mean_bias"} & {v.name for v in layer.trainable_variables}
    outputs = layer(x).numpy()
    for r in range(2):
        lone = SparseGaussianProcess(
            4, num_inducing=6, mean_fn="identity", cholesky_dtype="float64", jitter=1e-6
        )
        lone(x[r])
        theirs = {v.name: v for v in layer.trainable_variables}
        assert sorted(theirs) == sorted(v.name for v in lone.trainable_variables)
        for mine in lone.trainable_variables:
            mine.assign(theirs[mine.name][r])
        mean, variance, _ = lone.predict_marginals(x[r])
        np.testing.assert_allclose(outputs[r, :, :4], mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(outputs[r, :, 4:], variance, rtol=1e-4, atol=1e-6)
    # With q(u)'s mean at zero the GP adds nothing to the mean: it is the inputs, zero-padded.
    layer.variational_mean.assign(tf.zeros_like(layer.variational_mean))
    padded = np.concatenate([x, np.zeros((2, 8, 1), "float32")], -1)
    np.testing.assert_allclose(layer(x).numpy()[..., :4], padded, atol=1e-6)
    # A projection: each replica's own fixed [d, units] map.
    projection = rng.normal(size=(2, 3, 2)).astype("float32")
    projected = ReplicatedSparseGaussianProcess(
        2, inducing, [1, 2], mean_fn="identity", mean_projection=projection, name="pr"
    )
    projected(x)
    projected.variational_mean.assign(tf.zeros_like(projected.variational_mean))
    np.testing.assert_allclose(
        projected(x).numpy()[..., :2], np.einsum("rbd,rdu->rbu", x, projection), rtol=1e-5
    )
    clone = ReplicatedSparseGaussianProcess.from_config(projected.get_config())
    clone(x)
    for mine, theirs in zip(clone.weights, projected.weights):
        mine.assign(theirs)
    np.testing.assert_array_equal(clone(x), projected(x))
    with pytest.raises(ValueError, match="id1: mean_fn='identity' copies the inputs.*3 features"):
        ReplicatedSparseGaussianProcess(2, inducing, [1, 2], mean_fn="identity", name="id1")(x)
    with pytest.raises(ValueError, match=r"id2: mean_projection must be \[replicas, features"):
        ReplicatedSparseGaussianProcess(
            2, inducing, [1, 2], mean_fn="identity", mean_projection=projection[:1], name="id2"
        )
    with pytest.raises(ValueError, match="id3: mean_projection is the fixed map"):
        ReplicatedSparseGaussianProcess(
            2, inducing, [1, 2], mean_fn="linear", mean_projection=projection, name="id3"
        )


def test_svgp_draws_have_the_marginals_moments_and_do_not_depend_on_the_group():
    rng = np.random.default_rng(7)
    inducing = rng.normal(size=(2, 5, 3)).astype("float32")
    x = np.tile(rng.normal(size=(2, 1, 3)).astype("float32"), (1, 4000, 1))
    seeds = replica_seeds([4, 5])
    moments = _svgp(seeds, inducing)
    moments(x[:, :1])
    _perturb(moments, rng)
    sampler = _svgp(seeds, inducing, sample=True)
    sampler(x[:, :1])
    for mine, theirs in zip(sampler.trainable_variables, moments.trainable_variables):
        mine.assign(theirs)
    mean, variance = np.split(moments(x[:, :1]).numpy()[:, 0], 2, axis=-1)
    draws = sampler(x).numpy()  # independent across rows
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * np.sqrt(variance / 4000))
    np.testing.assert_allclose(draws.var(1), variance, rtol=5 * np.sqrt(2 / 4000))
    lone = _svgp(seeds[1:], inducing[1:], sample=True)
    lone(x[1:, :1])
    for mine, theirs in zip(lone.trainable_variables, sampler.trainable_variables):
        mine.assign(theirs[1:])
    lone.counter.assign(sampler.counter)
    np.testing.assert_allclose(lone(x[1:])[0], sampler(x)[1], rtol=1e-6)


def test_noise_with_a_function_variance_and_the_svgp_config_round_trip():
    noise = ReplicatedNoise([0.5, 2.0], 2, function_variance=True)
    out = noise(np.array([[[1.0, 0.1]], [[2.0, 0.2]]], "float32")).numpy()
    np.testing.assert_allclose(
        out[:, 0], [[1.0, np.log(0.5), 0.1], [2.0, np.log(2.0), 0.2]], rtol=1e-6
    )
    layer = _svgp([1, 2], np.zeros((2, 3, 4)), mean_fn="linear", kl_weight=0.5, name="gp")
    clone = ReplicatedSparseGaussianProcess.from_config(layer.get_config())
    x = np.ones((2, 5, 4), "float32")
    np.testing.assert_array_equal(layer(x), clone(x))
    with pytest.raises(ValueError, match=r"gp2: inducing_inputs must be \[replicas=2"):
        _svgp([1, 2], np.zeros((3, 3, 4)), name="gp2")
    with pytest.raises(ValueError, match="gp3: inputs have 5 features, the inducing inputs 4"):
        _svgp([1, 2], np.zeros((2, 3, 4)), name="gp3")(np.ones((2, 5, 5), "float32"))
