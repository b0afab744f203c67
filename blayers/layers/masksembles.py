"""Masksembles (Durasov et al., CVPR 2021): `N` fixed binary masks over a layer's channels, one
per ensemble member, whose overlap a `scale` sets: between MC dropout (many random masks, large
overlap) and a deep ensemble (disjoint masks).

Member `m`'s rows of a member-major batch (`blayers.layers.EnsembleTile`, rows `[m B, (m + 1) B)`)
are multiplied by mask `m` (no rescaling, as the paper). Masks are generated once, as in the
paper's reference code: each of the `N` masks draws `k` ones among `round(k * s)` positions,
positions no mask uses are dropped, and `k` and `s` are searched so that exactly `C` positions
remain; the expected number of used positions is `k s (1 - (1 - 1/s)^N)`, so a larger `scale`
means less overlap. The masks are a (non-trainable) weight: a saved model keeps them.
"""

import keras
import numpy as np
import tensorflow as tf

from blayers.layers.base import register
from blayers.layers.ensemble import check_ensemble_size, member_rows
from blayers.registry import ArgsDoc

__all__ = ["Masksembles1D", "Masksembles2D", "generate_masks"]

_MAX_TRIES = 2000


def _draw(ones, count, scale, rng):
    positions = int(ones * scale)
    masks = np.zeros([count, positions])
    for row in masks:
        row[rng.choice(positions, ones, replace=False)] = 1.0
    return masks[:, masks.any(axis=0)]


def _masks_of_expected_size(ones, count, scale, rng):
    expected = int(ones * scale * (1 - (1 - 1 / scale) ** count))
    for _ in range(_MAX_TRIES):
        masks = _draw(ones, count, scale, rng)
        if masks.shape[1] == expected:
            return masks
    return masks


def generate_masks(channels, num_masks, scale, seed=None):
    """`[num_masks, channels]` binary masks with the overlap `scale` sets (Durasov et al., 2021,
    Sec. 3.2): `k = channels / (s (1 - (1 - 1/s)^N))` ones a mask, then a bisection on the
    scale until exactly `channels` positions are used.

    Args:
      channels: the layer's channels `C` (at least 10, as the paper's code requires).
      num_masks: masks `N`.
      scale: `s` in [1, 6]: 1 gives identical all-ones masks; larger, less overlap.
      seed: seeds NumPy's generator (None: a random one).

    Returns:
      float32 NumPy array `[num_masks, channels]` of zeros and ones.
    """
    if channels < 10:
        raise ValueError(
            f"Masksembles needs at least 10 channels, got {channels}: put the layer where the "
            "network is wider, or remove it."
        )
    if not 1.0 <= scale <= 6.0:
        raise ValueError(f"Masksembles' scale must be in [1, 6], got {scale}.")
    rng = np.random.RandomState(seed)
    if scale == 1.0:
        return np.ones([num_masks, channels], np.float32)
    ones = int(channels / (scale * (1 - (1 - 1 / scale) ** num_masks)))
    low, high = max(0.2 * scale, 1.0), 4.0 * scale
    s = scale
    for _ in range(200):
        masks = _masks_of_expected_size(ones, num_masks, s, rng)
        if masks.shape[1] == channels:
            return masks.astype(np.float32)
        if masks.shape[1] < channels:
            low = s
        else:
            high = s
        s = (low + high) / 2
    raise ValueError(
        f"Masksembles found no {num_masks} masks over exactly {channels} channels at scale "
        f"{scale}; try another scale or seed."
    )


class _Masksembles(ArgsDoc, keras.layers.Layer):
    _args_doc = """    Args:
      ensemble_size: masks `N`, one per member (the reference code's `n`).
      scale: the masks' `scale` `s` in [1, 6] (larger: less overlap between members).
      seed: seeds the masks' generation (None: a random one; the masks are saved with the
        model either way).
      **kwargs: `keras.layers.Layer` arguments.
"""

    rank = None

    def __init__(self, ensemble_size, scale, seed=None, **kwargs):
        super().__init__(**kwargs)
        name = f"{type(self).__name__} ({self.name})"
        self.ensemble_size = check_ensemble_size(name, ensemble_size)
        self.scale = float(scale)
        self.seed = seed
        self.input_spec = keras.layers.InputSpec(ndim=self.rank)

    def build(self, input_shape):
        channels = input_shape[-1]
        try:
            masks = generate_masks(int(channels), self.ensemble_size, self.scale, self.seed)
        except ValueError as error:
            raise ValueError(f"{type(self).__name__} ({self.name}): {error}") from None
        self.masks = self.add_weight(
            name="masks",
            shape=masks.shape,
            initializer=keras.initializers.Constant(masks),
            trainable=False,
        )

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        name = f"{type(self).__name__} ({self.name})"
        return x * member_rows(tf.cast(self.masks, x.dtype), x, name)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "ensemble_size": self.ensemble_size,
            "scale": self.scale,
            "seed": self.seed,
        }


@register
class Masksembles1D(_Masksembles):
    """Masksembles on `[N * B, C]` features: member `m`'s rows times mask `m` (the reference
    Keras layer of that name)."""

    rank = 2


@register
class Masksembles2D(_Masksembles):
    """Masksembles on channels-last images `[N * B, H, W, C]`: member `m`'s rows times mask `m`
    on the channel axis (the reference Keras layer of that name)."""

    rank = 4
