"""Many small models as one (`SupervisedLearner` on replicated data): three replicas trained
together through the Loop end where each ends trained alone (same seed, same data order, same
hyperparameters), with per-replica metrics equal to the lone runs'; a resumed replicated run
continues exactly; the replicated MC dropout network is Gal & Ghahramani's (its objective
against the lone `mc_dropout_regressor`'s), the replicated Flipout network is
`mlp(dense_layer='DenseFlipout')`'s negative ELBO per example, and a GP's loss is the
closed-form variational expectation."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers.lab import loop
from blayers.lab.data.base import Replica, standardized_regression
from blayers.lab.data.replicas import Replicas
from blayers.lab.learners.supervised import SupervisedLearner
from blayers.lab.models import deep_gp, mc_dropout_regressor, mlp
from blayers.lab.tasks import Regression
from blayers.layers import GaussianLikelihood, MCDropout


def _data(split):
    rng = np.random.default_rng(split)
    x = rng.normal(size=(120, 3))
    y = np.sin(x @ [1.0, -0.5, 0.3])[:, None] * 3 + 10 + rng.normal(size=(120, 1)) * 0.3
    return standardized_regression(f"toy_{split}", x[:100], y[:100], x[100:], y[100:])


REPLICAS = [
    Replica("a", _data(0), seed=7, hparams={"dropout_rate": 0.05, "tau": 2.0}),
    Replica("b", _data(1), seed=8, hparams={"dropout_rate": 0.2, "tau": 0.5}),
    Replica("c", _data(0), seed=9, hparams={"dropout_rate": 0.1, "tau": 1.0}),
]


def _mc_dropout(shape, outputs, replicas):
    return mc_dropout_regressor(shape, outputs, hidden_units=(16,), replicas=replicas)


def _flipout(shape, outputs, replicas):
    return mlp(
        shape,
        outputs,
        hidden_units=(16,),
        dense_layer="DenseFlipout",
        noise_variance=0.1,
        replicas=replicas,
    )


_GP = {"inducing_inputs_initializer": "kmeans", "cholesky_dtype": "float64", "num_inducing": 10}


def _svgp(shape, outputs, replicas):
    return deep_gp(shape, outputs, depth=1, noise_variance=0.05, replicas=replicas, **_GP)


def _dgp2(shape, outputs, replicas):
    return deep_gp(shape, outputs, depth=2, noise_variance=0.05, replicas=replicas, **_GP)


def _dgp3(shape, outputs, replicas):
    """Salimbeni & Deisenroth's start, its inputs wider than its inner layers: each replica's
    first inner mean is the fixed projection onto its own inputs' principal directions."""
    return deep_gp(
        shape,
        outputs,
        replicas=replicas,
        **_GP,
        depth=3,
        hidden_units=2,
        inner_mean="identity",
        length_scale="sqrt_width",
        inner_variational_scale=1e-5,
        noise_variance=0.01,
    )


def _run(
    model_dir,
    replicas,
    steps=60,
    model=_mc_dropout,
    batch_size=32,
    num_eval_samples=50,
    epsilon=1e-7,
    **kwargs,
):
    learner = SupervisedLearner(
        data=replicas,
        model=model,
        optimizer=lambda: keras.optimizers.Adam(1e-2, epsilon=epsilon),
        batch_size=batch_size,
        num_eval_samples=num_eval_samples,
    )
    metrics = loop.train(
        str(model_dir), learner=learner, train_steps=steps, progress=False, plots=False, **kwargs
    )
    return learner, metrics


