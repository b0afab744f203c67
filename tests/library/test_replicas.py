"""Replicas as an argument of the library's layers (`replicas=R`): replica `r` of a layer is the
layer built alone with `replicas=1` and its seed (initial weights, outputs, noise, KL and weight
decay), replicas never mix (outputs, masks and Adam trajectories alone or in a group are the
same), the replicated draws have the right moments and independent replicas (to 5 standard
errors), dropout keeps each unit with probability `1 - rate_r`, Flipout's outputs have each
replica's posterior moments and the KL is the sum of the replicas' closed forms."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from conftest import graph_draws

from blayers import sampling
from blayers.initializers import TrainableMultivariateNormal, TrainableNormal
from blayers.layers import (
    Conv2DFlipout,
    DenseDVI,
    DenseFlipout,
    DenseLocalReparameterization,
    DenseReparameterization,
    GaussianLikelihood,
    MCDropout,
)
from blayers.regularizers import NormalKLDivergence
from blayers.replicas import ReplicaInitializer, ReplicaL2

ESTIMATORS = [DenseReparameterization, DenseFlipout, DenseLocalReparameterization]
SEEDS = [11, 22, 33]


def test_replicated_draws_depend_on_their_own_key_and_have_the_right_moments():
    seed, keys = tf.constant([5, 6]), sampling.replica_keys(SEEDS)
    n = 100_000
    normal = sampling.standard_normal([3, n], seed, keys=keys).numpy()
    uniform = sampling.uniform([3, n], seed, keys=keys).numpy()
    signs = sampling.rademacher([3, n], seed, keys=keys).numpy()
    for r in range(3):  # alone, replica r draws its slice of the group's
        alone = sampling.replica_keys(SEEDS[r : r + 1])
        np.testing.assert_array_equal(
            sampling.standard_normal([1, n], seed, keys=alone)[0], normal[r]
        )
        np.testing.assert_array_equal(sampling.uniform([1, n], seed, keys=alone)[0], uniform[r])
        np.testing.assert_array_equal(sampling.rademacher([1, n], seed, keys=alone)[0], signs[r])
    se = 1 / np.sqrt(n)
    assert np.all(np.abs(normal.mean(1)) < 5 * se)
    assert np.all(np.abs(normal.var(1) - 1) < 5 * np.sqrt(2) * se)
    assert np.all(np.abs(uniform.mean(1) - 0.5) < 5 * se / np.sqrt(12))
    assert 0 < uniform.min() and uniform.max() < 1
    assert set(np.unique(signs)) == {-1.0, 1.0} and np.all(np.abs(signs.mean(1)) < 5 * se)
    # Independent replicas: no correlation between them beyond sampling error.
    for draws in (normal, uniform, signs):
        correlation = np.corrcoef(draws)
        assert np.all(np.abs(correlation[np.triu_indices(3, 1)]) < 5 * se)
    # Another seed, other draws; the ordinary draw is unchanged by the keys' path.
    assert not np.allclose(sampling.standard_normal([3, 10], seed + 1, keys=keys), normal[:, :10])
    with pytest.raises(ValueError, match="leading axis must be the replica axis"):
        sampling.uniform([2, 5], seed, keys=keys)


def _pair(cls, **kwargs):
    """A layer of three replicas and each replica's lone twin, built from one global seed."""
    keras.utils.set_random_seed(4)
    group = cls(replicas=3, replica_seeds=SEEDS, **kwargs)
    alone = []
    for seed in SEEDS:
        keras.utils.set_random_seed(4)
        alone.append(cls(replicas=1, replica_seeds=[seed], **kwargs))
    return group, alone


def _noisy_posterior():
    # Posterior stddevs near 0.3 and means of order 1, so the noise is far from negligible.
    return TrainableNormal(
        mean_initializer=keras.initializers.RandomNormal(stddev=1.0),
        stddev_initializer=keras.initializers.RandomUniform(-1.5, -0.5),
    )


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_each_replica_is_the_lone_layer_with_its_seed(cls):
    x = np.random.default_rng(0).normal(size=(3, 7, 5)).astype("float32")
    group, alone = _pair(
        lambda **kw: cls(4, activation="relu", kernel_initializer=_noisy_posterior(), **kw)
    )
    for _ in range(3):  # the noise of successive calls matches too
        together = group(x)
        for r, lone in enumerate(alone):
            # Equal up to the batched matmul's rounding (the draws themselves are identical).
            np.testing.assert_allclose(together[r], lone(x[r : r + 1])[0], rtol=1e-5, atol=1e-5)
    # The KL is the sum of the replicas' closed forms, each against the prior N(0, 1).
    mean, stddev = (v.numpy() for v in group.kernel_initializer.weights)
    expected = 0.0
    for r in range(3):
        q = tfp.distributions.Normal(mean[r], tf.nn.softplus(stddev[r]))
        expected += float(
            tf.reduce_sum(tfp.distributions.kl_divergence(q, tfp.distributions.Normal(0.0, 1.0)))
        )
        np.testing.assert_array_equal(mean[r], alone[r].kernel_initializer.weights[0][0])
    np.testing.assert_allclose(float(group.losses[-1]), expected, rtol=1e-5)
    assert group.kernel.shape == (3, 5, 4) and group.bias.shape == (3, 4)


