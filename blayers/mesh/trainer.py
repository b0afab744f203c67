"""The graph-mode training loop of the Mesh TensorFlow Bayesian Transformer.

TF 2.21 has no `tf.estimator` (and Mesh TensorFlow's own Transformer needs TPUEstimator), so
the loop is ours: one `mtf.Graph` lowered onto a placement mesh (logical CPU devices or GPUs),
master variables in a `tf.compat.v1.train.Saver` checkpoint (slices copied to the masters
before each save, masters to slices after each restore), the per-example ELBO
`NLL + beta * KL / N`, the run lock and `history.jsonl` of the Keras trainer,
`operative_config.gin`, `training_curves.png`, `sequence_reliability.png` and `metrics.json`
with the teacher-forced test token NLL, perplexity, accuracy and ECE under the
Monte Carlo predictive (`num_eval_samples` weight draws), and greedy and beam decodes scored by
BLEU and sequence-level calibration, all as the Keras path's `SequenceToSequence` computes them
(its `decode_metrics` runs on a `next_log_probs` that feeds each prefix to the graph).

Run it in a process of its own: it switches TensorFlow to graph mode. From the command line:

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

from blayers import decoding, plots, run_files
from blayers.mesh.layers import mtf
from blayers.mesh.transformer import TransformerHParams, transformer_logits
from blayers.tasks.sequence import SequenceToSequence, token_metrics, token_statistics

__all__ = ["MeshRun", "parameter_bytes_per_device", "train_mesh"]


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
    """One lowered graph: the model on a batch from a feedable iterator (train or test)."""

    def __init__(
        self, data, hparams, mesh_shape, layout, devices, batch_size, learning_rate, kl_weight, seed
    ):
        tf.compat.v1.set_random_seed(seed)
        self.data = data
        self.handle = tf.compat.v1.placeholder(tf.string, [])
        iterator = tf.compat.v1.data.Iterator.from_string_handle(
            self.handle,
            tf.compat.v1.data.get_output_types(data.train),
            tf.compat.v1.data.get_output_shapes(data.train.batch(batch_size, drop_remainder=True)),
        )
        features, targets = iterator.get_next()
        # Decoding feeds these directly (TF1 lets a feed replace any tensor).
        self.inputs = (features["source"], features["target_in"], targets)
        self.batch_size = batch_size
        self.graph = mtf.Graph()
        self.mesh = mtf.Mesh(self.graph, "mesh")
        batch = mtf.Dimension("batch", batch_size)
        source_len = mtf.Dimension("source_length", int(features["source"].shape[1]))
        target_len = mtf.Dimension("length", int(targets.shape[1]))
        source = mtf.import_tf_tensor(self.mesh, features["source"], mtf.Shape([batch, source_len]))
        target_in = mtf.import_tf_tensor(
            self.mesh, features["target_in"], mtf.Shape([batch, target_len])
        )
        target_out = mtf.import_tf_tensor(self.mesh, targets, mtf.Shape([batch, target_len]))
        logits, kl_terms, dims = transformer_logits(self.mesh, source, target_in, hparams)
        weights = mtf.cast(mtf.not_equal(target_out, 0), logits.dtype)
        token_nll = mtf.layers.softmax_cross_entropy_with_logits(
            logits, mtf.one_hot(target_out, dims.vocab, dtype=logits.dtype), dims.vocab
        )
        nll = mtf.reduce_sum(token_nll * weights)
        correct = mtf.reduce_sum(
            mtf.cast(mtf.equal(mtf.argmax(logits, dims.vocab), target_out), logits.dtype) * weights
        )
        tokens = mtf.reduce_sum(weights)
        probs = mtf.softmax(logits, dims.vocab)  # before the lowering, which lowers what exists
        kl = mtf.add_n(kl_terms) if kl_terms else mtf.zeros(self.mesh, mtf.Shape([]))
        loss = nll / float(batch_size) + kl_weight * kl / float(data.num_train)
        grads = mtf.gradients([loss], [v.outputs[0] for v in self.graph.trainable_variables])
        optimizer = mtf.optimize.AdamWeightDecayOptimizer(learning_rate=learning_rate)
        updates = optimizer.apply_grads(grads, self.graph.trainable_variables)
        self.mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mtf.convert_to_shape(mesh_shape), mtf.convert_to_layout_rules(layout), devices
        )
        self.lowering = mtf.Lowering(self.graph, {self.mesh: self.mesh_impl})
        self.step = tf.compat.v1.train.get_or_create_global_step()
        self.train_op = tf.group(
            [self.lowering.lowered_operation(op) for op in updates],
            tf.compat.v1.assign_add(self.step, 1),
        )
        export = self.lowering.export_to_tf_tensor
        self.eval_fetch = {
            "probs": export(probs),
            "targets": export(target_out),
        }
        self.fetch = {
            "loss": export(loss),
            "nll": export(nll),
            "kl": export(kl),
            "tokens": export(tokens),
            "correct": export(correct),
        }
        self.saver = tf.compat.v1.train.Saver(max_to_keep=3, sharded=False)
        self.to_masters = self.lowering.copy_slices_to_masters()
        self.to_slices = self.lowering.copy_masters_to_slices()


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


@gin.configurable(module="blayers.mesh", denylist=["model_dir"])
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
    kl_weight=1.0,
    log_every=50,
    checkpoint_every=500,
    num_eval_samples=4,
    seed=0,
):
    """Trains the mtf Bayesian Transformer on a sequence-to-sequence `data`; resumes from
    `model_dir`. Returns the final test metrics.

    Args:
      model_dir: output folder (checkpoints/, history.jsonl, metrics.json).
      data: a sequence-to-sequence `Data` with fixed-length (padded) examples (in gin:
        `train_mesh.data = @synthetic_translation()`).
      hparams: a `TransformerHParams` (its vocabulary defaults to `data.num_classes`).
      mesh_shape, layout: Mesh TensorFlow's mesh (`'batch:2,model:4'`) and layout rules.
      devices: device names, one per mesh processor (default: the visible GPUs, else the
        logical CPUs).
      batch_size, train_steps, learning_rate: the optimization (Adam with weight decay 0).
      kl_weight: beta of `NLL + beta * KL / N`.
      log_every, checkpoint_every: steps between history records and checkpoints.
      num_eval_samples: weight draws averaged into the test predictive.
      seed: TensorFlow's graph-level seed.
    """
    train_arrays, test_arrays = _materialized(data)
    tf.compat.v1.disable_eager_execution()
    hparams = hparams or TransformerHParams()
    if hparams.vocab_size is None:
        hparams = dataclasses.replace(hparams, vocab_size=data.num_classes)
    os.makedirs(model_dir, exist_ok=True)
    checkpoints = os.path.join(model_dir, "checkpoints")
    with run_files.RunLock(model_dir), tf.Graph().as_default():
        data = _GraphData(data, train_arrays, test_arrays)
        run = MeshRun(
            data,
            hparams,
            mesh_shape,
            layout,
            _devices(mesh_shape, devices),
            batch_size,
            learning_rate,
            kl_weight,
            seed,
        )
        train_iter = tf.compat.v1.data.make_one_shot_iterator(
            data.train.repeat()
            .shuffle(min(data.num_train, 10_000), seed=seed)
            .batch(batch_size, drop_remainder=True)
        )
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            latest = tf.compat.v1.train.latest_checkpoint(checkpoints)
            if latest:
                run.saver.restore(session, latest)
            session.run(run.to_slices)
            start = int(session.run(run.step))
            history = run_files.History(os.path.join(model_dir, "history.jsonl"), start)
            train_handle = session.run(train_iter.string_handle())
            sums, window_start, clock = np.zeros(3), start, time.time()

            def save():
                session.run(run.to_masters)
                os.makedirs(checkpoints, exist_ok=True)
                run.saver.save(session, os.path.join(checkpoints, "model.ckpt"), global_step=step)

            step = start
            while step < train_steps:
                _, out, step = session.run(
                    [run.train_op, run.fetch, run.step], {run.handle: train_handle}
                )
                step = int(step)
                if not np.isfinite(out["loss"]):
                    raise FloatingPointError(f"Non-finite mesh loss at step {step}: {out}.")
                sums += (out["loss"], out["nll"] / batch_size, out["kl"] / data.num_train)
                if step % log_every == 0 or step == train_steps:
                    count = step - window_start
                    record = dict(zip(("loss", "nll", "kl_per_example"), sums / max(count, 1)))
                    record.update(
                        kind="train",
                        step=step,
                        steps_per_second=count / max(time.time() - clock, 1e-9),
                    )
                    history.add({k: float(v) if k != "kind" else v for k, v in record.items()})
                    sums, window_start, clock = np.zeros(3), step, time.time()
                if step % checkpoint_every == 0:
                    save()
            save()
            metrics, arrays = _evaluate(session, run, data, batch_size, num_eval_samples)
            history.add({"kind": "eval", "step": step, **metrics})
            _write_outputs(model_dir, history.records, arrays)
    summary = {"status": "finished", "step": step, "resumed_from_step": start, "final": metrics}
    with open(os.path.join(model_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    logging.info("Mesh run finished at step %d: %s", step, metrics)
    return metrics


def _materialized(data):
    """The splits as NumPy arrays. They are read eagerly, before the process switches to graph
    mode, and kept on `data` so that a second run in the same process (a resume) finds them:
    after the switch, `data`'s eagerly made datasets can no longer be read."""
    cached = getattr(data, "_mesh_arrays", None)
    if cached is None:
        if not tf.executing_eagerly():
            raise RuntimeError(
                "train_mesh reads the data eagerly: build it before the process is in graph "
                "mode (or reuse a Data record a previous train_mesh call has read)."
            )
        cached = (_arrays(data.train), _arrays(data.test))
        data._mesh_arrays = cached
    return cached


