"""Posterior Network (Charpentier et al., NeurIPS 2020; edward2's `PosteriorNetworkLayer`): an
evidential classifier whose evidence is a density.

The layer normalizes its input latents `z` (batch normalization) and gives each class `c` a
normalizing flow with density `p(z | c)`; class `c`'s evidence is `N_c p(z | c)` (`N_c`: its
training examples), so the Dirichlet concentration is

    alpha_c(z) = 1 + N_c p(z | c),

large where the class has data and back to the flat prior `alpha = 1` far from every class: the
total evidence falls out of distribution by construction. It returns a `RandomVariable` over
`blayers.layers.evidential.DirichletPredictive` whose training objective is the paper's uncertainty-aware
cross-entropy `E_Dir[-log p_y] = psi(S) - psi(alpha_y)` minus `entropy_regularizer` times the
Dirichlet's entropy.

Flows (per class, `flow_depth` layers each, evaluated in the data-to-base direction where their
log-determinants are closed-form): `'radial'` (Rezende & Mohamed, 2015, the paper's choice;
`z <- z + beta h(r) (z - z0)`, `h = 1 / (alpha + r)`, `beta >= -alpha` keeps each map
invertible), `'affine'` (a per-dimension scale and shift) and `'maf'` (edward2's default: one
masked autoregressive flow (Papamakarios et al., 2017) per class, `u = (z - mu(z)) exp(-s(z))`
with `mu`, `s` from a `MADE` of `flow_depth` hidden layers of `flow_width` units, whose
log-determinant `-sum s(z)` is one pass).

`PosteriorNetworkLayer` is edward2's form: the same network, returning the concentrations as a
tensor.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from blayers.layers.base import NamedOutput, SeededLayer, register
from blayers.layers.evidential import make_dirichlet_rv
from blayers.layers.reversible import MADE

__all__ = ["PosteriorNetwork", "PosteriorNetworkLayer"]

_FLOWS = ("radial", "affine", "maf")


@register
class PosteriorNetwork(NamedOutput, SeededLayer):
    """The Posterior Network's output layer (module docstring): latents `[B, d]` -> a random
    variable over `DirichletPredictive` with `alpha_c = 1 + N_c p(z | c)`.

    Args:
      num_classes: classes `C`.
      flow_type: `'radial'` (default, the paper's), `'affine'` or `'maf'` (edward2's default).
      flow_depth: flow layers per class (the paper uses 6 radial layers; edward2's default 8);
        for `'maf'`, the hidden layers of its `MADE`.
      flow_width: the `MADE`'s hidden units (`'maf'`; default twice the latent size).
      class_counts: training examples per class `N_c` (default ones, as edward2's).
      entropy_regularizer: `lambda` of the Dirichlet's entropy in the loss (the paper's 1e-5).
      seed: seeds the returned variable's draw.
      output_name: the random variable's name (default: the layer's).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        num_classes,
        flow_type="radial",
        flow_depth=8,
        class_counts=None,
        entropy_regularizer=1e-5,
        flow_width=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        name = f"PosteriorNetwork ({self.name})"
        if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
            raise ValueError(f"{name}: num_classes must be an integer >= 2, got {num_classes!r}.")
        if flow_type not in _FLOWS:
            raise ValueError(f"{name}: flow_type must be one of {_FLOWS}, got {flow_type!r}.")
        if not isinstance(flow_depth, (int, np.integer)) or flow_depth < 1:
            raise ValueError(f"{name}: flow_depth must be a positive integer, got {flow_depth!r}.")
        counts = [1.0] * int(num_classes) if class_counts is None else list(class_counts)
        if len(counts) != num_classes or min(counts) < 0:
            raise ValueError(
                f"{name}: class_counts must hold {num_classes} non-negative counts, got "
                f"{class_counts!r}."
            )
        self.num_classes, self.flow_type, self.flow_depth = (
            int(num_classes),
            flow_type,
            int(flow_depth),
        )
        self.class_counts = [float(c) for c in counts]
        self.flow_width = None if flow_width is None else int(flow_width)
        self.entropy_regularizer = float(entropy_regularizer)
        # The paper's (PyTorch's default) normalization of the latents.
        self.batch_norm = keras.layers.BatchNormalization(
            epsilon=1e-5, momentum=0.9, name="batch_norm", dtype=self.dtype_policy
        )

    def build(self, input_shape):
        d = input_shape[-1]
        if d is None:
            raise ValueError(f"PosteriorNetwork ({self.name}) needs a known latent size.")
        self.latent_dim = int(d)
        self.batch_norm.build(input_shape)
        shape = (self.flow_depth, self.num_classes)
        normal = keras.initializers.RandomNormal(stddev=1.0 / math.sqrt(d))
        if self.flow_type == "radial":
            self.centers = self.add_weight(name="centers", shape=(*shape, d), initializer=normal)
            self.raw_alpha = self.add_weight(name="raw_alpha", shape=shape, initializer=normal)
            self.raw_beta = self.add_weight(name="raw_beta", shape=shape, initializer=normal)
        elif self.flow_type == "maf":
            width = self.flow_width or 2 * self.latent_dim
            self.mafs = [
                MADE([width] * self.flow_depth, params=2, name=f"maf_{c}", dtype=self.dtype_policy)
                for c in range(self.num_classes)
            ]
            for made in self.mafs:
                made.build((None, self.latent_dim))
        else:
            self.log_scale = self.add_weight(
                name="log_scale", shape=(*shape, d), initializer="zeros"
            )
            self.shift = self.add_weight(name="shift", shape=(*shape, d), initializer="zeros")

    def class_log_density(self, latents):
        """`log p(z | c)` `[B, C]` of (normalized) latents `[B, d]` under each class's flow."""
        d = float(self.latent_dim)
        if self.flow_type == "maf":
            densities = []
            for made in self.mafs:
                shift, log_scale = tf.unstack(made(latents), axis=-1)  # [B, d] each
                u = (latents - shift) * tf.exp(-log_scale)
                base = -0.5 * tf.reduce_sum(tf.square(u), -1) - 0.5 * d * math.log(2 * math.pi)
                densities.append(base - tf.reduce_sum(log_scale, axis=-1))
            return tf.stack(densities, axis=-1)
        z = tf.tile(latents[:, None, :], [1, self.num_classes, 1])  # [B, C, d]
        log_det = tf.zeros(tf.shape(z)[:2], z.dtype)
        for layer in range(self.flow_depth):
            if self.flow_type == "radial":
                alpha = tf.nn.softplus(tf.cast(self.raw_alpha[layer], z.dtype))  # [C]
                beta = -alpha + tf.nn.softplus(tf.cast(self.raw_beta[layer], z.dtype))
                diff = z - tf.cast(self.centers[layer], z.dtype)
                r = tf.norm(diff, axis=-1)  # [B, C]
                h = 1.0 / (alpha + r)
                beta_h = beta * h
                log_det += (d - 1.0) * tf.math.log1p(beta_h) + tf.math.log1p(
                    beta_h - beta * h * h * r
                )
                z = z + beta_h[..., None] * diff
            else:
                log_scale = tf.cast(self.log_scale[layer], z.dtype)
                z = z * tf.exp(log_scale) + tf.cast(self.shift[layer], z.dtype)
                log_det += tf.reduce_sum(log_scale, axis=-1)
        base = -0.5 * tf.reduce_sum(tf.square(z), axis=-1) - 0.5 * d * math.log(2 * math.pi)
        return base + log_det

    def concentration(self, inputs, training=None):
        """`alpha = 1 + N_c p(z | c)`, `[B, C]`."""
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        latents = self.batch_norm(x, training=training)
        log_density = self.class_log_density(latents)
        counts = tf.constant(self.class_counts, log_density.dtype)
        # 1 + N_c p(z | c), without overflow where a density is huge.
        return 1.0 + tf.exp(tf.minimum(tf.math.log(counts) + log_density, 80.0))

    def call(self, inputs, training=None):
        concentration = self.concentration(inputs, training)
        return make_dirichlet_rv(
            concentration,
            loss="digamma",
            kl_weight=0.0,
            entropy_regularizer=self.entropy_regularizer,
            seed=self.next_seed(),
            name=self.output_name,
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1])

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "flow_type": self.flow_type,
            "flow_depth": self.flow_depth,
            "class_counts": self.class_counts,
            "entropy_regularizer": self.entropy_regularizer,
            "flow_width": self.flow_width,
        }


