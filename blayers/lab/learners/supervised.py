"""The supervised ELBO learner, and the variational-program learner built on it.

Per example, `loss = NLL + local + beta_t * KL / N`: the task's negative log-likelihood, the
per-example local losses (a VAE's latent KL), and the weights' KL divided by the number of
training examples and weighted by `kl_schedule` (the paper's Section 2 objective; a
`tf.distribute` strategy splits the batch).

Replicated data (`blayers.lab.data.Replicas`: many independent models as one, the splits, grid
points and seeds of a UCI table or a deep ensemble's members) trains the sum over replicas of
each one's objective, through a model whose layers have `replicas=R` (`blayers.replicas`): the
builder gets the replicas (`model(input_shape, num_outputs, replicas=...)`), each replica reads
its own rows in its own order (gathered in the graph from resident data), and since a
replica's weights get the gradient of its own loss only and Adam's update is elementwise, each
follows the trajectory it follows alone. The records hold the means over replicas; the
evaluation scores each replica on its own test rows, and `metrics.json` lists each replica's
metrics under `replicas` (with its name, seed and hyperparameters) for model selection.
"""

import functools
import json
import numbers
import os

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from blayers import objectives, optimizers, seeds
from blayers.lab import plots
from blayers.lab.configurables import unapplied_layer_bindings
from blayers.lab.data.replicas import Replicas, as_replicas
from blayers.lab.data.stream import epoch_batches
from blayers.lab.learners.base import KerasLearner, Steps, non_finite, refuse_strategy
from blayers.random_variable import RandomVariable
from blayers.replicas import fold_seed

__all__ = [
    "SupervisedLearner",
    "VariationalProgramLearner",
    "first_non_finite_layer",
    "make_optimizer",
]


# The scalars of a supervised step, in every record.
STEP_SCALARS = ("loss", "nll", "local_loss", "kl_per_example", "elbo", "kl_weight", "non_finite")


@gin.configurable(module="blayers.lab.learners")
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
    # Keras' Adam and AdamW, each variable's update one fused kernel (`blayers.optimizers`)
    cls = _FUSED.get(cls, cls)
    return cls(learning_rate=learning_rate, **kwargs)


_FUSED = {keras.optimizers.Adam: optimizers.Adam, keras.optimizers.AdamW: optimizers.AdamW}


def _register_schedules():
    """Keras learning-rate schedules usable as `make_optimizer.schedule = @cosine_decay` (or
    `@cosine_decay_restarts`, the cycles of a snapshot ensemble)."""
    schedules = keras.optimizers.schedules
    for name, cls in (
        ("cosine_decay", schedules.CosineDecay),
        ("exponential_decay", schedules.ExponentialDecay),
        ("polynomial_decay", schedules.PolynomialDecay),
        # Warm restarts (Loshchilov & Hutter, 2017): snapshot ensembles' cyclic schedule.
        ("cosine_decay_restarts", schedules.CosineDecayRestarts),
    ):
        gin.external_configurable(cls, name=name, module="keras.optimizers.schedules")


_register_schedules()


def _is_finite(value):
    value = tf.convert_to_tensor(value)
    return bool(np.all(np.isfinite(value.numpy()))) if value.dtype.is_floating else True


def first_non_finite_layer(model, inputs=None):
    """Replays a forward pass layer by layer; returns `(layer name, what)` for the first layer
    whose weights, KL (`layer.losses`) or output is non-finite, or None. Without `inputs` (or
    for a subclassed model) only the weights are checked."""
    if hasattr(model, "non_finite_culprit") and inputs is not None:
        return model.non_finite_culprit(inputs)
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if inputs is not None and isinstance(model, keras.Sequential):
        outputs, h = [], inputs
        for layer in layers:
            h = layer(h, training=True)
            outputs.append(h)
    elif inputs is not None and getattr(model, "inputs", None):  # functional: a probe model
        probe = keras.Model(model.inputs, [layer.output for layer in layers])
        outputs = probe(inputs, training=True)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    else:  # subclassed: no layer-by-layer replay; weights only
        outputs = [None] * len(layers)
    for layer, output in zip(layers, outputs):
        for weight in layer.weights:
            if not _is_finite(weight):
                return layer.name, f"weight '{weight.path}'"
        for loss in layer.losses if output is not None else ():
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


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"SupervisedLearner.{name} must be a positive integer, got {value!r}.")
    return int(value)


