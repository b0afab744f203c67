"""`SparseGaussianProcess`: the inducing-point variational GP (Hensman et al., 2013), whose
stacked layers form the doubly stochastic deep GP (Salimbeni & Deisenroth, 2017).
"""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import distributions as rv_lib
from blayers.layers.base import AddsKL, register

tfd = tfp.distributions
psd = tfp.math.psd_kernels
from blayers.layers.gp.base import GaussianProcessBase
from blayers.layers.gp.kernels import float_softplus_inverse, non_negative_number, positive_number

__all__ = ["SparseGaussianProcess", "explained_variances"]


@tf.custom_gradient
def explained_variances(scale, a):
    """`[R, U, B]`: `||L_u^T a_b||^2 = a_b^T S_u a_b` with `S_u = L_u L_u^T`, for each
    replica's `L_u` (`scale`, `[R, U, M, M]`) and column `a_b` of its `a` (`[R, M, B]`): the
    variance a whitened sparse GP's `q(u)` explains (`R = 1` for one GP,
    `SparseGaussianProcess(replicas=R)` for many).

    Written out, its gradient costs two `U M^2 B` products where autodiff of `||L^T a||^2`
    costs three: with `g` the upstream gradient, `dS_u = A diag(g_u) A^T`, `dL_u = 2 dS_u L_u`
    and `da = 2 sum_u g_u S_u a`, which reuses the forward product `S_u a`. Each `U M^2 B`
    product is one GEMM per replica, the units stacked as `[U M, M]` rows, rather than `R U`
    broadcast ones: 1.5-2x faster on a CPU, where an inner layer's variances are most of a deep
    GP's step.
    """
    r, u, m = tf.unstack(tf.shape(scale)[:3])
    b = tf.shape(a)[-1]
    covariance = tf.matmul(scale, scale, transpose_b=True)
    product = tf.reshape(tf.matmul(tf.reshape(covariance, [r, u * m, m]), a), [r, u, m, b])
    forms = _column_forms(product, a)

    def grad(upstream):
        weighted = tf.reshape(a[:, None] * upstream[:, :, None, :], [r, u * m, b])  # A diag(g_u)
        d_covariance = tf.reshape(tf.matmul(weighted, a, transpose_b=True), [r, u, m, m])
        d_scale = 2.0 * tf.matmul(d_covariance, scale)
        return d_scale, _weighted_unit_sum(product, upstream)

    return forms, grad


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _column_squares_and_cast(a, dtype):
    """`(sum_m a[..., m, b]^2, a in dtype)`: one fused pass over `a` (and one back) where the
    square, the sum and the cast were three (4% of a power-plant-sized DGP-2 step)."""
    return tf.reduce_sum(tf.square(a), -2), tf.cast(a, dtype)


# Each reduction of a `[R, U, M, B]` product, compiled: XLA fuses the multiply into the sum,
# which otherwise writes and reads the whole product once more (275 MB an inner layer of a
# power-plant-sized deep GP).
@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _column_forms(product, a):
    """`[R, U, B]`: `sum_m product[r, u, m, b] a[r, m, b]`."""
    return tf.reduce_sum(product * a[:, None], 2)


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _weighted_unit_sum(product, upstream):
    """`[R, M, B]`: `2 sum_u product[r, u, m, b] upstream[r, u, b]`."""
    return 2.0 * tf.reduce_sum(product * upstream[:, :, None, :], 1)