@pytest.mark.parametrize(
    "model",
    # The GPs through the Loop are slow: the fast suite checks the deep GP's start per replica
    # below, and each replica of a GP layer against the lone layer with the same parameters in
    # tests/library/test_replicas.py; the Loop's part is the networks' here.
    [
        _mc_dropout,
        _flipout,
        pytest.param(_svgp, marks=pytest.mark.slow),
        pytest.param(_dgp2, marks=pytest.mark.slow),
        pytest.param(_dgp3, marks=pytest.mark.slow),
    ],
    ids=["mc_dropout", "flipout", "svgp", "dgp2", "dgp3"],
)
def test_replicas_trained_together_end_where_each_ends_alone(tmp_path, model):
    steps = (
        150 if model in (_svgp, _dgp2, _dgp3) else 60
    )  # GPs: Adam moves q(u) from the prior slowly
    # The deep GP's inner q(u) scales have components whose gradients are near zero: with
    # Adam's default epsilon its normalized steps turn the float32 rounding of one replica's
    # GEMMs against three's (they sum in other orders) into steps of up to the learning rate,
    # a random walk (1e-2 apart after 150 steps with AVX2 kernels). An epsilon of 1e-4 keeps
    # rounding-sized gradients' steps rounding-sized; mixing replicas would still move weights
    # by up to a step (1e-2) each time.
    epsilon = 1e-4 if model in (_dgp2, _dgp3) else 1e-7
    group, metrics = _run(tmp_path / "group", REPLICAS, steps=steps, model=model, epsilon=epsilon)
    summary = json.loads((tmp_path / "group" / "metrics.json").read_text())
    assert summary["num_replicas"] == 3 and [r["name"] for r in summary["replicas"]] == [
        "a",
        "b",
        "c",
    ]
    for key in ("rmse", "test_log_likelihood", "coverage_95"):
        assert metrics[key] == pytest.approx(
            np.mean([r["final"][key] for r in summary["replicas"]])
        )
    # It learns: each replica's test RMSE (original units) is a quarter under its targets' spread
    # (a model that learned nothing would match it).
    for replica, scores in zip(REPLICAS, summary["replicas"]):
        assert scores["final"]["rmse"] < 0.75 * replica.data.target_scale, scores
    # The predictive's parts are scored: the function's spread (draws, or a GP's closed form)
    # is positive, and the noise is the likelihood's (MC dropout's 1 / tau), in original units.
    (noise,) = [layer for layer in group.model.layers if isinstance(layer, GaussianLikelihood)]
    variances = noise.noise_variance.numpy()
    for r, (replica, scores) in enumerate(zip(REPLICAS, summary["replicas"])):
        assert scores["final"]["function_stddev"] > 0.0
        expected = np.sqrt(variances[r]) * replica.data.target_scale
        if model is _mc_dropout:
            assert expected == pytest.approx(replica.hparams["tau"] ** -0.5, rel=1e-5)
        assert scores["final"]["noise_stddev"] == pytest.approx(expected, rel=1e-4)
    weights = [v.numpy() for v in group.model.trainable_variables]
    # The middle replica alone (its neighbours on both sides share the group); each replica
    # alone against the group, layer by layer, is tests/library/test_replicas.py's.
    compared = [1]
    atol = 1e-4 if model in (_dgp2, _dgp3) else 1e-6  # the GPs' rounding left: about 1e-5
    for r in compared:
        replica = REPLICAS[r]
        alone, _ = _run(
            tmp_path / replica.name, [replica], steps=steps, model=model, epsilon=epsilon
        )
        for together, lone in zip(weights, alone.model.trainable_variables):
            np.testing.assert_allclose(together[r : r + 1], lone.numpy(), rtol=1e-5, atol=atol)
        lone_summary = json.loads((tmp_path / replica.name / "metrics.json").read_text())
        for key, value in lone_summary["replicas"][0]["final"].items():
            assert summary["replicas"][r]["final"][key] == pytest.approx(value, rel=1e-4, abs=1e-5)
    # Replicas a and c share their data but not seed or hyperparameters: they differ.
    assert not np.allclose(weights[1][0], weights[1][2])