def test_the_deterministic_twin_draws_each_replica_with_its_own_fans_and_decay():
    x = np.random.default_rng(1).normal(size=(3, 6, 5)).astype("float32")
    decay = [0.1, 0.2, 0.3]
    group, alone = _pair(
        lambda **kw: DenseReparameterization(
            40, kernel_initializer="glorot_uniform", kernel_regularizer=ReplicaL2(decay), **kw
        )
    )
    outputs = group(x)
    kernel = group.kernel.numpy()
    # Glorot's bound for one replica's fans (5 in, 40 out), not the [3, 5, 40] shape's.
    assert np.abs(kernel).max() <= np.sqrt(6 / 45) and np.abs(kernel).max() > 0.8 * np.sqrt(6 / 45)
    penalty = sum(d * np.sum(np.square(kernel[r])) for r, d in enumerate(decay))
    np.testing.assert_allclose(float(sum(group.losses)), penalty, rtol=1e-5)
    for r, lone in enumerate(alone):
        np.testing.assert_allclose(outputs[r], lone(x[r : r + 1])[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(kernel[0], kernel[1])


def test_dropout_keeps_each_unit_with_its_replica_s_probability_and_is_unbiased():
    rates = [0.05, 0.3, 0.6]
    layer = MCDropout(rates, replicas=3, replica_seeds=[6, 7, 8])
    x = tf.ones((3, 200, 100))
    outputs = np.stack([layer(x).numpy() for _ in range(10)])  # 200,000 units per replica
    for r, rate in enumerate(rates):
        kept = np.mean(outputs[:, r] != 0)
        se = np.sqrt(rate * (1 - rate) / outputs[:, r].size)
        assert abs(kept - (1 - rate)) < 5 * se
        assert abs(outputs[:, r].mean() - 1.0) < 5 * se / (1 - rate)  # E[y] = x
        np.testing.assert_allclose(outputs[:, r][outputs[:, r] != 0], 1 / (1 - rate), rtol=1e-6)
    assert not np.array_equal(layer(x)[1], layer(x)[1])  # prediction draws masks too


def test_dropout_masks_do_not_depend_on_the_group():
    rates = [0.1, 0.3, 0.5]
    x = np.random.default_rng(2).normal(size=(3, 6, 5)).astype("float32")
    keras.utils.set_random_seed(4)
    group = MCDropout(rates, replicas=3, replica_seeds=SEEDS)
    alone = []
    for rate, seed in zip(rates, SEEDS):
        keras.utils.set_random_seed(4)
        alone.append(MCDropout(rate, replicas=1, replica_seeds=[seed]))
    for _ in range(3):
        together = group(x)
        for r, lone in enumerate(alone):
            np.testing.assert_array_equal(together[r], lone(x[r : r + 1])[0])


def _train(layers_fn, xs, ys, steps):
    """Adam on the sum of the replicas' Gaussian NLLs and penalties; each replica sees its own
    examples."""
    model = keras.Sequential([keras.Input((None, xs.shape[-1])), *layers_fn()])
    optimizer = keras.optimizers.Adam(1e-2)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            out = model(x)
            nll = -out.distribution.log_prob(y)
            loss = tf.reduce_sum(tf.reduce_mean(nll, [1, 2])) + tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    for t in range(steps):
        rows = slice(8 * (t % 4), 8 * (t % 4) + 8)
        step(xs[:, rows], ys[:, rows])
    return [v.numpy() for v in model.trainable_variables]


def _mc_dropout_net(rates, decays, seeds):
    group = {"replicas": len(seeds), "replica_seeds": seeds}
    dense = {"kernel_initializer": "glorot_uniform", "kernel_regularizer": ReplicaL2(decays)}
    return lambda: [
        MCDropout(rates, **group),
        DenseReparameterization(16, activation="relu", **dense, **group),
        MCDropout(rates, **group),
        DenseReparameterization(1, **dense, **group),
        GaussianLikelihood(0.1, trainable=False, **group),
    ]


def _flipout_net(noise, seeds):
    group = {"replicas": len(seeds), "replica_seeds": seeds}
    kl = {"kernel_regularizer": NormalKLDivergence(scale_factor=1 / 32)}
    return lambda: [
        DenseFlipout(8, activation="relu", **kl, **group),
        DenseFlipout(1, **kl, **group),
        GaussianLikelihood(noise, **group),
    ]


# MC dropout's replicas trained together are checked against each trained alone through the
# Loop in the fast suite (tests/lab/test_replicated_training.py); here in the slow one.
@pytest.mark.parametrize("net", [pytest.param("mc_dropout", marks=pytest.mark.slow), "flipout"])
def test_training_in_a_group_follows_each_replica_s_lone_trajectory(net):
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(3, 32, 4)).astype("float32")
    ys = (np.sin(xs.sum(-1, keepdims=True)) + rng.normal(size=(3, 32, 1)) * 0.1).astype("float32")
    rates, decays, noise = [0.05, 0.2, 0.0], [1e-3, 1e-2, 0.0], [0.1, 0.3, 1.0]

    def layers(idx):
        if net == "mc_dropout":
            return _mc_dropout_net(
                [rates[i] for i in idx], [decays[i] for i in idx], [SEEDS[i] for i in idx]
            )
        return _flipout_net([noise[i] for i in idx], [SEEDS[i] for i in idx])

    keras.utils.set_random_seed(9)
    group = _train(layers([0, 1, 2]), xs, ys, steps=40)
    for r in range(3):
        keras.utils.set_random_seed(9)
        alone = _train(layers([r]), xs[r : r + 1], ys[r : r + 1], 40)
        for together, lone in zip(group, alone):
            np.testing.assert_allclose(together[r : r + 1], lone, rtol=1e-5, atol=1e-6)
        assert not np.allclose(group[0][r], group[0][(r + 1) % 3])  # replicas did differ


def test_flipout_outputs_have_each_replica_s_posterior_mean_and_variance():
    # Given x, each output is x @ W + b with W ~ q_r: mean x @ M_r + b_r, variance x^2 @ S_r^2;
    # each row is a valid draw (Flipout's signs), so rows of one call and calls both sample it.
    layer = DenseFlipout(4, kernel_initializer=_noisy_posterior(), replicas=2)
    x = np.tile(np.random.default_rng(5).normal(size=(2, 1, 5)).astype("float32"), (1, 20, 1))
    calls = 1000
    draws = np.concatenate(graph_draws(lambda: layer(x), calls), axis=1)  # [2, 20,000, 4]
    mean_w, rho = (v.numpy() for v in layer.kernel_initializer.weights)
    mean = np.einsum("ri,rio->ro", x[:, 0], mean_w) + layer.bias.numpy()
    variance = np.einsum("ri,rio->ro", x[:, 0] ** 2, np.log1p(np.exp(rho)) ** 2)
    # Rows within a call share |dW|: the standard errors count calls, not rows (conservative);
    # a sample variance's relative standard error is at most sqrt(2 / calls).
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * np.sqrt(variance / calls))
    np.testing.assert_allclose(draws.var(1), variance, rtol=5 * np.sqrt(2 / calls))
    assert variance.min() > 0.05


