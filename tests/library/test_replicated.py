"""The replicated sparse GP and its noise: replica `r` is the lone sparse GP with the same
parameters, its draws have the marginals' moments and do not depend on the group (the dense
layers' and dropout's replicas are tested in `test_replicas.py`)."""

import numpy as np
import pytest
import tensorflow as tf

from blayers.layers import ReplicatedNoise, ReplicatedSparseGaussianProcess
from blayers.layers.replicated import replica_seeds


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
