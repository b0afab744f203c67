"""TensorFlow Datasets: `mnist`, `fashion_mnist`, `cifar10`, `cifar100`, `binarized_mnist`,
`imagenet2012`, ... through `tfds.load` with a user's `data_dir` (nothing is downloaded unless
`download=True`). Images are scaled to [0, 1]; sizes come from the data set's info.
"""

import gin
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from blayers.lab.data.augment import dequantization, fixed_dequantization, random_crop_flip
from blayers.lab.data.base import Data

__all__ = ["load", "tfds_dataset"]

# Data sets TFDS cannot download by itself: their archives go in <data_dir>/downloads/manual.
_MANUAL = ("imagenet2012",)


def load(caller, name, data_dir=None, download=False, **kwargs):
    """`tfds.load(name, data_dir=..., download=..., **kwargs)`, failing on data that is not
    prepared with what to do: which data set, where it was looked for, and how to prepare it.

    Args:
      caller: the configurable asking (named in the message, with its gin bindings).
    """
    try:
        return tfds.load(name, data_dir=data_dir, download=download, **kwargs)
    except AssertionError as error:
        if "could not find data" not in str(error):
            raise
        where = data_dir or tfds.core.constants.DATA_DIR
        manual = (
            f" ({name} cannot be downloaded by TFDS: place its archives in "
            "DIR/downloads/manual first, see the TFDS catalogue page)"
            if name.split("/")[0] in _MANUAL
            else ""
        )
        raise ValueError(
            f"{caller}: the TFDS data set {name!r} is not prepared in {where!r}. Prepare it once "
            f"on a machine with network access, `tfds build {name.split('/')[0]} "
            f"--data_dir=DIR`{manual}, then pass "
            f"--gin_param=\"{caller}.data_dir = 'DIR'\"; or bind {caller}.download = True to let "
            "the run download and prepare it."
        ) from None


def _prepare(flatten, image_size):
    def fn(x, y):
        is_image = x.dtype == tf.uint8
        x = tf.cast(x, tf.float32)
        if is_image:
            x = x / 255.0
        if image_size is not None and x.shape.rank == 3:
            x = tf.image.resize(x, [image_size, image_size])
        if flatten:
            x = tf.reshape(x, [-1])
        return x, tf.cast(y, tf.int32)

    return fn


def _load(caller, name, train_split, test_split, data_dir, download, prepare, **kwargs):
    """`(train, test, common)`: the two prepared splits, and the `Data` fields they determine
    (sizes, input shape)."""
    (train, test), info = load(
        caller,
        name,
        data_dir,
        download,
        split=[train_split, test_split],
        with_info=True,
        **kwargs,
    )
    train, test = train.map(prepare), test.map(prepare)
    common = {
        "name": name,
        "train": train,
        "test": test,
        "num_train": _num_examples(info, train_split, train),
        "num_test": _num_examples(info, test_split, test),
        "input_shape": tuple(train.element_spec[0].shape),
    }
    return info, common


def _num_examples(info, split, dataset):
    """The split's size from TFDS metadata, or counted when there is none (mocked data)."""
    try:
        return info.splits[split].num_examples
    except KeyError:
        return int(dataset.reduce(0, lambda count, _: count + 1))


@gin.configurable(module="blayers.lab.data")
def tfds_dataset(
    name=gin.REQUIRED,
    data_dir=None,
    train_split="train",
    test_split="test",
    ood=None,
    flatten=False,
    image_size=None,
    download=False,
    crop_padding=None,
):
    """A TFDS classification data set as `Data` (features scaled to [0, 1]).

    Args:
      name: TFDS name, e.g. 'mnist', 'cifar10'.
      data_dir: where the prepared data lives (TFDS' default when None).
      train_split, test_split: TFDS split names ('validation' for imagenet2012).
      ood: optional TFDS name whose test split serves as OOD features (same preprocessing).
      flatten: flatten images to vectors (for MLPs).
      image_size: resize square images (e.g. 32 for small-scale smoke runs).
      download: let TFDS download and prepare (needs the network).
      crop_padding: augment training images by `random_crop_flip(crop_padding)` (zero-pad,
        random crop, random flip; 4 for CIFAR). Not with `flatten`.
    """
    if crop_padding and flatten:
        raise ValueError("tfds_dataset: crop_padding augments images; it cannot go with flatten.")
    prepare = _prepare(flatten, image_size)
    info, common = _load(
        "tfds_dataset",
        name,
        train_split,
        test_split,
        data_dir,
        download,
        prepare,
        as_supervised=True,
    )
    ood_ds = None
    if ood is not None:
        ood_ds = (
            load("tfds_dataset", ood, data_dir, download, split="test", as_supervised=True)
            .map(prepare)
            .map(lambda x, y: x)
        )
    return Data(
        task="classification",
        num_classes=info.features["label"].num_classes,
        ood=ood_ds,
        augment=random_crop_flip(crop_padding) if crop_padding else None,
        **common,
    )


