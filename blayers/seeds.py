"""Seeds: one helper to make runs reproducible, one to draw per-call stateless seeds.

Layers own a `keras.random.SeedGenerator` and draw a fresh stateless seed on every call, so
randomness is reproducible from `set_seed`, works in `tf.function` and XLA, and is saved with
the model. Under a `tf.distribute` strategy with several replicas, the replica id is folded into
the seed so that replicas draw independent noise (Flipout's variance reduction relies on
independent perturbations across the examples of a global batch).
"""

import keras
import tensorflow as tf

__all__ = ["next_seed", "set_seed"]


def set_seed(seed):
    """Seeds Python, NumPy, TensorFlow and Keras (and thus every layer created afterwards)."""
    keras.utils.set_random_seed(int(seed))


def next_seed(generator):
    """A fresh stateless seed (int32 tensor of shape [2]) from a `keras.random.SeedGenerator`."""
    seed = tf.cast(generator.next(), tf.int32)
    replica_context = tf.distribute.get_replica_context()
    if replica_context is not None and replica_context.num_replicas_in_sync > 1:
        replica_id = tf.cast(replica_context.replica_id_in_sync_group, tf.int32)
        seed = seed + tf.stack([replica_id * 7919, replica_id])
    return seed
