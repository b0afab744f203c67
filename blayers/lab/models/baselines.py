"""The uncertainty-baselines comparison network: one ResNet, one method switch.

`uncertainty_baseline(method=...)` builds, with `architecture='resnet'`, the CIFAR ResNet of He
et al. (2016): `depth = 6n + 2` (20: ResNet-20), three stages of `n` basic blocks of widths
`w, 2w, 4w` (`width`, 16 in the paper); with `architecture='wide_resnet'`, the Wide ResNet of
Zagoruyko & Komodakis (2016), `depth = 6n + 4` (28), pre-activation blocks of widths
`16k, 32k, 64k` (`width_multiplier` k = 10: WRN-28-10, uncertainty-baselines' CIFAR network);
then global average pooling and a linear head, in the variant of each method compared by
uncertainty-baselines (Nado et al., 2021) on its CIFAR-10 table:

* `'deterministic'`: `Conv2D` / `Dense`.
* `'mc_dropout'`: the deterministic network with `MCDropout(dropout_rate)` after each block's
  first convolution and before the head (Gal & Ghahramani, 2016), active at prediction.
* `'flipout'`: mean-field Gaussian weights, `Conv2DFlipout` / `DenseFlipout` (Wen et al., 2018).
* `'batch_ensemble'`: `Conv2DBatchEnsemble` / `DenseBatchEnsemble` with `ensemble_size`
  members on a tiled batch (Wen et al., 2020).
* `'rank1'`: `Conv2DRank1` / `DenseRank1` (Dusenberry et al., 2020), members as above.
* `'sngp'`: spectrally normalized convolutions (`SpectralNormalizationConv2D`, bound
  `norm_multiplier`) and the `RandomFeatureGaussianProcess` head (Liu et al., 2020).

Every variant returns logits except the ensembles, whose `EnsembleOutput` returns a random
variable over the mixture of their members; the classification task reads both.
"""

import gin
import keras

from blayers import layers

__all__ = ["METHODS", "uncertainty_baseline"]

METHODS = ("deterministic", "mc_dropout", "flipout", "batch_ensemble", "rank1", "sngp")
_ENSEMBLES = ("batch_ensemble", "rank1")


class _Factory:
    """Convolutions and the head of one method."""

    def __init__(self, method, ensemble_size, dropout_rate, norm_multiplier, num_inducing):
        self.method, self.ensemble_size = method, ensemble_size
        self.dropout_rate, self.norm_multiplier = dropout_rate, norm_multiplier
        self.num_inducing = num_inducing

    def conv(self, filters, kernel_size, strides, name):
        kwargs = {"strides": strides, "padding": "same", "use_bias": False, "name": name}
        if self.method == "flipout":
            return layers.Conv2DFlipout(
                filters, kernel_size, kernel_initializer="trainable_he_normal", **kwargs
            )
        if self.method == "batch_ensemble":
            return layers.Conv2DBatchEnsemble(
                filters, kernel_size, ensemble_size=self.ensemble_size, **kwargs
            )
        if self.method == "rank1":
            return layers.Conv2DRank1(
                filters, kernel_size, ensemble_size=self.ensemble_size, **kwargs
            )
        conv = keras.layers.Conv2D(filters, kernel_size, kernel_initializer="he_normal", **kwargs)
        if self.method == "sngp":
            return layers.SpectralNormalizationConv2D(
                conv, norm_multiplier=self.norm_multiplier, name=f"{name}_sn"
            )
        return conv

    def dropout(self, x, name):
        if self.method == "mc_dropout" and self.dropout_rate:
            return layers.MCDropout(self.dropout_rate, name=name)(x)
        return x

    def head(self, x, num_outputs):
        if self.method == "flipout":
            return layers.DenseFlipout(num_outputs, name="logits")(x)
        if self.method == "batch_ensemble":
            x = layers.DenseBatchEnsemble(
                num_outputs, ensemble_size=self.ensemble_size, name="logits"
            )(x)
            return layers.EnsembleOutput(self.ensemble_size, name="members")(x)
        if self.method == "rank1":
            x = layers.DenseRank1(num_outputs, ensemble_size=self.ensemble_size, name="logits")(x)
            return layers.EnsembleOutput(self.ensemble_size, name="members")(x)
        if self.method == "sngp":
            return layers.RandomFeatureGaussianProcess(
                num_outputs, num_inducing=self.num_inducing, name="logits"
            )(x)
        return keras.layers.Dense(num_outputs, name="logits")(x)


