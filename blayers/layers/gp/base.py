"""The shared base of the exact and sparse GP layers: kernel weights, mean functions, the
covariance, dtype and Cholesky plumbing, and their Keras config.
"""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.layers.base import NamedOutput, SeededLayer

tfd = tfp.distributions
psd = tfp.math.psd_kernels
from blayers.layers.gp.kernels import (
    check_covariance_fn,
    deserialize_covariance_fn,
    float_softplus_inverse,
    jittered_cholesky,
    kernel_in_dtype,
    make_kernel,
    positive_number,
    serialize_covariance_fn,
)

__all__ = []

# 'identity': the fixed map x -> x @ eye(d, units), the inputs copied to the first units (Salimbeni
# & Deisenroth's inner-layer mean); no weights, so nothing trains it away from the identity.
MEAN_FUNCTIONS = ("zero", "constant", "linear", "identity")


# The `[n, m]` float64 covariance and its gradient are a chain of elementwise passes (scale,
# squared distances, exp, amplitude); compiled, XLA fuses them: at power-plant's deep-GP shape
# (20 replicas, 100 x 8,611 a layer) the kernel's forward and backward took 94 ms against 129,
# equal to 1e-15 relative, about a tenth of a DGP-2 step on a 2-core CPU.
@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _exponentiated_quadratic(a, b, amplitude, length_scale):
    a, b = a / length_scale, b / length_scale
    squared = (
        tf.reduce_sum(tf.square(a), -1)[..., :, None]
        + tf.reduce_sum(tf.square(b), -1)[..., None, :]
        - 2.0 * tf.matmul(a, b, transpose_b=True)
    )
    return tf.square(amplitude)[..., None, None] * tf.exp(-0.5 * tf.maximum(squared, 0.0))


def check_identity_mean(name, input_dim, units):
    """`mean_fn='identity'` copies the inputs: it needs at least as many units as features."""
    if input_dim > units:
        raise ValueError(
            f"{name}: mean_fn='identity' copies the inputs into the outputs, so it needs units >= "
            f"input features; got {input_dim} features and {units} units. Use mean_fn='linear' "
            "(a trained projection), or more units."
        )


