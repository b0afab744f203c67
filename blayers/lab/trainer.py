"""The trainer: the ELBO on a `tf.distribute` strategy, in phases an experiment overrides.

`Trainer.run()` goes through the phases, each a method (dopamine's `Runner` is the model):

    lock the run folder; refuse a resume whose gin bindings changed in a way that cannot apply
    setup()              build model and optimizer, the checkpoint
    restore()            newest intact checkpoint (step, optimizer, seed-generator states); a
                         checkpoint of another model is refused, nothing touched
    bindings.json, command.json, write_operative_config()
    while step < train_steps:
        collect()        hook between training phases (a reinforcement-learning loop collects
                         episodes here); no-op by default
        train_phase(end) train_step(batch) per batch of `batches()`, then after_step(): log(),
                         checkpoint(), evaluate() on their schedules
    checkpoint(); evaluate(); write_outputs()

A graph-mode loop (Mesh TensorFlow) overrides `setup`, `train_step`, `save_checkpoint` and
`restore`; a control task overrides `collect` and `batches`.

Everything lands in `model_dir`: `checkpoints/`, `operative_config.gin`, `history.jsonl` (one
record per log interval and per evaluation), `metrics.json` (final), `tensorboard/` (scalars and
the task's plots as images), `training_curves.png` and the task's plots. Re-running the same
command resumes from the last intact checkpoint; Ctrl-C or SIGTERM saves a checkpoint first;
evaluation never advances the training random streams, so a resumed run matches the
uninterrupted one from any checkpoint.
"""

import inspect
import json
import math
import numbers
import os
import time

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from blayers import objectives, seeds
from blayers.lab import plots, run_files
from blayers.lab import strategy as strategy_lib
from blayers.lab.configurables import unapplied_layer_bindings
from blayers.lab.data.stream import epoch_batches
from blayers.random_variable import RandomVariable

__all__ = [
    "ChangedBindingsError",
    "NonFiniteLossError",
    "Trainer",
    "first_non_finite_layer",
    "make_optimizer",
    "train",
]

# Bindings a resumed run may change: they steer the loop, not the model or its optimization.
RESUMABLE_BINDINGS = (
    "train.train_steps",
    "train.eval_every",
    "train.checkpoint_every",
    "train.log_every",
    "train.keep_checkpoints",
    "train.num_eval_samples",
    "train.eval_batch_size",
    "train.progress",
)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the message names the step and the layer."""


ChangedBindingsError = run_files.ChangedBindingsError  # where callers look for it


@gin.configurable(module="blayers.lab.trainer")
def make_optimizer(name="adam", learning_rate=1e-3, schedule=None, **kwargs):
    """A Keras optimizer by name (`'adam'`, `'sgd'`, `'rmsprop'`, `'adamw'`, ...).

    Args:
      name: a `keras.optimizers` name.
      learning_rate: the (initial) learning rate.
      schedule: optional callable `schedule(learning_rate)` returning a Keras
        `LearningRateSchedule`, e.g. `@cosine_decay`.
      **kwargs: the optimizer's other arguments (`weight_decay`, `clipnorm`, ...).
    """
    if isinstance(learning_rate, numbers.Real) and not learning_rate > 0:  # a schedule passes
        raise ValueError(f"make_optimizer.learning_rate must be positive, got {learning_rate!r}.")
    if schedule is not None:
        learning_rate = schedule(learning_rate)
    try:
        cls = keras.optimizers.get(name).__class__
    except ValueError:
        raise ValueError(
            f"Unknown optimizer {name!r} (a keras.optimizers name such as 'adam', 'sgd')."
        ) from None
    return cls(learning_rate=learning_rate, **kwargs)


def _register_schedules():
    """Keras learning-rate schedules usable as `make_optimizer.schedule = @cosine_decay`."""
    schedules = keras.optimizers.schedules
    for name, cls in (
        ("cosine_decay", schedules.CosineDecay),
        ("exponential_decay", schedules.ExponentialDecay),
        ("polynomial_decay", schedules.PolynomialDecay),
    ):
        gin.external_configurable(cls, name=name, module="keras.optimizers.schedules")


_register_schedules()


def _current(step):
    """The step variable's value (also for a MirroredVariable, which `int()` rejects)."""
    return int(step.numpy())


