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


def epoch_batches(data, batch_size, seed, epoch, skip=0, shuffle_buffer=10_000, prefetch=True):
    """`data.train`'s batches of `epoch` (full batches only), less the first `skip`.

    Args:
      data: a `Data` record (its `train`, `num_train` and `augment`).
      batch_size: examples a batch.
      seed, epoch: fix the shuffle order and augmentation draws (`epoch_seed`).
      skip: batches of the epoch already trained on.
      shuffle_buffer: examples shuffled at a time (capped at `data.num_train`).
      prefetch: prefetch the batches (off for a pipeline that chains epochs and prefetches
        once).
    """
    this_seed = epoch_seed(seed, epoch)
    ds = data.train
    if data.augment is not None:  # index examples first: their noise follows them
        ds = ds.enumerate()
    ds = ds.shuffle(
        max(1, min(data.num_train, shuffle_buffer)), seed=this_seed, reshuffle_each_iteration=False
    )
    if data.augment is not None:
        ds = augment_indexed(ds, data.augment, this_seed)
    ds = ds.batch(batch_size, drop_remainder=True)
    if skip:
        ds = ds.skip(skip)
    return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds
