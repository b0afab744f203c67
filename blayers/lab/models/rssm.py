"""PlaNet's recurrent state-space model with a Bayesian transition (paper Section 3.2).

The latent state is `(h_t, z_t)`: a deterministic GRU path `h_t = GRU(h_{t-1}, f(z_{t-1},
a_{t-1}))` and a stochastic `z_t`, with prior `p(z_t | h_t)` and posterior `q(z_t | h_t, e_t)`
(`e_t` the encoded observation), as Hafner et al. (2019). The transition's feed-forward layers
(`f` and the prior's hidden layer) are `transition_layer`s: `'DenseReparameterization'` for
the paper's Bayesian PlaNet (their weight KL joins the loss), `'Dense'` for the deterministic
agent. Observations are pixels `[64, 64, 3]` in [-0.5, 0.5] (convolutional encoder and
decoder) or state vectors (MLPs).

`WorldModel.loss(observations, actions, rewards)` on `[batch, time, ...]` sequences returns
PlaNet's per-sequence terms: reconstruction and reward NLL (unit-variance Gaussians, summed
over time), the latent KL `sum_t max(free_nats, KL[q(z_t) || p(z_t)])`; the weights' KL is in
`model.losses`, which the trainer divides by the number of training sequences.
"""

import gin
import keras
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import seeds
from blayers.layers.base import BayesianLayer
from blayers.registry import get_layer

tfd = tfp.distributions

__all__ = ["WorldModel"]

_MIN_STDDEV = 0.1


class _Encoder(keras.layers.Layer):
    def __init__(self, pixels, units, **kwargs):
        super().__init__(**kwargs)
        if pixels:  # PlaNet's: 4 convolutions, 4x4 kernels, stride 2, 32-256 channels
            self.net = [
                keras.layers.Conv2D(32 * 2**i, 4, strides=2, activation="relu") for i in range(4)
            ] + [keras.layers.Flatten()]
        else:
            self.net = [keras.layers.Dense(units, activation="elu") for _ in range(2)]

    def call(self, x):
        for layer in self.net:
            x = layer(x)
        return x


class _Decoder(keras.layers.Layer):
    def __init__(self, pixels, observation_shape, units, **kwargs):
        super().__init__(**kwargs)
        self.pixels = pixels
        if pixels:
            self.net = [
                keras.layers.Dense(1024),
                keras.layers.Reshape((1, 1, 1024)),
                keras.layers.Conv2DTranspose(128, 5, strides=2, activation="relu"),
                keras.layers.Conv2DTranspose(64, 5, strides=2, activation="relu"),
                keras.layers.Conv2DTranspose(32, 6, strides=2, activation="relu"),
                keras.layers.Conv2DTranspose(observation_shape[-1], 6, strides=2),
            ]
        else:
            self.net = [keras.layers.Dense(units, activation="elu") for _ in range(2)] + [
                keras.layers.Dense(observation_shape[-1])
            ]

    def call(self, x):
        for layer in self.net:
            x = layer(x)
        return x