def test_the_deep_gp_from_salimbeni_s_start():
    """`inner_mean='identity'`: the first inner layer's fixed mean is each replica's projection
    onto its training inputs' top principal directions (uncentred SVD), the next layer's
    inducing inputs start at k-means centres of the projected inputs, later inner means are
    the identity; `length_scale='sqrt_width'` starts each layer at sqrt(its input width)."""
    from blayers.lab.models.gaussian_process import kmeans_centres
    from blayers.lab.tasks.base import features
    from blayers.replicas import fold_seed

    model = _dgp3((3,), 2, REPLICAS)
    gps = model.layers[:3]
    assert [gp.length_scale_init for gp in gps] == pytest.approx([3**0.5, 2**0.5, 2**0.5])
    assert [gp.mean_fn for gp in gps] == ["identity", "identity", "zero"]
    assert gps[1].mean_projection is None  # 2 features into 2 units: the identity
    names = {v.name for v in model.trainable_variables}
    assert not {"mean_kernel", "mean_bias"} & names
    seeds = [replica.seed for replica in REPLICAS]
    for r, replica in enumerate(REPLICAS):
        x = features(replica.data.train)
        projection = gps[0].mean_projection[r]
        _, _, vt = np.linalg.svd(x.astype(np.float64), full_matrices=False)
        np.testing.assert_allclose(np.abs(projection.T @ vt[:2].T), np.eye(2), atol=1e-5)
        centres = kmeans_centres(x @ projection, 10, fold_seed(seeds[r], 11))
        np.testing.assert_allclose(gps[1].inducing_inputs.numpy()[r], centres, rtol=1e-6)
    with pytest.raises(ValueError, match="deep_gp: inner_mean must be"):
        deep_gp((3,), 2, inner_mean="zero", replicas=REPLICAS)
    with pytest.raises(ValueError, match="length_scale must be a positive number or 'sqrt_width'"):
        deep_gp((3,), 2, length_scale="sqrt", replicas=REPLICAS)


def test_the_lone_deep_gp_takes_the_same_start():
    from blayers.lab.models import deep_gp

    model = deep_gp((3,), 1, depth=2, inner_mean="identity", length_scale="sqrt_width")
    model(np.zeros((4, 3), "float32"))
    inner, last = model.layers[0], model.layers[1]
    assert inner.mean_fn == "identity" and last.mean_fn == "zero"
    assert inner.length_scale_init == pytest.approx(3**0.5)
    assert last.length_scale_init == pytest.approx(3**0.5)  # min(3, 30) = 3 units inside
    with pytest.raises(ValueError, match="deep_gp: inner_mean='identity' needs hidden_units"):
        deep_gp((3,), 1, depth=2, hidden_units=2, inner_mean="identity")


