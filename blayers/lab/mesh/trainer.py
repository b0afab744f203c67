"""The graph-mode training loop of the Mesh TensorFlow Bayesian Transformer.

TF 2.21 has no `tf.estimator` (and Mesh TensorFlow's own Transformer needs TPUEstimator), so
the loop is ours: one `mtf.Graph` lowered onto a placement mesh (logical CPU devices or GPUs)
in a `tf.Graph` with a session of its own (the process stays eager), training batches streamed
from `data.train` into placeholders as the Keras trainer draws them, master variables in a
`tf.compat.v1.train.Saver` checkpoint (slices copied to the masters before each save, masters
to slices after each restore), the per-example ELBO `NLL + beta * KL / N`, and the run
folder's promises of the Keras trainer (`blayers.lab.run_files`): the run lock, refusal of
changed bindings on resume, the newest intact checkpoint (relative paths, so a copied folder
restores its own), a checkpoint on SIGTERM or Ctrl-C, `history.jsonl` and `tensorboard/`,
`operative_config.gin`, `training_curves.png`, `sequence_reliability.png` and `metrics.json`
with the teacher-forced test token NLL, perplexity, accuracy and ECE under the
Monte Carlo predictive (`num_eval_samples` weight draws), and greedy and beam decodes scored by
BLEU and sequence-level calibration, all as the Keras path's `SequenceToSequence` computes them
(its `decode_metrics` runs on a `next_log_probs` that feeds each prefix to the graph).

Logical CPU devices are a process-wide setting made before TensorFlow starts; the CLI makes
them (`--num_cpu_devices`). From the command line:

    python -m blayers.train --strategy=mesh --num_cpu_devices=2 --mesh_shape=model:2 \
        --gin_file=bayesian_transformer_mesh_smoke --model_dir=runs/mesh

Every dimension a layout splits must be divisible by its mesh dimension (heads, d_ff and the
vocabulary for `model`, the batch for `batch`).
"""

import dataclasses
import json
import os
import time

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from blayers.lab import decoding, plots, run_files
from blayers.lab.data.stream import epoch_batches
from blayers.lab.mesh.random import NoiseSource, mtf
from blayers.lab.mesh.transformer import TransformerHParams, target_terms, transformer_logits
from blayers.lab.tasks.sequence import SequenceToSequence, token_metrics, token_statistics

__all__ = ["MeshRun", "parameter_bytes_per_device", "train_mesh"]


# Bindings a resumed mesh run may change: lengths and cadences, not the model or the optimizer.
RESUMABLE_BINDINGS = (
    "train_mesh.train_steps",
    "train_mesh.log_every",
    "train_mesh.checkpoint_every",
    "train_mesh.keep_checkpoints",
    "train_mesh.num_eval_samples",
)


def _devices(mesh_shape, devices):
    size = int(np.prod([d.size for d in mtf.convert_to_shape(mesh_shape).dims]))
    if devices:
        return list(devices)
    gpus = tf.config.list_logical_devices("GPU")
    pool = gpus or tf.config.list_logical_devices("CPU")
    if len(pool) < size:
        raise ValueError(
            f"mesh {mesh_shape!r} needs {size} devices; {len(pool)} are visible. Split the CPU "
            "with tf.config.set_logical_device_configuration before TensorFlow starts."
        )
    return [d.name for d in pool[:size]]


