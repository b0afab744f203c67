"""The pipelines blayers iterates run without tf.data's autotuner thread (whose end stalls the
deletion of an iterator for up to its sleep), and yield exactly what the caller's pipeline does."""

import numpy as np
import tensorflow as tf

from blayers import pipelines
from blayers.posthoc.batches import arrays, batches, input_batches


def _pairs(n=10):
    x = np.arange(2 * n, dtype="float32").reshape(n, 2)
    return tf.data.Dataset.from_tensor_slices((x, np.arange(n)))


def test_untuned_passes_to_every_pipeline_built_on_it():
    base = pipelines.untuned(_pairs())
    assert base.options().autotune.enabled is False
    built = (
        base.enumerate()
        .shuffle(10, seed=1)
        .map(lambda i, e: e, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(3)
        .concatenate(base.batch(4))
        .prefetch(tf.data.AUTOTUNE)
    )
    assert built.options().autotune.enabled is False
    # The same elements, in the same order, as the tuned twin.
    twin = _pairs().batch(3).prefetch(tf.data.AUTOTUNE)
    for a, b in zip(pipelines.untuned(_pairs()).batch(3).prefetch(-1), twin, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_untuned_keeps_the_caller_s_options_and_passes_other_values_through():
    options = tf.data.Options()
    options.autotune.enabled = True
    options.deterministic = False
    mine = _pairs().with_options(options)
    assert pipelines.untuned(mine).options().autotune.enabled is True
    other = tf.data.Options()
    other.deterministic = False
    kept = pipelines.untuned(_pairs().with_options(other)).options()
    assert kept.deterministic is False and kept.autotune.enabled is False
    assert pipelines.untuned(None) is None
    x = np.zeros((3, 2))
    assert pipelines.untuned(x) is x


def test_post_hoc_batches_of_a_dataset_are_its_batches():
    data = _pairs(7).batch(3)
    got = list(batches(data, 3))
    assert [len(y) for _, y in got] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate([y for _, y in got]), np.arange(7))
    x, y = arrays(data)
    np.testing.assert_array_equal(x[:, 0], 2 * np.arange(7))
    np.testing.assert_array_equal(y, np.arange(7))
    inputs = list(input_batches(data, 3))
    np.testing.assert_array_equal(np.concatenate(inputs), x)
