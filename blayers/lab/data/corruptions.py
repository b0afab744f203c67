"""Corrupted copies of an image test set, for accuracy and calibration under distribution shift
(in the manner of CIFAR-10-C and MNIST-C; Hendrycks & Dietterich, 2019; Mu & Gilmer, 2019).

Four corruptions at five severities each, generated deterministically from a seed, on images
with pixels in `[0, 1]` (`[n, height, width, channels]`):

* `gaussian_noise`: `clip(x + N(0, s^2))`, `s` = 0.08, 0.12, 0.18, 0.26, 0.38;
* `gaussian_blur`: a Gaussian filter of width `f * max(height, width)` pixels,
  `f` = 0.02, 0.03, 0.045, 0.06, 0.08 (0.56 to 2.2 pixels on 28x28 MNIST);
* `contrast`: `(x - mean(x)) c + mean(x)` per image, `c` = 0.4, 0.3, 0.2, 0.1, 0.05;
* `rotation`: by 15, 30, 45, 60, 75 degrees, clockwise or anticlockwise at random per image
  (bilinear, zeros outside).
"""

import numpy as np
import scipy.ndimage

__all__ = ["CORRUPTIONS", "SEVERITIES", "corrupt", "corrupted_sets"]

SEVERITIES = (1, 2, 3, 4, 5)
_NOISE = (0.08, 0.12, 0.18, 0.26, 0.38)
_BLUR = (0.02, 0.03, 0.045, 0.06, 0.08)
_CONTRAST = (0.4, 0.3, 0.2, 0.1, 0.05)
_ROTATION = (15.0, 30.0, 45.0, 60.0, 75.0)


def _gaussian_noise(images, severity, rng):
    return images + rng.normal(scale=_NOISE[severity - 1], size=images.shape)


def _gaussian_blur(images, severity, rng):
    sigma = _BLUR[severity - 1] * max(images.shape[1:3])
    return scipy.ndimage.gaussian_filter(images, sigma=(0, sigma, sigma, 0), mode="constant")


def _contrast(images, severity, rng):
    mean = images.mean(axis=(1, 2, 3), keepdims=True)
    return (images - mean) * _CONTRAST[severity - 1] + mean


def _rotation(images, severity, rng):
    signs = rng.choice([-1.0, 1.0], size=len(images))
    return np.stack(
        [
            scipy.ndimage.rotate(
                image,
                sign * _ROTATION[severity - 1],
                axes=(0, 1),
                reshape=False,
                order=1,
                mode="constant",
            )
            for image, sign in zip(images, signs)
        ]
    )


CORRUPTIONS = {
    "gaussian_noise": _gaussian_noise,
    "gaussian_blur": _gaussian_blur,
    "contrast": _contrast,
    "rotation": _rotation,
}


def corrupt(images, name, severity, seed=0):
    """`images` (`[n, h, w, c]`, pixels in `[0, 1]`) under corruption `name` at `severity`
    (1-5), clipped to `[0, 1]`; the same seed gives the same images."""
    if name not in CORRUPTIONS:
        raise ValueError(f"corrupt: unknown corruption {name!r}; use one of {sorted(CORRUPTIONS)}.")
    if severity not in SEVERITIES:
        raise ValueError(f"corrupt: severity {severity!r} is not one of {SEVERITIES}.")
    images = np.asarray(images, np.float64)
    if images.ndim != 4:
        raise ValueError(
            f"corrupt: images must be [n, height, width, channels], got {images.shape}."
        )
    rng = np.random.default_rng([seed, list(CORRUPTIONS).index(name), severity])
    return np.clip(CORRUPTIONS[name](images, severity, rng), 0.0, 1.0).astype(np.float32)


def corrupted_sets(x, image_shape, names=None, severities=SEVERITIES, seed=0):
    """`{'<name>_<severity>': corrupted x}` for flat or image features `x`; `image_shape` is one
    example's `(h, w, c)`, and each set keeps `x`'s own layout."""
    names = list(CORRUPTIONS) if names in (None, True) else list(names)
    images = np.asarray(x).reshape(len(x), *image_shape)
    return {
        f"{name}_{severity}": corrupt(images, name, severity, seed).reshape(np.shape(x))
        for name in names
        for severity in severities
    }