def _is_finite(value):
    value = tf.convert_to_tensor(value)
    return bool(np.all(np.isfinite(value.numpy()))) if value.dtype.is_floating else True


def first_non_finite_layer(model, inputs):
    """Replays a forward pass layer by layer; returns `(layer name, what)` for the first layer
    whose weights, KL (`layer.losses`) or output is non-finite, or None."""
    if hasattr(model, "non_finite_culprit"):  # a model that can name its own culprit
        return model.non_finite_culprit(inputs)
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if isinstance(model, keras.Sequential):
        outputs, h = [], inputs
        for layer in layers:
            h = layer(h, training=True)
            outputs.append(h)
    elif getattr(model, "inputs", None):  # functional: replay through a probe model
        probe = keras.Model(model.inputs, [layer.output for layer in layers])
        outputs = probe(inputs, training=True)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    else:  # subclassed: no layer-by-layer replay; weights only
        outputs = [None] * len(layers)
    for layer, output in zip(layers, outputs):
        for weight in layer.weights:
            if not _is_finite(weight):
                return layer.name, f"weight '{weight.path}'"
        for loss in layer.losses:
            if not _is_finite(loss):
                return layer.name, "KL / regularization loss"
        value = output.value if isinstance(output, RandomVariable) else output
        for leaf in tf.nest.flatten(value) if value is not None else []:
            if not _is_finite(leaf):
                return layer.name, "output"
    return None


def _non_finite_rows(values, what):
    """`'features are not finite in rows [3, 7]'`, or None for finite (or non-float) data."""
    if not isinstance(values, (tf.Tensor, np.ndarray)) or not tf.as_dtype(values.dtype).is_floating:
        return None
    values = np.asarray(values)
    finite = np.isfinite(values).reshape(len(values), -1).all(axis=1)
    if finite.all():
        return None
    return f"{what} are not finite in rows {np.flatnonzero(~finite)[:10].tolist()}"


def _jsonable(metrics):
    return {
        k: (float(v) if isinstance(v, (np.floating, float, int)) else v) for k, v in metrics.items()
    }