@gin.configurable(module="blayers.lab.models", denylist=["observation_shape", "action_dim"])
class WorldModel(keras.Model):
    """The RSSM, its encoder, decoder and reward model.

    Args:
      observation_shape: `(64, 64, 3)` pixels or `(d,)` states.
      action_dim: action dimensions.
      deterministic_size, stochastic_size: `h` and `z` sizes (PlaNet: 200 and 30).
      hidden_units: width of the transition's, posterior's, reward's and state MLPs' layers.
      transition_layer: the transition's feed-forward layer, a blayers or Keras layer name
        (`'DenseReparameterization'`: the paper's Bayesian PlaNet; `'Dense'`: deterministic).
      free_nats: the latent KL's floor per time step (PlaNet: 3).
      overshooting: latent overshooting's longest distance `D` (Hafner et al., 2019, Sec. 4;
        0: off): the priors predicted `d = 1..D` steps open-loop from each posterior state are
        pulled towards the (fixed) posteriors there, `overshooting_scale / D` times the sum
        over `d` of their per-sequence KL (free nats applied per step).
      overshooting_scale: the weight `beta` of that term.
    """

    def __init__(
        self,
        observation_shape,
        action_dim,
        deterministic_size=200,
        stochastic_size=30,
        hidden_units=200,
        transition_layer="DenseReparameterization",
        free_nats=3.0,
        overshooting=0,
        overshooting_scale=1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.observation_shape = tuple(observation_shape)
        self.pixels = len(self.observation_shape) == 3
        self.action_dim = int(action_dim)
        self.deterministic_size, self.stochastic_size = deterministic_size, stochastic_size
        self.free_nats = float(free_nats)
        if int(overshooting) < 0:
            raise ValueError(f"WorldModel.overshooting must be >= 0, got {overshooting}.")
        self.overshooting, self.overshooting_scale = int(overshooting), float(overshooting_scale)
        # Latent noise comes from this generator (its state is checkpointed with the model), so
        # a resumed run draws what the uninterrupted one would.
        self.seed_generator = keras.random.SeedGenerator(name="latent_noise")
        layer = get_layer(transition_layer)
        self.transition_name = getattr(layer, "__name__", str(transition_layer))
        self.transition_input = layer(hidden_units, activation="elu", name="transition_input")
        self.gru = keras.layers.GRUCell(deterministic_size, name="transition_gru")
        self.prior_hidden = layer(hidden_units, activation="elu", name="transition_prior")
        # Built up front: a sequence draws their weights before its first step.
        self.transition_input.build((None, stochastic_size + self.action_dim))
        self.prior_hidden.build((None, deterministic_size))
        self.prior_head = keras.layers.Dense(2 * stochastic_size, name="prior_head")
        self.posterior_hidden = keras.layers.Dense(hidden_units, activation="elu")
        self.posterior_head = keras.layers.Dense(2 * stochastic_size)
        self.encoder = _Encoder(self.pixels, hidden_units, name="encoder")
        self.decoder = _Decoder(self.pixels, self.observation_shape, hidden_units, name="decoder")
        self.reward_model = [
            keras.layers.Dense(hidden_units, activation="elu"),
            keras.layers.Dense(hidden_units, activation="elu"),
            keras.layers.Dense(1),
        ]
        self._build_all()

    def _build_all(self):
        observations = tf.zeros((1, 2, *self.observation_shape))
        actions = tf.zeros((1, 2, self.action_dim))
        self.loss_terms(observations, actions, tf.zeros((1, 2)))

    # -- the state-space model --------------------------------------------------------------
    def initial_state(self, batch):
        return {
            "h": tf.zeros((batch, self.deterministic_size)),
            "z": tf.zeros((batch, self.stochastic_size)),
        }

    @staticmethod
    def _normal(params):
        mean, raw = tf.split(params, 2, axis=-1)
        return tfd.MultivariateNormalDiag(mean, tf.nn.softplus(raw) + _MIN_STDDEV)

    def transition(self, add_losses=True):
        """The transition's feed-forward maps with one weight draw, shared by every step of a
        sequence (or of a planner's imagined rollouts): `(input_fn, prior_hidden_fn)`. With
        `add_losses`, the draw's KL joins `self.losses` (inside a Keras call)."""

        def fixed(layer):
            if not isinstance(layer, BayesianLayer):
                return layer
            layer.call_weights(add_losses=add_losses)
            kernel = layer.kernel_fn("kernel")
            return lambda x: layer.add_bias_and_activate(kernel(x))

        return fixed(self.transition_input), fixed(self.prior_hidden)

    def prior_step(self, state, action, transition):
        """`(h_t, p(z_t | h_t))` after `action` from `state`: the transition alone."""
        input_fn, prior_fn = transition
        x = input_fn(tf.concat([state["z"], action], -1))
        h, _ = self.gru(x, [state["h"]])
        return h, self._normal(self.prior_head(prior_fn(h)))

    def latent_noise(self, shape):
        """Standard normal noise of `shape` from the model's seed generator."""
        return tf.random.stateless_normal(shape, seeds.next_seed(self.seed_generator))

    def observe_step(self, state, action, embedding, transition):
        """`(prior, posterior, h)`: one filtering step with the encoded observation."""
        h, prior = self.prior_step(state, action, transition)
        posterior = self._normal(
            self.posterior_head(self.posterior_hidden(tf.concat([h, embedding], -1)))
        )
        return prior, posterior, h

    def encode(self, observations):
        """`[batch, time, ...]` observations to `[batch, time, units]` embeddings."""
        shape = tf.shape(observations)
        flat = tf.reshape(observations, tf.concat([[-1], shape[2:]], 0))
        embedded = self.encoder(flat)
        return tf.reshape(embedded, tf.concat([shape[:2], [-1]], 0))

    def decode(self, features):
        """Observation means of `[batch, time, h + z]` features."""
        shape = tf.shape(features)
        out = self.decoder(tf.reshape(features, [-1, features.shape[-1]]))
        return tf.reshape(out, tf.concat([shape[:2], self.observation_shape], 0))

    def reward(self, features):
        x = features
        for layer in self.reward_model:
            x = layer(x)
        return tf.squeeze(x, -1)

    def observe(self, observations, actions, state=None, transition=None):
        """Filters `[batch, time]` sequences; `actions[:, t]` is the action taken before
        `observations[:, t]`. Returns per-step `h`, `z` (posterior samples), the priors' and
        posteriors' means and stddevs, as `[batch, time, ...]` tensors, and the last state."""
        transition = transition or self.transition(add_losses=False)
        observations = tf.convert_to_tensor(observations, tf.float32)
        actions = tf.convert_to_tensor(actions, tf.float32)
        embeddings = self.encode(observations)
        state = state or self.initial_state(tf.shape(observations)[0])

        def step(carry, inputs):
            action, embedding, noise = inputs
            prior, posterior, h = self.observe_step(
                {"h": carry["h"], "z": carry["z"]}, action, embedding, transition
            )
            return {
                "h": h,
                "z": posterior.mean() + posterior.stddev() * noise,
                "pm": prior.mean(),
                "ps": prior.stddev(),
                "qm": posterior.mean(),
                "qs": posterior.stddev(),
            }

        zeros = tf.zeros_like(state["z"])
        initial = {**state, "pm": zeros, "ps": zeros, "qm": zeros, "qs": zeros}
        time_major = lambda x: tf.transpose(x, [1, 0, *range(2, x.shape.rank)])
        noise = self.latent_noise(tf.concat([tf.shape(actions)[1:2], tf.shape(state["z"])], 0))
        out = tf.scan(
            step, (time_major(actions), time_major(embeddings), noise), initializer=initial
        )
        out = {k: time_major(v) for k, v in out.items()}
        return out, {"h": out["h"][:, -1], "z": out["z"][:, -1]}

    def imagine(self, state, actions, transition=None):
        """Open-loop rollout of `[batch, time, action]` from `state` with the prior (one
        transition weight draw for all of it): `[batch, time, h + z]` features."""
        transition = transition or self.transition(add_losses=False)

        def step(carry, inputs):
            action, noise = inputs
            h, prior = self.prior_step(carry, action, transition)
            return {"h": h, "z": prior.mean() + prior.stddev() * noise}

        actions = tf.convert_to_tensor(actions, tf.float32)
        noise = self.latent_noise(tf.concat([tf.shape(actions)[1:2], tf.shape(state["z"])], 0))
        out = tf.scan(step, (tf.transpose(actions, [1, 0, 2]), noise), initializer=dict(state))
        features = tf.concat([out["h"], out["z"]], -1)
        return tf.transpose(features, [1, 0, 2])

    # -- the objective -------------------------------------------------------------------------
    def loss_terms(self, observations, actions, rewards):
        """Per-sequence means over the batch: `reconstruction`, `reward` (NLLs summed over
        time, up to their constants), `latent_kl` (free nats applied per step) and
        `overshooting` (0 when off). Inside a Keras call the transition's weight KL (one draw
        per batch of sequences) joins `self.losses`."""
        transition = self.transition(add_losses=True)
        out, _ = self.observe(observations, actions, transition=transition)
        features = tf.concat([out["h"], out["z"]], -1)
        squared = tf.square(self.decode(features) - observations)
        axes = list(range(2, 2 + len(self.observation_shape)))
        # Unit-variance Gaussians: the NLL is the squared error / 2 (plus a constant).
        reconstruction = tf.reduce_sum(squared, axes) / 2.0
        reward = tf.square(self.reward(features) - rewards) / 2.0
        posterior = tfd.MultivariateNormalDiag(out["qm"], out["qs"])
        prior = tfd.MultivariateNormalDiag(out["pm"], out["ps"])
        latent_kl = tf.maximum(posterior.kl_divergence(prior), self.free_nats)
        total = lambda x: tf.reduce_mean(tf.reduce_sum(x, 1))
        overshooting = tf.constant(0.0)
        if self.overshooting:
            overshooting = self.overshooting_scale * self.overshooting_kl(
                out, actions, self.overshooting, transition
            )
        return {
            "reconstruction": total(reconstruction),
            "reward": total(reward),
            "latent_kl": total(latent_kl),
            "overshooting": overshooting,
        }, out

    def overshooting_kl(self, out, actions, distance, transition, free_nats=None):
        """`(1 / D) sum_{d=1..D} sum_t max(free, KL[sg(q(z_t)) || p_d(z_t)])`, batch mean:
        `p_d` is the prior predicted open-loop `d` steps from the posterior state at `t - d`
        with the actions taken; posteriors are fixed targets (stop-gradient), as PlaNet's.
        At `d = 1` it is the filtering KL of steps `1..T-1`."""
        free = self.free_nats if free_nats is None else free_nats
        actions = tf.convert_to_tensor(actions, tf.float32)
        steps = actions.shape[1] if actions.shape[1] is not None else tf.shape(actions)[1]
        if isinstance(steps, int):
            if steps < 2:
                return tf.constant(0.0)  # no step has a predecessor to predict it from
            distance = min(distance, steps - 1)  # longer predictions have no target
        starts = steps - 1
        flat = lambda x: tf.reshape(x, [-1, x.shape[-1]])
        state = {"h": flat(out["h"][:, :-1]), "z": flat(out["z"][:, :-1])}
        # Shifted by k, padded past the end (padding rows are masked out below; a stddev pads
        # with 1 so that their KL stays finite).
        pad = lambda x, k, value=0.0: tf.pad(
            x[:, k:], [[0, 0], [0, starts - tf.shape(x[:, k:])[1]], [0, 0]], constant_values=value
        )
        targets = {k: tf.stop_gradient(out[k]) for k in ("qm", "qs")}
        total = 0.0
        for d in range(1, distance + 1):
            h, prior = self.prior_step(state, flat(pad(actions, d)), transition)
            target = tfd.MultivariateNormalDiag(
                flat(pad(targets["qm"], d)), flat(pad(targets["qs"], d, 1.0))
            )
            kl = tf.maximum(target.kl_divergence(prior), free)
            kl = tf.reshape(kl, [-1, starts])
            valid = (tf.range(starts) + d < steps)[None]  # the target exists
            total += tf.reduce_mean(tf.reduce_sum(tf.where(valid, kl, 0.0), 1))
            noise = self.latent_noise(tf.shape(prior.mean()))
            state = {"h": h, "z": prior.mean() + prior.stddev() * noise}
        return total / distance

    @staticmethod
    def objective(terms, weight_kl, num_sequences, kl_weight=1.0):
        """`(loss, weight_term)`: PlaNet's loss (reconstruction + reward + latent KL +
        overshooting, from `call`'s terms) plus the weight KL over the training sequences,
        `kl_weight * weight_kl / num_sequences` (the paper's Bayesian PlaNet objective)."""
        weight_term = kl_weight * weight_kl / num_sequences
        loss = (
            terms["reconstruction"]
            + terms["reward"]
            + terms["latent_kl"]
            + terms["overshooting"]
            + weight_term
        )
        return loss, weight_term

    def call(self, inputs):
        observations, actions, rewards = inputs
        terms, _ = self.loss_terms(observations, actions, rewards)
        return terms