def _arrays(dataset):
    """`({'source', 'target_in'}, target_out)` NumPy arrays of a padded, unbatched dataset."""
    parts = [
        (f["source"].numpy(), f["target_in"].numpy(), t.numpy()) for f, t in dataset.batch(4096)
    ]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


class _GraphData:
    """The `Data` fields the mesh loop reads, with its datasets rebuilt in graph mode (the
    originals were made eagerly and cannot be captured by a graph)."""

    def __init__(self, data, train, test):
        self.num_train, self.num_classes, self.name = data.num_train, data.num_classes, data.name
        self.task, self.detokenize, self.test_arrays = data.task, data.detokenize, test
        self.train, self.test = self._dataset(train), self._dataset(test)

    @staticmethod
    def _dataset(arrays):
        source, target_in, target_out = arrays
        return tf.data.Dataset.from_tensor_slices(
            ({"source": source, "target_in": target_in}, target_out)
        )


def _evaluate(session, run, data, batch_size, num_samples):
    """Teacher-forced token metrics under the Monte Carlo predictive `mean_s p_s`, as the Keras
    path's `SequenceToSequence`: one pass over the (unshuffled) test set per weight draw."""
    summed, targets = None, None
    for _ in range(num_samples):
        iterator = tf.compat.v1.data.make_one_shot_iterator(
            data.test.batch(batch_size, drop_remainder=True)
        )
        handle = session.run(iterator.string_handle())
        probs, labels = [], []
        while True:
            try:
                out = session.run(run.eval_fetch, {run.handle: handle})
            except tf.errors.OutOfRangeError:
                break
            probs.append(out["probs"])
            labels.append(out["targets"])
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


