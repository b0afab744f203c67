"""The Mesh TensorFlow Bayesian Transformer learner: graph mode behind the Learner contract.

The lowered graph (`blayers.lab.mesh.graph.MeshRun`) lives in a `tf.Graph` with a session of
its own, so the process stays eager: training batches stream from `data.train` as the
supervised learner draws them (`blayers.lab.data.stream.epoch_batches`) into placeholders, and
the Loop checkpoints the v1 Saver through `blayers.lab.runs.SaverState` (relative paths, keep
N, newest intact), exactly as it checkpoints an eager learner. Noise is a function of the
seed, the step and each entry's place in the whole tensor, so a resume and any layout see the
same numbers.

Logical CPU devices are a process-wide setting made before TensorFlow starts; the command line
makes them (`--num_cpu_devices`):

    python -m blayers.train --num_cpu_devices=2 --mesh_shape=model:2 \\
        --gin_file=bayesian_transformer_mesh_smoke --model_dir=runs/mesh
"""

import dataclasses

import gin
import tensorflow as tf

from blayers.lab import plots
from blayers.lab.data.stream import epoch_batches
from blayers.lab.learners.base import Learner, refuse_strategy
from blayers.lab.mesh import graph as mesh_graph
from blayers.lab.mesh.random import mtf
from blayers.lab.mesh.transformer import TransformerHParams
from blayers.lab.runs import SaverState

__all__ = ["MeshLearner"]


