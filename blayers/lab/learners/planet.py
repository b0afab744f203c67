"""Bayesian PlaNet (paper Section 3.2): the agent as a Learner under the Loop.

`PlanetLearner`'s calls are PlaNet's (Hafner et al., 2019):

    collect()         seed episodes of random actions at step 0, then one episode planned by
                      the cross-entropy method in the world model's latent space (with Gaussian
                      exploration noise) after every `collect_interval` training steps
    batches()         `[batch, chunk]` sequences drawn from the episode buffer until the next
                      collection
    evaluate()        a noise-free planned episode's return, a 50-step open-loop prediction
                      against the true observations, and the velocity probe (a linear
                      regression from latent states to the true joint velocities, fitted on
                      collected episodes, R^2 on the evaluation episode)
    outputs()         score.png (return per episode), weight_kl.png (the transition's weight
                      KL over training), open_loop.png (true frames or states above predicted
                      ones), training_curves.png

The loss per sequence is PlaNet's (reconstruction + reward NLL + latent KL with free nats,
and latent overshooting when `WorldModel.overshooting` is on)
plus `kl_weight * KL[q(W) || p(W)] / N`, the transition weights' KL over `N` the number of
training sequences (buffer steps / chunk length), as the paper adds it. Episodes live in the
run folder's `episodes/` (written whole as each ends), so a killed run loses no experience; a
checkpoint records how many episodes the buffer held, so a run resumed from an older
checkpoint sets the later ones aside and collects them again (the episode in progress at a
kill is replayed), ending as the uninterrupted run.

From the command line: `python -m blayers.train --gin_file=bayesian_planet_smoke
--model_dir=runs/planet` (the config binds `train.learner = @PlanetLearner()`).
"""

import itertools
import os

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from blayers import objectives, optimizers, seeds
from blayers.lab import plots
from blayers.lab.control.buffer import EpisodeBuffer
from blayers.lab.control.planner import cem
from blayers.lab.learners.base import KerasLearner, Steps, non_finite, refuse_strategy
from blayers.lab.learners.supervised import first_non_finite_layer
from blayers.lab.models.rssm import WorldModel

__all__ = ["PlanetLearner"]

STACKED_BYTES = 1 << 28  # the batches of one multi-step call, at most (256 MB)

_TERMS = (
    "loss",
    "reconstruction",
    "reward_nll",
    "latent_kl",
    "overshooting",
    "weight_kl_per_sequence",
)


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"PlanetLearner.{name} must be a positive integer, got {value!r}.")
    return int(value)


