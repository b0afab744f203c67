"""Mesh TensorFlow's core on TF 2.21 through blayers' compat shim. A check on logical devices
runs in a process of its own (they are a process-wide setting); one on a single device builds
its own graph in the test process."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from blayers.lab.mesh.compat import import_mesh_tensorflow

mtf = import_mesh_tensorflow()
tf.compat.v1.disable_eager_execution()
results = {}
for layout, devices in (("", ["/cpu:0"]), ("hidden:model", ["/cpu:0", "/cpu:1"])):
    with tf.Graph().as_default():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        batch, io, hidden = (mtf.Dimension(n, s) for n, s in (("batch", 4), ("io", 8), ("hidden", 6)))
        x_np = np.arange(32, dtype=np.float32).reshape(4, 8) / 10.0
        x = mtf.import_tf_tensor(mesh, tf.constant(x_np), mtf.Shape([batch, io]))
        w = mtf.get_variable(
            mesh, "w", mtf.Shape([io, hidden]), initializer=tf.compat.v1.constant_initializer(
                np.arange(48, dtype=np.float32).reshape(8, 6) / 100.0
            )
        )
        y = mtf.einsum([x, w], output_shape=mtf.Shape([batch, hidden]))
        shape = "model:%d" % len(devices)
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mtf.convert_to_shape(shape), mtf.convert_to_layout_rules(layout), devices
        )
        lowering = mtf.Lowering(graph, {mesh: impl})
        out = lowering.export_to_tf_tensor(y)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(lowering.copy_masters_to_slices())
            results[shape] = session.run(out).tolist()
print(json.dumps(results))
"""


def test_mesh_tensorflow_core_runs_model_parallel_on_two_logical_cpus():
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    x = np.arange(32).reshape(4, 8) / 10.0
    w = np.arange(48).reshape(8, 6) / 100.0
    for shape in ("model:1", "model:2"):  # one device and the hidden axis split over two
        np.testing.assert_allclose(results[shape], x @ w, rtol=1e-5)


def test_shim_is_idempotent_and_gives_the_two_hooks():
    import tensorflow as tf

    from blayers.lab.mesh import compat

    compat.install()
    compat.install()
    assert tf.compat.v1.estimator.SessionRunHook is tf.compat.v1.train.SessionRunHook
    assert (
        tf.compat.v1.estimator.CheckpointSaverListener is tf.compat.v1.train.CheckpointSaverListener
    )


def _mtf_draws(num_draws=3000):
    """Each estimator's `bayesian_dense` output for `num_draws` noise draws (one weight draw
    a draw) and its KL, in a graph of its own (Mesh TensorFlow's lowering, one device)."""
    import tensorflow as tf

    from blayers.lab.mesh.layers import bayesian_dense, mtf
    from blayers.lab.mesh.random import NoiseSource

    rng = np.random.RandomState(0)
    x_np = rng.randn(3, 5).astype(np.float32)
    x_np[2] = x_np[1]  # two identical examples: Flipout and local reparameterization decorrelate
    mean = (0.5 * rng.randn(5, 4)).astype(np.float32)
    stddev = rng.uniform(0.1, 0.5, (5, 4)).astype(np.float32)
    out = {"x": x_np, "mean": mean, "stddev": stddev}
    for estimator in ("reparameterization", "flipout", "local_reparameterization"):
        with tf.Graph().as_default():
            graph = mtf.Graph()
            mesh = mtf.Mesh(graph, "mesh")
            batch = mtf.Dimension("batch", 3)
            io, hidden = mtf.Dimension("io", 5), mtf.Dimension("hidden", 4)
            x = mtf.import_tf_tensor(mesh, tf.constant(x_np), mtf.Shape([batch, io]))
            draw = tf.compat.v1.placeholder(tf.int64, [])
            y, kl = bayesian_dense(
                x,
                hidden,
                "dense",
                estimator=estimator,
                use_bias=False,
                noise=NoiseSource(0, tf.constant(0, tf.int64), draw),
                mean_initializer=tf.compat.v1.constant_initializer(mean),
                rho_initializer=tf.compat.v1.constant_initializer(np.log(np.expm1(stddev))),
            )
            impl = mtf.placement_mesh_impl.PlacementMeshImpl(
                mtf.convert_to_shape("model:1"), mtf.convert_to_layout_rules(""), ["/cpu:0"]
            )
            lowering = mtf.Lowering(graph, {mesh: impl})
            y_tf, kl_tf = lowering.export_to_tf_tensor(y), lowering.export_to_tf_tensor(kl)
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(lowering.copy_masters_to_slices())
                run = session.make_callable(y_tf, [draw])
                draws = np.stack([run(d) for d in range(num_draws)])
                out[estimator] = {"draws": draws, "kl": float(session.run(kl_tf))}
    return out


