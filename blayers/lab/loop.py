"""The Loop: one schedule for every learner (dopamine's Runner and Keras' trainer contract are
the models). It knows nothing of what a step means; a `blayers.lab.learners.Learner` does.

    lock the run folder; refuse a resume whose gin bindings changed in a way that cannot apply
    learner.build(context); restore the newest intact checkpoint of learner.state()
    (a checkpoint of another model is refused, nothing touched); learner.restored()
    bindings.json, command.json, operative_config.gin
    while step < train_steps:
        learner.collect()                         (reinforcement learning; no-op otherwise)
        learner.begin_phase()                     (an epoch, a collection interval)
        until the phase ends:
            steps = learner.train_steps(n)        n: up to `steps_per_execution`, never past
            non-finite stop                       the next log, checkpoint or evaluation step
            log / checkpoint / evaluate on their schedules
    checkpoint; learner.evaluate(); learner.outputs(); metrics.json, plots, TensorBoard

A learner runs the `n` steps of a call in one graph call where it can, so the host reads the
scalars once a call, not once a step: every event falls on its own step exactly, whatever
`steps_per_execution` is, and so does the run (the same steps, the same order). Ctrl-C or SIGTERM
stops at the end of the current call with a checkpoint; evaluation never advances the training
random streams (the learner restores them), so a resumed run matches the uninterrupted one from
any checkpoint. Everything lands in the run folder through `blayers.lab.runs.RunDir`.

The gin root: `train.learner = @SupervisedLearner()` (the default), `@VariationalProgramLearner()`,
`@MeshLearner()` or `@PlanetLearner()`; the schedule is `train.train_steps`, `train.eval_every`,
`train.log_every`, `train.checkpoint_every`, `train.keep_checkpoints`, `train.progress`,
`train.plots`, `train.steps_per_execution`, and `train.seed` seeds the learner.
"""

import dataclasses
import inspect
import math
import signal
import threading
import time

import gin
import keras
import numpy as np
import tensorflow as tf

from blayers.lab import plots as plots_lib
from blayers.lab import runs
from blayers.lab import strategy as strategy_lib
from blayers.lab.runs import train_seconds  # re-exported: the Loop's metrics report it

__all__ = [
    "Context",
    "Loop",
    "NonFiniteLossError",
    "StopRequest",
    "Stopped",
    "fit",
    "stopping",
    "train",
    "train_seconds",
]

# Bindings a resumed run may change: they steer the loop, not the model or its optimization.
RESUMABLE_BINDINGS = tuple(
    f"train.{name}"
    for name in (
        "train_steps",
        "eval_every",
        "checkpoint_every",
        "log_every",
        "keep_checkpoints",
        "progress",
        "plots",
        "steps_per_execution",
    )
)

# Steps a learner takes in one call at most. Measured (`benchmarks/replica_steps.py`): the
# replicated MC dropout network runs within a few percent of its bare graph from 20 steps a
# call; the calls end at the log cadence anyway, which is 50 steps by default.
STEPS_PER_EXECUTION = 50


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the message names the step and the culprit."""


class Stopped(KeyboardInterrupt):
    """A signal stopped the run after its checkpoint; `signal` is the signal's number (the
    command line exits `128 + signal`: 130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, signum, step):
        super().__init__(f"Stopped by signal {signum} at step {step}; checkpoint saved.")
        self.signal, self.step = signum, step


_STOPPING = threading.Event()


def stopping():
    """Whether a signal asked a run of this process to stop (its stop checkpoint is being, or
    was, written): a command line ignores later signals then, instead of being killed by one
    while it releases the run folder."""
    return _STOPPING.is_set()


class StopRequest:
    """Turns the first Ctrl-C (SIGINT) or SIGTERM into a request to stop after the current
    call, so the checkpoint is written outside any TensorFlow call. Later signals while it
    stops are absorbed (a sweep forwards SIGTERM to trainers that the terminal's Ctrl-C already
    reached: it must not cut the stop checkpoint), except a second Ctrl-C after a Ctrl-C,
    which interrupts at once."""

    def __init__(self):
        self.requested = False
        self.signal = None
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT == self.signal:
            raise KeyboardInterrupt  # Ctrl-C twice: the user wants out now
        if not self.requested:
            self.requested, self.signal = True, signum
            _STOPPING.set()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        return False


@dataclasses.dataclass
class Context:
    """What the Loop hands a learner's `build`.

    Attributes:
      run: the `RunDir` (a learner keeps files of its own there: PlaNet's episodes).
      strategy: the `tf.distribute.Strategy` (the default one unless the command line chose).
      strategy_name: the command line's `--strategy` (None: the learner's default).
      seed: seeds the weights, the noise and the data order.
      train_steps: the run's length (a learner's schedules may depend on it).
    """

    run: runs.RunDir
    strategy: tf.distribute.Strategy
    strategy_name: str | None
    seed: int
    train_steps: int

    def scalars(self, step, prefix, values):
        """TensorBoard scalars from inside a phase (PlaNet's episode returns)."""
        self.run.scalars(step, prefix, values)


def _positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"train.{name} must be a positive integer, got {value!r}.")
    return int(value)