def test_a_resumed_replicated_run_continues_exactly(tmp_path):
    whole, _ = _run(tmp_path / "whole", REPLICAS, steps=40)
    _run(tmp_path / "cut", REPLICAS, steps=15, checkpoint_every=15)
    resumed, _ = _run(tmp_path / "cut", REPLICAS, steps=40)  # steps 15-40 after a restore
    for a, b in zip(whole.model.trainable_variables, resumed.model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_each_epoch_visits_every_row_once_in_the_replica_s_own_order(tmp_path):
    learner = Replicas(REPLICAS)
    order = learner.epoch_order(3)
    assert all(sorted(row) == list(range(100)) for row in order)
    assert not np.array_equal(order[0], order[2])  # same data, other seed, other order
    np.testing.assert_array_equal(order, learner.epoch_order(3))
    assert not np.array_equal(order, learner.epoch_order(4))


def _objective(net, x, y, num_train, replicated):
    """The learner's objective of one batch: the mean NLL plus the penalties over `N`."""
    task = Regression()
    outputs = net(x)
    if replicated:
        nll = tf.reduce_mean(task.negative_log_likelihood(outputs, y, example_axes=2))
    else:
        nll = tf.reduce_mean(task.negative_log_likelihood(outputs, y))
    return outputs, float(nll) + float(tf.add_n(net.losses)) / num_train


def test_the_replicated_network_has_gal_and_ghahramani_s_objective():
    """With dropout off, replica r's output and objective (mean NLL + weight decay / N) equal
    the lone `mc_dropout_regressor`'s with the same weights, rate, tau and target scale."""
    replica = Replica("a", _data(0), seed=3, hparams={"dropout_rate": 0.1, "tau": 2.0})
    net = mc_dropout_regressor((3,), 2, hidden_units=(8,), replicas=[replica])
    lone = mc_dropout_regressor(
        (3,),
        2,
        hidden_units=(8,),
        dropout_rate=0.1,
        tau=2.0,
        target_scale=replica.data.target_scale,
    )
    dense = [layer for layer in lone.layers if isinstance(layer, keras.layers.Dense)]
    kernels = [v for v in net.trainable_variables if "kernel" in v.path]
    biases = [v for v in net.trainable_variables if "bias" in v.path]
    assert len(dense) == len(kernels) == len(biases) == 2
    for layer, kernel, bias in zip(dense, kernels, biases):
        layer.kernel.assign(kernel[0])
        layer.bias.assign(bias[0])
    for model, rate in ((net, [0.0]), (lone, 0.0)):
        for layer in model.layers:
            if isinstance(layer, MCDropout):
                layer.rate = rate
    x, y = next(iter(replica.data.train.batch(100)))
    x, y = tf.convert_to_tensor(x), tf.cast(y, tf.float32)
    outputs, ours = _objective(net, x[None], y[None], replica.data.num_train, True)
    likelihood, theirs = _objective(lone, x, y, replica.data.num_train, False)
    np.testing.assert_allclose(
        outputs.distribution.mean()[0, :, 0], likelihood.distribution.mean()[:, 0], rtol=1e-5
    )
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_the_replicated_flipout_network_has_dense_flipout_s_objective():
    """With the posterior stddevs near 0 (so both estimators' noise vanishes), replica r's
    outputs, noise variance and objective (mean NLL + KL / N) equal those of the lone
    `mlp(dense_layer='DenseFlipout', noise_variance=0.1, learn_noise=True)` with the same
    posterior means, stddevs and noise."""
    replica = Replica("a", _data(0), seed=3)
    net = _flipout((3,), 2, [replica])
    lone = mlp((3,), 2, hidden_units=(16,), dense_layer="DenseFlipout", noise_variance=0.1)
    x, y = next(iter(replica.data.train.batch(100)))
    x, y = tf.convert_to_tensor(x, tf.float32), tf.cast(y, tf.float32)
    net(x[None]), lone(x)  # builds both
    assert len(net.trainable_variables) == 7  # means, rhos and biases of two layers, the noise
    rng = np.random.default_rng(0)
    for layer, replicated in zip(lone.layers[:2], net.layers[:2]):
        replicated.kernel_initializer.mean.assign(
            rng.normal(size=replicated.kernel_initializer.mean.shape) * 0.5  # not ~1e-5
        )
        replicated.kernel_initializer.stddev.assign(
            tf.fill(replicated.kernel_initializer.stddev.shape, -16.0)
        )
        for theirs, ours in zip(layer.trainable_variables, replicated.trainable_variables):
            theirs.assign(ours[0])
    lone.layers[-1].raw_noise_variance.assign(net.layers[-1].raw_noise_variance[0])
    outputs, ours = _objective(net, x[None], y[None], replica.data.num_train, True)
    likelihood, theirs = _objective(lone, x, y, replica.data.num_train, False)
    np.testing.assert_allclose(
        outputs.distribution.mean()[0, :, 0],
        likelihood.distribution.mean()[:, 0],
        rtol=1e-4,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        outputs.distribution.variance()[0], likelihood.distribution.variance(), rtol=1e-5
    )
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_replicas_of_different_sizes_are_refused(tmp_path):
    small = standardized_regression(
        "small", np.zeros((50, 3)), np.arange(50.0)[:, None], np.zeros((5, 3)), np.zeros((5, 1))
    )
    with pytest.raises(ValueError, match="same number of training rows"):
        _run(tmp_path / "bad", [REPLICAS[0], Replica("small", small)])


def test_the_replicated_uci_config_trains_every_split_and_grid_point_in_one_run(tmp_path):
    import gin

    from blayers.lab import config
    from tests.conftest import run_module_noting_tensorflow, write_uci_folder

    write_uci_folder(tmp_path / "uci", rows=80, splits=3)
    model_dir = tmp_path / "run"
    config.parse(
        ["uci_mc_dropout_smoke"],
        [
            "uci_replicas.name = 'toy'",
            f"uci_replicas.root = '{tmp_path / 'uci'}'",
            "train.progress = False",
            "train.plots = False",
        ],
    )
    loop.train(str(model_dir))
    gin.clear_config()
    summary = json.loads((model_dir / "metrics.json").read_text())
    names = [r["name"] for r in summary["replicas"]]
    assert len(names) == 6 and names[0] == "split0[dropout_rate=0.05,tau=1.0]seed0"
    assert {r["hparams"]["tau"] for r in summary["replicas"]} == {1.0, 0.5}
    assert all(np.isfinite(r["final"]["test_log_likelihood"]) for r in summary["replicas"])
    # Post-hoc methods take a run of one model: a run of replicas is refused, in one line
    # (the command line's exit 2), read from the run's files before TensorFlow loads.
    posthoc = run_module_noting_tensorflow(
        "blayers.posthoc", f"--model_dir={model_dir}", "--method=temperature"
    )
    assert posthoc.returncode == 2, posthoc.stderr[-2000:]
    assert "trained 6 replicas as one model" in posthoc.stderr
    assert "Traceback" not in posthoc.stderr
    assert "tensorflow loaded: False" in posthoc.stdout
    # The test runs' form: one chosen pair per split.
    from blayers.lab.data.uci import uci_replicas

    chosen = uci_replicas(
        "toy", root=str(tmp_path / "uci"), chosen={2: {"dropout_rate": 0.1, "tau": 0.5}}
    )
    assert [r.name for r in chosen] == ["split2[dropout_rate=0.1,tau=0.5]seed0"]


def test_a_gp_s_loss_is_the_closed_form_variational_expectation():
    """The Regression task's NLL of a Gaussian likelihood of a GP's marginals is
    `-E_q[log N(y; f, sigma^2)]`, `GaussianLikelihood.variational_expectation`'s closed form
    (Hensman et al., 2013), not the one-draw estimate; replicated or not."""
    from blayers.layers import SparseGaussianProcess

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 20, 3)).astype("float32")
    y = rng.normal(size=(2, 20, 1)).astype("float32")
    gp = SparseGaussianProcess(1, num_inducing=4, replicas=2)
    likelihood = GaussianLikelihood(0.3, replicas=2)
    outputs = likelihood(gp(x))
    expected = -likelihood.variational_expectation(outputs.function, y)
    nll = Regression().negative_log_likelihood(outputs, y, example_axes=2)
    np.testing.assert_allclose(nll, expected[..., 0], rtol=1e-5)
    lone_gp, lone_likelihood = SparseGaussianProcess(1, num_inducing=4), GaussianLikelihood(0.3)
    lone = lone_likelihood(lone_gp(x[0]))
    expected = -lone_likelihood.variational_expectation(lone.function, y[0])
    np.testing.assert_allclose(
        Regression().negative_log_likelihood(lone, y[0]), expected[:, 0], rtol=1e-5
    )


