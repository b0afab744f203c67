"""Mesh TensorFlow's core on TF 2.21 through blayers' compat shim (issue 12). Each check runs in
a process of its own: graph mode and logical devices are process-wide settings."""

import json
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]

_SCRIPT = r"""
import json
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from blayers.mesh.compat import import_mesh_tensorflow

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

    from blayers.mesh import compat

    compat.install()
    compat.install()
    assert tf.compat.v1.estimator.SessionRunHook is tf.compat.v1.train.SessionRunHook
    assert (
        tf.compat.v1.estimator.CheckpointSaverListener is tf.compat.v1.train.CheckpointSaverListener
    )
