"""Stochastic-gradient MCMC: samplers of a network's weight posterior as Keras optimizers, and the
kept samples as one model.

The potential is `U(theta) = N * L(theta)` for the per-example loss `L = mean NLL + (-log
prior) / N` a Keras training step minimizes (`N`: the training examples), so the samplers take
the learning rate `lr` of that loss, as an optimizer does, and `num_data = N`:

* `SGLD` (Welling & Teh, 2011): `theta <- theta - lr g + sqrt(2 lr T / N) xi`, the Langevin
  step `eps = 2 lr / N` on `U`;
* `SGHMC` (Chen et al., 2014), with friction `alpha` (the momentum's decay):
  `v <- (1 - alpha) v - lr g + sqrt(2 alpha lr T / N) xi`, `theta <- theta + v`;
* `CyclicalSchedule` (Zhang et al., ICLR 2020, cyclical SG-MCMC): the cosine step size
  `lr_k = lr_0 / 2 (cos(pi mod(k, C) / C) + 1)` over cycles of `C` steps, an exploration stage
  (the first `exploration_fraction` of a cycle: no noise, an optimizer) and a sampling stage;
  either sampler reads it as its learning rate and adds noise in the sampling stage only.

`T` is the temperature (1: the posterior; below 1, the "cold" posteriors of Wenzel et al.,
2020); `xi ~ N(0, I)` is stateless, a function of the sampler's seed, its step and the
variable's index, so a run restored from a checkpoint (which holds the step) draws the same
noise as the uninterrupted one.

`PosteriorSamples` keeps thinned samples of a model's weights in variables (a checkpoint holds
them) and is itself a model: each call runs the network under the next kept sample, so
`blayers.predict(samples, x, num_samples=samples.num_kept)` averages the predictive over the
samples, `p(y | x) = 1/S sum_s p(y | x, theta_s)`.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from blayers.random_variable import RandomVariable

__all__ = ["SGHMC", "SGLD", "CyclicalSchedule", "PosteriorSamples"]


def _check_positive(owner, name, value, allow_zero=False):
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.number))
        or not (value > 0 or (allow_zero and value == 0))
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{owner}: {name} must be a number {bound}, got {value!r}.")
    return float(value)


@keras.saving.register_keras_serializable("blayers.sgmcmc")
class CyclicalSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Cyclical SG-MCMC's step size (Zhang et al., 2020, Eq. 1) and stages.

    Args:
      initial_learning_rate: `lr_0`, the step size at each cycle's start.
      cycle_length: steps `C` a cycle (the paper's `ceil(K / M)` for `K` steps and `M` cycles).
      exploration_fraction: `beta`, the part of each cycle without noise (the paper's code
        samples in the last 3 of 50 epochs a cycle, `beta = 0.94`; 0.8 here by default).
    """

    def __init__(self, initial_learning_rate, cycle_length, exploration_fraction=0.8):
        self.initial_learning_rate = _check_positive(
            "CyclicalSchedule", "initial_learning_rate", initial_learning_rate
        )
        if not isinstance(cycle_length, (int, np.integer)) or cycle_length < 1:
            raise ValueError(
                f"CyclicalSchedule: cycle_length must be a positive int, got {cycle_length!r}."
            )
        if not 0.0 <= exploration_fraction < 1.0:
            raise ValueError(
                "CyclicalSchedule: exploration_fraction must be in [0, 1), got "
                f"{exploration_fraction!r}."
            )
        self.cycle_length = int(cycle_length)
        self.exploration_fraction = float(exploration_fraction)

    def _position(self, step):
        """`mod(step, C) / C` in [0, 1): where `step` (0-based) falls in its cycle."""
        step = tf.cast(step, tf.int64)
        return tf.cast(step % self.cycle_length, tf.float32) / float(self.cycle_length)

    def __call__(self, step):
        return 0.5 * self.initial_learning_rate * (tf.cos(math.pi * self._position(step)) + 1.0)

    def sampling(self, step):
        """1.0 in the sampling stage of `step`'s cycle, else 0.0 (exploration: no noise)."""
        return tf.cast(self._position(step) >= self.exploration_fraction, tf.float32)

    def get_config(self):
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "cycle_length": self.cycle_length,
            "exploration_fraction": self.exploration_fraction,
        }


