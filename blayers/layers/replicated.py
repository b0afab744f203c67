"""Many small GPs as one: the sparse GP and its noise with a leading replica axis.

The dense layers, MC dropout and the Gaussian likelihood take `replicas=R` themselves
(`blayers.replicas`); the sparse GP's replicated form still lives here, as its own class.

Replica `r`'s inducing inputs, kernel and `q(u)` are its own, and its draws (an inner layer's
sample) come from a stateless seed `(seeds[r], t)` at the layer's `t`-th call, so a replica
trained in a group follows the trajectory it follows alone.
"""

import keras
import numpy as np
import tensorflow as tf

from blayers import constraints as constraints_lib
from blayers.layers.base import register
from blayers.layers.gp import base as gp_base
from blayers.layers.gp.sparse import explained_variances

__all__ = [
    "ReplicatedNoise",
    "ReplicatedSparseGaussianProcess",
    "replica_seeds",
]


def replica_seeds(seeds, salt=0):
    """A layer's per-replica seeds from each replica's own seed and the layer's `salt` (its
    index in the network): replica `r`'s seed depends on `seeds[r]` alone, so it is the same
    whichever replicas share the model, and no two layers of a replica share a noise stream."""
    return [
        int(np.random.SeedSequence([int(s), int(salt)]).generate_state(1)[0] >> 1) for s in seeds
    ]


def _per_replica(name, values, replicas, layer_name):
    if values is None:
        return None
    values = np.asarray(values, np.float64)
    if values.ndim > 1 or values.size not in (1, replicas):
        raise ValueError(
            f"{layer_name}: {name} needs one value or {replicas} (one per replica), got "
            f"{values.tolist()}."
        )
    return [float(v) for v in np.broadcast_to(values, (replicas,))]


def _check_seeds(seeds, layer_name):
    if (
        not isinstance(seeds, (list, tuple))
        or not seeds
        or not all(isinstance(s, (int, np.integer)) for s in seeds)
    ):
        raise ValueError(
            f"{layer_name}: seeds must be a non-empty list of ints (one per replica; see "
            f"blayers.layers.replicated.replica_seeds), got {seeds!r}."
        )
    return [int(s) for s in seeds]


def _check_input(layer_name, input_shape, replicas, rank=3):
    if len(input_shape) != rank or (input_shape[0] is not None and input_shape[0] != replicas):
        raise ValueError(
            f"{layer_name}: inputs must be [replicas={replicas}, batch, features]; got shape "
            f"{tuple(input_shape)}."
        )


def _next_call(counter):
    """The layer's call index `t` (then counts the call): the second half of its draws' seeds."""
    t = tf.cast(counter.value, tf.int32)
    counter.assign_add(1)
    return t


def _stateless(sampler, shape, seeds, t, dtype):
    """`[R, *shape]`: replica `r`'s slice drawn by `sampler` from the stateless seed
    `(seeds[r], t)`, so it is the same whichever replicas share the call."""
    return tf.stack([sampler(shape, seed=tf.stack([seed, t]), dtype=dtype) for seed in seeds])


def _call_counter(layer):
    # Named like Keras' seed generators' state: checkpointed with them, kept out of evaluation.
    return layer.add_weight(
        name="seed_generator_state", shape=(), dtype="int32", initializer="zeros", trainable=False
    )