class Loop:
    """Runs a learner on a schedule in a run folder; see the module docstring.

    Args:
      model_dir: the run folder; an existing run there is resumed.
      learner: a `blayers.lab.learners.Learner`.
      strategy: a `tf.distribute.Strategy`, a `--strategy` name (`'mesh'`), or None.
      train_steps: optimizer steps in total.
      eval_every: steps between evaluations (None or 0: only at the end).
      checkpoint_every: steps between checkpoints (default `min(eval_every, 500)`).
      log_every: steps between history records.
      keep_checkpoints: checkpoints kept on disk.
      seed: the learner's seed.
      progress: show Keras' progress bar.
      plots: draw the run's figures (training curves and the task's plots) as PNGs in the run
        folder and TensorBoard images. False skips them, with the work done only to draw them
        (a second or more a run): sweeps of many short runs.
      steps_per_execution: steps a learner takes in one call at most (Keras' setting of that
        name): the scalars reach the host once a call. Changing it changes nothing but speed.
    """

    def __init__(
        self,
        model_dir,
        learner,
        strategy=None,
        train_steps=1000,
        eval_every=None,
        checkpoint_every=None,
        log_every=50,
        keep_checkpoints=3,
        seed=0,
        progress=True,
        steps_per_execution=STEPS_PER_EXECUTION,
        plots=True,
    ):
        self.train_steps = _positive_int("train_steps", train_steps)
        self.steps_per_execution = _positive_int("steps_per_execution", steps_per_execution)
        # 0, as None: only the final evaluation
        self.eval_every = _positive_int("eval_every", eval_every or None, allow_none=True)
        self.log_every = _positive_int("log_every", log_every)
        self.checkpoint_every = _positive_int(
            "checkpoint_every",
            checkpoint_every or max(min(eval_every or train_steps, 500), 1),
        )
        self.keep_checkpoints = _positive_int("keep_checkpoints", keep_checkpoints)
        self.seed, self.progress, self.learner = int(seed), progress, learner
        self.plots = bool(plots)
        if isinstance(strategy, str):
            self.strategy_name, self.strategy = strategy, tf.distribute.get_strategy()
        else:
            self.strategy_name = None if strategy is None else strategy_lib.flag_name(strategy)
            self.strategy = strategy or tf.distribute.get_strategy()
        self.run_dir = runs.RunDir(strategy_lib.worker_directory(str(model_dir), self.strategy))

    def run(self):
        """The whole run; returns the final metrics (dict)."""
        run, learner = self.run_dir, self.learner
        with run.lock():
            # Refusals first: nothing in the folder is touched by a run that will not go on.
            run.check_bindings(RESUMABLE_BINDINGS + tuple(learner.resumable_bindings))
            try:
                learner.build(
                    Context(run, self.strategy, self.strategy_name, self.seed, self.train_steps)
                )
                self.checkpointer = run.checkpointer(learner.state(), self.keep_checkpoints)
                restored = self.checkpointer.restore(max_step=self.train_steps)
                learner.restored()
                self.start_step = learner.step
                # A longer run's checkpoints past this length stay, and so do their records.
                newest = self.checkpointer.latest_step() or 0
                if restored:
                    print(f"Resumed from {restored} at step {self.start_step}.")
                run.accept()
                # From here on a SIGTERM or Ctrl-C saves a checkpoint (even before a step).
                with StopRequest() as self.stop:
                    run.write_operative_config()
                    self.history = run.open_history(max(self.start_step, newest))
                    self._open_window(self.start_step)
                    while learner.step < self.train_steps and not self.stop.requested:
                        learner.collect()
                        self._phase()
                    if self.stop.requested:  # saved while the handlers still absorb signals
                        self.save()
                        raise Stopped(self.stop.signal, learner.step)
                learner.before_save()
                self.checkpointer.save_unless_current(learner.step)
                metrics, arrays = self.evaluate()
                with plots_lib.skipped(not self.plots):
                    summary, images = learner.outputs(run, self.history.records, metrics, arrays)
                run.write_metrics(
                    {
                        "status": "finished",
                        "step": learner.step,
                        "resumed_from_step": self.start_step,
                        **summary,
                        "train_seconds": train_seconds(self.history.records),
                        "final": _jsonable(metrics),
                    }
                )
                run.images(learner.step, images if self.plots else [])
                run.write_operative_config()
            finally:
                learner.close()
                run.close()
        return metrics

    # -- the schedule ----------------------------------------------------------------------------
    def _phase(self):
        """Steps through one phase of the learner on the schedule, several steps a call."""
        learner = self.learner
        learner.begin_phase()
        while True:
            n = self._steps_to_next_event(learner.step)
            steps = learner.train_steps(n)
            if steps.count == 0:
                return
            step = learner.step
            last = {k: v for k, v in steps.last.items() if k != "non_finite"}
            if steps.bad is not None or not all(math.isfinite(v) for v in last.values()):
                terms = ", ".join(f"{k}={v:.6g}" for k, v in last.items())
                raise NonFiniteLossError(
                    f"Non-finite loss or gradient at step {step} ({terms}): "
                    f"{learner.diagnose_non_finite(steps.bad)}. Training stopped; the last good "
                    f"checkpoint is {self.checkpointer.latest}."
                )
            self._window_add({k: v for k, v in steps.sums.items() if k != "non_finite"}, last)
            if step % self.log_every == 0 or step == self.train_steps:
                self.log(step)
            if step % self.checkpoint_every == 0:
                self.save()
            if self.eval_every and step % self.eval_every == 0 and step < self.train_steps:
                began = time.time()
                self.evaluate()
                self._clock += time.time() - began  # evaluation time is not training time
            if step >= self.train_steps or self.stop.requested or steps.count < n:
                return

    def _steps_to_next_event(self, step):
        """The steps of the next call: at most `steps_per_execution`, and none past the next
        log, checkpoint or evaluation step or the end of the run."""
        n = min(self.steps_per_execution, self.train_steps - step)
        for every in (self.log_every, self.checkpoint_every, self.eval_every):
            if every:
                n = min(n, every - step % every)
        return max(n, 1)

    def _open_window(self, step):
        self._start, self._clock, self._sums, self._last = step, time.time(), {}, {}

    def _window_add(self, sums, last):
        """Adds a call's sums of the scalars (and its last step's) to the log window."""
        for key, value in sums.items():
            self._sums[key] = self._sums.get(key, 0.0) + value
        self._last = last

    def log(self, step):
        """One training record: the means of the learner's scalars over the steps since the
        last record (its `instant_scalars` as their last value)."""
        learner = self.learner
        count = max(step - self._start, 1)
        record = {k: v / count for k, v in self._sums.items()}
        record.update({k: self._last[k] for k in learner.instant_scalars if k in self._last})
        record.update(learner.log_extras())
        record.update(
            kind="train",
            step=step,
            steps_per_second=count / max(time.time() - self._clock, 1e-9),
        )
        self.history.add(record)
        self.run_dir.scalars(step, "train", {k: v for k, v in record.items() if k in self._sums})
        shown = [
            (label, record[key])
            for key, label in learner.progress_scalars
            if key in record and (record[key] or key not in learner.progress_if_nonzero)
        ]
        self._progress_bar().update(step, shown)
        self._open_window(step)

    def save(self):
        self.learner.before_save()
        self.checkpointer.save(self.learner.step)

    def evaluate(self):
        """The learner's evaluation, recorded (a re-run of a finished run replaces its record)."""
        metrics, arrays = self.learner.evaluate()
        step = self.learner.step
        self.history.put({"kind": "eval", "step": step, **_jsonable(metrics)})
        self.run_dir.scalars(step, "eval", metrics)
        return metrics, arrays

    def _progress_bar(self):
        if not hasattr(self, "_bar"):
            self._bar = keras.utils.Progbar(
                self.train_steps,
                verbose=1 if self.progress else 0,
                stateful_metrics=[label for _, label in self.learner.progress_scalars],
            )
        return self._bar