class Trainer:
    """Trains `model(data.input_shape, data.num_outputs)` on `data` with the ELBO.

    Per example, `loss = NLL + local + beta_t * KL / N`: the task's negative log-likelihood,
    the per-example local losses (a VAE's latent KL), and the weights' KL divided by the number
    of training examples and weighted by `kl_schedule`.

    Args:
      model_dir: output folder; an existing run there is resumed.
      data: a `blayers.lab.data.Data` (its `task` owns likelihood, metrics and plots).
      model: model builder `fn(input_shape, num_outputs)`.
      strategy: a `tf.distribute.Strategy` (default: the default strategy).
      optimizer: optimizer factory (default `make_optimizer`, Adam 1e-3).
      batch_size: global batch size (split across replicas).
      train_steps: optimizer steps in total.
      kl_schedule: `fn(step) -> beta_t`, the weight of `KL / N`.
      eval_every: steps between evaluations (default: only at the end).
      num_eval_samples: Monte Carlo posterior draws per evaluation.
      checkpoint_every: steps between checkpoints (default `min(eval_every, 500)`).
      log_every: steps between logged training scalars.
      keep_checkpoints: checkpoints kept on disk.
      seed: seeds weights, noise and the data order.
      shuffle_buffer: examples shuffled at a time.
      progress: show Keras' progress bar.
      eval_batch_size: examples per evaluation batch.
    """

    def __init__(
        self,
        model_dir,
        data,
        model,
        strategy=None,
        optimizer=make_optimizer,
        batch_size=128,
        train_steps=1000,
        kl_schedule=objectives.constant_kl_weight,
        eval_every=None,
        num_eval_samples=10,
        checkpoint_every=None,
        log_every=50,
        keep_checkpoints=3,
        seed=0,
        shuffle_buffer=10_000,
        progress=True,
        eval_batch_size=500,
    ):
        for name, value in (("train_steps", train_steps), ("batch_size", batch_size)):
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"train.{name} must be a positive integer, got {value!r}.")
        for name, value in (("log_every", log_every), ("num_eval_samples", num_eval_samples)):
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"train.{name} must be a positive integer, got {value!r}.")
        self.data, self.model_fn = data, model
        self.strategy = strategy or tf.distribute.get_strategy()
        self.model_dir = strategy_lib.worker_directory(model_dir, self.strategy)
        self.optimizer_fn = optimizer
        self.num_train = int(data.num_train)
        self.batch_size = min(int(batch_size), self.num_train)
        if self.batch_size < batch_size:
            logging.warning(
                "train.batch_size=%d is more than the %d training examples of %s: full batches "
                "of %d (metrics.json records the batch size used).",
                batch_size,
                self.num_train,
                getattr(data, "name", "the data"),
                self.batch_size,
            )
        self.steps_per_epoch = max(self.num_train // self.batch_size, 1)
        self.train_steps = int(train_steps)
        self.kl_schedule = kl_schedule
        self.eval_every = eval_every
        self.num_eval_samples = int(num_eval_samples)
        self.checkpoint_every = checkpoint_every or max(min(eval_every or train_steps, 500), 1)
        self.log_every = int(log_every)
        self.keep_checkpoints = keep_checkpoints
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.progress = progress
        self.eval_batch_size = eval_batch_size
        self.phase_steps = None  # steps per training phase between collect() calls (None: one)

    # Bindings a resumed run may change (a subclass with its own gin entry point names its own).
    resumable_bindings = RESUMABLE_BINDINGS

    # -- phases ----------------------------------------------------------------------------------
    def run(self):
        """All phases; returns the final test metrics (dict)."""
        os.makedirs(self.model_dir, exist_ok=True)
        with run_files.RunLock(self.model_dir):
            # Refusals first: nothing in the folder is touched by a run that will not go on.
            run_files.check_bindings(self.model_dir, self.resumable_bindings)
            self.setup()
            self.start_step = self.restore()
            run_files.write_bindings(self.model_dir)
            run_files.write_command(self.model_dir)
            # From here on a SIGTERM or Ctrl-C saves a checkpoint (even before the first step).
            with run_files.StopRequest() as self.stop:
                self.write_operative_config()
                self.history = run_files.History(
                    os.path.join(self.model_dir, "history.jsonl"), self.start_step
                )
                self.writer = tf.summary.create_file_writer(
                    os.path.join(self.model_dir, "tensorboard")
                )
                self._window = (self.start_step, time.time(), np.zeros(4))
                while self.step_value() < self.train_steps and not self.stop.requested:
                    self.collect()
                    end = self.train_steps
                    if self.phase_steps:
                        end = min(self.step_value() + self.phase_steps, end)
                    self.train_phase(end)
            if self.stop.requested:
                self.save_checkpoint()
                logging.warning(
                    "Stopped by signal %s at step %d; checkpoint saved, re-run to resume.",
                    self.stop.signal,
                    self.step_value(),
                )
                raise KeyboardInterrupt
            self.checkpoint(final=True)
            metrics, arrays = self.evaluate()
            self.writer.flush()
            self.write_outputs(metrics, arrays)
            self.write_operative_config()
        return metrics

    def setup(self):
        """Seeds, the model, the optimizer, the step and the checkpoint object."""
        seeds.set_seed(self.seed)
        with self.strategy.scope():
            self.model = self.model_fn(self.data.input_shape, self.data.num_outputs)
            self.optimizer = self.optimizer_fn()
            self.optimizer.build(self.model.trainable_variables)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        unapplied = unapplied_layer_bindings(self.model)
        if unapplied:
            raise ValueError(
                "These gin bindings did not take effect (the model builder passes the argument "
                "itself, and the caller wins):\n  " + "\n  ".join(unapplied)
            )
        # Keras does not checkpoint seed-generator states; without them a resumed run would
        # replay the weight noise of its first steps.
        self.seed_states = [
            v for v in self.model.variables if v.path.endswith("seed_generator_state")
        ]
        self.checkpoint_object = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, step=self.step, seed_states=self.seed_states
        )
        self._train_step_fn = self._make_train_step()

    def restore(self):
        """Restores the newest intact checkpoint; returns the step to start from."""
        directory = os.path.join(self.model_dir, "checkpoints")
        restored = run_files.restore_newest_intact(self.checkpoint_object, directory)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint_object, directory, max_to_keep=self.keep_checkpoints
        )
        if restored:
            print(f"Resumed from {restored} at step {self.step_value()}.")
        return self.step_value()

    def write_operative_config(self):
        """`operative_config.gin`: every gin parameter the run used."""
        with open(os.path.join(self.model_dir, "operative_config.gin"), "w") as f:
            f.write(gin.operative_config_str())

    def collect(self):
        """Hook between training phases (e.g. collect episodes into a replay buffer)."""

    def train_phase(self, end_step):
        """Trains until `end_step` (or a stop request), epoch by epoch from the data position
        the step implies."""
        while self.step_value() < end_step and not self.stop.requested:
            epoch, skip = divmod(self.step_value(), self.steps_per_epoch)
            if skip == 0:
                self.begin_epoch(epoch)
            for batch in self.batches(epoch, skip):
                values = [float(v) for v in self.train_step(batch)]
                self.after_step(batch, *values)
                if self.step_value() >= end_step or self.stop.requested:
                    break

    def begin_epoch(self, epoch):
        """Start of an epoch (not of a resumed one's middle): layers with a `begin_epoch()`
        (SNGP's exact-sum precision) restart their per-epoch statistics."""
        del epoch
        for layer in self.model._flatten_layers(include_self=False, recursive=True):
            if callable(getattr(layer, "begin_epoch", None)):
                layer.begin_epoch()

    def batches(self, epoch, skip):
        """The distributed batches of `epoch`, less the first `skip`
        (`blayers.lab.data.stream.epoch_batches`)."""
        ds = epoch_batches(self.data, self.batch_size, self.seed, epoch, skip, self.shuffle_buffer)
        if self.strategy.num_replicas_in_sync == 1:
            # One replica needs no splitting, and distributing costs ~35 ms an epoch: most of
            # the step time on a small data set (UCI's few batches an epoch).
            return ds
        return self.strategy.experimental_distribute_dataset(ds)

    def train_step(self, batch):
        """One optimizer step; returns `(nll, local, kl, kl_weight, bad_replicas)`."""
        return self._train_step_fn(batch)

    def after_step(self, batch, nll, local, kl, kl_weight, bad_replicas):
        """Non-finite guard, then logging, checkpoints and evaluation on their schedules."""
        current = self.step_value()
        loss = nll + local + kl_weight * kl / self.num_train
        if not math.isfinite(loss) or bad_replicas > 0:
            self._raise_non_finite(batch, current, nll, kl)
        start, started, sums = self._window
        sums += (loss, nll, local, kl / self.num_train)
        if current % self.log_every == 0 or current == self.train_steps:
            self.log(current, current - start, sums, kl_weight, time.time() - started)
            self._window = (current, time.time(), np.zeros(4))
        if current % self.checkpoint_every == 0:
            self.save_checkpoint()
        if self.eval_every and current % self.eval_every == 0 and current < self.train_steps:
            began = time.time()
            self.evaluate()
            # Evaluation time is not training time (steps_per_second, train_seconds).
            start, started, sums = self._window
            self._window = (start, started + time.time() - began, sums)

    def log(self, step, count, sums, kl_weight, seconds):
        """One training record: means over the `count` steps since the last record."""
        record = dict(zip(("loss", "nll", "local_loss", "kl_per_example"), sums / max(count, 1)))
        # The (un-annealed) ELBO per example; `loss` is its annealed negative.
        record["elbo"] = -(record["nll"] + record["local_loss"] + record["kl_per_example"])
        record.update(
            kind="train",
            step=step,
            kl_weight=kl_weight,
            steps_per_second=count / max(seconds, 1e-9),
        )
        self.history.add(record)
        with self.writer.as_default(step=step):
            for key in ("loss", "nll", "local_loss", "kl_per_example", "elbo", "kl_weight"):
                tf.summary.scalar(f"train/{key}", record[key])
        shown = [("loss", record["loss"]), ("nll", record["nll"])]
        if record["local_loss"]:  # a VAE's latent KL, per example
            shown.append(("latent_kl", record["local_loss"]))
        shown.append(("weights_kl/N", record["kl_per_example"]))
        self._progress_bar().update(step, shown)

    def save_checkpoint(self):
        """Writes a checkpoint numbered by the step."""
        self.manager.save(checkpoint_number=self.step_value())

    def checkpoint(self, final=False):
        """Saves unless the latest checkpoint is of the current step already."""
        latest = self.manager.latest_checkpoint
        if not final or latest is None or not latest.endswith(f"-{self.step_value()}"):
            self.save_checkpoint()

    def evaluate(self):
        """The task's evaluation of the current model, logged; the training random streams
        (seed-generator states) are restored afterwards, so evaluating never changes the
        weight noise of the steps that follow."""
        saved = [v.numpy() for v in self.seed_states]
        try:
            metrics, arrays = self.data.task.evaluate(
                self.model, self.data, self.num_eval_samples, self.eval_batch_size
            )
        finally:
            for variable, value in zip(self.seed_states, saved):
                variable.assign(value)
        current = self.step_value()
        # put: a re-run of a finished run evaluates again, replacing its record at that step
        self.history.put({"kind": "eval", "step": current, **_jsonable(metrics)})
        with self.writer.as_default(step=current):
            for key, value in metrics.items():
                tf.summary.scalar(f"eval/{key}", value)
        return metrics, arrays

    def write_outputs(self, metrics, arrays):
        """`metrics.json`, `training_curves.png`, the task's plots (also to TensorBoard)."""
        summary = {
            "status": "finished",
            "step": self.step_value(),
            "resumed_from_step": self.start_step,
            "data": self.data.name,
            "task": self.data.task.name,
            "num_train": self.num_train,
            "batch_size": self.batch_size,
            "parameters": self.parameter_counts(),
            "train_seconds": self.train_seconds(),
            "final": _jsonable(metrics),
        }
        with open(os.path.join(self.model_dir, "metrics.json"), "w") as f:
            json.dump(summary, f, indent=2)
        curves = os.path.join(self.model_dir, "training_curves.png")
        plots.training_curves(self.history.records, curves)
        images = [curves, *self.data.task.plot(self.model, self.data, arrays, self.model_dir)]
        with self.writer.as_default(step=self.step_value()):
            for path in images:
                plots.png_to_tensorboard(path)
        self.writer.flush()

    # -- helpers ---------------------------------------------------------------------------------
    def parameter_counts(self):
        """`{'trainable', 'total'}` scalars in the model's variables (`total` adds the
        non-trainable state: normalization statistics, a GP's precision; seed states excluded)."""

        def count(variables):
            return int(sum(np.prod(v.shape) for v in variables))

        state = {id(v) for v in self.seed_states}
        return {
            "trainable": count(self.model.trainable_variables),
            "total": count(v for v in self.model.variables if id(v) not in state),
        }

    def train_seconds(self):
        """Wall-clock seconds of the training steps over the whole run (resumes included), from
        the logged windows (`steps / steps_per_second`); evaluations are not counted."""
        seconds, previous = 0.0, None
        for record in self.history.records:
            if record.get("kind") != "train":
                continue
            start = previous if previous is not None and previous < record["step"] else 0
            if record.get("steps_per_second"):
                seconds += (record["step"] - start) / record["steps_per_second"]
            previous = record["step"]
        return seconds

    def step_value(self):
        return _current(self.step)

    def _progress_bar(self):
        if not hasattr(self, "_bar"):
            self._bar = keras.utils.Progbar(
                self.train_steps,
                verbose=1 if self.progress else 0,
                stateful_metrics=["nll", "latent_kl", "weights_kl/N", "loss"],
            )
        return self._bar

    def _make_train_step(self):
        net, opt, step, strategy = self.model, self.optimizer, self.step, self.strategy
        task, batch_size, num_train = self.data.task, self.batch_size, self.num_train
        kl_schedule = self.kl_schedule

        # reduce_retracing: batches of varying length (padded sequences) trace twice at most
        @tf.function(reduce_retracing=True)
        def train_step(batch):
            def replica_step(x, y):
                with tf.GradientTape() as tape:
                    outputs = net(x, training=True)
                    nll_per_example = task.negative_log_likelihood(outputs, y)
                    nll = tf.nn.compute_average_loss(nll_per_example, global_batch_size=batch_size)
                    local, kl = objectives.split_losses(net)
                    local = local / strategy.num_replicas_in_sync  # per-example (latent KL)
                    kl_weight = tf.cast(kl_schedule(step), kl.dtype)
                    loss = (
                        nll
                        + tf.cast(local, nll.dtype)
                        + tf.cast(
                            tf.nn.scale_regularization_loss(kl_weight * kl / num_train), nll.dtype
                        )
                    )
                grads = tape.gradient(loss, net.trainable_variables)
                dense = [g for g in grads if g is not None and not isinstance(g, tf.IndexedSlices)]
                finite = tf.math.is_finite(loss)
                if dense:
                    finite = tf.logical_and(finite, tf.math.is_finite(tf.linalg.global_norm(dense)))
                # A non-finite step changes no weight: the host stops the run and diagnoses it.
                grads = [
                    g
                    if isinstance(g, tf.IndexedSlices) or g is None
                    else tf.where(finite, g, tf.zeros_like(g))
                    for g in grads
                ]
                opt.apply_gradients(zip(grads, net.trainable_variables))
                return (
                    tf.cast(nll, tf.float32),
                    tf.cast(local, tf.float32),
                    tf.cast(kl, tf.float32),
                    tf.cast(kl_weight, tf.float32),
                    1.0 - tf.cast(finite, tf.float32),
                )

            nll, local, kl, kl_weight, non_finite = strategy.run(replica_step, args=batch)
            step.assign_add(1)
            reduce = tf.distribute.ReduceOp
            return (
                strategy.reduce(reduce.SUM, nll, axis=None),
                strategy.reduce(reduce.SUM, local, axis=None),
                strategy.reduce(reduce.MEAN, kl, axis=None),
                strategy.reduce(reduce.MEAN, kl_weight, axis=None),
                strategy.reduce(reduce.SUM, non_finite, axis=None),  # replicas with a bad step
            )

        return train_step

    def _raise_non_finite(self, batch, step, nll, kl):
        x = self.strategy.experimental_local_results(batch[0])[0]
        y = self.strategy.experimental_local_results(batch[1])[0]
        bad_data = _non_finite_rows(x, "features") or _non_finite_rows(y, "targets")
        culprit = None if bad_data else first_non_finite_layer(self.model, x)
        if bad_data:  # the data, not a layer: say which rows of the batch
            where = f"the batch's {bad_data} of data {self.data.name!r}"
        elif culprit:
            where = f"first non-finite value in '{culprit[0]}' ({culprit[1]})"
        else:
            where = "no layer reproduced a non-finite value on a second pass"
        raise NonFiniteLossError(
            f"Non-finite loss or gradient at step {step} (nll={nll}, kl={kl}): {where}. Training "
            f"stopped; the last good checkpoint is {self.manager.latest_checkpoint}."
        )


def train(
    model_dir, strategy=None, data=gin.REQUIRED, model=gin.REQUIRED, trainer_class=Trainer, **kwargs
):
    """Trains with `trainer_class` (default `Trainer`; an experiment's subclass overrides its
    phases) and returns the final test metrics. The gin entry point: `train.data = @digits()`,
    `train.model = @mlp`, `train.train_steps = 1500`, ...; the other arguments are `Trainer`'s
    (see its docstring).
    """
    return trainer_class(model_dir, data, model, strategy=strategy, **kwargs).run()


# `train` takes exactly Trainer's arguments: its signature says so, so that gin and
# `blayers.lab.config.validate_bindings` reject a misspelt `train.trian_steps` before anything runs.
train.__signature__ = inspect.Signature(
    [
        *list(inspect.signature(train).parameters.values())[:5],
        *(
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for name, p in inspect.signature(Trainer.__init__).parameters.items()
            if name not in ("self", "model_dir", "data", "model", "strategy")
        ),
    ]
)
train = gin.configurable(module="blayers.lab.trainer", denylist=["model_dir", "strategy"])(train)
