"""The Learner contract: what a step means. The Loop (`blayers.lab.loop`) owns the schedule
and the run folder; a learner owns the model and answers these calls, in this order:

    build(context)         the model, optimizer, step, random streams; from `context.seed`
    state()                what a checkpoint holds: a `tf.train.Checkpoint`, or a
                           `blayers.lab.runs.SaverState` (a graph-mode learner's v1 Saver)
    restored()             after the Checkpointer restored `state()` (or found none)
    collect()              between phases (reinforcement learning); no-op by default
    begin_phase()          a phase starts (an epoch, a collection interval), from the data
                           position `step` implies; by default it iterates `batches()`
    train_steps(n)         up to `n` optimizer steps of the phase in one call -> `Steps` (the
                           scalars' sums over the steps and the last step's; fewer steps at the
                           phase's end; it stops after a non-finite step). By default one
                           `train_step(batch)` a batch of `batches()`; a Keras learner runs them
                           in one graph call (`compile_steps`), no host round trip per step
    batches()              the batches of one phase, from the data position `step` implies
    train_step(batch)      one optimizer step -> `{name: float}` (a `non_finite` > 0 marks a
                           step the learner found non-finite without a non-finite scalar)
    diagnose_non_finite(batch)  where a non-finite step came from (a layer, the data's rows)
    before_save()          before each checkpoint (copy state the checkpoint holds)
    evaluate()             `(metrics, arrays)`; never advances the training random streams
    outputs(run, records, metrics, arrays)  plots in the run folder -> (summary fields for
                           `metrics.json`, image paths for TensorBoard)
    close()                release what `build` opened (a session)

`step` is the number of optimizer steps taken (part of the state). A learner is configured by
gin under its class name (`SupervisedLearner.batch_size = 128`) and chosen by
`train.learner = @SupervisedLearner()`.
"""

import contextlib
import dataclasses
import functools
import itertools
import math

import tensorflow as tf

__all__ = ["KerasLearner", "Learner", "Steps", "refuse_strategy"]


@dataclasses.dataclass
class Steps:
    """What one `train_steps(n)` call did.

    Attributes:
      count: the steps taken (fewer than `n` at the end of a phase; 0 once it is over).
      sums: `{name: float}`, each scalar summed over the steps (`non_finite` included).
      last: the last step's scalars.
      bad: the batch of the non-finite step that ended the call (None: every step was finite).
    """

    count: int
    sums: dict
    last: dict
    bad: object = None


def non_finite(scalars):
    """Whether a step's scalars mark it non-finite (a flag, or a NaN or infinite value)."""
    return bool(scalars.get("non_finite", 0.0)) or not all(
        math.isfinite(v) for v in scalars.values()
    )


class Learner:
    """Base class: the optional calls' defaults (see the module docstring)."""

    # Gin bindings of this learner that a resumed run may change (cadences, not the model).
    resumable_bindings = ()
    # Scalars logged as their last value in a record, not averaged (a schedule's weight).
    instant_scalars = ()
    # `(scalar, label)` pairs on the progress bar.
    progress_scalars = (("loss", "loss"),)
    # Scalars left off the progress bar while zero (a latent KL the model does not have).
    progress_if_nonzero = ()

    @property
    def step(self):
        raise NotImplementedError(
            f"{type(self).__name__} does not count its steps."
        )  # abstract; intentional

    def build(self, context):
        raise NotImplementedError(f"{type(self).__name__} does not build.")  # abstract; intentional

    def state(self):
        raise NotImplementedError(
            f"{type(self).__name__} has no checkpoint state."
        )  # abstract; intentional

    def restored(self):
        """After the Checkpointer restored `state()` (or found no checkpoint)."""

    def collect(self):
        """Between training phases: nothing to collect."""

    def begin_phase(self):
        """A phase starts: its batches are `batches()`."""
        self._phase = iter(self.batches())

    def train_steps(self, n):
        """Up to `n` steps of the phase, one `train_step` a batch (see the module docstring)."""
        sums, last, count = {}, {}, 0
        for batch in itertools.islice(self._phase, n):
            last = dict(self.train_step(batch))
            count += 1
            for key, value in last.items():
                sums[key] = sums.get(key, 0.0) + value
            if non_finite(last):
                return Steps(count, sums, last, bad=batch)
        return Steps(count, sums, last)

    def batches(self):
        raise NotImplementedError(f"{type(self).__name__} has no batches.")  # abstract; intentional

    def train_step(self, batch):
        raise NotImplementedError(
            f"{type(self).__name__} has no train step."
        )  # abstract; intentional

    def diagnose_non_finite(self, batch):
        del batch
        return "no diagnosis"

    def before_save(self):
        """Before each checkpoint."""

    def log_extras(self):
        """Fields added to each training record (PlaNet's episode count)."""
        return {}

    def evaluate(self):
        raise NotImplementedError(f"{type(self).__name__} does not evaluate.")

    def outputs(self, run, records, metrics, arrays):
        del run, records, metrics, arrays
        return {}, []

    def close(self):
        """After the run (also a failed one)."""


