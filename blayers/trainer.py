"""The training and evaluation loop: ELBO on a `tf.distribute` strategy, with checkpoints,
resume, a non-finite-loss guard, TensorBoard scalars, metrics and plots.

Everything in `model_dir`:

* `checkpoints/` (`tf.train.CheckpointManager`: model, optimizer, step);
* `operative_config.gin` (the gin bindings the run used);
* `history.jsonl` (one record per log interval and per evaluation), `metrics.json` (final);
* `tensorboard/` scalars; `training_curves.png`, `reliability.png` or `regression_1d.png`.

Re-running the same command resumes from the last checkpoint: the step, the optimizer state and
the data position (the epoch's shuffle order is a function of the seed and the epoch, and the
batches already consumed in that epoch are skipped). Ctrl-C saves a checkpoint first.
"""

import json
import math
import os
import signal
import threading
import time

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from blayers import config as config_lib
from blayers import evaluation, objectives, plots, seeds
from blayers.data.augment import augment_indexed
from blayers.random_variable import RandomVariable

__all__ = ["NonFiniteLossError", "first_non_finite_layer", "make_optimizer", "train"]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the message names the step and the layer."""


@gin.configurable(module="blayers.trainer")
def make_optimizer(name="adam", learning_rate=1e-3, schedule=None, **kwargs):
    """A Keras optimizer by name (`'adam'`, `'sgd'`, `'rmsprop'`, `'adamw'`, ...).

    `schedule`: optional callable `schedule(learning_rate)` returning a Keras
    `LearningRateSchedule`, e.g. `@cosine_decay` (see `blayers.config`).
    """
    if schedule is not None:
        learning_rate = schedule(learning_rate)
    try:
        cls = keras.optimizers.get(name).__class__
    except ValueError:
        raise ValueError(
            f"Unknown optimizer {name!r} (a keras.optimizers name such as 'adam', 'sgd')."
        ) from None
    return cls(learning_rate=learning_rate, **kwargs)


def _current(step):
    """The step variable's value (also for a MirroredVariable, which `int()` rejects)."""
    return int(step.numpy())


def _is_finite(value):
    value = tf.convert_to_tensor(value)
    return bool(np.all(np.isfinite(value.numpy()))) if value.dtype.is_floating else True


def first_non_finite_layer(model, inputs):
    """Replays a forward pass layer by layer; returns `(layer name, what)` for the first layer
    whose weights, KL (`layer.losses`) or output is non-finite, or None."""
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if isinstance(model, keras.Sequential):
        outputs, h = [], inputs
        for layer in layers:
            h = layer(h, training=True)
            outputs.append(h)
    else:
        probe = keras.Model(model.inputs, [layer.output for layer in layers])
        outputs = probe(inputs, training=True)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    for layer, output in zip(layers, outputs):
        for weight in layer.weights:
            if not _is_finite(weight):
                return layer.name, f"weight '{weight.path}'"
        for loss in layer.losses:
            if not _is_finite(loss):
                return layer.name, "KL / regularization loss"
        value = output.value if isinstance(output, RandomVariable) else output
        for leaf in tf.nest.flatten(value):
            if not _is_finite(leaf):
                return layer.name, "output"
    return None


