"""PoissonProcess: log densities against closed forms, the quadrature rules against
their documented errors, thinning against Poisson moments; the shipped point patterns, the
kernel-intensity baseline and the Cox process fitted by variational inference over programs."""

import json

import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers.lab import data as data_lib
from blayers.lab.models import cox_process
from blayers.lab.tasks.point_process import kernel_intensity
from blayers.layers import PoissonProcess
from blayers.layers.point_process import quadrature_rule


def constant(value):
    return lambda x: tf.fill([tf.shape(x)[0]], tf.constant(value, x.dtype))


@pytest.mark.parametrize("bounds", [[[0.0, 2.0]], [[-1.0, 1.0], [0.0, 3.0]]])
def test_homogeneous_log_prob_is_n_log_lambda_minus_lambda_volume(bounds):
    rng = np.random.default_rng(0)
    low, high = np.array(bounds).T
    points = (low + (high - low) * rng.uniform(size=(7, len(bounds)))).astype("float32")
    process = PoissonProcess(constant(3.0), bounds, value=points)
    volume = np.prod(high - low)
    np.testing.assert_allclose(process.log_prob(points), 7 * np.log(3.0) - 3.0 * volume, rtol=1e-5)


def test_points_outside_the_window_have_zero_density():
    process = PoissonProcess(constant(1.0), [[0.0, 1.0]])
    assert process.log_prob(np.array([[0.5], [1.5]], "float32")).numpy() == -np.inf


def test_quadrature_errors_are_within_their_documented_bounds():
    # rate 5 exp(-x) on [0, 2]: integral 5 (1 - e^-2); |rate''| <= 5.
    exact = 5 * (1 - np.exp(-2.0))

    def rate(x):
        return 5.0 * tf.exp(-x[:, 0])

    points = np.array([[0.3], [1.7]], "float32")
    log_rates = np.log(5.0) - points.sum()
    for rule, size, bound in (
        ("midpoint", 32, 2.0 / 24 * (2.0 / 32) ** 2 * 5.0),
        ("gauss_legendre", 8, 1e-6),
    ):
        process = PoissonProcess(
            rate, [[0.0, 2.0]], quadrature=rule, num_quadrature_points=size, dtype=tf.float64
        )
        integral = log_rates + np.log(5.0) - float(process.log_prob(points.astype("float64")))
        assert abs(integral - exact) <= bound, (rule, integral - exact, bound)
    # Monte Carlo: unbiased over the nodes' draw, standard error |W| std(rate(U)) / sqrt(G).
    estimates = []
    for seed in range(200):
        nodes, weights = quadrature_rule([[0.0, 2.0]], "monte_carlo", 50, seed=seed)
        estimates.append(np.sum(weights * 5 * np.exp(-nodes[:, 0])))
    u = np.random.default_rng(0).uniform(0, 2, 100_000)
    se = 2.0 * np.std(5 * np.exp(-u)) / np.sqrt(50)
    np.testing.assert_allclose(np.std(estimates), se, rtol=0.2)
    assert abs(np.mean(estimates) - exact) < 5 * se / np.sqrt(len(estimates))


def test_thinning_gives_poisson_counts_at_the_rate():
    # rate 20 x on [0, 1]: count ~ Poisson(10), locations with density 2 x (mean 2/3).
    def rate(x):
        return 20.0 * x[:, 0]

    # One trace, a seed a call (600 eager draws took seconds).
    draw = tf.function(lambda s: PoissonProcess(rate, [[0.0, 1.0]], max_rate=20.0, seed=s).value)
    draws = [draw(tf.constant([s, 0])) for s in range(600)]
    counts = np.array([len(d) for d in draws])
    mean, n = 10.0, len(counts)
    assert abs(counts.mean() - mean) < 5 * np.sqrt(mean / n)
    # Var of the sample variance of Poisson(lam): (mu_4 - sigma^4) / n, mu_4 = lam (1 + 3 lam).
    assert abs(counts.var() - mean) < 5 * np.sqrt((mean * (1 + 3 * mean) - mean**2) / n)
    locations = np.concatenate([d.numpy()[:, 0] for d in draws])
    assert abs(locations.mean() - 2 / 3) < 5 * np.sqrt(1 / 18 / len(locations))


def test_thinning_refuses_a_rate_above_its_bound():
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_rate"):
        _ = PoissonProcess(constant(5.0), [[0.0, 4.0]], max_rate=1.0, seed=0).value


def test_bad_arguments_name_the_culprit():
    with pytest.raises(ValueError, match="bounds"):
        PoissonProcess(constant(1.0), [[1.0, 0.0]])
    with pytest.raises(TypeError, match="rate must be a callable"):
        PoissonProcess(3.0, [[0.0, 1.0]])
    with pytest.raises(ValueError, match="quadrature"):
        PoissonProcess(constant(1.0), [[0.0, 1.0]], quadrature="simpson")


