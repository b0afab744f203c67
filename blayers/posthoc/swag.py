"""Stochastic Weight Averaging (SWA, Izmailov et al., 2018) and SWA-Gaussian (SWAG, Maddox et al.,
2019) for any Keras model.

Training continues from a trained solution with a constant (or cyclic) learning rate; the weights
`theta_1..theta_T` visited at the end of each epoch (or every `collect_every` steps) are summarised
by their first and second moments and the deviations of the last `K` of them,

    theta_SWA = 1/T sum_t theta_t,
    Sigma_diag = diag(1/T sum_t theta_t^2 - theta_SWA^2),
    D = [theta_i - theta_bar_i]_{i = T-K+1..T}   (theta_bar_i: the running mean at step i),

and the posterior is `N(theta_SWA, 1/2 (Sigma_diag + D D^T / (K - 1)))`. A draw is

    theta = theta_SWA + sqrt(scale) (Sigma_diag^{1/2} z_1 + D z_2 / sqrt(K - 1)),

with `z_1 ~ N(0, I_p)`, `z_2 ~ N(0, I_K)` and `scale = 1/2` as in the paper. The predictive is a
Monte Carlo average over draws; batch-normalization statistics are recomputed for each draw
(`bn_data`), since the running averages of the SWA iterates do not match a sampled network.
"""

import keras
import numpy as np

from blayers.posthoc.batches import input_batches

__all__ = ["SWAG", "update_batch_norm"]