class GaussianProcessBase(NamedOutput, SeededLayer):
    """Kernel and mean-function variables, shared by the GP layers."""

    def __init__(
        self,
        units,
        mean_fn="zero",
        covariance_fn="exponentiated_quadratic",
        amplitude=1.0,
        length_scale=1.0,
        jitter=1e-6,
        max_jitter_tries=4,
        cholesky_dtype=None,
        mean_projection=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        name = f"{type(self).__name__} ({self.name})"
        if not isinstance(units, (int, np.integer)) or isinstance(units, bool) or units <= 0:
            raise ValueError(f"{name} needs a positive integer `units`, got {units!r}.")
        covariance_fn = deserialize_covariance_fn(covariance_fn)
        check_covariance_fn(name, covariance_fn)
        if mean_fn not in MEAN_FUNCTIONS:
            raise ValueError(
                f"{name}: mean_fn must be one of {', '.join(map(repr, MEAN_FUNCTIONS))}, "
                f"got {mean_fn!r}."
            )
        self.units, self.mean_fn, self.covariance_fn = int(units), mean_fn, covariance_fn
        self.amplitude_init = positive_number(name, "amplitude", amplitude)
        self.length_scale_init = positive_number(name, "length_scale", length_scale)
        self.jitter = positive_number(name, "jitter", jitter)
        if not isinstance(max_jitter_tries, (int, np.integer)) or max_jitter_tries < 1:
            raise ValueError(f"{name}: max_jitter_tries must be >= 1, got {max_jitter_tries!r}.")
        self.max_jitter_tries = int(max_jitter_tries)
        self.input_dim = None
        self.cholesky_dtype = cholesky_dtype
        self.mean_projection = None
        if mean_projection is not None:
            if mean_fn != "identity":
                raise ValueError(
                    f"{name}: mean_projection is the fixed map of mean_fn='identity'; got "
                    f"mean_fn={mean_fn!r}."
                )
            self.mean_projection = np.asarray(mean_projection, np.float32)

    def _build_kernel_and_mean(self, input_dim):
        if input_dim is None:
            raise ValueError(
                f"{type(self).__name__} ({self.name}) needs a known number of input features."
            )
        self.input_dim = int(input_dim)
        lead = self.replica_shape(())  # a replicated layer's weights lead with its replicas
        # The jitter that worked last (`jittered_cholesky`'s sticky `level`), saved with the
        # layer so that a resumed run factorizes exactly as the uninterrupted one.
        self.jitter_level = self.add_weight(
            name="jitter_level",
            shape=(),
            dtype="int64",
            initializer="zeros",
            trainable=False,
            aggregation="only_first_replica",
        )
        constant = keras.initializers.Constant
        if not self.fixed_kernel:  # a kernel instance keeps its own hyperparameters
            self.raw_amplitude = self.add_weight(
                name="amplitude",
                shape=lead,
                initializer=constant(float_softplus_inverse(self.amplitude_init)),
            )
            self.raw_length_scale = self.add_weight(
                name="length_scale",
                shape=(*lead, input_dim),
                initializer=constant(float_softplus_inverse(self.length_scale_init)),
            )
        if self.mean_fn == "constant":
            self.mean_bias = self.add_weight(
                name="mean_bias", shape=(*lead, self.units), initializer="zeros"
            )
        elif self.mean_fn == "linear":
            eye = np.eye(input_dim, self.units, dtype="float32")
            self.mean_kernel = self.add_weight(
                name="mean_kernel",
                shape=(*lead, input_dim, self.units),
                initializer=constant(np.broadcast_to(eye, (*lead, *eye.shape))),
            )
            self.mean_bias = self.add_weight(
                name="mean_bias", shape=(*lead, self.units), initializer="zeros"
            )
        elif self.mean_fn == "identity" and self.mean_projection is not None:
            shapes = [(input_dim, self.units), (*lead, input_dim, self.units)]
            if self.mean_projection.shape not in shapes:
                raise ValueError(
                    f"{type(self).__name__} ({self.name}): mean_projection must be "
                    f"{' or '.join(str(list(s)) for s in set(shapes))}, got shape "
                    f"{list(self.mean_projection.shape)}."
                )
        elif self.mean_fn == "identity":
            check_identity_mean(f"{type(self).__name__} ({self.name})", input_dim, self.units)

    @property
    def fixed_kernel(self):
        """True when `covariance_fn` is a kernel instance: the layer then has no amplitude or
        length-scale weights (nothing would train them)."""
        return isinstance(self.covariance_fn, psd.PositiveSemidefiniteKernel)

    def kernel(self, dtype=None):
        """The layer's current TFP kernel (`make_kernel` of `covariance_fn` and the trainable
        amplitude and ARD length scales; a kernel instance as it is)."""
        if self.fixed_kernel:
            return kernel_in_dtype(self.covariance_fn, dtype or self.compute_dtype)
        dtype = dtype or self.compute_dtype
        amplitude = tf.cast(tf.nn.softplus(self.raw_amplitude), dtype)
        length_scale = tf.cast(tf.nn.softplus(self.raw_length_scale), dtype)
        return make_kernel(self.covariance_fn, amplitude, length_scale)

    def covariance(self, kernel, a, b=None):
        """`k(a, b)` (`[n, m]`), or with `b=None` the diagonal `k(a_i, a_i)` (`[n]`). In float64
        the default exponentiated quadratic takes GPflow's route, one matmul for the squared
        distances (`|a|^2 + |b|^2 - 2 a b^T`, clipped at 0), faster than TFP's broadcast
        differences; in float32 that cancellation would cost near-diagonal accuracy, so float32
        and other kernels go through TFP."""
        if self.covariance_fn != "exponentiated_quadratic" or a.dtype != tf.float64:
            return kernel.matrix(a, b) if b is not None else kernel.apply(a, a, example_ndims=1)
        # A replicated layer's `[R]` amplitudes and `[R, d]` length scales broadcast against
        # its `[R, n, d]` inputs; an ordinary layer's are a scalar and `[d]`.
        amplitude = tf.cast(tf.nn.softplus(self.raw_amplitude), a.dtype)
        if b is None:
            return tf.square(amplitude)[..., None] * tf.ones(tf.shape(a)[:-1], a.dtype)
        length_scale = tf.cast(tf.nn.softplus(self.raw_length_scale), a.dtype)[..., None, :]
        return _exponentiated_quadratic(a, b, amplitude, length_scale)

    def mean(self, x):
        """The prior mean `m(x)`, `[batch, units]` (a replicated layer's `[R, batch, units]`)."""
        if self.mean_fn == "zero":
            return tf.zeros(tf.concat([tf.shape(x)[:-1], [self.units]], 0), x.dtype)
        rank = x.shape.rank
        if self.mean_fn == "constant":
            return tf.zeros(tf.concat([tf.shape(x)[:-1], [self.units]], 0), x.dtype) + tf.cast(
                self.replica_broadcast(self.mean_bias, rank), x.dtype
            )
        if self.mean_fn == "identity" and self.mean_projection is not None:
            return tf.matmul(x, tf.constant(self.mean_projection, x.dtype))
        if self.mean_fn == "identity":
            return tf.matmul(x, tf.eye(self.input_dim, self.units, dtype=x.dtype))
        bias = self.replica_broadcast(self.mean_bias, rank)
        return tf.matmul(x, tf.cast(self.mean_kernel, x.dtype)) + tf.cast(bias, x.dtype)

    def _linalg_dtype(self):
        return tf.as_dtype(self.cholesky_dtype or self.compute_dtype)

    def _cholesky(self, matrix, what):
        return jittered_cholesky(
            matrix,
            self.jitter,
            self.max_jitter_tries,
            f"{what} of layer '{self.name}'",
            level=self.jitter_level,
        )

    def _inputs(self, inputs, argument="inputs"):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        expected = "[batch, features]" if self.replicas is None else "[replicas, batch, features]"
        rank = 2 if self.replicas is None else 3
        if x.shape.rank != rank or (rank == 3 and x.shape[0] not in (None, self.replicas)):
            raise ValueError(
                f"{type(self).__name__} ({self.name}) takes {argument} of shape "
                f"{expected}, got {x.shape}."
            )
        if self.input_dim is not None and x.shape[-1] not in (None, self.input_dim):
            raise ValueError(
                f"{type(self).__name__} ({self.name}) was built for {self.input_dim} input "
                f"features; {argument} have {x.shape[-1]} (shape {x.shape})."
            )
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "mean_fn": self.mean_fn,
            "covariance_fn": serialize_covariance_fn(self.covariance_fn),
            "amplitude": self.amplitude_init,
            "length_scale": self.length_scale_init,
            "jitter": self.jitter,
            "max_jitter_tries": self.max_jitter_tries,
            "cholesky_dtype": self.cholesky_dtype,
            **(
                {}
                if self.mean_projection is None
                else {"mean_projection": self.mean_projection.tolist()}
            ),
        }
