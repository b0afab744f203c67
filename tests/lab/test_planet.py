"""Bayesian PlaNet: the CEM planner, the RSSM world model and its Bayesian
transition's KL, the on-disk episode buffer, the dm_control tasks, and the agent loop with an
exact resume."""

import json
import pathlib
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

from blayers import objectives
from blayers.lab import config
from blayers.lab.control.buffer import EpisodeBuffer
from blayers.lab.control.planner import cem
from blayers.lab.models.rssm import WorldModel

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_cem_finds_the_optimum_of_a_known_reward_in_known_dynamics():
    # s_t = s_{t-1} + 0.5 a_t, reward -|s_t - target|^2: the optimum reaches the target in one
    # step (a_1 = 2 * target, inside [-1, 1]) and stays (a_t = 0): return 0.
    target = tf.constant([[0.5, -0.3]])

    def rollout_return(states, actions):
        positions = states["s"][:, None] + 0.5 * tf.cumsum(actions, axis=1)
        return -tf.reduce_sum(tf.square(positions - target), axis=[1, 2])

    state = {"s": tf.zeros([1, 2])}
    action, plan = cem(
        state,
        rollout_return,
        2,
        horizon=5,
        candidates=1000,
        top_k=50,
        iterations=12,
        seed=tf.constant([1, 2]),
    )
    np.testing.assert_allclose(action.numpy(), [1.0, -0.6], atol=0.05)
    achieved = rollout_return(state, plan[None]).numpy()[0]
    assert achieved > -0.01  # the optimum is 0; a zero plan scores -5 * 0.34 = -1.7
    with pytest.raises(ValueError, match="top_k"):
        cem(state, rollout_return, 2, candidates=10, top_k=20)


def _linear_system_episodes(count, steps, seed=0):
    """Episodes of a documented linear-Gaussian system: x' = A x + B a + 0.05 noise,
    observations x, reward -|x|^2; random actions."""
    rng = np.random.default_rng(seed)
    a_matrix = np.array([[0.9, 0.2, 0.0], [-0.2, 0.9, 0.0], [0.0, 0.0, 0.8]])
    b_matrix = np.array([[0.0], [0.5], [0.3]])
    episodes = []
    for _ in range(count):
        x = rng.normal(size=3)
        obs, acts, rews = [x], [np.zeros(1)], [0.0]
        for _ in range(steps):
            action = rng.uniform(-1, 1, 1)
            x = a_matrix @ x + b_matrix @ action + 0.05 * rng.normal(size=3)
            obs.append(x)
            acts.append(action)
            rews.append(-float(x @ x))
        episodes.append((np.array(obs), np.array(acts), np.array(rews)))
    return episodes


def test_rssm_loss_falls_on_recorded_episodes(tmp_path):
    buffer = EpisodeBuffer(str(tmp_path))
    for episode in _linear_system_episodes(8, 40):
        buffer.add(*episode)
    tf.keras.utils.set_random_seed(0)
    model = WorldModel((3,), 1, deterministic_size=32, stochastic_size=4, hidden_units=32)
    optimizer = tf.keras.optimizers.Adam(3e-3)

    @tf.function
    def step(o, a, r):
        with tf.GradientTape() as tape:
            terms = model((o, a, r))
            _, kl = objectives.split_losses(model)
            loss, _ = model.objective(terms, kl, num_sequences=16.0)
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        )
        return terms["reconstruction"] + terms["reward"]

    # 100 steps: the last 20 losses' mean is about 0.13 of the first 20's (0.09 after 200)
    losses = [float(step(*buffer.sample(16, 20, 0, i))) for i in range(100)]
    first, last = np.mean(losses[:20]), np.mean(losses[-20:])
    assert last < 0.3 * first, (first, last)


def test_weight_kl_is_in_the_loss_and_reaches_the_transition_posterior():
    o, a, r = tf.random.normal((4, 6, 3)), tf.random.normal((4, 6, 1)), tf.random.normal((4, 6))
    bayesian = WorldModel((3,), 1, deterministic_size=8, stochastic_size=2, hidden_units=8)
    with tf.GradientTape() as tape:
        bayesian((o, a, r))
        _, kl = objectives.split_losses(bayesian)
    # Two Bayesian layers (input and prior), one weight draw each per batch of sequences.
    assert len(bayesian.losses) == 2 and float(kl) > 0
    transition = [v for v in bayesian.trainable_variables if "transition_" in v.path]
    grads = tape.gradient(kl, transition)
    stddev_params = [
        v.path
        for v, g in zip(transition, grads)
        if g is not None and "kernel" in v.path and float(tf.reduce_max(tf.abs(g))) > 0
    ]
    assert any("transition_input" in p for p in stddev_params)
    assert any("transition_prior" in p for p in stddev_params)
    deterministic = WorldModel(
        (3,), 1, deterministic_size=8, stochastic_size=2, hidden_units=8, transition_layer="Dense"
    )
    deterministic((o, a, r))
    assert float(objectives.split_losses(deterministic)[1]) == 0.0