def test_the_process_is_traceable_and_in_the_log_joint():
    points = np.array([[0.2], [0.9]], "float32")

    def model():
        lam = blayers.Gamma(2.0, 1.0, name="lam")
        return PoissonProcess(constant_from(lam), [[0.0, 1.0]], name="events")

    def constant_from(lam):
        return lambda x: tf.fill([tf.shape(x)[0]], tf.convert_to_tensor(lam))

    with blayers.tape() as recorded:
        value = blayers.make_log_joint(model)(lam=4.0, events=points)
    assert list(recorded) == ["lam", "events"]
    from scipy import stats

    expected = stats.gamma(2.0).logpdf(4.0) + 2 * np.log(4.0) - 4.0
    np.testing.assert_allclose(value, expected, rtol=1e-5)


def test_shipped_patterns_and_thinning_split():
    coal, window, _ = data_lib.load_pattern("coal")
    assert coal.shape == (191, 1) and window.tolist() == [[1851.0, 1963.0]]
    brambles, _, _ = data_lib.load_pattern("brambles")
    assert brambles.shape == (823, 2)
    data = data_lib.point_pattern("brambles", train_fraction=0.3, split_seed=1)
    assert data.num_train + data.num_test == 823
    assert abs(data.num_train - 0.3 * 823) < 5 * np.sqrt(823 * 0.3 * 0.7)


def test_kernel_intensity_integrates_to_the_count():
    points = np.random.default_rng(0).beta(2, 5, size=(300, 1))
    fn, bandwidth = kernel_intensity(points)
    grid = (np.arange(2000) + 0.5) / 2000
    np.testing.assert_allclose(np.mean(fn(grid[:, None])), 300, rtol=1e-3)
    assert 0.01 < bandwidth < 0.2


@pytest.mark.slow  # an end-to-end run
def test_cox_process_elbo_rises_and_beats_the_homogeneous_rate():
    tf.keras.utils.set_random_seed(0)
    data = data_lib.point_pattern("coal")
    points = np.concatenate([x.numpy()[None] for x, _ in data.train])
    model = cox_process((1,), 1, num_inducing=16, num_samples=2)
    model(points)
    import keras

    optimizer = keras.optimizers.Adam(0.01)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(points))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    def elbo():
        draws = [float(model.elbo(points, num_samples=32).elbo) for _ in range(4)]
        return np.mean(draws), np.std(draws) / np.sqrt(len(draws))

    before, se_before = elbo()
    for _ in range(200):
        step()
    after, se_after = elbo()
    assert after - before > 5 * np.hypot(se_before, se_after)
    metrics, _ = data.task.evaluate(model, data, num_samples=100)
    assert metrics["test_log_likelihood"] > metrics["homogeneous_test_log_likelihood"]


def test_deep_gp_prior_cox_process_runs():
    points = np.random.default_rng(0).uniform(size=(30, 2)).astype("float32")
    model = cox_process((2,), 1, hidden_units=(2,), num_inducing=8, num_quadrature_points=6)
    loss = model(points)
    assert loss.shape == (30,) and np.all(np.isfinite(loss))
    rates = model.posterior_rate(points, 3)
    assert rates.shape == (3, 30) and np.all(rates > 0)


def test_cox_smoke_run_elbo_rises(tmp_path):
    """The smoke config through the trainer, its first 150 steps (the whole run with the slow
    suite's experiment): the logged ELBO (per point, means over 25 steps) rises, the intensity
    plot is written and the held-out pattern beats a constant rate."""
    import gin

    from blayers.lab import config, loop

    config.parse(
        ["cox_process_smoke.gin"],
        ["train.progress = False", "train.train_steps = 150", "train.log_every = 25"],
    )
    try:
        metrics = loop.fit(str(tmp_path))
    finally:
        gin.clear_config()
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    elbo = [r["elbo"] for r in map(json.loads, lines) if r["kind"] == "train"]
    assert len(elbo) == 6 and elbo[-1] > elbo[0] + 0.1, elbo
    assert (tmp_path / "intensity.png").exists()
    assert metrics["test_log_likelihood"] > metrics["homogeneous_test_log_likelihood"]


def test_a_non_finite_elbo_names_its_variable():
    model = cox_process((1,), 1, num_inducing=4, num_quadrature_points=8)
    points = np.array([[0.2], [0.7]], "float32")
    model(points)
    assert model.non_finite_culprit(points) is None
    outside = np.array([[0.2], [1.5]], "float32")  # a point outside the window: p = 0
    assert model.non_finite_culprit(outside) == ("events", "model log density")
    layer = model.posterior_layers[0]
    layer.variational_mean.assign(np.full(layer.variational_mean.shape, np.nan))
    assert model.non_finite_culprit(points) == ("f", "posterior draw")
