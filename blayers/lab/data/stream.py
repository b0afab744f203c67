"""The training stream every loop draws from: epoch `e`'s order (and any augmentation) is a
function of the run's seed, `e` and the example, so a loop resumed at step `s` starts at epoch
`s // steps_per_epoch` and skips `s % steps_per_epoch` batches to continue exactly where the
stopped run was. Used by the Keras trainer and the Mesh TensorFlow loop alike."""

import tensorflow as tf

from blayers.lab.data.augment import augment_indexed

__all__ = ["epoch_batches", "epoch_seed"]


def epoch_seed(seed, epoch):
    """The shuffle (and augmentation) seed of `epoch` in a run seeded with `seed`."""
    return seed * 100_003 + epoch


def epoch_batches(data, batch_size, seed, epoch, skip=0, shuffle_buffer=10_000, epochs=1):
    """`data.train`'s batches of `epochs` epochs from `epoch` (full batches only; each epoch's
    own order), less the first `skip`, as one prefetching pipeline.

    Args:
      data: a `Data` record (its `train`, `num_train` and `augment`).
      batch_size: examples a batch.
      seed, epoch: fix the shuffle order and augmentation draws (`epoch_seed`).
      skip: batches of the epoch already trained on.
      shuffle_buffer: examples shuffled at a time (capped at `data.num_train`).
      epochs: epochs in the pipeline. Its cost to build does not grow with them (the epochs
        are a `flat_map` over their numbers): chaining a pipeline an epoch cost about 5 ms an
        epoch on 2 cores, a third of the main job's training time on digits (11 batches an
        epoch).
    """
    buffer_size = max(1, min(data.num_train, shuffle_buffer))

    def one_epoch(number):
        this_seed = epoch_seed(seed, number)
        ds = data.train
        if data.augment is not None:  # index examples first: their noise follows them
            ds = ds.enumerate()
        ds = _shuffle(ds, buffer_size, this_seed)
        if data.augment is not None:
            ds = augment_indexed(ds, data.augment, this_seed)
        return ds.batch(batch_size, drop_remainder=True)

    # Traced as written: no tensor-valued Python control flow for autograph to convert.
    one_epoch = tf.autograph.experimental.do_not_convert(one_epoch)
    ds = tf.data.Dataset.range(epoch, epoch + epochs).flat_map(one_epoch)
    ds = ds.with_options(data.train.options())  # the data's (`blayers.pipelines`) over the epochs
    if skip:
        ds = ds.skip(skip)
    return ds.prefetch(tf.data.AUTOTUNE)


_MAXINT32 = 2**31 - 1
_DEFAULT_GRAPH_SEED = 87654321  # TensorFlow's graph-level seed while no global seed is set


def _shuffle(ds, buffer_size, op_seed):
    """`ds.shuffle(buffer_size, seed=op_seed, reshuffle_each_iteration=False)` inside a
    `tf.data` function, with `op_seed` a tensor (the epoch's seed): the same order, by
    TensorFlow's rule for the pair of seeds a shuffle runs on (the graph-level seed, or its
    default while none is set, and `op_seed`, both modulo 2^31 - 1; `(0, 0)` becomes
    `(0, 2^31 - 1)`). `Dataset.shuffle` compares that pair in Python and refuses a tensor
    seed while the global seed is 0, every run's default."""
    graph_seed = tf.compat.v1.get_default_graph().seed  # a tf.data function's: the global seed
    seed = _DEFAULT_GRAPH_SEED if graph_seed is None else graph_seed % _MAXINT32
    seed2 = tf.cast(op_seed, tf.int64) % _MAXINT32
    if seed == 0:
        seed2 = tf.where(seed2 == 0, tf.constant(_MAXINT32, tf.int64), seed2)
    # The element's component tensors, as the op lists them (a ragged or sparse part: its encoding).
    flat = [t for spec in tf.nest.flatten(ds.element_spec) for t in spec._flat_tensor_specs]
    variant = tf.raw_ops.ShuffleDatasetV3(
        input_dataset=tf.data.experimental.to_variant(ds),
        buffer_size=tf.constant(buffer_size, tf.int64),
        seed=tf.constant(seed, tf.int64),
        seed2=seed2,
        seed_generator=tf.raw_ops.DummySeedGenerator(),
        output_types=[t.dtype for t in flat],
        output_shapes=[t.shape for t in flat],
        reshuffle_each_iteration=False,
    )
    return tf.data.experimental.from_variant(variant, ds.element_spec)