@register
class SparseGaussianProcess(AddsKL, GaussianProcessBase):
    """Sparse variational GP layer (Hensman et al., 2013) for scalable and deep GPs.

    Inducing inputs `Z` `[num_inducing, d]` (trainable) and, per output unit, `q(v) = N(m, L L^T)`
    over whitened inducing outputs `v = L_Z^{-1} u` (`whiten=True`, prior `N(0, I)`) or over `u`
    itself (`whiten=False`, prior `N(0, K_ZZ)`). With `A = L_Z^{-1} K_Zx` the marginals are

    `mu(x) = m(x) + A^T m`, `sigma^2(x) = k(x, x) - ||A_x||^2 + ||L^T A_x||^2` (whitened),

    and `KL[q || p]` (analytic, TFP) is added to `layer.losses` on every call.

    Args:
      units: independent output functions.
      num_inducing: number of inducing points M (a positive integer).
      mean_fn: `'zero'`, `'constant'`, `'linear'` (trainable `x @ W + b`, `W` starting at
        the identity) or `'identity'` (fixed `x @ eye(d, units)`, Salimbeni & Deisenroth's
        inner-layer mean; needs `units >= d`): the last two for inner layers of a deep GP.
      covariance_fn: a kernel name, a `tfp.math.psd_kernels` class or instance, or a callable
        `fn(amplitude, length_scale) -> kernel` (as `GaussianProcess`).
      whiten: parameterize `q` over whitened inducing outputs.
      variational: `'full'` (Cholesky `L`) or `'mean_field'` (diagonal `L`).
      initial_variational_scale: initial diagonal of `L` (small values start inner layers of a
        deep GP near deterministic, as Salimbeni & Deisenroth).
      inducing_inputs_initializer: Keras initializer of `Z` (e.g. a `Constant` of data points),
        or `'kmeans'`: k-means centres of the layer's inputs in its first training call (a
        data-dependent initialization, as Salimbeni & Deisenroth's `kmeans2`; with a deep GP
        each layer clusters what reaches it).
      full_covariance: False returns the marginals `N(mu(x), sigma^2(x))` (independent across
        the batch); True returns the joint `q(f(X))` over the batch, per unit
        `N(mu, K_XX - A^T A + A_u^T L L^T A_u)` (a `MultivariateNormalTriL` per unit, transposed
        to `[batch, units]`), the variable a posterior program hands to a model's exact
        `GaussianProcess` (`blayers.programs`, the Cox process).
      add_kl_loss: add `scale_factor * KL[q(u) || p(u)]` to `layer.losses` on every call (the
        Keras-model ELBO). A posterior program sets False: there `log p(f) - log q(f)` carries
        the KL.
      scale_factor: multiplies the KL in `layer.losses` (default 1; `1 / N` gives the
        per-example ELBO's KL term in `model.fit`, which `blayers.set_kl_scale` sets, as it
        does for every weight's KL regularizer).
      output_name: name of the returned random variable (default: the layer's name).
      mean_projection: with `mean_fn='identity'`, a fixed `[d, units]` map instead of the
        identity (with replicas, one a replica, `[R, d, units]`): Salimbeni & Deisenroth
        project inputs wider than an inner layer onto their top principal directions.
      replicas, replica_seeds: `R` independent sparse GPs at once (`blayers.replicas`): every
        weight leads with the replica axis, inputs are `[R, batch, d]`, the marginals
        `[R, batch, units]`, the KL is the sum of the replicas' and each replica's draws depend
        on its own seed (not with `full_covariance` or k-means initialization; the jitter,
        raised only when a factorization fails, is shared).
      **kwargs: `GaussianProcess`'s kernel arguments (`amplitude`, `length_scale`, `jitter`,
        `cholesky_dtype`, `seed`) and `keras.layers.Layer` arguments.
    """

    supports_replicas = True

    def __init__(
        self,
        units,
        num_inducing=100,
        mean_fn="zero",
        covariance_fn="exponentiated_quadratic",
        whiten=True,
        variational="full",
        initial_variational_scale=1e-2,
        inducing_inputs_initializer="random_normal",
        full_covariance=False,
        add_kl_loss=True,
        scale_factor=1.0,
        **kwargs,
    ):
        super().__init__(units, mean_fn=mean_fn, covariance_fn=covariance_fn, **kwargs)
        self.full_covariance, self.add_kl_loss = bool(full_covariance), bool(add_kl_loss)
        name = f"SparseGaussianProcess ({self.name})"
        self.scale_factor = non_negative_number(name, "scale_factor", scale_factor)
        if variational not in ("full", "mean_field"):
            raise ValueError(
                f"SparseGaussianProcess: variational must be 'full' or "
                f"'mean_field', got {variational!r}."
            )
        name = f"SparseGaussianProcess ({self.name})"
        if (
            not isinstance(num_inducing, (int, np.integer))
            or isinstance(num_inducing, bool)
            or num_inducing < 1
        ):
            raise ValueError(
                f"{name}: num_inducing must be a positive integer, got {num_inducing!r}."
            )
        self.num_inducing, self.whiten = int(num_inducing), bool(whiten)
        self.variational = variational
        self.initial_variational_scale = positive_number(
            name, "initial_variational_scale", initial_variational_scale
        )
        self.kmeans = inducing_inputs_initializer == "kmeans"
        self.inducing_inputs_initializer = keras.initializers.get(
            "random_normal" if self.kmeans else inducing_inputs_initializer
        )
        if self.replicas is not None and (self.kmeans or self.full_covariance):
            raise ValueError(
                f"{name}: replicas take their inducing inputs from an initializer (a Constant of "
                "each replica's k-means centres) and return marginals: not "
                "inducing_inputs_initializer='kmeans' or full_covariance=True."
            )

    def build(self, input_shape):
        m = self.num_inducing
        self._build_kernel_and_mean(input_shape[-1])
        self.inducing_inputs = self.add_weight(
            name="inducing_inputs",
            shape=self.replica_shape((m, input_shape[-1])),
            initializer=self.replica_initializer(self.inducing_inputs_initializer),
        )
        if self.kmeans:  # set once, from the first training batch; saved with the layer
            self.kmeans_done = self.add_weight(
                name="kmeans_done", shape=(), initializer="zeros", trainable=False
            )
        self.variational_mean = self.add_weight(
            name="variational_mean", shape=self.replica_shape((self.units, m)), initializer="zeros"
        )
        raw_diag = float_softplus_inverse(self.initial_variational_scale)
        if self.variational == "full":
            init = np.zeros(self.replica_shape((self.units, m, m)), "float32")
            init[..., np.arange(m), np.arange(m)] = raw_diag
            self.variational_scale = self.add_weight(
                name="variational_scale",
                shape=init.shape,
                initializer=keras.initializers.Constant(init),
            )
        else:
            self.variational_scale = self.add_weight(
                name="variational_scale",
                shape=self.replica_shape((self.units, m)),
                initializer=keras.initializers.Constant(raw_diag),
            )

    def variational_scale_tril(self, dtype=None):
        """`L` of `q`: lower-triangular `[units, M, M]` with a softplus-positive diagonal."""
        raw = tf.cast(self.variational_scale, dtype or self.compute_dtype)
        if self.variational == "mean_field":
            return tf.linalg.diag(tf.nn.softplus(raw))
        lower = tf.linalg.band_part(raw, -1, 0)
        return tf.linalg.set_diag(lower, tf.nn.softplus(tf.linalg.diag_part(raw)))

    def kl_divergence(self, chol_zz=None):
        """`sum_units KL[q(u) || p(u)]`; whitened, in closed form in O(M^2):
        `1/2 (||L||_F^2 + ||m||^2 - M) - sum log diag L` per unit."""
        dtype = self._linalg_dtype()
        scale = self.variational_scale_tril(dtype)
        mean = tf.cast(self.variational_mean, dtype)
        if self.whiten:
            entries = float(np.prod(self.variational_mean.shape))  # M units (R M units)
            return 0.5 * (
                tf.reduce_sum(tf.square(scale)) + tf.reduce_sum(tf.square(mean)) - entries
            ) - tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(scale))))
        q = tfd.MultivariateNormalTriL(mean, scale)
        if chol_zz is None:
            z = tf.cast(self.inducing_inputs, dtype)
            chol_zz = self._cholesky(
                self.covariance(self.kernel(dtype), z, z), "inducing covariance"
            )
        if self.replicas is not None:  # one prior a replica, for each of its units
            chol_zz = chol_zz[:, None]
        prior = tfd.MultivariateNormalTriL(tf.zeros([self.num_inducing], dtype), chol_zz)
        return tf.reduce_sum(tfd.kl_divergence(q, prior))

    def predict_marginals(self, inputs):
        """`(mu, sigma^2)` of `q(f(x))`, each `[batch, units]`, and the KL."""
        mean, prior_var, explained, kl = self._predict(inputs, full_covariance=False)
        variance = prior_var[..., None] + tf.linalg.matrix_transpose(explained)
        out = self.compute_dtype
        return tf.cast(mean, out), tf.cast(tf.maximum(variance, 1e-12), out), tf.cast(kl, out)

    def predict_joint(self, inputs):
        """`(mu [batch, units], L [units, batch, batch], KL)`: the mean and the jittered
        Cholesky factor of each unit's joint covariance of `q(f(X))` over the batch."""
        mean, prior_cov, explained, kl = self._predict(inputs, full_covariance=True)
        chol = self._cholesky(prior_cov[None] + explained, "joint posterior covariance")
        out = self.compute_dtype
        return tf.cast(mean, out), tf.cast(chol, out), tf.cast(kl, out)

    def _predict(self, inputs, full_covariance):
        x = self._inputs(inputs)
        dtype = self._linalg_dtype()
        kernel = self.kernel(dtype)
        xd, z = tf.cast(x, dtype), tf.cast(self.inducing_inputs, dtype)
        chol_zz = self._cholesky(self.covariance(kernel, z, z), "inducing covariance")
        a = tf.linalg.triangular_solve(chol_zz, self.covariance(kernel, z, xd))  # [M, B]
        if not self.whiten:  # project through K_ZZ^{-1} K_Zx
            a_u = tf.linalg.triangular_solve(chol_zz, a, adjoint=True)
        else:
            a_u = a
        kl = self.kl_divergence(chol_zz)
        if full_covariance:  # K_XX - A^T A and A_u^T L L^T A_u
            q_mean = tf.cast(self.variational_mean, dtype)  # [units, M]
            scale = self.variational_scale_tril(dtype)  # [units, M, M]
            mean = tf.cast(self.mean(x), dtype) + tf.linalg.matrix_transpose(tf.matmul(q_mean, a_u))
            projected = tf.matmul(scale, a_u[None], transpose_a=True)  # L^T A_u, [units, M, B]
            prior = self.covariance(kernel, xd, xd) - tf.matmul(a, a, transpose_a=True)
            return mean, prior, tf.matmul(projected, projected, transpose_a=True), kl
        # The marginals' O(units M^2 B) products with q take the layer's dtype (float32: twice
        # as fast on a CPU); the factorization and the prior variance's cancellation stay in
        # the factorization's (`cholesky_dtype`).
        products = self.compute_dtype
        squares, a_low = _column_squares_and_cast(a, products)
        prior_var = self.covariance(kernel, xd) - squares
        a_u = a_low if self.whiten else tf.cast(a_u, products)
        q_mean = tf.cast(self.variational_mean, products)  # [units, M]
        scale = self.variational_scale_tril(products)  # [units, M, M]
        mean = self.mean(x) + tf.linalg.matrix_transpose(tf.matmul(q_mean, a_u))
        if self.variational == "mean_field":  # diagonal L: ||L^T a||^2 = sum_m L_mm^2 a_m^2
            explained = tf.matmul(tf.square(tf.linalg.diag_part(scale)), tf.square(a_u))
        elif self.replicas is not None:  # [R, units, M, M] and [R, M, B]
            explained = explained_variances(scale, a_u)
        else:
            explained = explained_variances(scale[None], a_u[None])[0]
        return mean, tf.cast(prior_var, products), explained, kl

    def kmeans_inducing_inputs(self, inputs, iterations=10):
        """`M` k-means centres of `inputs` (Lloyd's algorithm from `M` distinct random rows, as
        `scipy.cluster.vq.kmeans2(x, M, minit='points')` in Salimbeni & Deisenroth's code); with
        fewer rows than `M`, the rows and then the current inducing inputs."""
        x = tf.convert_to_tensor(inputs, self.inducing_inputs.dtype)
        m = self.num_inducing
        rows = tf.random.experimental.stateless_shuffle(x, self.next_seed())
        current = tf.convert_to_tensor(self.inducing_inputs)
        centres = tf.concat([rows, current], 0)[:m]
        if x.shape[0] is not None and x.shape[0] < m:
            return centres
        for _ in range(iterations):
            distances = tf.reduce_sum(tf.square(x[:, None, :] - centres[None]), -1)
            assignment = tf.argmin(distances, axis=1, output_type=tf.int32)
            sums = tf.math.unsorted_segment_sum(x, assignment, m)
            counts = tf.math.unsorted_segment_sum(tf.ones_like(x[:, :1]), assignment, m)
            # An empty cluster keeps its centre.
            centres = tf.where(counts > 0, sums / tf.maximum(counts, 1.0), centres)
        return centres

    def _initialize_by_kmeans(self, inputs):
        def run():
            self.inducing_inputs.assign(self.kmeans_inducing_inputs(inputs))
            self.kmeans_done.assign(1.0)
            return tf.constant(True)

        tf.cond(self.kmeans_done > 0, lambda: tf.constant(False), run)

    def call(self, inputs, training=None):
        if self.kmeans and training:
            # A random-variable input (a deep GP's inner layer) is drawn here, outside the cond.
            self._initialize_by_kmeans(tf.convert_to_tensor(inputs, self.compute_dtype))
        if not self.full_covariance:
            mean, variance, kl = self.predict_marginals(inputs)
            if self.add_kl_loss:
                self.add_loss(tf.cast(self.scale_factor, kl.dtype) * kl)
            return rv_lib.Normal(
                loc=mean,
                scale=tf.sqrt(variance),
                seed=self.next_seed(),
                name=self.output_name,
                replica_keys=self.replica_keys,
            )
        mean, chol, kl = self.predict_joint(inputs)
        if self.add_kl_loss:
            self.add_loss(tf.cast(self.scale_factor, kl.dtype) * kl)
        per_unit = tfd.MultivariateNormalTriL(loc=tf.transpose(mean), scale_tril=chol)
        return rv_lib.TransformedDistribution(
            distribution=tfd.Independent(per_unit, reinterpreted_batch_ndims=1),
            bijector=tfp.bijectors.Transpose(perm=[1, 0]),
            seed=self.next_seed(),
            name=self.output_name,
        )

    def get_config(self):
        return {
            **super().get_config(),
            "num_inducing": self.num_inducing,
            "whiten": self.whiten,
            "variational": self.variational,
            "initial_variational_scale": self.initial_variational_scale,
            "inducing_inputs_initializer": "kmeans"
            if self.kmeans
            else keras.initializers.serialize(self.inducing_inputs_initializer),
            "full_covariance": self.full_covariance,
            "add_kl_loss": self.add_kl_loss,
            "scale_factor": self.scale_factor,
        }