@gin.configurable(module="blayers.lab.learners")
class MeshLearner(Learner):
    """Trains the mtf Bayesian Transformer on a sequence-to-sequence or language-model `data`.

    Args:
      data: a sequence-to-sequence `Data` whose examples have one padded length (in gin:
        `MeshLearner.data = @synthetic_translation()` with `pad_to`), or a language-model
        `Data` of `(ids, next ids)` windows (`@pydoc_text_lm()`): the decoder-only model.
      hparams: a `TransformerHParams` (its vocabulary defaults to `data.num_classes`, padded
        to divide by the mesh).
      mesh_shape, layout: Mesh TensorFlow's mesh (`'batch:2,model:4'`) and layout rules
        (`--mesh_shape` and `--layout` on the command line bind these).
      devices: device names, one per mesh processor (default: the visible GPUs, else the
        logical CPUs).
      batch_size, learning_rate: the optimization (Adam with weight decay 0).
      schedule: None (a constant rate) or `schedule(learning_rate)` -> a callable of the
        step, as `make_optimizer.schedule` (e.g. `@transformer_schedule`).
      beta_2, epsilon: Adam's (the Transformer's: 0.98 and 1e-9).
      kl_weight: beta of `NLL + beta * KL / N`.
      num_eval_samples: weight draws averaged into the test predictive.
      shuffle_buffer: training examples shuffled at a time.
      graph_rewrites: run TensorFlow's graph optimizer (grappler) on the lowered graph. Off by
        default: on CPUs its rewrites of the thousands of slicewise ops cost seconds at the
        first call of each fetch (a training step, an evaluation, a decode) and made the steps
        no faster (`benchmarks/mesh_graph_rewrites.py`), and with a mesh's processors on one
        device reruns differed in the last digits of the loss; the graph runs as lowered.
    """

    # The layout splits the same computation (a resume on another mesh continues the run).
    resumable_bindings = (
        "MeshLearner.num_eval_samples",
        "MeshLearner.mesh_shape",
        "MeshLearner.layout",
        "MeshLearner.devices",
        "MeshLearner.graph_rewrites",
    )
    instant_scalars = ("learning_rate",)
    progress_scalars = (("loss", "loss"), ("nll", "nll"), ("kl_per_example", "weights_kl/N"))

    def __init__(
        self,
        data=gin.REQUIRED,
        hparams=None,
        mesh_shape="model:1",
        layout="heads:model;d_ff:model;vocab:model",
        devices=None,
        batch_size=32,
        learning_rate=1e-3,
        schedule=None,
        beta_2=0.999,
        epsilon=1e-6,
        kl_weight=1.0,
        num_eval_samples=4,
        shuffle_buffer=10_000,
        graph_rewrites=False,
    ):
        if not learning_rate > 0:
            raise ValueError(f"MeshLearner.learning_rate must be positive, got {learning_rate!r}.")
        hparams = hparams or TransformerHParams()
        mesh = mtf.convert_to_shape(mesh_shape)
        if hparams.vocab_size is None:  # padded to split evenly: the extra ids are never targets
            vocab = -(-int(data.num_classes) // mesh.size) * mesh.size
            hparams = dataclasses.replace(hparams, vocab_size=vocab)
        mesh_graph.check_layout(hparams, batch_size, mesh, layout)
        self.source_length, self.target_length = mesh_graph.padded_lengths(data)
        self.num_train = int(data.num_train)
        if batch_size > self.num_train:
            raise ValueError(
                f"MeshLearner: batch_size={batch_size} exceeds the {self.num_train} examples."
            )
        self.data, self.hparams, self.mesh_shape, self.layout = data, hparams, mesh_shape, layout
        self.devices, self.batch_size = devices, int(batch_size)
        self.learning_rate, self.schedule = learning_rate, schedule
        self.beta_2, self.epsilon, self.kl_weight = beta_2, epsilon, kl_weight
        self.num_eval_samples, self.shuffle_buffer = int(num_eval_samples), shuffle_buffer
        self.graph_rewrites = bool(graph_rewrites)
        self.steps_per_epoch = self.num_train // self.batch_size
        self.session = None

    def build(self, context):
        if context.strategy_name not in (None, "mesh"):
            refuse_strategy(self, context, "its own Mesh TensorFlow mesh (--strategy=mesh)")
        if not tf.executing_eagerly():
            raise RuntimeError(
                "MeshLearner builds its own graph and streams data eagerly: run it in eager "
                "mode (not under tf.compat.v1.disable_eager_execution or Graph.as_default)."
            )
        self.seed = context.seed
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.run = mesh_graph.MeshRun(
                self.source_length,
                self.target_length,
                self.hparams,
                self.mesh_shape,
                self.layout,
                mesh_graph.mesh_devices(self.mesh_shape, self.devices),
                self.batch_size,
                self.learning_rate,
                self.kl_weight,
                self.num_train,
                self.seed,
                self.schedule,
                self.beta_2,
                self.epsilon,
            )
        # Not `with Session()`: that would make the graph the default, and the data stream
        # and summaries are eager.
        self.session = tf.compat.v1.Session(graph=self.graph, config=self.session_config())
        self.session.run(self.run.initializer)
        self._step = 0

    def session_config(self):
        """The session's `ConfigProto` (`blayers.lab.mesh.graph.session_config`)."""
        return mesh_graph.session_config(self.graph_rewrites)

    def state(self):
        return SaverState(self.run.saver, self.session, self.graph)

    def restored(self):
        self.session.run(self.run.to_slices)
        self._step = int(self.session.run(self.run.step))

    @property
    def step(self):
        return self._step

    def batches(self):
        epoch, skip = divmod(self._step, self.steps_per_epoch)
        ds = epoch_batches(self.data, self.batch_size, self.seed, epoch, skip, self.shuffle_buffer)
        return ds.as_numpy_iterator()

    def train_step(self, batch):
        features, targets = batch
        feed = self.run.feed(*mesh_graph.split_features(features), targets)
        step, out = self.session.run([self.run.train_op, self.run.fetch], feed)
        self._step = int(step)
        nll = float(out["nll"]) / self.batch_size
        kl = float(out["kl"]) / self.num_train
        return {
            "loss": float(out["loss"]),
            "nll": nll,
            "kl_per_example": kl,
            "elbo": -(nll + kl),
            "learning_rate": float(out["learning_rate"]),
        }

    def diagnose_non_finite(self, batch):
        del batch
        name = mesh_graph.first_non_finite_variable(self.session, self.run)
        if name:
            return f"first non-finite weight in mesh variable '{name}'"
        return "every weight is finite (the loss of this batch is not)"

    def before_save(self):
        self.session.run(self.run.to_masters)

    def evaluate(self):
        return mesh_graph.evaluate(self.session, self.run, self.data, self.num_eval_samples)

    def outputs(self, run, records, metrics, arrays):
        """`training_curves.png` and `sequence_reliability.png`, as the Keras path's."""
        del metrics
        curves = run.file("training_curves.png")
        reliability = run.file("sequence_reliability.png")
        plots.training_curves(records, curves)
        plots.sequence_reliability(
            arrays["token_confidence"],
            arrays["token_correct"],
            arrays.get("sequence_confidence"),
            arrays.get("sequence_bleu"),
            reliability,
        )
        summary = {
            "data": self.data.name,
            "num_train": self.num_train,
            "batch_size": self.batch_size,
            "mesh_shape": self.mesh_shape,
            "layout": self.layout,
        }
        return summary, [curves, reliability]

    def close(self):
        if self.session is not None:
            self.session.close()
            self.session = None