@register
class PosteriorNetworkLayer(PosteriorNetwork):
    """edward2's `PosteriorNetworkLayer`: `PosteriorNetwork`'s network, returning the
    concentrations `alpha` `[B, C]` as a tensor (or, `return_probs=True`, the expected
    probabilities `alpha / sum(alpha)`), with edward2's default `'maf'` flows. Train it on the
    paper's loss through `PosteriorNetwork`, or on the user's loss of these tensors.

    Args:
      num_classes: classes `C`.
      flow_type: `'maf'` (default), `'radial'` or `'affine'`.
      flow_depth: flow layers per class (`'maf'`: its `MADE`'s hidden layers).
      flow_width: the `MADE`'s hidden units (default twice the latent size).
      class_counts: training examples per class (default ones).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        num_classes,
        flow_type="maf",
        flow_depth=8,
        flow_width=None,
        class_counts=None,
        **kwargs,
    ):
        super().__init__(
            num_classes,
            flow_type=flow_type,
            flow_depth=flow_depth,
            class_counts=class_counts,
            flow_width=flow_width,
            **kwargs,
        )

    def call(self, inputs, training=None, return_probs=False):
        alpha = self.concentration(inputs, training)
        if return_probs:
            return alpha / tf.reduce_sum(alpha, axis=-1, keepdims=True)
        return alpha

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_classes,)