def test_mtf_estimators_have_the_posterior_moments_and_the_kl():
    """In-process: it builds in graphs of its own, on one device, and the process stays eager."""
    from conftest import check_moments

    result = _mtf_draws()
    x, mean, stddev = (result[k].astype(np.float64) for k in ("x", "mean", "stddev"))
    kl = np.sum(np.log(1.0 / stddev) + (stddev**2 + mean**2) / 2.0 - 0.5)
    for estimator in ("reparameterization", "flipout", "local_reparameterization"):
        draws = np.asarray(result[estimator]["draws"])  # [draws, 3, 4]
        check_moments(draws, x @ mean, x**2 @ stddev**2)
        assert result[estimator]["kl"] == pytest.approx(kl, rel=1e-5)  # the closed form
        # Examples 1 and 2 are identical: one weight draw (reparameterization) gives them the
        # same output; Flipout and local reparameterization decorrelate them.
        correlation = np.corrcoef(draws[:, 1, 0], draws[:, 2, 0])[0, 1]
        if estimator == "reparameterization":
            assert correlation > 0.999
        else:
            assert abs(correlation) < 5 / np.sqrt(len(draws))


_MODEL_PARALLEL = r"""
import json, sys
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
from blayers.lab.data import synthetic_translation
from blayers.lab.learners import MeshLearner
from blayers.lab.loop import train
from blayers.lab.mesh.graph import MeshRun, parameter_bytes_per_device
from blayers.lab.mesh.random import NoiseSource
from blayers.lab.mesh.transformer import TransformerHParams, transformer_loss, mtf

out = {}
# Training through the graph-mode loop on 2 devices, then a resumed run to 40 steps; a run
# straight to 40 steps in another folder; a resume on another layout.
data = synthetic_translation(
    num_train=256, num_test=64, vocab_size=13, max_length=6, noise=0.0, pad_to=8
)
hparams = TransformerHParams(vocab_size=16, d_model=16, d_ff=32, num_heads=4, num_layers=1)
kwargs = dict(hparams=hparams, mesh_shape="model:2", batch_size=16, num_eval_samples=2,
              learning_rate=3e-3)
def train_mesh(model_dir, steps, **changes):
    learner = MeshLearner(data, **{**kwargs, **changes})
    return train(model_dir, learner=learner, train_steps=steps, log_every=5,
                 checkpoint_every=10, progress=False)
out["first"] = train_mesh(sys.argv[1], 20)
out["resumed"] = train_mesh(sys.argv[1], 40)
out["straight"] = train_mesh(sys.argv[2], 40)
train_mesh(sys.argv[3], 20)
out["relaid"] = train_mesh(sys.argv[3], 40, mesh_shape="model:1", layout="")

# The same weights and noise on 1, 2, 4 and 2x2 devices give the same loss, with deterministic
# and with Bayesian (Flipout attention, local-reparameterization feed-forward) layers.
rng = np.random.RandomState(0)
src = rng.randint(3, 16, (4, 6)).astype(np.int32)
src[:, 5] = 0
tin = rng.randint(3, 16, (4, 7)).astype(np.int32)
tout = np.roll(tin, -1, 1)
tout[:, -1] = 0
losses, bayesian_losses, bytes_per_device = {}, {}, {}
meshes = {
    "1": ("model:1", "heads:model;d_ff:model;vocab:model"),
    "2": ("model:2", "heads:model;d_ff:model;vocab:model"),
    "4": ("model:4", "heads:model;d_ff:model;vocab:model"),
    "2x2": ("batch:2,model:2", "batch:batch;heads:model;d_ff:model;vocab:model"),
}
def loss_on(mesh_shape, layout, estimators):
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        b, ls, lt = (mtf.Dimension(k, v) for k, v in (("batch", 4), ("source_length", 6), ("length", 7)))
        tensors = [
            mtf.import_tf_tensor(mesh, tf.constant(a), mtf.Shape(s))
            for a, s in ((src, [b, ls]), (tin, [b, lt]), (tout, [b, lt]))
        ]
        h = TransformerHParams(vocab_size=16, d_model=16, d_ff=32, num_heads=4, num_layers=2,
                               attention_estimator=estimators[0], ffn_estimator=estimators[1])
        noise = NoiseSource(7, tf.constant(3, tf.int64), tf.constant(0, tf.int64))
        nll, kl, tokens = transformer_loss(mesh, *tensors, h, noise)
        shape = mtf.convert_to_shape(mesh_shape)
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            shape, mtf.convert_to_layout_rules(layout), [f"/cpu:{i}" for i in range(shape.size)]
        )
        lowering = mtf.Lowering(graph, {mesh: impl})
        nll_tf = lowering.export_to_tf_tensor(nll)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(lowering.copy_masters_to_slices())
            loss = float(session.run(nll_tf))

        class _Run:
            pass

        fake = _Run()
        fake.graph, fake.lowering = graph, lowering
        return loss, parameter_bytes_per_device(fake)


for n, (mesh_shape, layout) in meshes.items():
    losses[n], bytes_per_device[n] = loss_on(mesh_shape, layout, (None, None))
    bayesian_losses[n], _ = loss_on(mesh_shape, layout, ("flipout", "local_reparameterization"))
out["bayesian_losses"] = bayesian_losses
out["losses"] = losses
out["bytes"] = {n: sorted(v.values()) for n, v in bytes_per_device.items()}
print(json.dumps(out))
"""