def test_an_ensemble_s_members_are_scored_as_their_mixture(tmp_path):
    """A deep ensemble as replicas (`uci_replicas.ensemble_size`): every member of every split
    in one run, each its own seed and trajectory; each split's members are scored together, the
    uniform mixture of their Gaussian predictives (Lakshminarayanan et al., 2017), under the
    ensemble's name, and the mixture beats its average member."""
    from scipy.special import logsumexp

    from blayers.lab.data.uci import uci_replicas
    from tests.conftest import write_uci_folder

    write_uci_folder(tmp_path / "uci", rows=120, splits=2)
    members = uci_replicas("toy", root=str(tmp_path / "uci"), ensemble_size=3)
    assert [m.name for m in members[:3]] == [f"split0[]seed0member{k}" for k in range(3)]
    assert {m.ensemble for m in members} == {"split0[]seed0", "split1[]seed0"}
    assert [m.seed for m in members[:3]] == [0, 1, 2]

    def network(shape, outputs, replicas):
        return mlp(shape, outputs, hidden_units=(16,), dense_layer="Dense", replicas=replicas)

    learner, metrics = _run(
        tmp_path / "run", members, 120, network, batch_size=16, num_eval_samples=1
    )
    summary = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert summary["num_replicas"] == 6
    assert [u["name"] for u in summary["replicas"]] == ["split0[]seed0", "split1[]seed0"]
    assert summary["replicas"][0]["seed"] == [
        learner.replica_seeds[k] for k in range(3)
    ]  # the members' seeds
    data = learner.data
    x = np.stack([x for x, _ in data.tests])
    outputs = learner.model(x)
    likelihood = Regression().likelihood(outputs)
    mean, stddev = likelihood.mean().numpy(), likelihood.stddev().numpy()
    for unit, split in zip(summary["replicas"], (0, 1)):
        rows = range(3 * split, 3 * split + 3)
        y = data.tests[rows[0]][1]
        scale = data.members[rows[0]].data.target_scale
        log_density = [
            -0.5 * np.square((y - mean[r]) / stddev[r])
            - np.log(stddev[r])
            - 0.5 * np.log(2 * np.pi)
            for r in rows
        ]
        mixture = logsumexp(np.stack(log_density), axis=0) - np.log(3)
        expected = float(np.mean(mixture)) - np.log(scale)
        assert unit["final"]["test_log_likelihood"] == pytest.approx(expected, rel=1e-4)
        average_member = float(np.mean([np.mean(d) for d in log_density])) - np.log(scale)
        assert unit["final"]["test_log_likelihood"] >= average_member  # Jensen
    assert metrics["test_log_likelihood"] == pytest.approx(
        np.mean([u["final"]["test_log_likelihood"] for u in summary["replicas"]])
    )
    # The members learned, each its own: their means differ, and the ensemble's RMSE is well
    # under the targets' spread.
    assert not np.allclose(mean[0], mean[1])
    assert metrics["rmse"] < 0.5 * data.members[0].data.target_scale


def test_a_non_finite_replica_stops_the_run_at_its_step_and_is_named(tmp_path):
    """One replica's weights poisoned after the restore: the first step of a call of several
    is non-finite, the call ends there and the run stops naming the step and the replica; the
    other replicas' weights did not move on that step."""

    class Poisoned(SupervisedLearner):
        def restored(self):
            kernel = self.model.layers[1].kernel  # the first dense layer's [R, in, out]
            poisoned = kernel.numpy()
            poisoned[1, 0, 0] = np.nan
            kernel.assign(poisoned)
            self.before = [v.numpy() for v in self.model.trainable_variables]

    learner = Poisoned(
        data=REPLICAS,
        model=_mc_dropout,
        optimizer=lambda: keras.optimizers.Adam(1e-2),
        batch_size=32,
        num_eval_samples=5,
    )
    with pytest.raises(loop.NonFiniteLossError, match=r"at step 1 .*replica b \(the first of 3\)"):
        loop.train(
            str(tmp_path),
            learner=learner,
            train_steps=20,
            log_every=10,
            progress=False,
            plots=False,
        )
    assert learner.step == 1
    for before, after in zip(learner.before, learner.model.trainable_variables):
        np.testing.assert_array_equal(before[[0, 2]], after.numpy()[[0, 2]])
