"""edward2's `edward2/tensorflow/layers/hetsngp_test.py`, translated (its graph-mode branch,
`tf.compat.v1`, has no Keras 3 counterpart; the eager branch is here)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import layers as ed_layers

CASES = [
    (kernel_type, num_classes) for kernel_type in ("gaussian", "linear") for num_classes in (3, 6)
]
cases = pytest.mark.parametrize(
    "gp_kernel_type, num_classes",
    CASES,
    ids=[f"_posterior_network_{kernel}_{classes}" for kernel, classes in CASES],
)


class Classifier(keras.Model):
    """Wrapper for classifiers defined below."""

    def __init__(self, gp_kernel_type, num_classes, **kwargs):
        super().__init__()
        self.hidden_layer = keras.layers.Dense(16)
        self.output_layer = ed_layers.HeteroscedasticSNGPLayer(
            num_classes=num_classes, num_factors=num_classes, gp_kernel_type=gp_kernel_type
        )
        self.classifier = keras.Sequential(layers=[self.hidden_layer, self.output_layer])

    def call(self, inputs, **kwargs):
        return self.classifier(inputs, **kwargs)


def create_dataset(num_classes):
    x = np.asarray([[1.0, 2.0], [0.5, 1.5], [0.2, 0.15], [-0.3, 0.0]])
    y = np.asarray([[i % num_classes] for i in range(4)])
    return tf.convert_to_tensor(x), tf.convert_to_tensor(y)


@cases
def test_layer_construction(gp_kernel_type, num_classes):
    output_layer = ed_layers.HeteroscedasticSNGPLayer(
        num_classes=num_classes, num_factors=num_classes, gp_kernel_type=gp_kernel_type
    )
    assert output_layer is not None


@cases
def test_model_construction(gp_kernel_type, num_classes):
    model = Classifier(num_classes=num_classes, gp_kernel_type=gp_kernel_type)
    assert model is not None


@cases
def test_train_step(gp_kernel_type, num_classes):
    x, y = create_dataset(num_classes)
    model = Classifier(num_classes=num_classes, gp_kernel_type=gp_kernel_type)
    out = model(x)
    assert out is not None
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam()
    with tf.GradientTape() as tape:
        log_preds = model(x)
        loss_value = loss_fn(y, log_preds)
    grads = tape.gradient(loss_value, model.trainable_weights)
    assert grads is not None
    grads, _ = tf.clip_by_global_norm(grads, 2.5)
    optimizer.apply_gradients(zip(grads, model.trainable_weights))
    assert float(loss_value) > 0