@gin.configurable(module="blayers.lab.data")
def tfds_char_lm(
    name="tiny_shakespeare",
    data_dir=None,
    sequence_length=100,
    train_split="train",
    test_split="test",
    text_key="text",
    download=False,
):
    """Character-level language modelling on a TFDS text set (default `tiny_shakespeare`).

    The split texts are joined, mapped to ids of the training text's characters (unseen test
    characters map to 0) and cut into non-overlapping windows of `sequence_length + 1`:
    features are ids `0..T-1`, targets ids `1..T`.
    """
    import numpy as np

    splits = load("tfds_char_lm", name, data_dir, download, split=[train_split, test_split])
    texts = [
        "".join(t.decode("utf-8") for t in tfds.as_numpy(ds.map(lambda e: e[text_key])))
        for ds in splits
    ]
    vocab = sorted(set(texts[0]))
    index = {c: i for i, c in enumerate(vocab)}

    def windows(text):
        ids = np.array([index.get(c, 0) for c in text], np.int32)
        count = (len(ids) - 1) // sequence_length
        if count < 1:
            raise ValueError(
                f"tfds_char_lm: {name} has fewer than sequence_length + 1 = "
                f"{sequence_length + 1} characters in a split."
            )
        x = ids[: count * sequence_length].reshape(count, sequence_length)
        y = ids[1 : count * sequence_length + 1].reshape(count, sequence_length)
        return x.astype(np.float32), y

    (x_train, y_train), (x_test, y_test) = windows(texts[0]), windows(texts[1])
    return Data(
        name=name,
        task="classification",
        train=tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        test=tf.data.Dataset.from_tensor_slices((x_test, y_test)),
        num_train=len(x_train),
        num_test=len(x_test),
        input_shape=(sequence_length,),
        num_classes=len(vocab),
    )


@gin.configurable(module="blayers.lab.data")
def tfds_images(
    name="binarized_mnist",
    data_dir=None,
    train_split="train",
    test_split="test",
    image_key="image",
    binarize=False,
    dequantize=False,
    flatten=False,
    download=False,
    seed=0,
):
    """An image data set as a density task (VAEs, flows): features are the images scaled to
    [0, 1] (uint8 sources) or as stored (`binarized_mnist`), targets the flattened images.
    `dequantize`: `(k + u) / 256` with `u ~ U(0, 1)` drawn afresh per training example and epoch
    and fixed per test example (for flows; bits per dimension then bound the discrete ones
    after adding 8); `flatten`: features as vectors."""

    def prepare(example):
        image = example[image_key]
        x = tf.cast(image, tf.float32)
        if dequantize:  # k / 256 here; the noise comes per epoch (train) or fixed (test)
            x = x / 256.0
        elif image.dtype == tf.uint8 and name != "binarized_mnist":
            x = x / 255.0
        if binarize:
            x = tf.cast(x > 0.5, tf.float32)
        if flatten:
            x = tf.reshape(x, [-1])
        return x, tf.reshape(x, [-1])

    _, common = _load("tfds_images", name, train_split, test_split, data_dir, download, prepare)
    if dequantize:
        common["test"] = fixed_dequantization(common["test"], 256, seed)
    return Data(
        task="density",
        target_dim=int(np.prod(common["input_shape"])),
        reference={"levels": 256} if dequantize else {},
        augment=dequantization(256) if dequantize else None,
        **common,
    )