class SWAG(keras.callbacks.Callback):
    """SWA and SWAG moments of a model's weights, as a Keras callback or a wrapper.

    As a callback: `model.fit(..., callbacks=[SWAG(start_epoch=10)])` collects from epoch 10 on.
    As a wrapper around a trained, compiled model: `SWAG(model).fit(x, y, epochs=20,
    learning_rate=0.01)` continues training at a constant learning rate and collects each epoch.
    Then `swag.sample()`, `swag.predict(x)`, or `swag.assign_swa()` for the SWA solution.

    Args:
      model: the model, for the wrapper (a callback is handed its model by `fit`).
      max_rank: `K`, how many recent deviations form the low-rank part (0: diagonal SWAG).
      start_epoch: the first epoch (0-based) whose end is collected.
      collect_every: collect every `collect_every` training steps instead of at epoch ends.
      scale: the covariance's multiplier in a draw (the paper's `1/2`).
      variance_floor: the smallest diagonal variance, for weights that did not move.
    """

    def __init__(
        self,
        model=None,
        max_rank=20,
        start_epoch=0,
        collect_every=None,
        scale=0.5,
        variance_floor=1e-30,
    ):
        super().__init__()
        if max_rank < 0 or max_rank == 1:
            raise ValueError(
                f"SWAG: max_rank={max_rank}; use 0 (diagonal) or at least 2 (the low-rank "
                "covariance divides by K - 1)."
            )
        if collect_every is not None and collect_every < 1:
            raise ValueError(f"SWAG: collect_every={collect_every} must be a positive step count.")
        self.max_rank, self.start_epoch, self.collect_every = max_rank, start_epoch, collect_every
        self.scale, self.variance_floor = float(scale), float(variance_floor)
        self.num_collected = 0
        self._epoch = 0
        if model is not None:
            self.set_model(model)

    # ----------------------------------------------------------------------------------------
    # Collection.

    def _variables(self):
        return self.model.trainable_variables

    def weights_vector(self):
        """The model's trainable weights now, flat, in the order of `mean` and `variance`."""
        return self._flat()

    def _flat(self):
        return np.concatenate(
            [
                np.asarray(keras.ops.convert_to_numpy(v), np.float64).reshape(-1)
                for v in self._variables()
            ]
        )

    def collect(self):
        """Adds the model's current weights to the moments."""
        theta = self._flat()
        n = self.num_collected
        if n == 0:
            self._mean, self._sq_mean = np.zeros_like(theta), np.zeros_like(theta)
            self._deviations = []
        elif theta.shape != self._mean.shape:
            raise ValueError(
                f"SWAG: the model has {theta.size} trainable weights now but had "
                f"{self._mean.size} at the first collection."
            )
        self._mean = (n * self._mean + theta) / (n + 1)
        self._sq_mean = (n * self._sq_mean + theta**2) / (n + 1)
        self.num_collected = n + 1
        if self.max_rank:
            self._deviations.append(theta - self._mean)
            del self._deviations[: -self.max_rank]

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.collect_every is None and epoch >= self.start_epoch:
            self.collect()

    def on_train_batch_end(self, batch, logs=None):
        if self.collect_every is not None and self._epoch >= self.start_epoch:
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            if step % self.collect_every == 0:
                self.collect()

    def fit(self, *args, learning_rate=None, callbacks=(), **kwargs):
        """Continues training the (compiled) model with this object collecting, at a constant
        `learning_rate` when given. Arguments are `keras.Model.fit`'s; returns its history."""
        if getattr(self.model, "optimizer", None) is None:
            raise ValueError(
                f"SWAG.fit: compile {self.model.name!r} first (its loss and optimizer are the "
                "ones SWA continues with)."
            )
        if learning_rate is not None:
            if not self.model.optimizer.built:
                self.model.optimizer.build(self.model.trainable_variables)
            self.model.optimizer.learning_rate = learning_rate
        return self.model.fit(*args, callbacks=[*callbacks, self], **kwargs)

    # ----------------------------------------------------------------------------------------
    # The posterior.

    def _check(self):
        if not self.num_collected:
            raise ValueError(
                "SWAG: nothing collected yet; train with this callback (past start_epoch) or "
                "call collect()."
            )

    @property
    def mean(self):
        """`theta_SWA`, flat."""
        self._check()
        return self._mean

    @property
    def variance(self):
        """The diagonal `1/T sum theta^2 - theta_SWA^2`, floored at `variance_floor`."""
        self._check()
        return np.maximum(self._sq_mean - self._mean**2, self.variance_floor)

    @property
    def deviations(self):
        """`D`, `[K, p]`: the last (up to `max_rank`) deviations from the running mean."""
        self._check()
        if not self.max_rank:
            return np.zeros((0, self._mean.size))
        return np.stack(self._deviations)

    def covariance(self):
        """The sampling covariance `scale (Sigma_diag + D D^T / (K - 1))` as a dense matrix
        (for small models and tests)."""
        cov = np.diag(self.variance)
        deviations = self.deviations
        if len(deviations) > 1:
            cov = cov + deviations.T @ deviations / (len(deviations) - 1)
        return self.scale * cov

    def sample_flat(self, rng):
        """One flat draw of the weights."""
        theta = self.mean + np.sqrt(self.scale * self.variance) * rng.normal(size=self.mean.size)
        deviations = self.deviations
        if len(deviations) > 1:
            z = rng.normal(size=len(deviations))
            theta = theta + np.sqrt(self.scale / (len(deviations) - 1)) * (z @ deviations)
        return theta

    def _assign(self, flat):
        start = 0
        for variable in self._variables():
            size = int(np.prod(variable.shape))
            variable.assign(
                flat[start : start + size].reshape(variable.shape).astype(variable.dtype)
            )
            start += size

    def assign_swa(self, bn_data=None):
        """Sets the model's weights to `theta_SWA` (and recomputes batch-norm statistics on
        `bn_data` when given)."""
        self._assign(self.mean)
        if bn_data is not None:
            update_batch_norm(self.model, bn_data)

    def sample(self, seed=None, bn_data=None):
        """Sets the model's weights to a draw from the posterior (batch-norm statistics
        recomputed on `bn_data` when given) and returns the flat draw."""
        theta = self.sample_flat(np.random.default_rng(seed))
        self._assign(theta)
        if bn_data is not None:
            update_batch_norm(self.model, bn_data)
        return theta

    def draws(self, num_samples, seed=0, bn_data=None):
        """Iterates `num_samples` times with the model's weights set to a fresh posterior draw
        (batch-norm statistics recomputed on `bn_data` when given); the weights are restored
        when the iteration ends or is abandoned."""
        saved = [np.array(keras.ops.convert_to_numpy(v)) for v in self.model.variables]
        rng = np.random.default_rng(seed)
        try:
            for i in range(num_samples):
                self._assign(self.sample_flat(rng))
                if bn_data is not None:
                    update_batch_norm(self.model, bn_data)
                yield i
        finally:
            for variable, value in zip(self.model.variables, saved):
                variable.assign(value)

    def predict(self, x, num_samples=30, seed=0, bn_data=None, batch_size=256):
        """`[num_samples, ...]` outputs of the model under posterior draws. The model's weights
        are restored afterwards."""
        return np.stack(
            [
                np.asarray(self.model.predict(x, batch_size=batch_size, verbose=0))
                for _ in self.draws(num_samples, seed, bn_data)
            ]
        )

    def get_config(self):
        return {
            "max_rank": self.max_rank,
            "start_epoch": self.start_epoch,
            "collect_every": self.collect_every,
            "scale": self.scale,
            "variance_floor": self.variance_floor,
        }

    def save(self, path):
        """Writes the moments to an `.npz` file."""
        self._check()
        np.savez(
            path,
            mean=self._mean,
            sq_mean=self._sq_mean,
            deviations=self.deviations,
            num_collected=self.num_collected,
            **{k: np.asarray(v if v is not None else -1) for k, v in self.get_config().items()},
        )

    @classmethod
    def load(cls, path, model=None):
        """The `SWAG` saved at `path`, over `model`."""
        with np.load(path) as saved:
            config = {
                k: saved[k].item()
                for k in ("max_rank", "start_epoch", "collect_every", "scale", "variance_floor")
            }
            if config["collect_every"] == -1:
                config["collect_every"] = None
            swag = cls(model, **config)
            swag._mean, swag._sq_mean = saved["mean"], saved["sq_mean"]
            swag._deviations = list(saved["deviations"])
            swag.num_collected = int(saved["num_collected"])
        return swag


def update_batch_norm(model, data, batch_size=256):
    """Recomputes every `BatchNormalization` layer's moving statistics as the plain average of
    batch statistics over `data` (arrays or a dataset of inputs or `(x, y)` batches), with the
    model's weights as they are. Does nothing for a model without batch normalization."""
    layers = [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]
    if not layers:
        return
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.moving_mean.assign(keras.ops.zeros_like(layer.moving_mean))
        layer.moving_variance.assign(keras.ops.ones_like(layer.moving_variance))
    try:
        for i, x in enumerate(input_batches(data, batch_size)):
            # momentum i / (i + 1) makes the exponential average a plain running mean.
            for layer in layers:
                layer.momentum = i / (i + 1)
            model(x, training=True)
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