def test_config_round_trip_and_errors_name_the_layer():
    x = np.ones((2, 4, 5), "float32")
    for layer in (
        DenseFlipout(3, replicas=2, replica_seeds=[4, 5], name="rf"),
        DenseReparameterization(
            3, kernel_initializer="he_normal", kernel_regularizer=ReplicaL2([0.5, 1.0]), replicas=2
        ),
        MCDropout([0.2, 0.4], replicas=2),
        GaussianLikelihood([0.2, 0.4], replicas=2),
    ):
        layer(x)
        clone = type(layer).from_config(layer.get_config())
        clone(x)
        assert clone.replicas == 2 and clone.replica_seeds == layer.replica_seeds
        for a, b in zip(layer.weights, clone.weights):
            assert a.shape == b.shape
    clone = keras.layers.deserialize(
        keras.layers.serialize(
            DenseReparameterization(3, kernel_regularizer=ReplicaL2([0.5, 1.0]), replicas=2)
        )
    )
    assert clone.kernel_regularizer.l2 == [0.5, 1.0]
    assert ReplicaInitializer.from_config(ReplicaInitializer("zeros", [1, 2]).get_config())
    with pytest.raises(ValueError, match=r"rf2.*replicas=2: its inputs are \[replicas, batch"):
        DenseFlipout(3, replicas=2, name="rf2")(np.ones((3, 4, 5), "float32"))
    with pytest.raises(ValueError, match=r"rate needs one value or 2"):
        MCDropout([0.1, 0.2, 0.3], replicas=2)
    with pytest.raises(ValueError, match=r"0 <= rate < 1"):
        MCDropout([0.2, 1.0], replicas=2)
    with pytest.raises(ValueError, match="replica_seeds must be 2 ints"):
        DenseFlipout(3, replicas=2, replica_seeds=[1])
    with pytest.raises(ValueError, match="replicas must be a positive integer"):
        DenseFlipout(3, replicas=0)
    with pytest.raises(ValueError, match="has no replica axis"):
        Conv2DFlipout(3, 3, replicas=2)
    with pytest.raises(ValueError, match="has no replica axis"):
        DenseDVI(3, replicas=2)
    with pytest.raises(ValueError, match="noise_variance must be positive"):
        GaussianLikelihood([0.1, 0.0], replicas=2)
    with pytest.raises(ValueError, match="trainable_multivariate_normal has no replica axis"):
        DenseFlipout(3, kernel_initializer=TrainableMultivariateNormal(), replicas=2)(x)
    # Without replicas, the layers are the ordinary ones.
    assert DenseFlipout(3).replicas is None and "replicas" not in DenseFlipout(3).get_config()


