"""SG-MCMC as a learner: the supervised learner's steps with a sampler for an optimizer, and the
posterior samples it keeps.

The network is deterministic (`mlp.dense_layer = 'Dense'`); its prior is the penalty its layers
add (`mlp.prior_precision`: a Gaussian `N(0, I / lambda)`), divided by `N` like every global
term, so the per-example loss is `L = mean NLL + (-log prior) / N` and the samplers of
`blayers.sgmcmc` (SGLD, SGHMC, cyclical) draw from `p(theta | D) ~ exp(-N L / T)`.

After `burn_in` steps, every `thinning`-th step's weights are kept (cyclical: in each cycle's
sampling stage, counting back from its last step) in `blayers.sgmcmc.PosteriorSamples`, whose
variables are part of the checkpoint: the samples survive a killed run, and a resumed run keeps
the same samples as the uninterrupted one. Evaluation averages the predictive over the kept
samples (the chain's current weights before the first is kept); `metrics.json` records how many.
"""

import math

import gin
import tensorflow as tf

from blayers import sgmcmc
from blayers.lab.learners.supervised import SupervisedLearner

__all__ = ["SGMCMCLearner"]

_SAMPLERS = ("sgld", "sghmc")
# The task's evaluation runs up to 64 draws a batch in one call; each kept sample is one draw.
_MAX_KEPT = 64


@gin.configurable(module="blayers.lab.learners")
class SGMCMCLearner(SupervisedLearner):
    """SG-MCMC over the weights of `model` (module docstring).

    Args:
      sampler: `'sghmc'` (default) or `'sgld'`.
      learning_rate: the step size of the per-example loss (`blayers.sgmcmc`); with
        `cycle_length`, each cycle's first step size.
      friction: SGHMC's `alpha`.
      temperature: `T` (1: the posterior; < 1: a cold posterior).
      burn_in: steps before the first kept sample.
      thinning: steps between kept samples.
      max_samples: samples kept (the newest; at most 64).
      cycle_length: None, or the steps of a cyclical SG-MCMC cycle (`CyclicalSchedule`):
        samples are then kept in each cycle's sampling stage only.
      exploration_fraction: the part of a cycle without noise.
      **kwargs: `SupervisedLearner` arguments (`data`, `model`, `batch_size`, ...).
    """

    def __init__(
        self,
        sampler="sghmc",
        learning_rate=1e-3,
        friction=0.1,
        temperature=1.0,
        burn_in=1000,
        thinning=100,
        max_samples=20,
        cycle_length=None,
        exploration_fraction=0.8,
        **kwargs,
    ):
        kwargs.pop("optimizer", None)
        super().__init__(optimizer=self._make_sampler, **kwargs)
        if sampler not in _SAMPLERS:
            raise ValueError(f"SGMCMCLearner.sampler must be one of {_SAMPLERS}, got {sampler!r}.")
        if self.replicated:
            raise ValueError(
                "SGMCMCLearner samples one network's weights; replicated data (replicas) is "
                "for SupervisedLearner."
            )
        for name, value, low in (("burn_in", burn_in, 0), ("thinning", thinning, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"SGMCMCLearner.{name} must be an int >= {low}, got {value!r}.")
        if not isinstance(max_samples, int) or not 1 <= max_samples <= _MAX_KEPT:
            raise ValueError(
                f"SGMCMCLearner.max_samples must be an int in [1, {_MAX_KEPT}], got "
                f"{max_samples!r}."
            )
        self.sampler, self.learning_rate, self.friction = sampler, learning_rate, friction
        self.temperature, self.burn_in, self.thinning = temperature, burn_in, thinning
        self.max_samples, self.cycle_length = max_samples, cycle_length
        self.exploration_fraction = exploration_fraction
        if cycle_length is not None:
            self.schedule = sgmcmc.CyclicalSchedule(
                learning_rate, cycle_length, exploration_fraction
            )
            # The sampling stage's first position in a cycle (0-based).
            self._sampling_start = math.ceil(exploration_fraction * cycle_length)

    def _make_sampler(self):
        rate = self.schedule if self.cycle_length is not None else self.learning_rate
        common = {"num_data": self.num_train, "temperature": self.temperature, "seed": self.seed}
        if self.sampler == "sgld":
            return sgmcmc.SGLD(rate, **common)
        return sgmcmc.SGHMC(rate, friction=self.friction, **common)

    def build(self, context):
        super().build(context)
        random = [
            f"{layer.name}.{name}"
            for layer in self.model._flatten_layers(include_self=False, recursive=True)
            for name in getattr(layer, "_random_weight_names", ())
        ]
        if random:
            raise ValueError(
                "SGMCMCLearner samples the weights of a deterministic network, but these "
                f"weights are distributions: {', '.join(random)}. Use deterministic layers "
                "(mlp.dense_layer = 'Dense') with a prior penalty (mlp.prior_precision)."
            )
        with self.strategy.scope():
            self.samples = sgmcmc.PosteriorSamples(self.model, self.max_samples)

    def state(self):
        return super().state(samples=self.samples)

    def _keeps(self, step):
        """Whether the weights after `step` (1-based, a tensor) are kept."""
        if self.cycle_length is None:
            return (step > self.burn_in) & ((step - self.burn_in) % self.thinning == 0)
        position = (step - 1) % self.cycle_length
        from_end = self.cycle_length - 1 - position
        return (
            (step > self.burn_in)
            & (position >= self._sampling_start)
            & (from_end % self.thinning == 0)
        )

    def after_step(self):
        tf.cond(
            self._keeps(self.step_variable),
            lambda: self.samples.keep(),
            lambda: tf.identity(self.samples.count),
        )

    def predictive(self):
        """The kept samples, one draw each (the chain's weights while none is kept)."""
        kept = self.samples.num_kept
        if kept == 0:
            return super().predictive()
        self.samples.reset_cursor()
        return self.samples, kept

    def evaluate(self):
        """The task's evaluation of the predictive averaged over the kept samples (the chain's
        current weights while none is kept)."""
        kept = self.samples.num_kept
        if kept == 0:
            metrics, arrays = super().evaluate()
        else:
            with self.training_streams_kept():
                self.samples.reset_cursor()
                metrics, arrays = self.data.task.evaluate(
                    self.samples, self.data, kept, self.eval_batch_size
                )
        return {**metrics, "kept_samples": kept}, arrays
