"""`tf.distribute` strategy from a flag value: data parallelism without home-made code.

`cpu` / `gpu`: `OneDeviceStrategy`; `mirrored`: `MirroredStrategy` over all GPUs, or over all
logical CPU devices when there is no GPU (`num_cpu_devices` splits the CPU, for tests);
`multi_worker`: `MultiWorkerMirroredStrategy` configured by `TF_CONFIG`; `tpu`:
`TPUStrategy` through a `TPUClusterResolver` (`tpu` = name or address).
"""

import os

import tensorflow as tf

__all__ = ["STRATEGIES", "flag_name", "get_strategy", "split_cpu", "worker_directory"]

STRATEGIES = ("cpu", "gpu", "mirrored", "multi_worker", "tpu")


def split_cpu(num_devices):
    """Splits the physical CPU into `num_devices` logical devices (before TF initializes)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if existing and len(existing) == num_devices:
        return
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)]
    )


def get_strategy(name="cpu", tpu=None, num_cpu_devices=None):
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {STRATEGIES}.")
    if num_cpu_devices:
        split_cpu(num_cpu_devices)
    if name == "cpu":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if name == "gpu":
        if not tf.config.list_physical_devices("GPU"):
            raise ValueError("--strategy=gpu, but TensorFlow sees no GPU.")
        return tf.distribute.OneDeviceStrategy("/gpu:0")
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def worker_directory(model_dir, strategy):
    """Where this process writes: `model_dir` for the chief (or a single process); for another
    worker of a `MultiWorkerMirroredStrategy`, `model_dir/workers/<type>-<index>`. Every worker
    saves its checkpoints (saving is collective), but only the chief's are the run's, as
    `tf.distribute`'s multi-worker guide does it."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type:
        return model_dir
    task_id = resolver.task_id or 0
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    if task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief):
        return model_dir
    return os.path.join(model_dir, "workers", f"{task_type}-{task_id}")


def flag_name(strategy):
    """The `--strategy` name of a strategy object (`'cpu'`, `'mirrored'`, ...)."""
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        device = strategy.extended.worker_devices[0].lower()
        return "gpu" if "gpu" in device else "cpu"
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    return type(strategy).__name__
