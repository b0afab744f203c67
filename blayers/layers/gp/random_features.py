"""`RandomFourierFeatures`: the random-feature GP approximation with a Bayesian output layer
(Rahimi & Recht, 2007; Cutajar et al., 2017).
"""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.layers.base import NestedLayers, SeededLayer, register
from blayers.layers.dense import DenseReparameterization

tfd = tfp.distributions
psd = tfp.math.psd_kernels
from blayers.layers.gp.kernels import (
    SPECTRAL_DEGREES_OF_FREEDOM,
    float_softplus_inverse,
    positive_number,
)

__all__ = ["RandomFourierFeatures"]


@register
class RandomFourierFeatures(NestedLayers, SeededLayer):
    """Random-feature GP approximation (Rahimi & Recht, 2007; Cutajar et al., 2017).

    `phi(x) = amplitude * sqrt(2 / D) cos(x / length_scale @ Omega + b)` with fixed frequencies
    `Omega` `[d, D]` drawn from the kernel's spectral density (Bochner's theorem) and
    `b ~ U(0, 2 pi)`, so `phi(x)^T phi(y)` approximates the stationary kernel `k(x - y)` with
    error O(1 / sqrt(D)); `f(x) = phi(x)^T w` with a Bayesian output layer (`output_layer`,
    default `DenseReparameterization` without bias) whose KL regularizes `w` toward `N(0, I)`,
    making `f` approximately `GP(0, k)` a priori.

    Args:
      units: output functions.
      num_features: random features D.
      covariance_fn: `'exponentiated_quadratic'` (`Omega ~ N(0, I)`), `'matern12'`,
        `'matern32'`, `'matern52'` (Matern-nu: multivariate Student-t with `2 nu` degrees of
        freedom), or a callable `fn(rng, shape) -> frequencies` sampling the spectral density
        of another stationary kernel with unit length scale (`rng`: a NumPy `RandomState`).
      amplitude: the kernel's amplitude (fixed).
      length_scale: initial ARD length scale (trainable unless `trainable_length_scale=False`).
      output_layer: the Bayesian linear layer on the features.
      seed: seeds the frequencies and phases.
    """

    nested_layer_args = ("output_layer",)

    def __init__(
        self,
        units,
        num_features=1024,
        covariance_fn="exponentiated_quadratic",
        amplitude=1.0,
        length_scale=1.0,
        trainable_length_scale=True,
        output_layer=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"RandomFourierFeatures ({self.name})"
        for argument, value in (("units", units), ("num_features", num_features)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: {argument} must be a positive integer, got {value!r}.")
        if isinstance(covariance_fn, dict):
            covariance_fn = keras.saving.deserialize_keras_object(covariance_fn)
        if not (callable(covariance_fn) or covariance_fn in SPECTRAL_DEGREES_OF_FREEDOM):
            raise ValueError(
                f"{name}: covariance_fn must be one of {sorted(SPECTRAL_DEGREES_OF_FREEDOM)} or a "
                f"callable sampling a spectral density, got {covariance_fn!r}."
            )
        self.covariance_fn = covariance_fn
        self.units, self.num_features = int(units), int(num_features)
        self.amplitude_init = positive_number(name, "amplitude", amplitude)
        self.length_scale_init = positive_number(name, "length_scale", length_scale)
        self.trainable_length_scale = trainable_length_scale
        self.output_layer = output_layer or DenseReparameterization(
            units, use_bias=False, kernel_initializer="trainable_normal"
        )

    def build(self, input_shape):
        d = input_shape[-1]
        rng = np.random.RandomState(
            self.seed if self.seed is not None else np.random.randint(2**31 - 1)
        )
        constant = keras.initializers.Constant
        self.projection = self.add_weight(
            name="projection",
            shape=(d, self.num_features),
            trainable=False,
            initializer=constant(self._frequencies(rng, (d, self.num_features))),
        )
        self.phase = self.add_weight(
            name="phase",
            shape=(self.num_features,),
            trainable=False,
            initializer=constant(rng.uniform(0, 2 * np.pi, self.num_features).astype("float32")),
        )
        self.raw_length_scale = self.add_weight(
            name="length_scale",
            shape=(d,),
            trainable=self.trainable_length_scale,
            initializer=constant(float_softplus_inverse(self.length_scale_init)),
        )
        if not self.output_layer.built:
            self.output_layer.build((None, self.num_features))

    def _frequencies(self, rng, shape):
        """Draws `Omega` from the spectral density of the unit-length-scale kernel."""
        if callable(self.covariance_fn):
            return np.asarray(self.covariance_fn(rng, shape), "float32").reshape(shape)
        normal = rng.randn(*shape)
        dof = SPECTRAL_DEGREES_OF_FREEDOM[self.covariance_fn]
        if dof is None:
            return normal.astype("float32")
        # Multivariate Student-t: one chi-square draw per feature (column) scales its vector.
        chi2 = rng.chisquare(dof, size=(1, shape[1]))
        return (normal * np.sqrt(dof / chi2)).astype("float32")

    def feature_map(self, inputs):
        """`phi(x)`, `[batch, num_features]`."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype) / tf.nn.softplus(self.raw_length_scale)
        scale = self.amplitude_init * math.sqrt(2.0 / self.num_features)
        return scale * tf.cos(tf.matmul(x, self.projection) + self.phase)

    def call(self, inputs):
        return self.output_layer(self.feature_map(inputs))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "num_features": self.num_features,
            "covariance_fn": (
                self.covariance_fn
                if isinstance(self.covariance_fn, str)
                else keras.saving.serialize_keras_object(self.covariance_fn)
            ),
            "amplitude": self.amplitude_init,
            "length_scale": self.length_scale_init,
            "trainable_length_scale": self.trainable_length_scale,
            **self._nested_config(),
        }