@register
class ReplicatedNoise(keras.layers.Layer):
    """A homoscedastic Gaussian likelihood per replica: appends each replica's log noise
    variance to its means, `[R, B, d] -> [R, B, 2d]` (means, then `log sigma_r^2`), so that
    `y[r] ~ N(means[r], sigma_r^2)`. Fixed (MC dropout's `1 / tau`) or learned, with
    `sigma_r^2 = softplus(raw_r)` as `blayers.layers.GaussianLikelihood` parameterizes it.

    With `function_variance=True` the inputs are a GP's marginal means and variances
    `[R, B, 2d]` (`ReplicatedSparseGaussianProcess(sample=False)`) and the outputs are
    `[R, B, 3d]`: means, `log sigma_r^2`, then the function's variances `s^2`, from which the
    learner takes the variational expectation `E_q[log N(y; f, sigma^2)] = log N(y; mu,
    sigma^2) - s^2 / (2 sigma^2)` and the predictive `N(mu, sigma^2 + s^2)`.

    Args:
      variances: one variance, or one per replica (in the targets' units).
      replicas: the number of replicas `R`.
      trainable: learn the variances (else they stay fixed).
      function_variance: the inputs carry the function's variances (see above).
    """

    def __init__(self, variances, replicas, trainable=False, function_variance=False, **kwargs):
        super().__init__(trainable=trainable, **kwargs)
        self.function_variance = bool(function_variance)
        self.replicas = int(replicas)
        self.variances = _per_replica("variances", variances, self.replicas, self.name)
        if min(self.variances) <= 0:
            raise ValueError(f"{self.name}: variances must be positive, got {self.variances}.")

    def build(self, input_shape):
        _check_input(self.name, input_shape, self.replicas)
        self.raw_noise_variance = self.add_weight(
            name="noise_variance",
            shape=(self.replicas,),
            initializer=keras.initializers.Constant(
                [float(constraints_lib.softplus_inverse(v)) for v in self.variances]
            ),
            trainable=self.trainable,
        )

    @property
    def noise_variance(self):
        """`[R]`: each replica's noise variance."""
        return tf.nn.softplus(self.raw_noise_variance)

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        _check_input(self.name, inputs.shape, self.replicas)
        log_variance = tf.math.log(tf.cast(self.noise_variance, inputs.dtype))[:, None, None]
        if not self.function_variance:
            return tf.concat([inputs, tf.broadcast_to(log_variance, tf.shape(inputs))], -1)
        means, variances = tf.split(inputs, 2, axis=-1)
        return tf.concat([means, tf.broadcast_to(log_variance, tf.shape(means)), variances], -1)

    def compute_output_shape(self, input_shape):
        if self.function_variance:
            return (*input_shape[:-1], 3 * input_shape[-1] // 2)
        return (*input_shape[:-1], 2 * input_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "variances": self.variances,
            "replicas": self.replicas,
            "function_variance": self.function_variance,
        }


@register
class ReplicatedSparseGaussianProcess(keras.layers.Layer):
    """`R` independent sparse variational GP layers (`blayers.layers.SparseGaussianProcess`,
        whitened, full Cholesky `q`, ARD exponentiated quadratic kernel), for SVGP and the deep GPs
        of Salimbeni & Deisenroth (2017), replica by replica.

        Replica `r` has inducing inputs `Z_r [M, d]`, kernel amplitude and length scales, and per
        output unit `q(v) = N(m, L L^T)` over whitened inducing outputs. With `A = L_Z^{-1} K_Zx`
        its marginals are `mu(x) = m(x) + A^T m` and `sigma^2(x) = k(x, x) - ||A_x||^2 +
        ||L^T A_x||^2` (the Cholesky factorization, batched over replicas, in float64; the products
    with `q` in the layer's dtype); the layer adds
        `sum_r kl_weight[r] * KL[q_r(v) || N(0, I)]` to its losses.

        With `sample=True` (a deep GP's inner layers) it returns one reparameterized draw of the
        marginals per row, `mu + sigma * eps` with `eps` from the stateless seed `(seeds[r], t)`
        (Salimbeni & Deisenroth's doubly stochastic estimator); otherwise `[R, B, 2 units]`, the
        marginal means then variances, for a likelihood to integrate in closed form
        (`ReplicatedNoise(function_variance=True)`).

        Args:
          units: output functions of every replica.
          inducing_inputs: `[R, M, d]` initial inducing inputs (k-means centres of each replica's
            inputs, as Salimbeni & Deisenroth start them).
          seeds: one int per replica (its length is the number of replicas `R`).
          mean_fn: `'zero'`, `'linear'` (inner layers: `x @ W + b`, `W` starting at the
            identity `eye(d, units)`, trainable, as `SparseGaussianProcess`'s) or `'identity'`
            (fixed `x @ P`, `P = eye(d, units)`: Salimbeni & Deisenroth's inner-layer mean).
          mean_projection: with `mean_fn='identity'`, a fixed `[R, d, units]` `P` instead of the
            identity; needed when `d > units` (Salimbeni & Deisenroth project wider inputs onto
            their top principal directions, `replicated_deep_gp`'s choice).
          amplitude, length_scale: initial kernel amplitude and length scales.
          initial_variational_scale: initial diagonal of every `L` (small for inner layers).
          kl_weight: one float or `R` (`1 / N_r`: the ELBO per example); None adds no KL.
          sample: return a draw (inner layers) instead of the marginals' moments.
          jitter: added to the diagonal of `K_ZZ` before its Cholesky factorization.
    """

    independent_rows = True  # each row's draw has its own noise

    def __init__(
        self,
        units,
        inducing_inputs,
        seeds,
        mean_fn="zero",
        amplitude=1.0,
        length_scale=1.0,
        initial_variational_scale=1.0,
        kl_weight=None,
        sample=False,
        jitter=1e-6,
        mean_projection=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = int(units)
        self.seeds = _check_seeds(seeds, self.name)
        self.replicas = len(self.seeds)
        self.inducing_inputs_init = np.asarray(inducing_inputs, np.float32)
        if self.inducing_inputs_init.ndim != 3 or len(self.inducing_inputs_init) != self.replicas:
            raise ValueError(
                f"{self.name}: inducing_inputs must be [replicas={self.replicas}, M, features], "
                f"got shape {self.inducing_inputs_init.shape}."
            )
        if mean_fn not in ("zero", "linear", "identity"):
            raise ValueError(
                f"{self.name}: mean_fn must be 'zero', 'linear' or 'identity', got {mean_fn!r}."
            )
        self.mean_projection = None
        if mean_projection is not None:
            if mean_fn != "identity":
                raise ValueError(
                    f"{self.name}: mean_projection is the fixed map of mean_fn='identity'; "
                    f"got mean_fn={mean_fn!r}."
                )
            self.mean_projection = np.asarray(mean_projection, np.float32)
            shape = (self.replicas, self.inducing_inputs_init.shape[-1], int(units))
            if self.mean_projection.shape != shape:
                raise ValueError(
                    f"{self.name}: mean_projection must be [replicas, features, units] = "
                    f"{list(shape)}, got shape {list(self.mean_projection.shape)}."
                )
        for name, value in (
            ("amplitude", amplitude),
            ("length_scale", length_scale),
            ("initial_variational_scale", initial_variational_scale),
            ("jitter", jitter),
        ):
            if not value > 0:
                raise ValueError(f"{self.name}: {name} must be positive, got {value!r}.")
        self.mean_fn, self.sample, self.jitter = mean_fn, bool(sample), float(jitter)
        self.amplitude, self.length_scale = float(amplitude), float(length_scale)
        self.initial_variational_scale = float(initial_variational_scale)
        self.kl_weight = _per_replica("kl_weight", kl_weight, self.replicas, self.name)
        self._noise_seeds = replica_seeds(self.seeds, 1)

    @property
    def num_inducing(self):
        return self.inducing_inputs_init.shape[1]

    def build(self, input_shape):
        _check_input(self.name, input_shape, self.replicas)
        r, m, d = self.inducing_inputs_init.shape
        if input_shape[-1] != d:
            raise ValueError(
                f"{self.name}: inputs have {input_shape[-1]} features, the inducing inputs {d}."
            )
        constant = keras.initializers.Constant
        self.inducing_inputs = self.add_weight(
            name="inducing_inputs", shape=(r, m, d), initializer=constant(self.inducing_inputs_init)
        )
        softplus_inverse = constraints_lib.softplus_inverse
        self.raw_amplitude = self.add_weight(
            name="amplitude",
            shape=(r,),
            initializer=constant(float(softplus_inverse(self.amplitude))),
        )
        self.raw_length_scale = self.add_weight(
            name="length_scale",
            shape=(r, d),
            initializer=constant(float(softplus_inverse(self.length_scale))),
        )
        if self.mean_fn == "linear":
            eye = np.broadcast_to(np.eye(d, self.units, dtype="float32"), (r, d, self.units))
            self.mean_kernel = self.add_weight(
                name="mean_kernel", shape=(r, d, self.units), initializer=constant(eye)
            )
            self.mean_bias = self.add_weight(
                name="mean_bias", shape=(r, self.units), initializer="zeros"
            )
        elif self.mean_fn == "identity" and self.mean_projection is None:
            gp_base.check_identity_mean(self.name, d, self.units)
        self.variational_mean = self.add_weight(
            name="variational_mean", shape=(r, self.units, m), initializer="zeros"
        )
        init = np.zeros((r, self.units, m, m), "float32")
        init[..., np.arange(m), np.arange(m)] = float(
            softplus_inverse(self.initial_variational_scale)
        )
        self.variational_scale = self.add_weight(
            name="variational_scale", shape=init.shape, initializer=constant(init)
        )
        self.counter = _call_counter(self)

    def _masks(self, dtype):
        """`(strictly lower, identity)` `[M, M]` masks: `L` from the raw scale by elementwise
        ops alone (the diagonal ops' gradients cost more than the GP's products)."""
        eye = tf.eye(self.num_inducing, dtype=dtype)
        return tf.linalg.band_part(tf.ones_like(eye), -1, 0) - eye, eye

    def variational_scale_tril(self, dtype=None):
        """`[R, units, M, M]`: each `L`, lower-triangular with a softplus-positive diagonal, in
        `dtype` (default the layer's)."""
        raw = tf.cast(self.variational_scale, dtype or self.compute_dtype)
        strictly_lower, eye = self._masks(raw.dtype)
        return raw * strictly_lower + self._diagonal(raw, eye)[..., None] * eye

    @staticmethod
    def _diagonal(raw, eye, dtype=None):
        """`[R, units, M]`: `L`'s softplus-positive diagonal from the raw scale, in `dtype`."""
        return tf.nn.softplus(tf.cast(tf.reduce_sum(raw * eye, -1), dtype or raw.dtype))

    def kl_divergence(self):
        """`[R]`: `sum_units KL[N(m, L L^T) || N(0, I)] = 1/2 (||L||_F^2 + ||m||^2 - M units)
        - sum log diag L` per replica (the diagonal's terms in float64)."""
        raw = tf.convert_to_tensor(self.variational_scale)
        strictly_lower, eye = self._masks(raw.dtype)
        off_diagonal = tf.reduce_sum(tf.square(raw * strictly_lower), [1, 2, 3])
        diagonal = self._diagonal(raw, eye, tf.float64)
        mean = tf.cast(self.variational_mean, tf.float64)
        m = float(self.num_inducing * self.units)
        squares = (
            tf.cast(off_diagonal, tf.float64)
            + tf.reduce_sum(tf.square(diagonal), [1, 2])
            + tf.reduce_sum(tf.square(mean), [1, 2])
        )
        return 0.5 * (squares - m) - tf.reduce_sum(tf.math.log(diagonal), [1, 2])

    def _covariance(self, a, b):
        """`[R, n, m]`: each replica's `k(a, b)`, squared distances by one matmul in float64."""
        amplitude = tf.nn.softplus(tf.cast(self.raw_amplitude, tf.float64))[:, None, None]
        length_scale = tf.nn.softplus(tf.cast(self.raw_length_scale, tf.float64))[:, None, :]
        a, b = a / length_scale, b / length_scale
        squared = (
            tf.reduce_sum(tf.square(a), -1)[:, :, None]
            + tf.reduce_sum(tf.square(b), -1)[:, None, :]
            - 2.0 * tf.matmul(a, b, transpose_b=True)
        )
        return tf.square(amplitude) * tf.exp(-0.5 * tf.maximum(squared, 0.0))

    def predict_marginals(self, inputs):
        """`(mu, sigma^2)`, each `[R, B, units]`, of every replica's `q(f(x))`."""
        x = tf.cast(inputs, tf.float64)
        z = tf.cast(self.inducing_inputs, tf.float64)
        k_zz = self._covariance(z, z)
        chol = tf.linalg.cholesky(k_zz + self.jitter * tf.eye(self.num_inducing, dtype=k_zz.dtype))
        a = tf.linalg.triangular_solve(chol, self._covariance(z, x))  # [R, M, B]
        amplitude = tf.nn.softplus(tf.cast(self.raw_amplitude, tf.float64))
        prior = tf.square(amplitude)[:, None] - tf.reduce_sum(tf.square(a), 1)  # [R, B]
        # The O(units M^2 B) products take the layer's dtype (float32: twice as fast on a CPU);
        # the factorization and the prior variance's cancellation stay in float64.
        dtype = self.compute_dtype
        a = tf.cast(a, dtype)
        mean = tf.transpose(tf.matmul(self.variational_mean, a), [0, 2, 1])  # [R, B, U]
        if self.mean_fn == "linear":
            mean += tf.matmul(tf.cast(x, dtype), self.mean_kernel) + self.mean_bias[:, None, :]
        elif self.mean_fn == "identity":
            mean += tf.matmul(tf.cast(x, dtype), self._identity_mean(x.shape[-1], dtype))
        scale = self.variational_scale_tril(dtype)
        explained = tf.transpose(explained_variances(scale, a), [0, 2, 1])
        variance = tf.cast(prior, dtype)[..., None] + explained
        return mean, tf.maximum(variance, 1e-12)

    def _identity_mean(self, d, dtype):
        """`mean_fn='identity'`'s fixed `[R, d, units]` map."""
        if self.mean_projection is not None:
            return tf.constant(self.mean_projection, dtype)
        return tf.eye(d, self.units, batch_shape=[self.replicas], dtype=dtype)

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs, self.compute_dtype)
        _check_input(self.name, inputs.shape, self.replicas)
        mean, variance = self.predict_marginals(inputs)
        if self.kl_weight is not None:
            weight = tf.constant(self.kl_weight, tf.float64)
            self.add_loss(tf.cast(tf.reduce_sum(weight * self.kl_divergence()), self.dtype))
        if not self.sample:
            return tf.concat([mean, variance], -1)
        t = _next_call(self.counter)
        eps = _stateless(
            tf.random.stateless_normal, tf.shape(mean)[1:], self._noise_seeds, t, mean.dtype
        )
        return mean + tf.sqrt(variance) * eps

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units * (1 if self.sample else 2))

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "inducing_inputs": self.inducing_inputs_init.tolist(),
            "seeds": self.seeds,
            "mean_fn": self.mean_fn,
            "amplitude": self.amplitude,
            "length_scale": self.length_scale,
            "initial_variational_scale": self.initial_variational_scale,
            "kl_weight": self.kl_weight,
            "sample": self.sample,
            "jitter": self.jitter,
            "mean_projection": (
                None if self.mean_projection is None else self.mean_projection.tolist()
            ),
        }
