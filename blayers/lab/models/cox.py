"""The Cox process of the paper's Figure 8 (Tran et al., 2019, Sec. 2.5): a Gaussian-process
prior on a rate function, then a Poisson process, as a *model program*; sparse GP layers as a
separate *posterior program*; fitted by variational inference over the two programs.

Model program, on the unit window `W = [0, 1]^d` (`blayers.lab.data.point_pattern` rescales):

    f ~ GP layers (`GaussianProcess`, a deep GP prior with `hidden_units`)
    rate(x) = lam_0 softplus(f(x)) / log 2
    events ~ PoissonProcess(rate, W)

`lam_0` is the homogeneous fit `n / |W|` of the first pattern the model sees (fixed after, saved
with the model), so `f = 0` is the constant rate and the GP models the departure from it. The
process evaluates the rate once, jointly at the events and its quadrature nodes, so the latent
variable `f` is the function at `process.locations(events)`; its prior is the GP's joint density
there (with a relative `nugget` on the diagonal, part of the model, that keeps `log p(f)` well
conditioned).

Posterior program: `SparseGaussianProcess` layers with `full_covariance=True`, named as the
model's variables (`output_name`), evaluated at the same locations: `q(f)` is the sparse GP's
exact joint there, so `E_q[log p(events | f) + log p(f) - log q(f)]` is an ELBO of the model
(`blayers.programs.elbo`). Model hyperparameters (kernel amplitude, length scales, mean) and
variational parameters train together (variational EM).

The ELBO is of a whole pattern: train with `train.batch_size` at least the pattern's size (the
trainer then feeds every training point each step).
"""

import math

import gin
import keras
import numpy as np
import tensorflow as tf

from blayers import programs
from blayers.layers.gp import GaussianProcess, SparseGaussianProcess
from blayers.layers.point_process import PoissonProcess, quadrature_rule

__all__ = ["CoxProcess", "cox_process"]