@gin.configurable(module="blayers.lab.learners")
class SupervisedLearner(KerasLearner):
    """Trains `model(data.input_shape, data.num_outputs)` on `data` with the ELBO (module
    docstring); the data's task owns the likelihood, the metrics and the plots.

    Args:
      data: a `blayers.lab.data.Data`, or replicas (`Replica`s, e.g. `@uci_replicas()`, or
        `blayers.lab.data.Replicas`): many independent models trained as one (module
        docstring).
      model: model builder `fn(input_shape, num_outputs)` (with replicated data,
        `fn(input_shape, num_outputs, replicas=...)`).
      optimizer: optimizer factory (default `make_optimizer`, Adam 1e-3).
      batch_size: global batch size (split across replicas).
      kl_schedule: `fn(step) -> beta_t`, the weight of `KL / N`.
      num_eval_samples: Monte Carlo posterior draws per evaluation.
      eval_batch_size: examples per evaluation batch.
      shuffle_buffer: examples shuffled at a time.
      eval_rows: with replicated data, rows (replicas x draws x examples) in one evaluation
        call.
    """

    resumable_bindings = (
        "SupervisedLearner.num_eval_samples",
        "SupervisedLearner.eval_batch_size",
        "SupervisedLearner.eval_rows",
    )
    instant_scalars = ("kl_weight",)
    progress_scalars = (
        ("loss", "loss"),
        ("nll", "nll"),
        ("local_loss", "latent_kl"),
        ("kl_per_example", "weights_kl/N"),
    )
    progress_if_nonzero = ("local_loss",)
    # Refuse layer bindings the model builder overrides. Off when rebuilding from an operative
    # config, which records each layer argument's default even where the builder passes its own.
    check_bindings = True

    def __init__(
        self,
        data=gin.REQUIRED,
        model=gin.REQUIRED,
        optimizer=make_optimizer,
        batch_size=128,
        kl_schedule=objectives.constant_kl_weight,
        num_eval_samples=10,
        eval_batch_size=500,
        shuffle_buffer=10_000,
        eval_rows=1_000_000,
    ):
        data = as_replicas(data)
        self.data, self.model_fn, self.optimizer_fn = data, model, optimizer
        self.replicated = isinstance(data, Replicas)
        self.num_train = int(data.num_train)
        requested = _positive("batch_size", batch_size)
        self.batch_size = min(requested, self.num_train)
        if self.batch_size < requested:
            logging.warning(
                "SupervisedLearner.batch_size=%d is more than the %d training examples of %s: "
                "full batches of %d (metrics.json records the batch size used).",
                requested,
                self.num_train,
                getattr(data, "name", "the data"),
                self.batch_size,
            )
        self.steps_per_epoch = max(self.num_train // self.batch_size, 1)
        self.kl_schedule = kl_schedule
        self.num_eval_samples = _positive("num_eval_samples", num_eval_samples)
        self.eval_batch_size = _positive("eval_batch_size", eval_batch_size)
        self.eval_rows = _positive("eval_rows", eval_rows)
        self.shuffle_buffer = shuffle_buffer

    # -- build and state -------------------------------------------------------------------------
    def build(self, context):
        if context.strategy_name == "mesh":
            refuse_strategy(self, context, "a tf.distribute strategy (cpu, gpu, mirrored, ...)")
        self.strategy, self.seed = context.strategy, context.seed
        self._train_steps = context.train_steps
        extra = {}
        if self.replicated:
            if context.strategy.num_replicas_in_sync > 1:
                refuse_strategy(self, context, "one device (replicas already batch the work)")
            # A replica's seed joins the run's (`train.seed`, the `seed` macro a sweep varies):
            # it still depends on no other replica of the group.
            self.replica_seeds = [r.seed for r in self.data.members]
            self.data = self.data.with_run_seed(self.seed, fold_seed).load()
            extra = {"replicas": self.data.members}
        seeds.set_seed(self.seed)
        with self.strategy.scope():
            model = self.model_fn(self.data.input_shape, self.data.num_outputs, **extra)
            optimizer = self.optimizer_fn()
            optimizer.build(model.trainable_variables)
            self.track(model, optimizer)
        unapplied = unapplied_layer_bindings(self.model) if self.check_bindings else []
        if unapplied:
            raise ValueError(
                "These gin bindings did not take effect (the model builder passes the argument "
                "itself, and the caller wins):\n  " + "\n  ".join(unapplied)
            )
        self._train_step_fn = self._make_train_step()

    # -- training --------------------------------------------------------------------------------
    def batches(self):
        """The rest of the current epoch, from the data position the step implies
        (`blayers.lab.data.stream.epoch_batches`; replicas: each one's rows in its own order),
        and the next epochs' to the run's end, as one pipeline; a new epoch starts with
        `begin_epoch` (a model whose layers restart statistics at each epoch keeps to one epoch a
        phase)."""
        epoch, skip = divmod(self.step, self.steps_per_epoch)
        if skip == 0:
            self.begin_epoch(epoch)
        if self.replicated:
            order = self.data.epoch_order(epoch)
            return (
                self.data.batch(order, b, self.batch_size)
                for b in range(skip, self.steps_per_epoch)
            )
        epochs = 1
        if not self._epoch_hooks:  # the rest of the run: one pipeline, one iterator
            left = self._train_steps - epoch * self.steps_per_epoch
            epochs = max(1, -(-left // self.steps_per_epoch))
        return self._epoch_batches(epoch, skip, epochs)

    @functools.cached_property
    def _epoch_hooks(self):
        """Whether anything runs at an epoch's start (`begin_epoch`)."""
        if type(self).begin_epoch is not SupervisedLearner.begin_epoch:
            return True
        layers = self.model._flatten_layers(include_self=False, recursive=True)
        return any(callable(getattr(layer, "begin_epoch", None)) for layer in layers)

    def _epoch_batches(self, epoch, skip, epochs=1):
        """Epoch `epoch`'s batches less its first `skip`, then the next `epochs - 1` epochs':
        one pipeline, one iterator (a new one costs milliseconds: most of a step on a small
        data set, whose epoch is a batch or a few)."""
        ds = epoch_batches(
            self.data, self.batch_size, self.seed, epoch, skip, self.shuffle_buffer, epochs
        )
        if self.strategy.num_replicas_in_sync == 1:
            # One replica needs no splitting, and distributing costs ~35 ms an epoch: most of
            # the step time on a small data set (UCI's few batches an epoch).
            return ds
        return self.strategy.experimental_distribute_dataset(ds)

    def begin_epoch(self, epoch):
        """Layers with a `begin_epoch()` (SNGP's exact-sum precision) restart their per-epoch
        statistics."""
        del epoch
        for layer in self.model._flatten_layers(include_self=False, recursive=True):
            if callable(getattr(layer, "begin_epoch", None)):
                layer.begin_epoch()

    def begin_phase(self):
        """The rest of the epoch: a data pipeline, or replicas' resident rows, run in the graph,
        several steps a call (`train_steps`); other batches (a subclass's `batches`), one step
        a call."""
        self._epoch = self.step // self.steps_per_epoch
        if self.replicated:
            if self.step % self.steps_per_epoch == 0:
                self.begin_epoch(self._epoch)
            self._order = self.data.epoch_order(self._epoch)
            self._order_tensor = tf.constant(self._order, tf.int32)
            self._iterator = None
            return
        batches = self.batches()
        graph_data = (tf.data.Dataset, tf.distribute.DistributedDataset)
        self._iterator = iter(batches) if isinstance(batches, graph_data) else None
        self._phase = self._iterator if self._iterator is not None else iter(batches)

    def train_steps(self, n):
        if self.replicated:
            start = self.step - self._epoch * self.steps_per_epoch
            n = min(n, self.steps_per_epoch - start)
            if n <= 0:
                return Steps(0, {}, {})
            args = (self._order_tensor, tf.constant(start))
        elif self._iterator is None:
            return super().train_steps(n)
        else:
            args = (self._iterator,)
        count, sums, last = self.read_steps(self._train_steps_fn(tf.constant(n), *args))
        self.bad_replica = int(last.pop("bad_replica", -1))
        sums.pop("bad_replica", None)
        bad = None
        if non_finite(last):  # the batch of the step again, from its place in the epoch
            epoch, position = divmod(self.step - 1, self.steps_per_epoch)
            if self.replicated:
                bad = self.data.batch(self._order, position, self.batch_size)
            else:
                bad = next(iter(self._epoch_batches(epoch, position)))
        return Steps(count, sums, last, bad)

    def train_step(self, batch):
        scalars = {k: float(v) for k, v in self._train_step_fn(batch).items()}
        self.bad_replica = int(scalars.pop("bad_replica", -1))
        return scalars

    def diagnose_non_finite(self, batch):
        if self.replicated:
            return self._diagnose_replicas(batch)
        x = self.strategy.experimental_local_results(batch[0])[0]
        y = self.strategy.experimental_local_results(batch[1])[0]
        bad_data = _non_finite_rows(x, "features") or _non_finite_rows(y, "targets")
        if bad_data:  # the data, not a layer: say which rows of the batch
            return f"the batch's {bad_data} of data {self.data.name!r}"
        culprit = first_non_finite_layer(self.model, x)
        if culprit:
            return f"first non-finite value in '{culprit[0]}' ({culprit[1]})"
        return "no layer reproduced a non-finite value on a second pass"

    def _diagnose_replicas(self, batch):
        x, y = batch
        members = self.data.members
        for what, values in (("features", x), ("targets", y)):
            bad = [r for r in range(len(members)) if not np.isfinite(values[r]).all()]
            if bad:
                return f"the batch's {what} of replica {members[bad[0]].name} are not finite"
        if getattr(self, "bad_replica", -1) >= 0:
            name = members[self.bad_replica].name
            return f"the NLL of replica {name} (the first of {len(members)}) is not finite"
        culprit = first_non_finite_layer(self.model)  # the weights: no per-replica replay
        if culprit:
            return f"first non-finite value in '{culprit[0]}' ({culprit[1]})"
        return "the weights' KL or penalty is not finite"

    # -- evaluation and outputs ------------------------------------------------------------------
    def evaluate(self):
        """The task's evaluation of the current model (replicas: each on its own test rows);
        the training random streams (seed-generator states) are restored afterwards."""
        with self.training_streams_kept():
            if self.replicated:
                return self.data.evaluate(self.model, self.num_eval_samples, self.eval_rows)
            return self.data.task.evaluate(
                self.model, self.data, self.num_eval_samples, self.eval_batch_size
            )

    def predictive(self):
        """`(model, draws)`: what the run's predictive calls, and how many draws it takes
        (None: `num_eval_samples`); the post-hoc methods score the run through it."""
        return self.model, None

    def outputs(self, run, records, metrics, arrays):
        """`training_curves.png` and the task's plots; the data, task and sizes (replicas:
        each one's metrics, with its name, seed and hyperparameters, under `replicas`)."""
        curves = run.file("training_curves.png")
        plots.training_curves(records, curves)
        summary = {
            "data": self.data.name,
            "task": self.data.task.name,
            "num_train": self.num_train,
            "batch_size": self.batch_size,
            "parameters": self.parameter_counts(),
        }
        if self.replicated:
            summary["num_replicas"] = len(self.data)
            summary["replicas"] = []
            for (name, members), scores in zip(self.data.units(), arrays["replicas"]):
                replica = self.data.members[members[0]]
                seeds = [self.replica_seeds[r] for r in members]
                summary["replicas"].append(
                    {
                        "name": name,
                        "data": replica.data.name,
                        "seed": seeds[0] if len(seeds) == 1 else seeds,
                        "hparams": json.loads(json.dumps(replica.hparams, default=str)),
                        "final": scores,
                    }
                )
            return summary, [curves]
        arrays.setdefault(
            "label", f"{os.path.basename(os.path.normpath(run.path))}: {self.model.name}"
        )
        images = [curves, *self.data.task.plot(self.model, self.data, arrays, run.path)]
        return summary, images

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

    def after_step(self):
        """In the step's graph, after the optimizer step and the step count (a sampler keeps
        its samples here); nothing by default."""
        return  # a statement: AutoGraph cannot convert a body that is only a docstring

    def _make_train_step(self):
        net, opt, step, strategy = self.model, self.optimizer, self.step_variable, self.strategy
        task, batch_size, num_train = self.data.task, self.batch_size, self.num_train
        kl_schedule, replicated = self.kl_schedule, self.replicated
        after_step = self.after_step
        # Records hold a replica's mean: the objective is the sum over replicas.
        per_replica = float(len(self.data)) if replicated else 1.0

        def train_step(batch):
            def replica_step(x, y):
                with tf.GradientTape() as tape:
                    outputs = net(x, training=True)
                    if replicated:  # [R, B]: each replica's mean NLL, summed over replicas
                        nll_rows = task.negative_log_likelihood(outputs, y, example_axes=2)
                        nll_replicas = tf.reduce_mean(nll_rows, axis=1)
                        nll = tf.reduce_sum(nll_replicas)
                    else:
                        nll_per_example = task.negative_log_likelihood(outputs, y)
                        nll = tf.nn.compute_average_loss(
                            nll_per_example, global_batch_size=batch_size
                        )
                        nll_replicas = tf.reshape(nll, [1])
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
                finite_replicas = tf.math.is_finite(nll_replicas)
                bad_replica = tf.where(
                    tf.reduce_all(finite_replicas),
                    -1,
                    tf.argmin(tf.cast(finite_replicas, tf.int32), output_type=tf.int32),
                )
                return (
                    tf.cast(nll, tf.float32),
                    tf.cast(local, tf.float32),
                    tf.cast(kl, tf.float32),
                    tf.cast(kl_weight, tf.float32),
                    1.0 - tf.cast(finite, tf.float32),
                    bad_replica,
                )

            nll, local, kl, kl_weight, bad, bad_replica = strategy.run(replica_step, args=batch)
            step.assign_add(1)
            after_step()
            reduce = tf.distribute.ReduceOp
            nll = strategy.reduce(reduce.SUM, nll, axis=None) / per_replica
            local = strategy.reduce(reduce.SUM, local, axis=None)
            kl = strategy.reduce(reduce.MEAN, kl, axis=None) / per_replica
            kl_per_example = kl / num_train
            kl_weight = strategy.reduce(reduce.MEAN, kl_weight, axis=None)
            scalars = {
                "loss": nll + local + kl_weight * kl_per_example,
                "nll": nll,
                "local_loss": local,
                "kl_per_example": kl_per_example,
                # The (un-annealed) ELBO per example; `loss` is its annealed negative.
                "elbo": -(nll + local + kl_per_example),
                "kl_weight": kl_weight,
                "non_finite": strategy.reduce(reduce.SUM, bad, axis=None),  # bad replicas
            }
            if replicated:  # one device: the replica context's value is the value
                scalars["bad_replica"] = bad_replica
            return scalars

        if replicated:
            data, table = self.data, tf.constant(self.data.table)
            replicas = len(data)

            def next_batch(i, order, start):
                """Batch `start + i` of the epoch: each replica's rows in its own order,
                gathered from the resident data in the graph."""
                rows = order[:, (start + i) * batch_size : (start + i + 1) * batch_size]
                rows = tf.reshape(rows, [replicas, batch_size])
                return tf.constant(True), lambda: data.gather(table, rows)

            names = (*STEP_SCALARS, "bad_replica")
        else:

            def next_batch(i, iterator):
                del i
                optional = iterator.get_next_as_optional()
                return optional.has_value(), optional.get_value

            names = STEP_SCALARS
        self._train_steps_fn = self.compile_steps(train_step, next_batch, names, autograph=False)
        # reduce_retracing: batches of varying length (padded sequences) trace twice at most
        return tf.function(train_step, reduce_retracing=True, autograph=False)


@gin.configurable(module="blayers.lab.learners")
class VariationalProgramLearner(SupervisedLearner):
    """Fits a probabilistic program: the model is a `blayers.programs.VariationalProgram`,
    whose output per example is the negative ELBO of its model program and posterior program
    (reparameterization gradients, score-function terms for discrete variables); the data's
    task is `VariationalInference` or `PointProcess`, whose negative log-likelihood is that
    output, so `nll` in the records is the programs' negative ELBO per example (and `loss`
    adds any weight KL the programs' layers add, annealed by `kl_schedule`).

    Args: as `SupervisedLearner`.
    """

    resumable_bindings = (
        "VariationalProgramLearner.num_eval_samples",
        "VariationalProgramLearner.eval_batch_size",
    )
    progress_scalars = (("loss", "loss"), ("elbo", "elbo"))

    def build(self, context):
        super().build(context)
        from blayers.programs import VariationalProgram

        if not isinstance(self.model, VariationalProgram):
            raise ValueError(  # noqa: TRY004 - a configuration error (the CLI exits 2)
                f"VariationalProgramLearner.model built a {type(self.model).__name__}, not a "
                "blayers.programs.VariationalProgram (its model and posterior programs); a "
                "Keras model with a likelihood trains with SupervisedLearner."
            )