@pytest.mark.slow  # an end-to-end run
def test_model_parallel_transformer_trains_resumes_and_splits_its_parameters(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _MODEL_PARALLEL, *(str(tmp_path / d) for d in ("a", "b", "c"))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # It learns (uniform over 16 tokens: 2.77 nats) and the second call resumed at step 20.
    assert out["resumed"]["token_nll"] < out["first"]["token_nll"] < np.log(16)
    summary = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert summary["step"] == 40 and summary["resumed_from_step"] == 20
    # A resumed run continues exactly where it stopped (the data position and the noise are
    # functions of the step), bit for bit: the session runs the graph as lowered (grappler's
    # rewrites let the split sums' order vary); resuming on another layout changes only the
    # float summation order.
    train = lambda d: [
        r for r in map(json.loads, (tmp_path / d / "history.jsonl").open()) if r["kind"] == "train"
    ]
    assert [(r["step"], r["loss"]) for r in train("a")] == [
        (r["step"], r["loss"]) for r in train("b")
    ]
    assert out["resumed"] == out["straight"]
    assert out["relaid"] == pytest.approx(out["straight"], rel=1e-3)
    # Model and data parallelism change no number: 1, 2, 4 devices and a 2x2 batch-by-model
    # mesh give one loss.
    losses = out["losses"]
    for mesh in ("2", "4", "2x2"):
        assert losses[mesh] == pytest.approx(losses["1"], rel=1e-5), mesh
        assert out["bayesian_losses"][mesh] == pytest.approx(out["bayesian_losses"]["1"], rel=1e-5)
    # ... and the noise is there: the Bayesian loss differs from the deterministic one.
    assert out["bayesian_losses"]["1"] != pytest.approx(losses["1"], rel=1e-3)
    # Per-device parameter bytes fall as 1/n for the split tensors (heads, d_ff, vocabulary);
    # the d_model-only ones (layer norms) are replicated, so the fall is a little less.
    one, two, four = (np.asarray(out["bytes"][k], float) for k in ("1", "2", "4"))
    assert len(two) == 2 and len(four) == 4
    assert two.max() < 0.6 * one.max() and four.max() < 0.35 * one.max()
    assert four.max() > 0.25 * one.max()  # not below 1/n


@pytest.mark.slow  # an end-to-end run
def test_mesh_smoke_config_through_the_cli(tmp_path):
    """`python -m blayers.train --strategy=mesh`: the gin config, the mesh flags, the outputs."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "blayers.train",
            "--strategy=mesh",
            "--num_cpu_devices=2",
            "--mesh_shape=model:2",
            "--gin_file=bayesian_transformer_mesh_smoke",
            "--gin_param=train.train_steps = 20",
            "--gin_param=train.log_every = 10",
            f"--model_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "metrics.json").read_text())
    final = summary["final"]
    assert summary["step"] == 20 and np.isfinite(final["token_nll"])
    # The Keras path's metrics on the mesh: decodes scored by BLEU, sequence calibration.
    assert 0.0 <= final["bleu_beam"] <= 100.0 and 0.0 <= final["bleu_greedy"] <= 100.0
    assert 0.0 <= final["sequence_calibration_error"] <= 1.0 and 0.0 <= final["token_ece"] <= 1.0
    assert (tmp_path / "history.jsonl").exists() and list((tmp_path / "checkpoints").iterdir())
    for name in ("operative_config.gin", "training_curves.png", "sequence_reliability.png"):
        assert (tmp_path / name).exists(), name
    assert "TransformerHParams.d_model = 32" in (tmp_path / "operative_config.gin").read_text()
