"""Batches of data for the post-hoc methods: a `tf.data.Dataset` or NumPy arrays, alike."""

import numpy as np

from blayers.pipelines import untuned

__all__ = ["arrays", "batches", "input_batches"]


def batches(data, batch_size):
    """`(x, y)` batches of NumPy arrays from a `tf.data.Dataset` of `(x, y)` or arrays."""
    if isinstance(data, (tuple, list)) and len(data) == 2:
        x, y = data
        for start in range(0, len(x), batch_size):
            yield (
                np.asarray(x[start : start + batch_size]),
                np.asarray(y[start : start + batch_size]),
            )
        return
    for x, y in untuned(data).as_numpy_iterator():
        yield x, y


def input_batches(data, batch_size):
    """Input batches (NumPy) of a dataset of inputs or `(x, y)` pairs, of arrays `x` or `(x, y)`."""
    if hasattr(data, "as_numpy_iterator"):
        for batch in untuned(data).as_numpy_iterator():
            yield batch[0] if isinstance(batch, tuple) else batch
        return
    x = data[0] if isinstance(data, (tuple, list)) else data
    for start in range(0, len(x), batch_size):
        yield np.asarray(x[start : start + batch_size])


def arrays(data):
    """All of `(x, y)` as two arrays."""
    xs, ys = zip(*batches(data, 1 << 30))
    return np.concatenate(xs), np.concatenate(ys)