# -- the sparse GP -------------------------------------------------------------------------------
def _svgp(replicas=3, seeds=None, **kwargs):
    from blayers.layers import SparseGaussianProcess

    kwargs = {"num_inducing": 7, "cholesky_dtype": "float64", **kwargs}
    return SparseGaussianProcess(
        kwargs.pop("units", 2), replicas=replicas, replica_seeds=seeds, **kwargs
    )


def _perturb(layer, rng):
    """Parameters away from their initial values, so that every term of the maths counts."""
    for variable in layer.trainable_variables:
        variable.assign(variable + rng.normal(size=variable.shape).astype("float32") * 0.3)


@pytest.mark.parametrize("mean_fn", ["linear", "identity", "constant"])
def test_svgp_replicas_are_the_lone_sparse_gp_with_the_same_parameters(mean_fn):
    """Marginals, KL and gradients of replica r (whitened and not) are the lone layer's with its
    slice of the parameters; the layer's loss is the replicas' KLs summed."""
    from blayers.layers import SparseGaussianProcess

    rng = np.random.default_rng(6)
    x = rng.normal(size=(3, 9, 4)).astype("float32")
    kwargs = {"units": 4 if mean_fn == "identity" else 2, "mean_fn": mean_fn}
    kwargs["whiten"] = mean_fn != "constant"
    layer = _svgp(scale_factor=0.1, **kwargs)
    layer(x)
    _perturb(layer, rng)
    weights = rng.normal(size=(3, 9, 2 * layer.units)).astype("float32")
    with tf.GradientTape() as tape:
        mean, variance, kl = layer.predict_marginals(x)
        objective = tf.reduce_sum(tf.concat([mean, variance], -1) * weights) + kl
    gradients = tape.gradient(objective, layer.trainable_variables)
    names = [v.name for v in layer.trainable_variables]
    total = 0.0
    for r in range(3):
        lone = _svgp(replicas=None, **kwargs)
        lone(x[r])
        theirs = {v.name: v for v in layer.weights}
        for mine in lone.weights:
            value = theirs[mine.name]
            mine.assign(value if mine.shape == value.shape else value[r])
        with tf.GradientTape() as tape:
            lone_mean, lone_variance, lone_kl = lone.predict_marginals(x[r])
            lone_objective = (
                tf.reduce_sum(tf.concat([lone_mean, lone_variance], -1) * weights[r]) + lone_kl
            )
        np.testing.assert_allclose(mean[r], lone_mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(variance[r], lone_variance, rtol=1e-4, atol=1e-5)
        total += float(lone_kl)
        for name, lone_gradient in zip(
            [v.name for v in lone.trainable_variables],
            tape.gradient(lone_objective, lone.trainable_variables),
        ):
            np.testing.assert_allclose(
                gradients[names.index(name)][r], lone_gradient, rtol=2e-3, atol=2e-4, err_msg=name
            )
        assert isinstance(lone, SparseGaussianProcess)
    np.testing.assert_allclose(float(kl), total, rtol=1e-5)
    outputs = layer(x)
    np.testing.assert_allclose(float(layer.losses[-1]), 0.1 * total, rtol=1e-5)
    assert outputs.shape == (3, 9, layer.units)


def test_the_identity_mean_is_fixed_and_a_projection_is_each_replica_s_own():
    """`mean_fn='identity'` adds the inputs, padded, and trains nothing; `mean_projection`
    swaps in a fixed map (one a replica) for inputs wider than the units."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2, 8, 3)).astype("float32")
    layer = _svgp(replicas=2, units=4, mean_fn="identity", num_inducing=6)
    layer(x)
    assert not {"mean_kernel", "mean_bias"} & {v.name for v in layer.trainable_variables}
    mean, _, _ = layer.predict_marginals(x)  # q(u)'s mean at zero: the inputs, zero-padded
    np.testing.assert_allclose(mean, np.concatenate([x, np.zeros((2, 8, 1))], -1), atol=1e-6)
    projection = rng.normal(size=(2, 3, 2)).astype("float32")
    projected = _svgp(replicas=2, mean_fn="identity", mean_projection=projection, name="pr")
    projected(x)
    mean, _, _ = projected.predict_marginals(x)
    np.testing.assert_allclose(mean, np.einsum("rbd,rdu->rbu", x, projection), rtol=1e-5)
    clone = type(projected).from_config(projected.get_config())
    clone(x)
    for mine, theirs in zip(clone.weights, projected.weights):
        mine.assign(theirs)
    np.testing.assert_allclose(clone.predict_marginals(x)[0], projected.predict_marginals(x)[0])
    with pytest.raises(ValueError, match="id1.*mean_fn='identity' copies the inputs"):
        _svgp(replicas=2, mean_fn="identity", name="id1")(x)
    with pytest.raises(ValueError, match=r"id2.*mean_projection must be"):
        _svgp(replicas=2, mean_fn="identity", mean_projection=projection[:1, :2], name="id2")(x)
    with pytest.raises(ValueError, match="id3.*mean_projection is the fixed map"):
        _svgp(replicas=2, mean_fn="linear", mean_projection=projection, name="id3")


def test_svgp_draws_have_the_marginals_moments_and_do_not_depend_on_the_group():
    rng = np.random.default_rng(7)
    x = np.tile(rng.normal(size=(2, 1, 3)).astype("float32"), (1, 4000, 1))
    keras.utils.set_random_seed(3)
    layer = _svgp(replicas=2, seeds=[4, 5], num_inducing=5)
    layer(x[:, :1])
    _perturb(layer, rng)
    mean, variance, _ = layer.predict_marginals(x[:, :1])
    mean, variance = mean.numpy()[:, 0], variance.numpy()[:, 0]
    draws = tf.convert_to_tensor(layer(x)).numpy()  # independent across rows
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * np.sqrt(variance / 4000))
    np.testing.assert_allclose(draws.var(1), variance, rtol=5 * np.sqrt(2 / 4000))
    keras.utils.set_random_seed(3)
    lone = _svgp(replicas=1, seeds=[5], num_inducing=5)
    lone(x[1:, :1])
    for mine, theirs in zip(lone.variables, layer.variables):  # the seed generator's state too
        mine.assign(theirs[1:] if mine.shape != theirs.shape else theirs)
    np.testing.assert_allclose(
        tf.convert_to_tensor(lone(x[1:]))[0],
        tf.convert_to_tensor(layer(x))[1],
        rtol=1e-5,
        atol=1e-6,
    )


def test_svgp_refusals_and_the_likelihood_s_closed_form_input():
    x = np.ones((2, 5, 4), "float32")
    with pytest.raises(
        ValueError, match=r"gp2.*takes inputs of shape \[replicas, batch, features\]"
    ):
        _svgp(replicas=2, name="gp2")(np.ones((3, 5, 4), "float32"))
    with pytest.raises(ValueError, match="not inducing_inputs_initializer='kmeans'"):
        _svgp(replicas=2, inducing_inputs_initializer="kmeans")
    with pytest.raises(ValueError, match="has no replica axis"):
        from blayers.layers import GaussianProcess

        GaussianProcess(1, replicas=2)
    # One Constant of every replica's inducing inputs.
    centres = np.random.default_rng(0).normal(size=(2, 7, 4)).astype("float32")
    layer = _svgp(replicas=2, inducing_inputs_initializer=keras.initializers.Constant(centres))
    f = layer(x)
    np.testing.assert_array_equal(layer.inducing_inputs, centres)
    y = GaussianLikelihood([0.5, 2.0], replicas=2)(f)
    assert y.function is f  # the GP's marginals, for the closed-form expectation
    np.testing.assert_allclose(y.distribution.variance()[:, 0, 0], [0.5, 2.0], rtol=1e-6)
