"""edward2's `edward2/tensorflow/layers/posterior_network_test.py`, translated (its graph-mode
branch, `tf.compat.v1`, has no Keras 3 counterpart; the eager branch is here)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import layers as ed_layers

CASES = [
    (flow_type, num_classes, 4, 16)
    for flow_type in ("maf", "radial", "affine")
    for num_classes in (2, 6)
]
cases = pytest.mark.parametrize(
    "flow_type, num_classes, flow_depth, flow_width",
    CASES,
    ids=[f"_posterior_network_{flow}_{classes}" for flow, classes, _, _ in CASES],
)


class Classifier(keras.Model):
    """Wrapper for classifiers defined below."""

    def __init__(self, flow_type, flow_width, flow_depth, num_classes, **kwargs):
        super().__init__()
        self.hidden_layer = keras.layers.Dense(16)
        self.output_layer = ed_layers.PosteriorNetworkLayer(
            num_classes=num_classes,
            flow_type=flow_type,
            flow_depth=flow_depth,
            flow_width=flow_width,
        )
        self.classifier = keras.Sequential(layers=[self.hidden_layer, self.output_layer])

    def call(self, inputs, **kwargs):
        return self.classifier(inputs, **kwargs)


def create_dataset(num_classes):
    x = np.asarray([[1.0, 2.0], [0.5, 1.5], [0.2, 0.15], [-0.3, 0.0]])
    y = np.asarray([[i % num_classes] for i in range(4)])
    return tf.convert_to_tensor(x), tf.convert_to_tensor(y)


@cases
def test_layer_construction(flow_type, flow_depth, flow_width, num_classes):
    output_layer = ed_layers.PosteriorNetworkLayer(
        num_classes=num_classes, flow_type=flow_type, flow_depth=flow_depth, flow_width=flow_width
    )
    assert output_layer is not None


@cases
def test_model_construction(flow_type, flow_depth, flow_width, num_classes):
    model = Classifier(
        num_classes=num_classes, flow_type=flow_type, flow_depth=flow_depth, flow_width=flow_width
    )
    assert model is not None


@cases
def test_train_step(flow_type, flow_depth, flow_width, num_classes):
    x, y = create_dataset(num_classes)
    model = Classifier(
        num_classes=num_classes, flow_type=flow_type, flow_depth=flow_depth, flow_width=flow_width
    )
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