class _StopOnInterrupt:
    """Turns the first Ctrl-C (SIGINT) into a request to stop after the current step, so the
    checkpoint is written outside any TensorFlow call; a second Ctrl-C interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, self._previous)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


class _History:
    """Append-only JSON lines, truncated to the restored step on resume."""

    def __init__(self, path, resume_step):
        self.path = path
        self.records = []
        if os.path.exists(path):
            with open(path) as f:
                self.records = [r for r in map(json.loads, f) if r["step"] <= resume_step]
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.records)

    def add(self, record):
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _jsonable(metrics):
    return {
        k: (float(v) if isinstance(v, (np.floating, float, int)) else v) for k, v in metrics.items()
    }


@gin.configurable(module="blayers.trainer", denylist=["model_dir", "strategy"])
def train(
    model_dir,
    strategy=None,
    data=gin.REQUIRED,
    model=gin.REQUIRED,
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
    """Trains `model(data.input_shape, data.num_outputs)` on `data` with the ELBO.

    Args:
      model_dir: output folder; an existing run there is resumed.
      strategy: a `tf.distribute.Strategy` (default: the default strategy).
      data: a `blayers.data.Data` (in gin: `train.data = @digits()`).
      model: model builder `fn(input_shape, num_outputs)` (in gin: `train.model = @mlp`).
      optimizer: optimizer factory (default `make_optimizer`, Adam 1e-3).
      batch_size: global batch size (split across replicas).
      train_steps: optimizer steps in total.
      kl_schedule: `fn(step) -> beta_t`, weight of `KL / num_train` in the loss.
      eval_every: steps between evaluations (default: only at the end).
      num_eval_samples: Monte Carlo posterior draws per evaluation.
      checkpoint_every: steps between checkpoints (default: `max(eval_every, 100)`-ish).
      log_every: steps between logged training scalars.
      seed: seeds weights, noise and the data order.

    Returns:
      The final test metrics (dict).
    """
    strategy = strategy or tf.distribute.get_strategy()
    os.makedirs(model_dir, exist_ok=True)
    seeds.set_seed(seed)
    num_train = int(data.num_train)
    batch_size = min(batch_size, num_train)
    steps_per_epoch = max(num_train // batch_size, 1)
    checkpoint_every = checkpoint_every or max(min(eval_every or train_steps, 500), 1)

    with strategy.scope():
        net = model(data.input_shape, data.num_outputs)
        opt = optimizer()
        opt.build(net.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    # Keras does not checkpoint seed-generator states; without them a resumed run would replay
    # the weight noise of its first steps.
    seed_states = [v for v in net.variables if v.path.endswith("seed_generator_state")]
    checkpoint = tf.train.Checkpoint(model=net, optimizer=opt, step=step, seed_states=seed_states)
    manager = tf.train.CheckpointManager(
        checkpoint, os.path.join(model_dir, "checkpoints"), max_to_keep=keep_checkpoints
    )
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        print(f"Resumed from {manager.latest_checkpoint} at step {_current(step)}.")
    config_lib.write_operative_config(model_dir)
    start_step = _current(step)
    history = _History(os.path.join(model_dir, "history.jsonl"), start_step)
    writer = tf.summary.create_file_writer(os.path.join(model_dir, "tensorboard"))

    @tf.function
    def train_step(batch):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                outputs = net(x, training=True)
                nll_per_example = objectives.negative_log_likelihood(outputs, y, data.task)
                nll = tf.nn.compute_average_loss(nll_per_example, global_batch_size=batch_size)
                local, kl = objectives.split_losses(net)
                nll += local / strategy.num_replicas_in_sync  # per-example terms (latent KL)
                kl_weight = tf.cast(kl_schedule(step), kl.dtype)
                loss = nll + tf.nn.scale_regularization_loss(kl_weight * kl / num_train)
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
            return nll, kl, kl_weight, 1.0 - tf.cast(finite, tf.float32)

        nll, kl, kl_weight, non_finite = strategy.run(replica_step, args=batch)
        step.assign_add(1)
        reduce = tf.distribute.ReduceOp
        return (
            strategy.reduce(reduce.SUM, nll, axis=None),
            strategy.reduce(reduce.MEAN, kl, axis=None),
            strategy.reduce(reduce.MEAN, kl_weight, axis=None),
            strategy.reduce(reduce.SUM, non_finite, axis=None),  # replicas with a bad step
        )

    def epoch_batches(epoch, skip):
        epoch_seed = seed * 100_003 + epoch
        ds = data.train
        if data.augment is not None:  # index examples first: their noise follows them
            ds = ds.enumerate()
        ds = ds.shuffle(
            min(num_train, shuffle_buffer), seed=epoch_seed, reshuffle_each_iteration=False
        )
        if data.augment is not None:
            ds = augment_indexed(ds, data.augment, epoch_seed)
        ds = ds.batch(batch_size, drop_remainder=True).skip(skip).prefetch(tf.data.AUTOTUNE)
        return strategy.experimental_distribute_dataset(ds)

    def run_eval():
        metrics, arrays = evaluation.evaluate(net, data, num_eval_samples, eval_batch_size)
        current = _current(step)
        history.add({"kind": "eval", "step": current, **_jsonable(metrics)})
        with writer.as_default(step=current):
            for key, value in metrics.items():
                tf.summary.scalar(f"eval/{key}", value)
        return metrics, arrays

    bar = keras.utils.Progbar(
        train_steps, verbose=1 if progress else 0, stateful_metrics=["nll", "kl", "loss"]
    )
    start_time, sums = time.time(), np.zeros(3)
    with _StopOnInterrupt() as stop:
        while _current(step) < train_steps and not stop.requested:
            current = _current(step)
            epoch, skip = divmod(current, steps_per_epoch)
            for batch in epoch_batches(epoch, skip):
                last_batch = batch
                nll, kl, kl_weight, bad_replicas = (float(v) for v in train_step(batch))
                current = _current(step)
                loss = nll + kl_weight * kl / num_train
                if not math.isfinite(loss) or bad_replicas > 0:
                    _raise_non_finite(net, strategy, last_batch, current, nll, kl, manager)
                sums += (loss, nll, kl / num_train)
                if current % log_every == 0 or current == train_steps:
                    count = (current - 1) % log_every + 1
                    record = dict(zip(("loss", "nll", "kl_per_example"), sums / count))
                    # The (un-annealed) ELBO per example; `loss` is its annealed negative.
                    record["elbo"] = -(record["nll"] + record["kl_per_example"])
                    record.update(
                        kind="train",
                        step=current,
                        kl_weight=kl_weight,
                        steps_per_second=count / max(time.time() - start_time, 1e-9),
                    )
                    history.add(record)
                    with writer.as_default(step=current):
                        for key in ("loss", "nll", "kl_per_example", "elbo", "kl_weight"):
                            tf.summary.scalar(f"train/{key}", record[key])
                    bar.update(
                        current,
                        [
                            ("loss", record["loss"]),
                            ("nll", record["nll"]),
                            ("kl", record["kl_per_example"]),
                        ],
                    )
                    sums[:] = 0
                    start_time = time.time()
                if current % checkpoint_every == 0:
                    manager.save(checkpoint_number=current)
                if eval_every and current % eval_every == 0 and current < train_steps:
                    run_eval()
                if current >= train_steps or stop.requested:
                    break
    if stop.requested:
        manager.save(checkpoint_number=_current(step))
        logging.warning(
            "Interrupted at step %d; checkpoint saved, re-run to resume.", _current(step)
        )
        raise KeyboardInterrupt
    if manager.latest_checkpoint is None or not manager.latest_checkpoint.endswith(
        f"-{_current(step)}"
    ):
        manager.save(checkpoint_number=_current(step))

    metrics, arrays = run_eval()
    writer.flush()
    _write_outputs(model_dir, data, metrics, arrays, history.records, _current(step), start_step)
    config_lib.write_operative_config(model_dir)
    return metrics


def _raise_non_finite(net, strategy, batch, step, nll, kl, manager):
    x = strategy.experimental_local_results(batch[0])[0]
    culprit = first_non_finite_layer(net, x)
    where = (
        f"first non-finite value in layer '{culprit[0]}' ({culprit[1]})"
        if culprit
        else "no layer reproduced a non-finite value on a second pass"
    )
    raise NonFiniteLossError(
        f"Non-finite loss or gradient at step {step} (nll={nll}, kl={kl}): {where}. Training "
        f"stopped; the last good checkpoint is {manager.latest_checkpoint}."
    )


def _write_outputs(model_dir, data, metrics, arrays, records, step, start_step):
    summary = {
        "status": "finished",
        "step": step,
        "resumed_from_step": start_step,
        "data": data.name,
        "task": data.task,
        "num_train": data.num_train,
        "final": _jsonable(metrics),
    }
    with open(os.path.join(model_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    plots.training_curves(records, os.path.join(model_dir, "training_curves.png"))
    if data.task == "classification":
        plots.reliability_diagram(
            arrays["probs"], arrays["labels"], os.path.join(model_dir, "reliability.png")
        )
    elif data.task == "density":
        if hasattr(arrays["density_model"], "reconstruct") and "inputs" in arrays:
            plots.image_grid(
                arrays["density_model"], arrays["inputs"], os.path.join(model_dir, "samples.png")
            )
        elif arrays["targets"].ndim == 2 and arrays["targets"].shape[1] > 2:
            plots.flow_samples(
                arrays["density_model"], arrays["inputs"], os.path.join(model_dir, "samples.png")
            )
        elif arrays["targets"].ndim == 2 and arrays["targets"].shape[1] == 2:
            plots.density_2d(
                arrays["density_model"], arrays["targets"], os.path.join(model_dir, "density.png")
            )
    elif arrays["inputs"].ndim == 2 and arrays["inputs"].shape[1] == 1:
        plots.regression_1d(
            arrays["inputs"],
            arrays["means"],
            arrays["stddevs"],
            arrays["targets"],
            os.path.join(model_dir, "regression_1d.png"),
            arrays["scale"],
            arrays["shift"],
        )