class MeshRun:
    """One lowered graph of the model: placeholders for a batch of `(source, target_in,
    target_out)` ids, the train op, and the fetches of training and evaluation.

    Build it inside `with graph.as_default():`; run it with `tf.compat.v1.Session(graph=graph)`.
    Its noise is a function of `seed`, the global step and `draw` (`blayers.lab.mesh.random`), so
    runs are reproducible and every layout trains on the same noise.
    """

    def __init__(
        self,
        source_length,
        target_length,
        hparams,
        mesh_shape,
        layout,
        devices,
        batch_size,
        learning_rate,
        kl_weight,
        num_train,
        seed,
        schedule=None,
        beta_2=0.999,
        epsilon=1e-6,
        keep_checkpoints=3,
    ):
        tf.compat.v1.set_random_seed(seed)
        self.batch_size = batch_size
        ids = lambda name, length: tf.compat.v1.placeholder(tf.int32, [batch_size, length], name)
        # source_length None: a decoder-only language model (no source placeholder).
        self.inputs = (
            None if source_length is None else ids("source", source_length),
            ids("target_in", target_length),
            ids("target_out", target_length),
        )
        self.step = tf.compat.v1.train.get_or_create_global_step()
        # Evaluation feeds 1, 2, ... to average distinct weight draws at one step.
        self.draw = tf.compat.v1.placeholder_with_default(tf.constant(0, tf.int64), [], "draw")
        self.graph = mtf.Graph()
        self.mesh = mtf.Mesh(self.graph, "mesh")
        batch = mtf.Dimension("batch", batch_size)
        source, target_in, target_out = (
            None
            if tensor is None
            else mtf.import_tf_tensor(
                self.mesh, tensor, mtf.Shape([batch, mtf.Dimension(name, tensor.shape[1])])
            )
            for tensor, name in zip(self.inputs, ("source_length", "length", "length"))
        )
        noise = NoiseSource(seed, self.step, self.draw)
        logits, kl_terms, dims = transformer_logits(self.mesh, source, target_in, hparams, noise)
        token_nll, weights = target_terms(logits, target_out, dims.vocab)
        nll = mtf.reduce_sum(token_nll * weights)
        correct = mtf.reduce_sum(
            mtf.cast(mtf.equal(mtf.argmax(logits, dims.vocab), target_out), logits.dtype) * weights
        )
        tokens = mtf.reduce_sum(weights)
        probs = mtf.softmax(logits, dims.vocab)  # before the lowering, which lowers what exists
        kl = mtf.add_n(kl_terms) if kl_terms else mtf.zeros(self.mesh, mtf.Shape([]))
        loss = nll / float(batch_size) + kl_weight * kl / float(num_train)
        grads = mtf.gradients([loss], [v.outputs[0] for v in self.graph.trainable_variables])
        if schedule is not None:  # a tf scalar of the step, brought onto the mesh
            self.learning_rate = tf.cast(schedule(learning_rate)(self.step), tf.float32)
            rate = mtf.import_tf_tensor(self.mesh, self.learning_rate, mtf.Shape([]))
        else:
            self.learning_rate, rate = tf.constant(learning_rate, tf.float32), learning_rate
        optimizer = mtf.optimize.AdamWeightDecayOptimizer(
            learning_rate=rate, beta_2=beta_2, epsilon=epsilon
        )
        updates = optimizer.apply_grads(grads, self.graph.trainable_variables)
        self.mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mtf.convert_to_shape(mesh_shape), mtf.convert_to_layout_rules(layout), devices
        )
        self.lowering = mtf.Lowering(self.graph, {self.mesh: self.mesh_impl})
        # The step moves after the updates, whose noise read it: one step, one noise key.
        with tf.control_dependencies([self.lowering.lowered_operation(op) for op in updates]):
            self.train_op = tf.compat.v1.assign_add(self.step, 1)
        export = self.lowering.export_to_tf_tensor
        self.eval_fetch = {"probs": export(probs), "targets": export(target_out)}
        self.fetch = {
            "loss": export(loss),
            "nll": export(nll),
            "kl": export(kl),
            "tokens": export(tokens),
            "correct": export(correct),
            "learning_rate": self.learning_rate,
        }
        # Relative paths in the state file: a copied or moved run folder restores its own.
        self.saver = tf.compat.v1.train.Saver(
            max_to_keep=keep_checkpoints, sharded=False, save_relative_paths=True
        )
        self.to_masters = self.lowering.copy_slices_to_masters()
        self.to_slices = self.lowering.copy_masters_to_slices()
        self.initializer = tf.compat.v1.global_variables_initializer()

    def feed(self, source, target_in, target_out, draw=None):
        """The feed dict of one batch (NumPy id arrays of the placeholders' shapes; `source`
        None for a language model)."""
        feed = {
            tensor: value
            for tensor, value in zip(self.inputs, (source, target_in, target_out))
            if tensor is not None
        }
        if draw is not None:
            feed[self.draw] = draw
        return feed


