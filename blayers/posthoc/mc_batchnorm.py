"""Monte Carlo Batch Normalization (Teye et al., ICML 2018) for a trained Keras model.

A network trained with batch normalization is an approximate Bayesian model: the batch
statistics a training example is normalized with are random (they depend on the other examples
of its mini-batch), so at prediction time each Monte Carlo draw normalizes with the statistics of
a random training mini-batch of the training batch size, and the predictive is the mixture over
draws. Each draw here sets every `BatchNormalization` layer's moving mean and variance to one
training mini-batch's statistics (a forward pass in training mode with the layers' momentum at
0, so each layer sees the batch as the network normalizes it), predicts in inference mode, and
puts the trained statistics back at the end.
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf

__all__ = ["MCBatchNorm", "batch_norm_layers"]


def batch_norm_layers(model):
    """The model's `keras.layers.BatchNormalization` layers (nested ones included)."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


class MCBatchNorm:
    """MC-BatchNorm draws of a trained model.

    Args:
      model: a Keras model with `BatchNormalization` layers.
      train_inputs: the training inputs (an array, or a structure of arrays) the mini-batches
        are drawn from.
      batch_size: the mini-batch size (the training batch size, as the paper).
      seed: seeds the mini-batches.
    """

    def __init__(self, model, train_inputs, batch_size=128, seed=0):
        self.model, self.layers = model, batch_norm_layers(model)
        if not self.layers:
            raise ValueError(
                f"MCBatchNorm: {model.name} has no BatchNormalization layer: there are no batch "
                "statistics to sample (MC dropout or an ensemble suits a network without)."
            )
        self.inputs = train_inputs
        self.num_train = len(tf.nest.flatten(train_inputs)[0])
        if not 1 < batch_size <= self.num_train:
            raise ValueError(
                f"MCBatchNorm: batch_size must be in [2, {self.num_train}] (the training "
                f"examples), got {batch_size}."
            )
        self.batch_size, self.seed = int(batch_size), seed

    @contextlib.contextmanager
    def kept(self):
        """Restores the trained statistics on exit."""
        saved = [
            (layer.moving_mean.numpy(), layer.moving_variance.numpy()) for layer in self.layers
        ]
        try:
            yield
        finally:
            for layer, (mean, variance) in zip(self.layers, saved):
                layer.moving_mean.assign(mean)
                layer.moving_variance.assign(variance)

    def set_batch_statistics(self, rows):
        """Every normalization layer's statistics := those of the training rows `rows` (until
        `kept()` ends, or for good outside it)."""
        batch = tf.nest.map_structure(lambda a: tf.gather(a, rows), self.inputs)
        momenta = [layer.momentum for layer in self.layers]
        try:
            for layer in self.layers:
                layer.momentum = 0.0
            self.model(batch, training=True)
        finally:
            for layer, momentum in zip(self.layers, momenta):
                layer.momentum = momentum

    def batch_rows(self, num_samples):
        """The training rows of each draw's mini-batch (seeded by `seed`; distinct rows within
        a batch)."""
        rng = np.random.default_rng(self.seed)
        return [
            rng.choice(self.num_train, self.batch_size, replace=False) for _ in range(num_samples)
        ]

    def draws(self, num_samples):
        """A generator of `num_samples` draws: within each, the model normalizes with one
        random training mini-batch's statistics; the trained statistics come back after the
        last (or when the generator is closed)."""
        with self.kept():
            for rows in self.batch_rows(num_samples):
                self.set_batch_statistics(rows)
                yield

    def predict(self, x, num_samples=10, batch_size=512):
        """`[num_samples, n, ...]` outputs of the model in inference mode, one draw each (a
        random-variable output gives its mean)."""
        outputs = []
        for _ in self.draws(num_samples):
            parts = []
            for start in range(0, len(x), batch_size):
                out = self.model(x[start : start + batch_size], training=False)
                out = out.distribution.mean() if hasattr(out, "distribution") else out
                parts.append(keras.ops.convert_to_numpy(out))
            outputs.append(np.concatenate(parts))
        return np.stack(outputs)
