"""Training-time augmentation: `Data.augment` functions `fn(features, target, seed)` that the
trainer applies to each training example as it is drawn, with a stateless seed fixed by the
run's seed, the epoch and the example (`augment_indexed`), so a resumed run replays its draws.

* `dequantization(levels)`: fresh uniform noise within each intensity bin (for flows), with
  `fixed_dequantization` for the test split.
* `random_crop_flip(padding)`: zero-pad, random crop back to size and random horizontal flip
  (the standard CIFAR/ResNet augmentation).
"""

import tensorflow as tf

__all__ = ["augment_indexed", "dequantization", "fixed_dequantization", "random_crop_flip"]


def dequantization(levels):
    """`augment` for density data whose features are integer levels scaled to `k / levels`:
    adds `u / levels`, `u ~ U(0, 1)` drawn afresh per example and epoch, so a flow cannot
    memorize one noise draw (Theis et al., 2016). Targets are the features, flattened."""

    def augment(features, target, seed):
        noise = tf.random.stateless_uniform(tf.shape(features), seed, dtype=features.dtype)
        features = features + noise / levels
        return features, tf.reshape(features, tf.shape(target))

    return augment


def augment_indexed(indexed, augment, seed):
    """Maps the `(index, (features, target))` pairs of `dataset.enumerate()` through
    `augment(features, target, seed=[seed, index])`: each example's draw is a function of
    `seed` and its index, wherever a shuffle has moved it."""

    def apply(index, example):
        return augment(*example, seed=tf.stack([tf.cast(seed, tf.int64), index]))

    return indexed.map(apply, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def fixed_dequantization(dataset, levels, seed):
    """The test-split counterpart of `dequantization`: one noise draw per example, a function
    of `seed` and the example's position, so every evaluation sees the same points."""
    return augment_indexed(dataset.enumerate(), dequantization(levels), seed)


def random_crop_flip(padding):
    """`augment` for `[height, width, channels]` images: zero-pad by `padding` pixels a side,
    crop a random window of the original size, and flip left-right with probability 1/2."""

    def augment(image, label, seed):
        seeds = tf.random.experimental.stateless_split(seed, 2)
        padded = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
        image = tf.image.stateless_random_crop(padded, tf.shape(image), seeds[0])
        return tf.image.stateless_random_flip_left_right(image, seeds[1]), label

    return augment