def _block(x, filters, strides, factory, name):
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = factory.conv(filters, 1, strides, f"{name}_proj")(x)
        shortcut = keras.layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
    y = factory.conv(filters, 3, strides, f"{name}_conv1")(x)
    y = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name=f"{name}_bn1")(y))
    y = factory.dropout(y, f"{name}_dropout")
    y = factory.conv(filters, 3, 1, f"{name}_conv2")(y)
    y = keras.layers.BatchNormalization(name=f"{name}_bn2")(y)
    return keras.layers.Activation("relu")(keras.layers.Add()([shortcut, y]))


def _wide_block(x, filters, strides, factory, name):
    """Pre-activation block (BN-ReLU-conv-BN-ReLU-conv) of a Wide ResNet."""
    y = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name=f"{name}_bn1")(x))
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = factory.conv(filters, 1, strides, f"{name}_proj")(y)
    y = factory.conv(filters, 3, strides, f"{name}_conv1")(y)
    y = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name=f"{name}_bn2")(y))
    y = factory.dropout(y, f"{name}_dropout")
    y = factory.conv(filters, 3, 1, f"{name}_conv2")(y)
    return keras.layers.Add()([shortcut, y])


@gin.configurable(module="blayers.lab.models")
def uncertainty_baseline(
    input_shape,
    num_outputs,
    method="deterministic",
    architecture="resnet",
    depth=20,
    width=16,
    width_multiplier=10,
    ensemble_size=4,
    dropout_rate=0.1,
    norm_multiplier=6.0,
    num_inducing=1024,
    name=None,
):
    """The CIFAR ResNet (`depth = 6n + 2`, widths `width * (1, 2, 4)`) as `method`'s variant.

    Args:
      method: one of `METHODS`.
      architecture: `'resnet'` (He et al.) or `'wide_resnet'` (Zagoruyko & Komodakis).
      depth: ResNet: 20, 32, 44, 56, ... (`6n + 2`); Wide ResNet: 28, ... (`6n + 4`).
      width: channels of a ResNet's first stage.
      width_multiplier: a Wide ResNet's `k`.
      ensemble_size: members of `'batch_ensemble'` and `'rank1'`.
      dropout_rate: of `'mc_dropout'`.
      norm_multiplier: SNGP's spectral bound of each convolution (uncertainty-baselines uses 6
        for its ResNets: a bound per layer on a residual network's distance preservation).
      num_inducing: SNGP's random features.
    """
    if method not in METHODS:
        raise ValueError(f"uncertainty_baseline: method must be one of {METHODS}, got {method!r}.")
    if architecture not in ("resnet", "wide_resnet"):
        raise ValueError(
            f"uncertainty_baseline: architecture must be 'resnet' or 'wide_resnet', got "
            f"{architecture!r}."
        )
    wide = architecture == "wide_resnet"
    offset = 4 if wide else 2
    if (depth - offset) % 6 or depth < 6 + offset:
        raise ValueError(
            f"uncertainty_baseline: a {architecture} needs depth = 6n + {offset} >= "
            f"{6 + offset}, got {depth}."
        )
    factory = _Factory(method, ensemble_size, dropout_rate, norm_multiplier, num_inducing)
    inputs = keras.Input(tuple(input_shape))
    x = inputs
    if len(input_shape) == 1:  # flat features (8 x 8 digits, say) as a 1-channel square
        side = round(input_shape[0] ** 0.5)
        if side * side != input_shape[0]:
            raise ValueError(
                f"uncertainty_baseline needs images [h, w, c] or square flat inputs, got "
                f"{tuple(input_shape)}."
            )
        x = keras.layers.Reshape((side, side, 1))(x)
    if method in _ENSEMBLES:
        x = layers.EnsembleTile(ensemble_size, name="tile")(x)
    x = factory.conv(16 if wide else width, 3, 1, "stem_conv")(x)
    if not wide:
        x = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name="stem_bn")(x))
    blocks = (depth - offset) // 6
    for stage in range(3):
        filters = 16 * width_multiplier * 2**stage if wide else width * 2**stage
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            block_fn = _wide_block if wide else _block
            x = block_fn(x, filters, strides, factory, f"stage{stage}_block{block}")
    if wide:
        x = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name="final_bn")(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = factory.dropout(x, "head_dropout")
    outputs = factory.head(x, num_outputs)
    label = f"wrn{depth}_{width_multiplier}" if wide else f"resnet{depth}"
    return keras.Model(inputs, outputs, name=name or f"{label}_{method}")