def test_latent_overshooting_at_distance_one_is_the_filtering_kl():
    import tensorflow_probability as tfp

    tf.keras.utils.set_random_seed(0)
    model = WorldModel(
        (3,), 1, deterministic_size=8, stochastic_size=2, hidden_units=8, free_nats=0.0
    )
    o, a = tf.random.normal((4, 6, 3)), tf.random.normal((4, 6, 1))
    transition = model.transition(add_losses=False)
    out, _ = model.observe(o, a, transition=transition)
    mvn = tfp.distributions.MultivariateNormalDiag
    filtering = mvn(out["qm"], out["qs"]).kl_divergence(mvn(out["pm"], out["ps"]))
    expected = float(tf.reduce_mean(tf.reduce_sum(filtering[:, 1:], 1)))
    one = float(model.overshooting_kl(out, a, 1, transition, free_nats=0.0))
    assert one == pytest.approx(expected, rel=1e-5)
    # Longer distances predict open-loop: a different, finite term with gradients to the
    # transition and none to the (fixed) posterior targets' networks.
    with tf.GradientTape() as tape:
        out, _ = model.observe(o, a, transition=transition)
        three = model.overshooting_kl(out, a, 3, transition, free_nats=0.0)
    grads = dict(
        zip(
            (v.path for v in model.trainable_variables),
            tape.gradient(three, model.trainable_variables),
        )
    )
    assert np.isfinite(float(three)) and float(three) != pytest.approx(one)
    assert any("transition_prior" in p and g is not None for p, g in grads.items())
    assert all(g is None for p, g in grads.items() if "posterior_head" in p)
    with pytest.raises(ValueError, match="overshooting"):
        WorldModel((3,), 1, overshooting=-1)
    on = WorldModel(
        (3,), 1, deterministic_size=8, stochastic_size=2, hidden_units=8, overshooting=2
    )
    assert float(on((o, a, tf.zeros((4, 6))))["overshooting"]) > 0
    longer = WorldModel(
        (3,), 1, deterministic_size=8, stochastic_size=2, hidden_units=8, overshooting=10
    )  # longer than the chunk: capped at T - 1
    assert np.isfinite(float(longer((o, a, tf.zeros((4, 6))))["overshooting"]))


def test_episode_buffer_survives_a_restart_and_a_torn_write(tmp_path):
    buffer = EpisodeBuffer(str(tmp_path))
    episodes = _linear_system_episodes(3, 10)
    for episode in episodes:
        buffer.add(*episode)
    (tmp_path / "000003.tmp.npz").write_bytes(b"torn")  # a write a kill interrupted
    again = EpisodeBuffer(str(tmp_path))
    assert len(again) == 3 and again.num_steps == 30
    assert not (tmp_path / "000003.tmp.npz").exists()
    np.testing.assert_array_equal(
        again.episodes[1]["observations"], episodes[1][0].astype(np.float32)
    )
    np.testing.assert_array_equal(again.sample(4, 5, 0, 7)[0], buffer.sample(4, 5, 0, 7)[0])
    # A resumed agent samples only the episodes its step implies.
    first_only = again.sample(16, 5, 0, 3, episodes=1)[0]
    rows = {tuple(r) for r in again.episodes[0]["observations"]}
    assert all(tuple(r) in rows for chunk in first_only for r in chunk)
    assert again.steps_in(1) == 10
    with pytest.raises(ValueError, match="rows differ"):
        buffer.add(np.zeros((3, 2)), np.zeros((2, 1)), np.zeros(3))


def test_truncating_the_buffer_sets_later_episodes_aside(tmp_path):
    buffer = EpisodeBuffer(str(tmp_path))
    for episode in _linear_system_episodes(3, 10):
        buffer.add(*episode)
    buffer.truncate(1)
    assert len(buffer) == 1 and len(EpisodeBuffer(str(tmp_path))) == 1
    assert sorted(p.name for p in tmp_path.glob("*.superseded")) == [
        "000001.npz.superseded",
        "000002.npz.superseded",
    ]
    assert buffer.add(*_linear_system_episodes(1, 10)[0]) == 1


def test_a_damaged_episode_is_named_and_set_aside_with_the_later_ones(tmp_path, caplog):
    buffer = EpisodeBuffer(str(tmp_path))
    for episode in _linear_system_episodes(3, 10):
        buffer.add(*episode)
    (tmp_path / "000001.npz").write_bytes(b"not a zip file")  # a bad disk, a bad copy
    with caplog.at_level("WARNING"):
        again = EpisodeBuffer(str(tmp_path))
    assert len(again) == 1  # collection resumes at episode 1, numbered as before
    assert any("000001.npz" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in tmp_path.glob("*.damaged")) == [
        "000001.npz.damaged",
        "000002.npz.damaged",
    ]
    assert again.add(*_linear_system_episodes(1, 10)[0]) == 1