def parameter_bytes_per_device(run, include_optimizer=False):
    """Bytes of parameter slices on each device of `run`'s mesh (masters excluded); with
    `include_optimizer`, the optimizer's slot variables (Adam's moments) too."""
    totals = {}
    variables = run.graph.all_variables if include_optimizer else run.graph.trainable_variables
    for variable in variables:
        laid_out = run.lowering.variables[variable]
        for slice_variable in laid_out.laid_out_tensor.all_slices:
            device = slice_variable.device
            totals[device] = totals.get(device, 0) + int(
                np.prod(slice_variable.shape) * slice_variable.dtype.size
            )
    return totals


@gin.configurable(module="blayers.lab.mesh", denylist=["model_dir"])
def train_mesh(
    model_dir,
    data=gin.REQUIRED,
    hparams=None,
    mesh_shape="model:1",
    layout="heads:model;d_ff:model;vocab:model",
    devices=None,
    batch_size=32,
    train_steps=1000,
    learning_rate=1e-3,
    schedule=None,
    beta_2=0.999,
    epsilon=1e-6,
    kl_weight=1.0,
    log_every=50,
    checkpoint_every=500,
    keep_checkpoints=3,
    num_eval_samples=4,
    shuffle_buffer=10_000,
    seed=0,
):
    """Trains the mtf Bayesian Transformer on a sequence-to-sequence `data`; resumes from
    `model_dir`. Returns the final test metrics.

    The training batches stream from `data.train` (`blayers.lab.data.stream.epoch_batches`, as the
    Keras trainer draws them) into the graph's placeholders, so data of any size (WMT'14) is
    never held in the graph, and a resumed run continues at the batch where it stopped. The
    process stays in eager mode: the graph has a session of its own.

    Args:
      model_dir: output folder (checkpoints/, history.jsonl, tensorboard/, metrics.json).
      data: a sequence-to-sequence `Data` whose examples have one padded length (in gin:
        `train_mesh.data = @synthetic_translation()` with `pad_to`), or a language-model
        `Data` of `(ids, next ids)` windows (`@pydoc_text_lm()`): the decoder-only model.
      hparams: a `TransformerHParams` (its vocabulary defaults to `data.num_classes`).
      mesh_shape, layout: Mesh TensorFlow's mesh (`'batch:2,model:4'`) and layout rules.
      devices: device names, one per mesh processor (default: the visible GPUs, else the
        logical CPUs).
      batch_size, train_steps, learning_rate: the optimization (Adam with weight decay 0).
      schedule: None (a constant rate) or `schedule(learning_rate)` -> a callable of the
        step, as `make_optimizer.schedule` (e.g. `@transformer_schedule`).
      beta_2, epsilon: Adam's (the Transformer's: 0.98 and 1e-9).
      kl_weight: beta of `NLL + beta * KL / N`.
      log_every, checkpoint_every: steps between history records and checkpoints.
      keep_checkpoints: checkpoints kept on disk.
      num_eval_samples: weight draws averaged into the test predictive.
      shuffle_buffer: training examples shuffled at a time.
      seed: the shuffle order, the initial weights and the weight noise.
    """
    if not tf.executing_eagerly():
        raise RuntimeError(
            "train_mesh builds its own graph and streams data eagerly: call it in eager mode "
            "(not under tf.compat.v1.disable_eager_execution or a Graph.as_default block)."
        )
    hparams = hparams or TransformerHParams()
    mesh = mtf.convert_to_shape(mesh_shape)
    if hparams.vocab_size is None:  # padded to split evenly: the extra ids are never targets
        vocab = -(-int(data.num_classes) // mesh.size) * mesh.size
        hparams = dataclasses.replace(hparams, vocab_size=vocab)
    _check_layout(hparams, batch_size, mesh, layout)
    source_length, target_length = _padded_lengths(data)
    num_train = int(data.num_train)
    if batch_size > num_train:
        raise ValueError(f"train_mesh: batch_size={batch_size} exceeds the {num_train} examples.")
    if not learning_rate > 0:
        raise ValueError(f"train_mesh.learning_rate must be positive, got {learning_rate!r}.")
    steps_per_epoch = num_train // batch_size
    os.makedirs(model_dir, exist_ok=True)
    checkpoints = os.path.join(model_dir, "checkpoints")
    graph = tf.Graph()
    with run_files.RunLock(model_dir):
        # Refusals first: nothing in the folder is touched by a run that will not go on.
        run_files.check_bindings(model_dir, RESUMABLE_BINDINGS)
        with graph.as_default():
            run = MeshRun(
                source_length,
                target_length,
                hparams,
                mesh_shape,
                layout,
                _devices(mesh_shape, devices),
                batch_size,
                learning_rate,
                kl_weight,
                num_train,
                seed,
                schedule,
                beta_2,
                epsilon,
                keep_checkpoints,
            )
        writer = tf.summary.create_file_writer(os.path.join(model_dir, "tensorboard"))
        # Not `with Session()`: that would make the graph the default, and the data stream
        # and summaries below are eager.
        session = tf.compat.v1.Session(graph=graph)
        stop = run_files.StopRequest()
        try:
            session.run(run.initializer)
            restored = run_files.restore_newest_intact(
                run_files.SaverCheckpoint(run.saver, session, graph), checkpoints
            )
            if restored:  # keep-N goes on counting the checkpoints already on disk
                run.saver.recover_last_checkpoints(
                    list(reversed(run_files.checkpoint_prefixes(checkpoints)))
                )
                print(f"Resumed from {restored}.")
            session.run(run.to_slices)
            start = step = int(session.run(run.step))
            run_files.write_bindings(model_dir)
            run_files.write_command(model_dir)
            history = run_files.History(os.path.join(model_dir, "history.jsonl"), start)
            sums, window_start, clock = np.zeros(3), start, time.time()

            def save():
                session.run(run.to_masters)
                os.makedirs(checkpoints, exist_ok=True)
                with graph.as_default():
                    run.saver.save(
                        session,
                        os.path.join(checkpoints, "model.ckpt"),
                        global_step=step,
                        write_meta_graph=False,
                    )

            stop.__enter__()  # from here a SIGTERM or Ctrl-C checkpoints after the step
            while step < train_steps:
                epoch, skip = divmod(step, steps_per_epoch)
                batches = epoch_batches(data, batch_size, seed, epoch, skip, shuffle_buffer)
                for features, targets in batches.as_numpy_iterator():
                    feed = run.feed(*_split(features), targets)
                    step, out = session.run([run.train_op, run.fetch], feed)
                    step = int(step)
                    if not np.isfinite(out["loss"]):
                        raise FloatingPointError(
                            f"Non-finite mesh loss at step {step}: {_floats(out)}."
                        )
                    sums += (out["loss"], out["nll"] / batch_size, out["kl"] / num_train)
                    if step % log_every == 0 or step == train_steps:
                        count = step - window_start
                        record = dict(zip(("loss", "nll", "kl_per_example"), sums / max(count, 1)))
                        record["elbo"] = -(record["nll"] + record["kl_per_example"])
                        record = {k: float(v) for k, v in record.items()}
                        record["learning_rate"] = float(out["learning_rate"])
                        record.update(
                            kind="train",
                            step=step,
                            steps_per_second=count / max(time.time() - clock, 1e-9),
                        )
                        history.add(record)
                        with writer.as_default(step=step):
                            for key in ("loss", "nll", "kl_per_example", "elbo", "learning_rate"):
                                tf.summary.scalar(f"train/{key}", record[key])
                        sums, window_start, clock = np.zeros(3), step, time.time()
                    if step % checkpoint_every == 0:
                        save()
                    if step >= train_steps or stop.requested:
                        break
                if stop.requested:
                    break
            save()
            if stop.requested:
                logging.warning(
                    "Stopped by signal %s at step %d; checkpoint saved, re-run to resume.",
                    stop.signal,
                    step,
                )
                raise KeyboardInterrupt
            metrics, arrays = _evaluate(session, run, data, num_eval_samples)
            history.put({"kind": "eval", "step": step, **metrics})
            with writer.as_default(step=step):
                for key, value in metrics.items():
                    tf.summary.scalar(f"eval/{key}", value)
            images = _write_outputs(model_dir, history.records, arrays)
            with writer.as_default(step=step):
                for path in images:
                    plots.png_to_tensorboard(path)
            writer.flush()
        finally:
            stop.__exit__()
            session.close()
    summary = {
        "status": "finished",
        "step": step,
        "resumed_from_step": start,
        "data": data.name,
        "num_train": num_train,
        "mesh_shape": mesh_shape,
        "layout": layout,
        "final": metrics,
    }
    with open(os.path.join(model_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    logging.info("Mesh run finished at step %d: %s", step, metrics)
    return metrics


def _floats(values):
    return {k: float(v) for k, v in values.items()}


def _check_layout(hparams, batch_size, mesh, layout):
    """Every layout rule names a dimension of the Transformer, and every dimension it splits
    must divide by its mesh dimension (rules naming a mesh dimension this mesh lacks split
    nothing, so one layout serves several meshes)."""
    sizes = {
        "batch": batch_size,
        "heads": hparams.num_heads,
        "d_ff": hparams.d_ff,
        "vocab": hparams.vocab_size,
        "d_model": hparams.d_model,
        "d_k": hparams.d_model // hparams.num_heads,
    }
    mesh_sizes = {d.name: d.size for d in mesh.dims}
    for tensor_dim, mesh_dim in sorted(mtf.convert_to_layout_rules(layout)._pairs):
        if tensor_dim not in sizes:  # a typo would silently split nothing
            raise ValueError(
                f"layout {layout!r}: the rule {tensor_dim}:{mesh_dim} names no dimension of the "
                f"Transformer; the dimensions are {', '.join(sorted(sizes))}."
            )
        if mesh_dim not in mesh_sizes:  # as Mesh TensorFlow: a rule for another mesh
            continue
        size = sizes.get(tensor_dim)
        if size is not None and size % mesh_sizes[mesh_dim]:
            raise ValueError(
                f"layout {layout!r} splits {tensor_dim}={size} over {mesh_dim}="
                f"{mesh_sizes[mesh_dim]}, which does not divide it."
            )


def _split(features):
    """`(source, target_in)` of a batch's features (`source` None for a language model)."""
    if isinstance(features, dict):
        return features["source"], features["target_in"]
    return None, features


def _padded_lengths(data):
    """The static source (None: a language model) and target lengths of `data`'s examples;
    graph mode needs them."""
    features, targets = data.train.element_spec
    source = features["source"].shape if isinstance(features, dict) else None
    shapes = [s for s in (source, targets.shape) if s is not None]
    if any(s.rank != 1 or s[0] is None for s in shapes):
        raise ValueError(
            f"train_mesh needs examples of one padded length; {data.name!r} gives "
            f"{data.train.element_spec}. Pad them (e.g. `synthetic_translation.pad_to`, "
            "`tfds_translation.max_length`)."
        )
    return (None if source is None else int(source[0])), int(targets.shape[0])


def _evaluate(session, run, data, num_samples):
    """Teacher-forced token metrics under the Monte Carlo predictive `mean_s p_s` (draws
    1..num_samples), as the Keras path's `SequenceToSequence`, over the whole test set (the
    last batch padded with repeats that are then dropped)."""
    batch = run.batch_size
    summed, targets = None, None
    for draw in range(1, num_samples + 1):
        probs, labels = [], []
        for features, target in data.test.batch(batch).as_numpy_iterator():
            n = len(target)
            arrays = [
                None if a is None else _pad_rows(a, batch) for a in (*_split(features), target)
            ]
            out = session.run(run.eval_fetch, run.feed(*arrays, draw=draw))
            probs.append(out["probs"][:n])
            labels.append(out["targets"][:n])
        probs = np.concatenate(probs).astype(np.float64)
        summed = probs if summed is None else summed + probs
        targets = np.concatenate(labels)
    picked, confidence, correct = token_statistics(summed / num_samples, targets)
    metrics = token_metrics(picked, confidence, correct)
    arrays = {"token_confidence": confidence, "token_correct": correct}
    task = getattr(data, "task", None)
    if isinstance(task, SequenceToSequence) and task.num_decode > 0:
        decoded, decode_arrays = _decode(session, run, data, task, num_samples)
        metrics.update(decoded)
        arrays.update(decode_arrays)
    return metrics, arrays


def _pad_rows(array, rows):
    """`array` with its last row repeated up to `rows` rows."""
    return np.concatenate([array, np.repeat(array[-1:], rows - len(array), 0)])


def _write_outputs(model_dir, records, arrays):
    """The Keras path's outputs: the operative config, training curves, the reliability plot.
    Returns the plots' paths."""
    with open(os.path.join(model_dir, "operative_config.gin"), "w") as f:
        f.write(gin.operative_config_str())
    curves = os.path.join(model_dir, "training_curves.png")
    reliability = os.path.join(model_dir, "sequence_reliability.png")
    plots.training_curves(records, curves)
    plots.sequence_reliability(
        arrays["token_confidence"],
        arrays["token_correct"],
        arrays.get("sequence_confidence"),
        arrays.get("sequence_bleu"),
        reliability,
    )
    return [curves, reliability]


def _decode(session, run, data, task, num_samples):
    """The Keras path's decodes (greedy, beam, BLEU, sequence-level calibration) on the mesh:
    each step runs the teacher-forced graph on the prefix padded to the static length (the
    causal mask keeps the padding out), averaging weight draws 1..`decode_samples`: the same
    draws at every step of a decode."""
    target_in_tf = run.inputs[1]
    length = int(target_in_tf.shape[1])
    batch = run.batch_size
    samples = max(1, min(task.decode_samples, num_samples))
    probs_tf = run.eval_fetch["probs"]

    def next_log_probs(sources, prefixes):
        out = []
        for start in range(0, len(sources), batch):
            src, prefix = sources[start : start + batch], prefixes[start : start + batch]
            n, width = len(src), prefix.shape[1]
            target_in = np.zeros((batch, length), np.int32)
            target_in[:n, :width] = prefix
            zeros = np.zeros((batch, length), np.int32)
            feeds = [
                run.feed(_pad_rows(src.astype(np.int32), batch), target_in, zeros, draw=draw)
                for draw in range(1, samples + 1)
            ]
            p = sum(session.run(probs_tf, feed) for feed in feeds) / samples
            out.append(p[:n, width - 1])
        return np.log(np.concatenate(out) + 1e-12)

    sources, references = [], []
    for features, target in data.test.take(task.num_decode).as_numpy_iterator():
        sources.append(features["source"])
        references.append(decoding.strip(target, task.eos_id, task.pad_id))
    return task.decode_metrics(next_log_probs, data, sources, references, max_length=length)