def _jsonable(metrics):
    return {
        k: (float(v) if isinstance(v, (np.floating, float, int, np.integer)) else v)
        for k, v in metrics.items()
    }


@gin.configurable("train", module="blayers.lab.loop", denylist=["model_dir", "strategy"])
def train(
    model_dir,
    strategy=None,
    learner=None,
    train_steps=1000,
    eval_every=None,
    checkpoint_every=None,
    log_every=50,
    keep_checkpoints=3,
    seed=0,
    progress=True,
    steps_per_execution=STEPS_PER_EXECUTION,
    plots=True,
):
    """Runs `learner` (default `SupervisedLearner()`, configured by gin) under the Loop in
    `model_dir`; returns the final metrics. The gin root of every config: `train.learner`,
    `train.train_steps`, ...; see `Loop` for the arguments."""
    if learner is None:
        from blayers.lab.learners.supervised import SupervisedLearner

        learner = SupervisedLearner()
    return Loop(
        model_dir,
        learner,
        strategy,
        train_steps=train_steps,
        eval_every=eval_every,
        checkpoint_every=checkpoint_every,
        log_every=log_every,
        keep_checkpoints=keep_checkpoints,
        seed=seed,
        progress=progress,
        steps_per_execution=steps_per_execution,
        plots=plots,
    ).run()


def fit(model_dir, strategy=None, **kwargs):
    """Python shorthand for a supervised run: `fit(model_dir, data=..., model=...,
    train_steps=..., batch_size=...)` splits the keyword arguments between `train` (the
    schedule) and `SupervisedLearner` (everything else) and runs them; gin bindings fill what
    is not passed. Returns the final metrics."""
    from blayers.lab.learners.supervised import SupervisedLearner

    schedule = set(inspect.signature(train).parameters) - {"model_dir", "strategy", "learner"}
    learner_kwargs = {k: v for k, v in kwargs.items() if k not in schedule}
    loop_kwargs = {k: v for k, v in kwargs.items() if k in schedule}
    if learner_kwargs:  # else the configured `train.learner`
        loop_kwargs["learner"] = SupervisedLearner(**learner_kwargs)
    return train(model_dir, strategy=strategy, **loop_kwargs)
