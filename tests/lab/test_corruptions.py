"""Corrupted test sets: each corruption is the stated transform, deterministic, growing with the
severity; the classification task reports accuracy and calibration under them."""

import itertools
import json

import keras
import numpy as np
import pytest
from conftest import epochs_of

from blayers.lab.data import bundled
from blayers.lab.data.corruptions import CORRUPTIONS, corrupt, corrupted_sets
from blayers.lab.tasks.classification import Classification


def _images(n=20, size=12, seed=0):
    rng = np.random.default_rng(seed)
    images = np.zeros((n, size, size, 1))
    images[:, 3:9, 5:7] = rng.uniform(0.5, 1.0, size=(n, 1, 1, 1))  # a bar per image
    return images


def test_each_corruption_is_deterministic_and_grows_with_severity():
    images = _images()
    for name in CORRUPTIONS:
        again = corrupt(images, name, 3, seed=4)
        np.testing.assert_array_equal(corrupt(images, name, 3, seed=4), again)
        assert again.dtype == np.float32 and again.min() >= 0 and again.max() <= 1
        change = [np.abs(corrupt(images, name, s, seed=4) - images).mean() for s in range(1, 6)]
        assert all(a < b for a, b in itertools.pairwise(change)), (name, change)


def test_the_transforms_are_the_documented_ones():
    images = _images()
    # Contrast: (x - mean) c + mean per image, c = 0.2 at severity 3.
    mean = images.mean(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(
        corrupt(images, "contrast", 3), (images - mean) * 0.2 + mean, atol=1e-6
    )
    # Noise: on mid-grey pixels the added noise has stddev 0.08 at severity 1 (clipping at
    # 6 sigma is negligible); 28,800 draws give a standard error of 0.2% on the stddev.
    grey = np.full((200, 12, 12, 1), 0.5)
    noise = corrupt(grey, "gaussian_noise", 1) - 0.5
    assert noise.std() == pytest.approx(0.08, rel=0.01)
    assert abs(noise.mean()) < 5 * 0.08 / np.sqrt(noise.size)
    # Blur keeps the image's mass away from the border and spreads it.
    blurred = corrupt(images, "gaussian_blur", 5)
    np.testing.assert_allclose(blurred.sum(axis=(1, 2, 3)), images.sum(axis=(1, 2, 3)), rtol=1e-3)
    assert (blurred > 0.01).sum() > (images > 0.01).sum()
    # Rotation by 15 degrees keeps (most of) the bar's mass and moves pixels.
    rotated = corrupt(images, "rotation", 1)
    np.testing.assert_allclose(rotated.sum(axis=(1, 2, 3)), images.sum(axis=(1, 2, 3)), rtol=0.1)
    assert np.abs(rotated - images).mean() > 0.01
    with pytest.raises(ValueError, match="unknown corruption 'fog'"):
        corrupt(images, "fog", 1)
    with pytest.raises(ValueError, match="severity 6"):
        corrupt(images, "contrast", 6)


def test_corrupted_sets_keep_the_layout_and_bundled_data_carries_them():
    flat = _images().reshape(20, -1)
    sets = corrupted_sets(flat, (12, 12, 1), names=["contrast"], severities=(1, 5))
    assert sorted(sets) == ["contrast_1", "contrast_5"]
    assert sets["contrast_5"].shape == flat.shape
    data = bundled.digits(corruptions=["gaussian_noise", "rotation"])
    assert sorted(data.corrupted) == [
        f"{n}_{s}" for n in ("gaussian_noise", "rotation") for s in range(1, 6)
    ]
    x, y = next(iter(data.corrupted["rotation_2"].batch(10_000)))
    x_test, y_test = next(iter(data.test.batch(10_000)))
    np.testing.assert_array_equal(y, y_test)
    assert x.shape == x_test.shape and not np.allclose(x, x_test)
    with pytest.raises(ValueError, match="digits: corruptions="):
        bundled.digits(corruptions=["snow"])


def test_classification_task_reports_accuracy_under_shift(tmp_path):
    data = bundled.digits(corruptions=["gaussian_noise", "contrast"])
    x, y = next(iter(data.train.batch(10_000)))
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(epochs_of(x, y, 20, batch_size=64), verbose=0)
    task = Classification()
    result, arrays = task.evaluate(model, data, num_samples=1)
    table = arrays["corruptions"]
    assert result["accuracy"] > 0.9
    assert result["corrupted_accuracy"] < result["accuracy"]
    assert result["corrupted_nll"] > result["nll"]
    noise = [table[f"gaussian_noise_{s}"]["accuracy"] for s in range(1, 6)]
    assert noise[-1] < noise[0] - 0.05  # the strongest noise costs accuracy
    means = np.mean([v["accuracy"] for k, v in table.items() if k != "clean"])
    assert result["corrupted_accuracy"] == pytest.approx(means)
    paths = task.plot(model, data, arrays, str(tmp_path))
    assert str(tmp_path / "corruptions.png") in paths
    written = json.loads((tmp_path / "corruptions.json").read_text())
    assert written["contrast_5"]["accuracy"] == pytest.approx(table["contrast_5"]["accuracy"])