@gin.configurable(module="blayers.lab.learners")
class PlanetLearner(KerasLearner):
    """PlaNet's agent with a (Bayesian) world model; see the module docstring.

    Args:
      env: a `blayers.lab.control.env.ControlEnv` (in gin: `PlanetLearner.env = @control_env()`).
      seed_episodes: random-action episodes before the first training step (PlaNet: 5).
      collect_interval: training steps between collected episodes (PlaNet: 100).
      batch_size, chunk_length: sequences a step and their length (PlaNet: 50 and 50).
      learning_rate, adam_epsilon, clipnorm: Adam's (PlaNet: 1e-3, 1e-4, 1000).
      kl_weight: the weight of the transition weights' `KL / N`.
      action_noise: stddev of the Gaussian exploration noise on planned actions (PlaNet: 0.3).
      open_loop_context, open_loop_steps: observed then predicted steps of the open-loop
        evaluation (the paper's strip: 5 and 50).
    """

    progress_scalars = (("loss", "loss"), ("latent_kl", "latent_kl"))

    def __init__(
        self,
        env=gin.REQUIRED,
        seed_episodes=5,
        collect_interval=100,
        batch_size=50,
        chunk_length=50,
        learning_rate=1e-3,
        adam_epsilon=1e-4,
        clipnorm=1000.0,
        kl_weight=1.0,
        action_noise=0.3,
        open_loop_context=5,
        open_loop_steps=50,
    ):
        self.env = env
        self.seed_episodes = _positive("seed_episodes", seed_episodes)
        self.collect_interval = _positive("collect_interval", collect_interval)
        self.batch_size = _positive("batch_size", batch_size)
        self.chunk_length = _positive("chunk_length", chunk_length)
        self.learning_rate, self.adam_epsilon, self.clipnorm = learning_rate, adam_epsilon, clipnorm
        self.kl_weight, self.action_noise = float(kl_weight), float(action_noise)
        self.open_loop_context, self.open_loop_steps = int(open_loop_context), int(open_loop_steps)

    # -- build and state -------------------------------------------------------------------------
    def build(self, context):
        if context.strategy_name == "mesh" or context.strategy.num_replicas_in_sync > 1:
            refuse_strategy(self, context, "one device (the default strategy)")
        self.context, self.seed = context, context.seed
        seeds.set_seed(self.seed)
        self.buffer = EpisodeBuffer(context.run.file("episodes"))
        model = WorldModel(self.env.observation_shape, self.env.action_dim)
        optimizer = optimizers.Adam(  # Keras' Adam, one fused kernel a variable
            self.learning_rate, epsilon=self.adam_epsilon, clipnorm=self.clipnorm
        )
        optimizer.build(model.trainable_variables)
        self.track(model, optimizer)
        # The buffer's length when a checkpoint was written: a resume drops later episodes.
        self.episodes_saved = tf.Variable(-1, dtype=tf.int64, trainable=False, name="episodes")
        # No autograph: the functions have no tensor-valued Python control flow.
        self._train_step_fn = tf.function(self._train_step, reduce_retracing=True, autograph=False)
        self._train_steps_fn = None  # several steps a call (`train_steps`), traced once
        self._filter_fn = tf.function(self._filter, autograph=False)
        self._plan_fn = tf.function(self._plan, autograph=False)

    def state(self):
        return super().state(episodes=self.episodes_saved)

    def before_save(self):
        self.episodes_saved.assign(len(self.buffer))

    def restored(self):
        """The buffer as it was when the restored checkpoint was written: episodes collected
        after it (by a run killed later, or whose newer checkpoints are damaged) are set aside
        (`*.npz.superseded`) and collected again, exactly as the uninterrupted run collected
        them, so collection advances the random streams as it did."""
        step, kept = self.step, int(self.episodes_saved.numpy())
        if kept < 0:  # no checkpoint (or one from before the count): what its step implies
            kept = min(len(self.buffer), self.expected_episodes(step))
        if len(self.buffer) > kept:
            logging.warning(
                "Resuming at step %d, whose checkpoint saw %d episodes: episodes %d-%d are set "
                "aside as *.npz.superseded and collected again.",
                step,
                kept,
                kept,
                len(self.buffer) - 1,
            )
            self.buffer.truncate(kept)

    # -- collecting and training -----------------------------------------------------------------
    def expected_episodes(self, step):
        """Episodes the buffer holds once `collect()` has run at `step`."""
        return self.seed_episodes + step // self.collect_interval

    def collect(self):
        """Random episodes up to `seed_episodes`, then one planned episode per phase; episodes
        already on disk (a resumed run) count."""
        while len(self.buffer) < self.expected_episodes(self.step):
            index = len(self.buffer)
            planned = index >= self.seed_episodes
            episode = self.run_episode(index, planned=planned, noise=self.action_noise)
            self.buffer.add(
                episode["observations"],
                episode["actions"],
                episode["rewards"],
                velocities=episode["velocities"],
            )
            logging.info(
                "Episode %d (%s): return %.1f",
                index,
                "planned" if planned else "random",
                episode["return"],
            )
            self.context.scalars(self.step, "episode", {"return": episode["return"]})

    def batches(self):
        """Sequences from the buffer until the next collection. They come from the episodes
        the step implies, not any collected after a checkpoint by a run that was then killed
        (a resume stays the uninterrupted run)."""
        step = self.step
        end = (step // self.collect_interval + 1) * self.collect_interval
        episodes = self.expected_episodes(step)
        sequences = tf.constant(
            max(self.buffer.steps_in(episodes) / self.chunk_length, 1.0), tf.float32
        )
        for at in range(step, end):
            yield (
                *self.buffer.sample(self.batch_size, self.chunk_length, self.seed, at, episodes),
                sequences,
            )

    def train_step(self, batch):
        return dict(zip(_TERMS, (float(v) for v in self._train_step_fn(*batch))))

    def train_steps(self, n):
        """Up to `n` steps of the phase in one graph call (`compile_steps`): their batches are
        drawn on the host first, the same draws from `(seed, step)` as one a call, and stacked
        (at most `STACKED_BYTES` of them: a full-size batch of 64 x 64 frames is 37 MB), so
        the host reads the scalars once a call."""
        first = next(self._phase, None)
        if first is None:
            return Steps(0, {}, {})
        size = sum(np.asarray(part).nbytes for part in first)
        batches = [first, *itertools.islice(self._phase, max(min(n, STACKED_BYTES // size), 1) - 1)]
        stacked = [tf.constant(np.stack([b[k] for b in batches])) for k in range(len(first))]
        if self._train_steps_fn is None:

            def step_fn(batch):
                scalars = dict(zip(_TERMS, self._train_step(*batch)))
                scalars["non_finite"] = tf.cast(
                    tf.logical_not(tf.math.is_finite(scalars["loss"])), tf.float32
                )
                return scalars

            def next_batch(i, *parts):
                return i < tf.shape(parts[0])[0], lambda: tuple(part[i] for part in parts)

            names = (*_TERMS, "non_finite")
            self._train_steps_fn = self.compile_steps(step_fn, next_batch, names, autograph=False)
        count, sums, last = self.read_steps(
            self._train_steps_fn(tf.constant(len(batches)), *stacked)
        )
        return Steps(count, sums, last, batches[count - 1] if non_finite(last) else None)

    def log_extras(self):
        return {"episodes": len(self.buffer)}

    def diagnose_non_finite(self, batch):
        del batch
        culprit = first_non_finite_layer(self.model)
        if culprit:
            return f"first non-finite value in '{culprit[0]}' ({culprit[1]})"
        return "every world-model weight is finite (the loss of this batch is not)"

    # -- evaluation and outputs ------------------------------------------------------------------
    def evaluate(self):
        """A noise-free planned episode: its return, the open-loop prediction error from its
        first `open_loop_context` steps, and the velocity probe's R^2. The training random
        streams are restored afterwards."""
        with self.training_streams_kept():
            episode = self.run_episode(self.step, planned=True, noise=0.0, eval=True)
            open_loop = self.open_loop(episode)
            probe = self.velocity_probe(episode)
        metrics = {
            "eval_return": episode["return"],
            "open_loop_mse": open_loop["mse"],
            "velocity_probe_r2": probe,
            "train_return_last": self.buffer.returns()[-1],
            "episodes": float(len(self.buffer)),
            "env_steps": float(self.buffer.num_steps * self.env.action_repeat),
        }
        return metrics, {"open_loop": open_loop, "episode": episode}

    def outputs(self, run, records, metrics, arrays):
        del metrics
        paths = {
            name: run.file(f"{name}.png")
            for name in ("training_curves", "score", "weight_kl", "open_loop")
        }
        plots.history_panels(records, _TERMS, paths["training_curves"])
        plots.episode_returns({self.model.transition_name: [self.buffer.returns()]}, paths["score"])
        train = [r for r in records if r["kind"] == "train"]
        name = os.path.basename(os.path.normpath(run.path))
        plots.curve(
            [r["step"] for r in train],
            [r["weight_kl_per_sequence"] for r in train],
            "training step",
            "transition weight KL / N (nats per sequence)",
            paths["weight_kl"],
            title=f"{name}: the {self.model.transition_name} transition's weight KL per sequence",
            label=f"{self.model.transition_name} transition",
        )
        plots.open_loop_strip(
            arrays["open_loop"]["true"],
            arrays["open_loop"]["predicted"],
            paths["open_loop"],
            title=(
                f"{name}: {self.env.name}, {self.model.transition_name} transition, open-loop "
                f"prediction after {self.open_loop_context} observed steps"
            ),
        )
        summary = {
            "env": self.env.name,
            "transition": self.model.transition_name,
            "episode_returns": self.buffer.returns(),
        }
        return summary, list(paths.values())

    # -- the world model and the planner -----------------------------------------------------------
    def _train_step(self, observations, actions, rewards, sequences):
        with tf.GradientTape() as tape:
            terms = self.model((observations, actions, rewards))
            _, weight_kl = objectives.split_losses(self.model)
            loss, weight_term = self.model.objective(terms, weight_kl, sequences, self.kl_weight)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        self.step_variable.assign_add(1)
        return (
            loss,
            terms["reconstruction"],
            terms["reward"],
            terms["latent_kl"],
            terms["overshooting"],
            weight_term,
        )

    def _filter(self, state, action, observation):
        """The posterior state after `action` and the new `observation` (batch of one)."""
        embedding = self.model.encode(observation[None, None])[:, 0]
        transition = self.model.transition(add_losses=False)
        _, posterior, h = self.model.observe_step(state, action[None], embedding, transition)
        noise = self.model.latent_noise(tf.shape(posterior.mean()))
        return {"h": h, "z": posterior.mean() + posterior.stddev() * noise}

    def _plan(self, state, seed):
        def rollout_return(states, actions):
            features = self.model.imagine(states, actions)
            return tf.reduce_sum(self.model.reward(features), axis=1)

        action, _ = cem(state, rollout_return, self.env.action_dim, seed=seed)
        return action

    def run_episode(self, index, planned, noise, eval=False):
        """One episode: uniform random actions, or CEM plans with Gaussian noise of stddev
        `noise`. Returns its rows (see `EpisodeBuffer`), its return and the true velocities
        of each row (for the probe)."""
        rng = np.random.default_rng([self.seed, index, 1 if eval else 0])
        observation = self.env.reset(seed=rng.integers(2**31))
        action = np.zeros(self.env.action_dim, np.float32)
        state = self.model.initial_state(1)
        rows = {"observations": [observation], "actions": [action], "rewards": [0.0]}
        velocities = [self.env.velocity()]
        done = False
        while not done:
            if planned:
                state = self._filter_fn(state, tf.constant(action), tf.constant(observation))
                seed = tf.constant([self.seed * 7919 + index, len(rows["rewards"])], tf.int32)
                action = self._plan_fn(state, seed).numpy()
                action = np.clip(action + noise * rng.standard_normal(action.shape), -1, 1)
            else:
                action = rng.uniform(-1.0, 1.0, self.env.action_dim)
            action = action.astype(np.float32)
            observation, reward, done = self.env.step(action)
            rows["observations"].append(observation)
            rows["actions"].append(action)
            rows["rewards"].append(reward)
            velocities.append(self.env.velocity())
        return {
            **{k: np.asarray(v, np.float32) for k, v in rows.items()},
            "return": float(np.sum(rows["rewards"])),
            "velocities": np.asarray(velocities, np.float32),
        }

    def open_loop(self, episode):
        """Observes the first `open_loop_context` steps, then predicts the next
        `open_loop_steps` observations from the actions alone."""
        context = self.open_loop_context
        steps = min(self.open_loop_steps, len(episode["rewards"]) - context)
        observations = episode["observations"][None]
        actions = episode["actions"][None]
        _, state = self.model.observe(observations[:, :context], actions[:, :context])
        features = self.model.imagine(state, actions[:, context : context + steps])
        predicted = self.model.decode(features)[0].numpy()
        true = episode["observations"][context : context + steps]
        return {
            "true": true,
            "predicted": predicted,
            "mse": float(np.mean((predicted - true) ** 2)),
        }

    def latent_features(self, episode):
        """`[T + 1, h + z]` filtered latent states of a whole episode."""
        out, _ = self.model.observe(episode["observations"][None], episode["actions"][None])
        return np.concatenate([out["h"][0], out["z"][0]], -1)

    def velocity_probe(self, episode, train_episodes=5):
        """R^2 on `episode` of a linear (ridge) regression from latent states to the true
        velocities, fitted on the last `train_episodes` collected episodes (the paper's
        Figure 11 probe: how much of the physical state the latents hold)."""
        from sklearn.linear_model import Ridge

        fitted = [e for e in self.buffer.episodes if "velocities" in e][-train_episodes:]
        if not fitted:
            return float("nan")
        x = np.concatenate([self.latent_features(e) for e in fitted])
        y = np.concatenate([e["velocities"] for e in fitted])
        probe = Ridge(alpha=1.0).fit(x, y)
        return float(probe.score(self.latent_features(episode), episode["velocities"]))