class KerasLearner(Learner):
    """A learner of a Keras model trained eagerly. `track(model, optimizer)` (in `build`, under
    the strategy's scope) makes the step variable and finds the layers' seed-generator
    states; the checkpoint holds all four (Keras does not checkpoint seed-generator states, and
    without them a resumed run would replay the weight noise of its first steps)."""

    def track(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.step_variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.seed_states = [v for v in model.variables if v.path.endswith("seed_generator_state")]

    def state(self, **extra):
        return tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            step=self.step_variable,
            seed_states=self.seed_states,
            **extra,
        )

    @property
    def step(self):
        return int(self.step_variable.numpy())

    @staticmethod
    def compile_steps(step_fn, next_batch, names, autograph=True):
        """A `tf.function` `(n, *args) -> (count, sums, last)` running up to `n` steps in one
        call: `next_batch(i, *args) -> (has_value, get)` says whether the call's `i`-th batch
        exists (not: the phase is over) and `get()` makes it, `step_fn(batch) -> {name: scalar tensor}` (the keys `names`,
        `non_finite` among them) takes one optimizer step, and a non-finite step ends the call.
        The scalars stay in the graph, summed; the host reads them once a call (`Steps`).
        The loop is written as a `tf.while_loop`; `autograph=False` also traces `step_fn` and
        `next_batch` as written (blayers' learners: no tensor-valued Python control flow), which
        spares every process the seconds autograph takes to convert them."""

        def steps(n, *args):
            zeros = {name: tf.constant(0.0) for name in names}

            def body(i, count, sums, last, done):
                has_value, get = next_batch(i, *args)

                def step():
                    scalars = step_fn(get())
                    scalars = {name: tf.cast(scalars[name], tf.float32) for name in names}
                    new_sums = {name: sums[name] + scalars[name] for name in names}
                    return count + 1, new_sums, scalars, scalars["non_finite"] > 0

                def stop():
                    return count, sums, last, tf.constant(True)

                return (i + 1, *tf.cond(has_value, step, stop))

            _, count, sums, last, _ = tf.while_loop(
                lambda i, count, sums, last, done: tf.logical_and(i < n, tf.logical_not(done)),
                body,
                (tf.constant(0), tf.constant(0), zeros, zeros, tf.constant(False)),
            )
            return count, sums, last

        # reduce_retracing: stacked batches, a phase's last call is shorter. The partial is this
        # run's own key for TensorFlow's retracing count, which is per code object: without it
        # the traces of every run in a process (a notebook's or a benchmark's several runs)
        # counted together, and the sixth run warned "triggered tf.function retracing". Its
        # name keeps the graph's (`__inference_steps_...` in profiles and TensorBoard).
        keyed = functools.partial(steps)
        keyed.__name__ = steps.__name__
        return tf.function(keyed, reduce_retracing=True, autograph=autograph)

    @staticmethod
    def read_steps(result):
        """`(count, sums, last)` of a compiled call as Python numbers (the call's one sync)."""
        count, sums, last = result
        as_floats = lambda d: {k: float(v) for k, v in d.items()}
        return int(count), as_floats(sums), as_floats(last)

    @contextlib.contextmanager
    def training_streams_kept(self):
        """Restores the seed-generator states on exit, so that what runs inside (an
        evaluation) never changes the weight noise of the training steps that follow."""
        saved = [v.numpy() for v in self.seed_states]
        try:
            yield
        finally:
            for variable, value in zip(self.seed_states, saved):
                variable.assign(value)


def refuse_strategy(learner, context, runs_on):
    """A `ValueError` naming a `--strategy` this learner cannot use and what it runs on."""
    raise ValueError(
        f"--strategy={context.strategy_name} cannot run {type(learner).__name__} (the config's "
        f"train.learner); it runs on {runs_on}."
    )
