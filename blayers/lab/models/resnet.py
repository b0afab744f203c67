"""ResNet-50 (He et al., 2016; v1.5 bottlenecks) with a Bayesian/deterministic switch.

The paper's appendix builds a Bayesian ResNet-50 from `Conv2DFlipout` and `DenseFlipout`, and
Figure 4 swaps layers with one flag:

    if FLAGS.be_bayesian: Conv2D = layers.Conv2DReparameterization
    else: Conv2D = tf.keras.layers.Conv2D

Here the flag is the gin binding `resnet.bayesian = True|False` (or name the layers with
`resnet.conv_layer` / `resnet.dense_layer`). `blocks_per_stage=(3, 4, 6, 3)` and
`base_filters=64` give ResNet-50; smaller values give the smoke-test network. `stem='imagenet'`
is the 7x7/2 convolution and 3x3/2 max-pool; `stem='cifar'` a 3x3/1 convolution for small images.
"""

import gin
import keras

from blayers.registry import get_layer as get_layer_class

__all__ = ["resnet"]


def _conv(conv_cls, filters, kernel_size, strides, bayesian, name):
    kwargs = {"kernel_initializer": "trainable_he_normal" if bayesian else "he_normal"}
    return conv_cls(
        filters, kernel_size, strides=strides, padding="same", use_bias=False, name=name, **kwargs
    )


def _bottleneck(x, filters, strides, conv_cls, bayesian, name):
    shortcut = x
    if strides != 1 or x.shape[-1] != 4 * filters:
        shortcut = _conv(conv_cls, 4 * filters, 1, strides, bayesian, f"{name}_proj")(x)
        shortcut = keras.layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
    y = _conv(conv_cls, filters, 1, 1, bayesian, f"{name}_conv1")(x)
    y = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name=f"{name}_bn1")(y))
    y = _conv(conv_cls, filters, 3, strides, bayesian, f"{name}_conv2")(y)
    y = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name=f"{name}_bn2")(y))
    y = _conv(conv_cls, 4 * filters, 1, 1, bayesian, f"{name}_conv3")(y)
    y = keras.layers.BatchNormalization(name=f"{name}_bn3", gamma_initializer="zeros")(y)
    return keras.layers.Activation("relu")(keras.layers.Add()([shortcut, y]))


@gin.configurable(module="blayers.lab.models")
def resnet(
    input_shape,
    num_outputs,
    bayesian=True,
    blocks_per_stage=(3, 4, 6, 3),
    base_filters=64,
    stem="imagenet",
    conv_layer=None,
    dense_layer=None,
    name="resnet50",
):
    """ResNet with bottleneck blocks; Bayesian (`Conv2DFlipout`, `DenseFlipout`) by default."""
    if stem not in ("imagenet", "cifar"):
        raise ValueError(f"resnet: stem must be 'imagenet' or 'cifar', got {stem!r}.")
    conv_cls = get_layer_class(conv_layer or ("Conv2DFlipout" if bayesian else "Conv2D"))
    dense_cls = get_layer_class(dense_layer or ("DenseFlipout" if bayesian else "Dense"))
    inputs = keras.Input(tuple(input_shape))
    if stem == "imagenet":
        x = _conv(conv_cls, base_filters, 7, 2, bayesian, "stem_conv")(inputs)
    else:
        x = _conv(conv_cls, base_filters, 3, 1, bayesian, "stem_conv")(inputs)
    x = keras.layers.Activation("relu")(keras.layers.BatchNormalization(name="stem_bn")(x))
    if stem == "imagenet":
        x = keras.layers.MaxPooling2D(3, strides=2, padding="same")(x)
    for stage, blocks in enumerate(blocks_per_stage):
        filters = base_filters * 2**stage
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _bottleneck(x, filters, strides, conv_cls, bayesian, f"stage{stage}_block{block}")
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = dense_cls(num_outputs, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)