class _Sampler(keras.optimizers.Optimizer):
    """The shared noise: `scale * xi`, `xi` a stateless normal of (seed, step, variable)."""

    def __init__(self, learning_rate, num_data, temperature, seed, name, **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        owner = type(self).__name__
        self.num_data = _check_positive(owner, "num_data", num_data)
        self.temperature = _check_positive(owner, "temperature", temperature, allow_zero=True)
        self.seed = int(seed)

    def _noise(self, variable, variance):
        """`sqrt(variance * T / N) xi`, off in a cyclical schedule's exploration stage."""
        index = self._get_variable_index(variable)
        key = tf.stack([tf.cast(self.iterations, tf.int32), index * 7919 + self.seed])
        xi = tf.random.stateless_normal(tf.shape(variable), key, dtype=variable.dtype)
        scale = variance * self.temperature / self.num_data
        schedule = self._learning_rate
        if isinstance(schedule, CyclicalSchedule):
            scale = scale * schedule.sampling(self.iterations)
        return tf.sqrt(tf.cast(scale, variable.dtype)) * xi

    def get_config(self):
        return {
            **super().get_config(),
            "num_data": self.num_data,
            "temperature": self.temperature,
            "seed": self.seed,
        }


@keras.saving.register_keras_serializable("blayers.sgmcmc")
class SGLD(_Sampler):
    """Stochastic gradient Langevin dynamics (Welling & Teh, 2011) on the per-example loss:
    `theta <- theta - lr g + sqrt(2 lr T / N) xi`.

    Args:
      learning_rate: `lr` of the per-example loss (a float or a schedule, `CyclicalSchedule`
        for cyclical SGLD); the Langevin step on `U = N L` is `2 lr / N`.
      num_data: `N`, the training examples.
      temperature: `T` (1: the posterior).
      seed: seeds the noise.
      name, **kwargs: `keras.optimizers.Optimizer` arguments.
    """

    def __init__(self, learning_rate, num_data, temperature=1.0, seed=0, name="sgld", **kwargs):
        super().__init__(learning_rate, num_data, temperature, seed, name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        lr = tf.cast(learning_rate, variable.dtype)
        step = -lr * tf.cast(gradient, variable.dtype) + self._noise(variable, 2.0 * lr)
        self.assign_add(variable, step)


@keras.saving.register_keras_serializable("blayers.sgmcmc")
class SGHMC(_Sampler):
    """Stochastic gradient Hamiltonian Monte Carlo (Chen et al., 2014) in its momentum form, on
    the per-example loss: `v <- (1 - alpha) v - lr g + sqrt(2 alpha lr T / N) xi`, `theta <-
    theta + v` (the friction `alpha` offsets the injected noise; the gradient noise's own
    estimate `beta_hat` is taken as 0, as the paper's experiments and cyclical SG-MCMC do).

    Args:
      learning_rate: `lr` of the per-example loss (or a schedule, `CyclicalSchedule`).
      num_data: `N`, the training examples.
      friction: `alpha` in (0, 1] (1 - the momentum; 0.1 in cyclical SG-MCMC's code).
      temperature: `T` (1: the posterior).
      seed: seeds the noise.
      name, **kwargs: `keras.optimizers.Optimizer` arguments.
    """

    def __init__(
        self,
        learning_rate,
        num_data,
        friction=0.1,
        temperature=1.0,
        seed=0,
        name="sghmc",
        **kwargs,
    ):
        super().__init__(learning_rate, num_data, temperature, seed, name, **kwargs)
        friction = _check_positive("SGHMC", "friction", friction)
        if friction > 1:
            raise ValueError(f"SGHMC: friction must be in (0, 1], got {friction!r}.")
        self.friction = friction

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momenta = self.add_optimizer_variables(variables, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        lr = tf.cast(learning_rate, variable.dtype)
        momentum = self.momenta[self._get_variable_index(variable)]
        alpha = tf.cast(self.friction, variable.dtype)
        new = (
            (1.0 - alpha) * momentum
            - lr * tf.cast(gradient, variable.dtype)
            + self._noise(variable, 2.0 * alpha * lr)
        )
        self.assign(momentum, new)
        self.assign_add(variable, new)

    def get_config(self):
        return {**super().get_config(), "friction": self.friction}


class PosteriorSamples(tf.Module):
    """Up to `max_samples` kept weight samples of `model` (a ring: the newest replace the
    oldest), callable as the model averaged over them.

    `keep()` copies the model's trainable weights into the next slot (in a graph too). A call
    `samples(x)` runs `model` under kept sample `cursor mod num_kept` and moves the cursor on,
    then puts the model's own weights back, so `blayers.predict(samples, x,
    num_samples=samples.num_kept)` averages over every kept sample once per batch (call
    `reset_cursor()` first). The variables are this module's: a `tf.train.Checkpoint` holding
    it keeps the samples.

    Args:
      model: a Keras model with deterministic weights.
      max_samples: the samples kept at most.
    """

    def __init__(self, model, max_samples, name="posterior_samples"):
        super().__init__(name=name)
        if not isinstance(max_samples, (int, np.integer)) or max_samples < 1:
            raise ValueError(
                f"PosteriorSamples: max_samples must be a positive int, got {max_samples!r}."
            )
        self.model = model
        self.max_samples = int(max_samples)
        self._weights = list(model.trainable_variables)
        self.buffers = [
            tf.Variable(
                tf.zeros([self.max_samples, *w.shape], w.dtype),
                trainable=False,
                name=f"sample_{i}",
            )
            for i, w in enumerate(self._weights)
        ]
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="count")
        self.cursor = tf.Variable(0, dtype=tf.int64, trainable=False, name="cursor")

    @property
    def num_kept(self):
        """The samples held now, `min(kept so far, max_samples)`."""
        return int(min(int(self.count.numpy()), self.max_samples))

    def keep(self):
        """Copies the model's current weights into the next slot; returns the kept count."""
        slot = self.count % self.max_samples
        for buffer, weight in zip(self.buffers, self._weights):
            buffer.scatter_nd_update([[slot]], tf.convert_to_tensor(weight)[None])
        return self.count.assign_add(1)

    def reset_cursor(self):
        self.cursor.assign(0)

    def sample(self, index):
        """Sample `index`'s weights, as NumPy arrays in the model's trainable order."""
        return [b[index].numpy() for b in self.buffers]

    def __call__(self, inputs, training=False):
        kept = tf.minimum(self.count, self.max_samples)
        index = self.cursor % tf.maximum(kept, 1)
        self.cursor.assign_add(1)
        own = [tf.identity(tf.convert_to_tensor(w)) for w in self._weights]
        for buffer, weight in zip(self.buffers, self._weights):
            weight.assign(tf.gather(buffer, index))
        outputs = self.model(inputs, training=training)
        with tf.control_dependencies(tf.nest.flatten(_tensors(outputs))):
            for weight, value in zip(self._weights, own):
                weight.assign(value)
        return outputs


def _tensors(outputs):
    """The tensors an output is made of (a random variable's distribution parameters too), for
    ordering the weights' restore after them."""
    if isinstance(outputs, RandomVariable):
        return [t for t in tf.nest.flatten(outputs.distribution.parameters) if tf.is_tensor(t)]
    return [t for t in tf.nest.flatten(outputs) if tf.is_tensor(t)]
