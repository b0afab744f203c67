"""The `tf.data` pipelines blayers iterates: without the autotuner's thread, whose end stalls.

TensorFlow's `tf.data` autotuner runs a thread per iterator that sleeps between optimization
rounds, the sleep doubling as the iterator lives (up to a minute), and deleting the iterator waits
for the sleep to end: measured with TensorFlow 2.21 on CPU, up to 5.5 s for an iterator that lived
3-15 s (how long depends on where in its sleep the thread is), and 4-35 s for the lab's left-over
iterators freed by a later garbage collection. A training run drops an iterator at every phase
(between evaluations and checkpoints) and an evaluation or a post-hoc fit one per pass, so those
waits add up to more than the steps on small data. With autotuning off, `prefetch(tf.data.AUTOTUNE)`
still grows its buffer as the consumer needs (its own tuner, in the iterator) and an `AUTOTUNE`
parallel map runs at TensorFlow's default parallelism (a call per core): the same throughput on
the in-memory pipelines blayers builds, without the wait.
"""

import tensorflow as tf

__all__ = ["untuned"]

_UNTUNED = tf.data.Options()
_UNTUNED.autotune.enabled = False


def untuned(dataset):
    """`dataset` with `tf.data`'s autotuning off (this module's docstring says why); its options
    pass to every pipeline built on it (`batch`, `shuffle`, `concatenate`, ...). The dataset's
    other options are kept, and so is an autotuning setting its maker chose: a pipeline with
    `options.autotune.enabled = True` keeps its tuner. Anything else passes through."""
    if dataset is None or not isinstance(dataset, tf.data.Dataset):
        return dataset
    if dataset.options().autotune.enabled is not None:
        return dataset
    return dataset.with_options(_UNTUNED)
