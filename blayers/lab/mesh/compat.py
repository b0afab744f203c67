"""Mesh TensorFlow 0.1.21's core on TensorFlow 2.21: the two things it needs that moved.

* `tf.compat.v1.estimator` is gone. Mesh TF's core uses only two classes from it, as base classes
  of its checkpoint hooks: `SessionRunHook` and `CheckpointSaverListener`, both still in
  `tf.compat.v1.train`. The shim gives `tf.compat.v1` an `estimator` module holding those two.
* `tensorflow.python.framework.ops.register_tensor_conversion_function` moved to
  `tensorflow.python.framework.tensor_conversion_registry`; the shim points the old name at it.

`import_mesh_tensorflow()` installs both (idempotently) and returns the `mesh_tensorflow`
module. `mesh_tensorflow.transformer` still does not import (it needs TPUEstimator): blayers
uses the core (`mtf` ops, `mtf.layers`, the placement and SIMD mesh implementations).
"""

import sys
import types

import tensorflow as tf

__all__ = ["import_mesh_tensorflow", "install"]


def install():
    """Installs the two compatibility names (a no-op where TensorFlow still has them)."""
    from tensorflow.python.framework import ops, tensor_conversion_registry

    v1 = tf.compat.v1
    if not hasattr(v1, "estimator"):
        estimator = types.ModuleType("tensorflow.compat.v1.estimator")
        estimator.__doc__ = "blayers' stand-in: the two hooks Mesh TensorFlow's core subclasses."
        estimator.SessionRunHook = v1.train.SessionRunHook
        estimator.CheckpointSaverListener = v1.train.CheckpointSaverListener
        v1.estimator = estimator
        sys.modules.setdefault("tensorflow.compat.v1.estimator", estimator)
    if not hasattr(ops, "register_tensor_conversion_function"):
        ops.register_tensor_conversion_function = (
            tensor_conversion_registry.register_tensor_conversion_function
        )


def import_mesh_tensorflow():
    """`mesh_tensorflow`, imported after `install()`."""
    install()
    import mesh_tensorflow

    return mesh_tensorflow
