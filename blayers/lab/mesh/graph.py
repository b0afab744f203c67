"""The lowered Mesh TensorFlow graph of the Bayesian Transformer, and its evaluation.

TF 2.21 has no `tf.estimator` (and Mesh TensorFlow's own Transformer needs TPUEstimator), so
the graph is ours: one `mtf.Graph` lowered onto a placement mesh (logical CPU devices or GPUs)
in a `tf.Graph` with a session of its own (the process stays eager), placeholders for each
batch, master variables saved by a v1 `Saver` (slices copied to the masters before each save,
masters to slices after each restore), the per-example ELBO `NLL + beta * KL / N`, and the
Keras path's metrics (`SequenceToSequence`'s token metrics, decodes, BLEU). The learner that
trains it is `blayers.lab.learners.MeshLearner`.

Every dimension a layout splits must be divisible by its mesh dimension (heads, d_ff and the
vocabulary for `model`, the batch for `batch`).
"""

import difflib

import numpy as np
import tensorflow as tf
from absl import logging

from blayers.lab import decoding
from blayers.lab.mesh.random import NoiseSource, mtf
from blayers.lab.mesh.transformer import target_terms, transformer_logits
from blayers.lab.tasks.sequence import SequenceToSequence, token_metrics, token_statistics

__all__ = [
    "MeshRun",
    "check_layout",
    "evaluate",
    "first_non_finite_variable",
    "mesh_devices",
    "padded_lengths",
    "parameter_bytes_per_device",
    "session_config",
    "split_features",
]


def mesh_devices(mesh_shape, devices):
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
        self.saver = tf.compat.v1.train.Saver(  # the Checkpointer keeps N
            max_to_keep=None, sharded=False, save_relative_paths=True
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


def session_config(graph_rewrites=False):
    """A `ConfigProto` for a session of a lowered graph: the process's (the one a session
    without a config takes: its logical CPUs, `tf.config.threading`'s thread counts), with
    TensorFlow's graph optimizer (grappler) off unless `graph_rewrites` (`MeshLearner`'s
    argument says why)."""
    from tensorflow.python.eager import context  # a session's default config lives there

    config = tf.compat.v1.ConfigProto()
    config.CopyFrom(context.context().config)
    config.graph_options.rewrite_options.disable_meta_optimizer = not graph_rewrites
    return config


def first_non_finite_variable(session, run):
    """The name of the first mesh variable with a non-finite entry in any of its slices (the
    layer that blew up, when a step's update reached the weights), or None."""
    for variable in run.graph.trainable_variables:
        slices = run.lowering.variables[variable].laid_out_tensor.all_slices
        for value in session.run(list(slices)):
            if not np.all(np.isfinite(value)):
                return variable.name
    return None


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


def check_layout(hparams, batch_size, mesh, layout):
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
        if mesh_dim not in mesh_sizes:  # as Mesh TensorFlow: a rule for another mesh...
            close = difflib.get_close_matches(mesh_dim, list(mesh_sizes), n=1, cutoff=0.6)
            if close:  # ...unless it is a misspelt dimension of this one
                raise ValueError(
                    f"layout {layout!r}: the rule {tensor_dim}:{mesh_dim} names no dimension "
                    f"of the mesh {mesh_sizes} (did you mean {tensor_dim}:{close[0]}?); it "
                    f"would leave {tensor_dim} unsplit."
                )
            logging.warning(
                "layout %r: the rule %s:%s splits nothing on the mesh %s (it has no %r).",
                layout,
                tensor_dim,
                mesh_dim,
                mesh_sizes,
                mesh_dim,
            )
            continue
        size = sizes.get(tensor_dim)
        if size is not None and size % mesh_sizes[mesh_dim]:
            raise ValueError(
                f"layout {layout!r} splits {tensor_dim}={size} over {mesh_dim}="
                f"{mesh_sizes[mesh_dim]}, which does not divide it."
            )


def split_features(features):
    """`(source, target_in)` of a batch's features (`source` None for a language model)."""
    if isinstance(features, dict):
        return features["source"], features["target_in"]
    return None, features


def padded_lengths(data):
    """The static source (None: a language model) and target lengths of `data`'s examples;
    graph mode needs them."""
    features, targets = data.train.element_spec
    source = features["source"].shape if isinstance(features, dict) else None
    shapes = [s for s in (source, targets.shape) if s is not None]
    if any(s.rank != 1 or s[0] is None for s in shapes):
        raise ValueError(
            f"MeshLearner needs examples of one padded length; {data.name!r} gives "
            f"{data.train.element_spec}. Pad them (e.g. `synthetic_translation.pad_to`, "
            "`tfds_translation.max_length`)."
        )
    return (None if source is None else int(source[0])), int(targets.shape[0])


def evaluate(session, run, data, num_samples):
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
                None if a is None else _pad_rows(a, batch)
                for a in (*split_features(features), target)
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