class CoxProcess(programs.VariationalProgram):
    """GP-modulated Poisson process (model program) with a sparse-GP posterior program.

    Args:
      dimension: of the locations (the window is `[0, 1]^dimension`).
      hidden_units: widths of the deep GP prior's inner layers (`()`: one GP layer, the
        log-Gaussian-Cox-like shallow model).
      num_inducing: inducing points of each posterior layer (initialized uniformly in `W`).
      covariance_fn: kernel name of every layer.
      amplitude, length_scale: initial kernel hyperparameters (length in window units).
      nugget: relative diagonal of the prior's and the posterior's joint covariances.
      quadrature, num_quadrature_points: the integral's rule (`quadrature_rule`; points per
        dimension for the grid rules).
      num_samples: draws of `f ~ q` per ELBO estimate.
      **kwargs: `keras.Model` arguments.
    """

    def __init__(
        self,
        dimension,
        hidden_units=(),
        num_inducing=32,
        covariance_fn="exponentiated_quadratic",
        amplitude=1.0,
        length_scale=0.1,
        nugget=1e-3,
        quadrature="midpoint",
        num_quadrature_points=64,
        num_samples=1,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "float64")
        super().__init__(num_samples=num_samples, **kwargs)
        self._config = {
            "dimension": int(dimension),
            "hidden_units": tuple(int(u) for u in hidden_units),
            "num_inducing": num_inducing,
            "covariance_fn": covariance_fn,
            "amplitude": amplitude,
            "length_scale": length_scale,
            "nugget": nugget,
            "quadrature": quadrature,
            "num_quadrature_points": num_quadrature_points,
            "num_samples": num_samples,
        }
        self.dimension = int(dimension)
        self.window = [[0.0, 1.0]] * self.dimension
        self.quadrature_kind, self.num_quadrature_points = quadrature, int(num_quadrature_points)
        nodes, weights = quadrature_rule(self.window, quadrature, self.num_quadrature_points)
        self._nodes, self._weights = nodes, weights
        widths = [*map(int, hidden_units), 1]
        names = [f"f_{i}" for i in range(len(widths) - 1)] + ["f"]
        common = {
            "covariance_fn": covariance_fn,
            "amplitude": amplitude,
            "length_scale": length_scale,
            "jitter": nugget,
            "cholesky_dtype": "float64",
            "dtype": self.dtype_policy,
        }
        self.prior_layers = [
            GaussianProcess(
                units,
                mean_fn="constant" if last else "linear",
                output_name=name,
                name=f"prior_{name}",
                **common,
            )
            for units, name, last in zip(widths, names, [False] * (len(widths) - 1) + [True])
        ]
        self.posterior_layers = [
            SparseGaussianProcess(
                units,
                num_inducing=num_inducing,
                mean_fn="constant" if last else "linear",
                full_covariance=True,
                add_kl_loss=False,
                initial_variational_scale=1.0 if last else 1e-2,
                inducing_inputs_initializer=keras.initializers.RandomUniform(0.0, 1.0, seed=0),
                output_name=name,
                name=f"posterior_{name}",
                **common,
            )
            for units, name, last in zip(widths, names, [False] * (len(widths) - 1) + [True])
        ]
        # Built now: the trainer builds its optimizer on the variables before the first step.
        for layers in (self.prior_layers, self.posterior_layers):
            width = self.dimension
            for layer in layers:
                layer.build((None, width))
                width = layer.units
        self.rate_scale = self.add_weight(
            name="rate_scale", shape=(), initializer="zeros", trainable=False
        )

    # -- the two programs ------------------------------------------------------------------------
    @staticmethod
    def _apply(layers, locations):
        h = locations
        for layer in layers:
            h = layer(h)
        return h

    def _rate(self, layers):
        def rate(locations):
            f = tf.convert_to_tensor(self._apply(layers, locations))
            return tf.cast(self.rate_scale, f.dtype) * tf.nn.softplus(f) / math.log(2.0)

        return rate

    def process(self, rate=None):
        """The `PoissonProcess` of the model program (optionally with another rate)."""
        return PoissonProcess(
            rate or self._rate(self.prior_layers),
            bounds=self.window,
            quadrature=self.quadrature_kind,
            num_quadrature_points=self.num_quadrature_points,
            dtype=tf.float64,
            name="events",
        )

    def model_program(self, points):
        return self.process()

    def posterior_program(self, points):
        return self._apply(self.posterior_layers, self.locations(points))

    def observed(self, points):
        return {"events": tf.cast(points, tf.float64)}

    # -- helpers ---------------------------------------------------------------------------------
    def locations(self, points):
        """`concat(points, nodes)`, where the model's process evaluates its rate."""
        points = tf.cast(tf.reshape(points, [-1, self.dimension]), tf.float64)
        return tf.concat([points, tf.constant(self._nodes, tf.float64)], 0)

    def quadrature(self):
        """`(nodes [G, d], weights [G])` of the model's integral over the window."""
        return self._nodes, self._weights

    def call(self, inputs, training=False):
        n = tf.cast(tf.shape(inputs)[0], self.rate_scale.dtype)
        volume = float(np.prod([high - low for low, high in self.window]))
        # lam_0 = n / |W| of the first pattern seen (a no-op once set, and after a restore).
        self.rate_scale.assign(tf.where(self.rate_scale > 0, self.rate_scale, n / volume))
        return super().call(inputs, training=training)

    def posterior_rate(self, locations, num_samples):
        """`[num_samples, m]` joint posterior draws of the rate at `locations [m, d]` (NumPy)."""
        x = tf.cast(tf.convert_to_tensor(locations), tf.float64)
        scale = float(self.rate_scale.numpy()) / math.log(2.0)
        if len(self.posterior_layers) == 1:  # one joint q(f): all draws from one factorization
            f = self.posterior_layers[0](x).distribution.sample(num_samples)[..., 0]
        else:  # a deep posterior: each draw passes through every layer
            draws = [self._apply(self.posterior_layers, x) for _ in range(num_samples)]
            f = tf.stack([tf.convert_to_tensor(d)[:, 0] for d in draws])
        return (scale * tf.nn.softplus(f)).numpy()

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype_policy.name, **self._config}


@gin.configurable(module="blayers.lab.models")
def cox_process(input_shape, num_outputs, **kwargs):
    """A `CoxProcess` for points of shape `input_shape` (`[d]`); `kwargs` are its arguments
    (gin: `cox_process.num_inducing = 32`, ...)."""
    del num_outputs
    if len(input_shape) != 1:
        raise ValueError(f"cox_process takes points of shape [d], got input_shape {input_shape}.")
    return CoxProcess(int(input_shape[0]), **kwargs)