def _write_outputs(model_dir, records, arrays):
    """The Keras path's outputs: the operative config, training curves, the reliability plot."""
    with open(os.path.join(model_dir, "operative_config.gin"), "w") as f:
        f.write(gin.operative_config_str())
    plots.training_curves(records, os.path.join(model_dir, "training_curves.png"))
    plots.sequence_reliability(
        arrays["token_confidence"],
        arrays["token_correct"],
        arrays.get("sequence_confidence"),
        arrays.get("sequence_bleu"),
        os.path.join(model_dir, "sequence_reliability.png"),
    )


def _decode(session, run, data, task, num_samples):
    """The Keras path's decodes (greedy, beam, BLEU, sequence-level calibration) on the mesh:
    each step runs the teacher-forced graph on the prefix padded to the static length (the
    causal mask keeps the padding out), averaging `decode_samples` weight draws."""
    source_tf, target_in_tf, target_tf = run.inputs
    length = int(target_in_tf.shape[1])
    batch = run.batch_size
    samples = max(1, min(task.decode_samples, num_samples))
    probs_tf = run.eval_fetch["probs"]

    def next_log_probs(sources, prefixes):
        out = []
        for start in range(0, len(sources), batch):
            src, prefix = sources[start : start + batch], prefixes[start : start + batch]
            n, width = len(src), prefix.shape[1]
            src = np.concatenate([src, np.repeat(src[-1:], batch - n, 0)])
            target_in = np.zeros((batch, length), np.int32)
            target_in[:n, :width] = prefix
            feed = {
                source_tf: src.astype(np.int32),
                target_in_tf: target_in,
                target_tf: np.zeros((batch, length), np.int32),
            }
            p = sum(session.run(probs_tf, feed) for _ in range(samples)) / samples
            out.append(p[:n, width - 1])
        return np.log(np.concatenate(out) + 1e-12)

    sources, _, target_out = data.test_arrays
    references = [decoding.strip(row, task.eos_id, task.pad_id) for row in target_out]
    padded_sources = [row[: source_tf.shape[1]] for row in sources]
    return task.decode_metrics(next_log_probs, data, padded_sources, references, max_length=length)