def test_control_env_states_and_pixels_next_to_tensorflow():
    pytest.importorskip("dm_control")
    from blayers.lab.control.env import ControlEnv

    env = ControlEnv("cartpole", "balance", "state", action_repeat=2, episode_steps=5)
    first = env.reset(seed=3)
    assert first.shape == env.observation_shape == (5,)
    np.testing.assert_array_equal(env.reset(seed=3), first)  # the seed fixes the start
    steps = [env.step(np.zeros(env.action_dim)) for _ in range(5)]
    assert steps[-1][2] and not steps[0][2] and all(r >= 0 for _, r, _ in steps)
    env.close()
    # Pixels render in the child process although this process has loaded TensorFlow.
    pixels = ControlEnv("cartpole", "swingup", "pixels", episode_steps=2, size=32)
    image = pixels.reset(seed=0)
    assert image.shape == (32, 32, 3) and -0.5 <= image.min() < image.max() <= 0.5
    pixels.close()
    with pytest.raises(ValueError, match="observation"):
        ControlEnv("cartpole", "balance", "rgb")


def _planet(model_dir, steps, *bindings):
    from blayers.lab import loop

    gin.clear_config()
    config.parse(["bayesian_planet_smoke"], [f"train.train_steps = {steps}", *bindings])
    loop.train(str(model_dir))
    return json.loads((model_dir / "metrics.json").read_text())


@pytest.mark.slow  # an end-to-end run
def test_planet_agent_resumes_collection_exactly_with_its_buffer_intact(tmp_path):
    pytest.importorskip("dm_control")
    straight = _planet(tmp_path / "straight", 40)
    first = _planet(tmp_path / "resumed", 20)
    saved = {p.name: p.read_bytes() for p in (tmp_path / "resumed" / "episodes").iterdir()}
    resumed = _planet(tmp_path / "resumed", 40)
    assert len(first["episode_returns"]) == 2 and resumed["resumed_from_step"] == 20
    # The episodes on disk before the stop are untouched; one more was collected after it.
    for name, data in saved.items():
        assert (tmp_path / "resumed" / "episodes" / name).read_bytes() == data
    assert len(resumed["episode_returns"]) == 3
    # Data order, latent and weight noise, planner draws and episode starts are functions of
    # the seed and the step: the resumed run is the uninterrupted one.
    np.testing.assert_allclose(resumed["episode_returns"], straight["episode_returns"], rtol=1e-5)
    for key in ("eval_return", "open_loop_mse"):
        assert resumed["final"][key] == pytest.approx(straight["final"][key], rel=1e-4), key
    for name in ("score.png", "weight_kl.png", "open_loop.png", "training_curves.png"):
        assert (tmp_path / "straight" / name).exists(), name
    history = [json.loads(line) for line in (tmp_path / "straight" / "history.jsonl").open()]
    train = [h for h in history if h["kind"] == "train"]
    assert train and all(h["weight_kl_per_sequence"] > 0 for h in train)


@pytest.mark.slow  # an end-to-end run
def test_planet_resumes_exactly_from_an_older_checkpoint(tmp_path):
    """The newest checkpoints lost (damaged, deleted): the run resumes from an older one, sets
    aside the episodes collected after it, collects them again and ends as the uninterrupted
    run."""
    pytest.importorskip("dm_control")
    every = ("train.checkpoint_every = 10", "train.keep_checkpoints = 5")
    straight = _planet(tmp_path / "straight", 40, *every)
    _planet(tmp_path / "cut", 40, *every)
    checkpoints = tmp_path / "cut" / "checkpoints"
    for step in (20, 30, 40):
        for path in checkpoints.glob(f"ckpt-{step}.*"):
            path.unlink()
    resumed = _planet(tmp_path / "cut", 40, *every)
    assert resumed["resumed_from_step"] == 10
    assert list((tmp_path / "cut" / "episodes").glob("*.npz.superseded"))
    np.testing.assert_allclose(resumed["episode_returns"], straight["episode_returns"], rtol=1e-5)
    for key in ("eval_return", "open_loop_mse"):
        assert resumed["final"][key] == pytest.approx(straight["final"][key], rel=1e-4), key


@pytest.mark.slow  # an end-to-end run
def test_planet_smoke_config_through_the_cli(tmp_path):
    pytest.importorskip("dm_control")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "blayers.train",
            "--gin_file=bayesian_planet_smoke",
            "--gin_param=train.train_steps = 20",
            f"--model_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    final = json.loads((tmp_path / "metrics.json").read_text())["final"]
    assert np.isfinite(final["eval_return"]) and final["episodes"] == 2
