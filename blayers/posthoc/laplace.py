"""Post-hoc Laplace approximation over the last layer of any trained Keras model (MacKay, 1992;
Daxberger et al., 2021, "Laplace Redux").

The last layer is a linear map `f = W^T phi(x) + b` of the features `phi` the rest of the network
computes (a `keras.layers.Dense`, or any `blayers` dense layer at its posterior mean). With the
trained weights `theta* = vec([W; b])` as the MAP estimate and an isotropic Gaussian prior
`N(0, 1 / delta)`, the posterior is approximated by

    q(theta) = N(theta*, P^-1),   P = H + delta I,

with `H` the generalized Gauss-Newton (GGN) matrix of the negative log-likelihood,

    H = sum_n  phi~_n phi~_n^T (x) Lambda_n,   phi~ = [phi; 1],

`Lambda_n = diag(p_n) - p_n p_n^T` for a softmax likelihood and `I / sigma^2` for a Gaussian one
(for the last layer the GGN is the exact Hessian of the NLL). `hessian_structure` picks how `H`
is kept:

* `'full'`: the whole `(D+1)K x (D+1)K` matrix;
* `'kron'`: Kronecker-factored (KFAC), `H ~ (1/N) (sum phi~ phi~^T) (x) (sum Lambda)`, exact for
  one example and for a Gaussian likelihood;
* `'diag'`: the diagonal of the GGN.

The prior precision (and the noise of a regression) can be chosen by the Laplace evidence

    log p(D | delta) ~ log p(D | theta*) - 1/2 (theta*^T delta theta* + log det P - p log delta),

or by the NLL of a validation set. Predictions are exact Gaussians over the outputs because the
last layer is linear: `f ~ N(f*, J P^-1 J^T)`; for classification the predictive is the probit
approximation `softmax(f* / sqrt(1 + pi/8 diag(Sigma_f)))` or a Monte Carlo average of
`softmax(f)`.
"""

import keras
import numpy as np

from blayers.posthoc.all_weights import AllWeightsLaplace
from blayers.posthoc.batches import batches
from blayers.posthoc.laplace_base import (
    _LaplaceBase,
    precision_eigenvalues,
    probit_or_gaussian,
)

__all__ = ["Laplace", "LaplacePredictive"]


class Laplace(_LaplaceBase):
    """A last-layer Laplace approximation of a trained Keras model.

    Args:
      model: a trained `keras.Model` whose last layer is a dense layer with a linear activation
        (for classification its outputs are logits; a softmax activation is read as logits).
        Functional and sequential models work as they are; for a subclassed model pass
        `features`.
      likelihood: `'classification'` (softmax, integer labels), `'regression'` (Gaussian with
        noise stddev `sigma_noise`) or `'heteroscedastic'` (a Gaussian whose mean and scale the
        network outputs: `[mu, rho]` a target, `sigma = softplus(rho) + 1e-3`, the regression
        task's layout; its curvature is the Gaussian's Fisher in `(mu, rho)`).
      hessian_structure: `'full'`, `'kron'` or `'diag'` (see the module's docstring).
      prior_precision: `delta` of the prior `N(0, I / delta)` on the last layer's weights.
      sigma_noise: the regression's noise standard deviation, or one an output (with `'kron'`
        or `'diag'`; the evidence then fits each).
      features: optional `fn(x) -> phi(x)` computing the last layer's inputs.
      dtype: `'float64'` (default) or `'float32'` for the accumulated curvature.
      subset_of_weights: `'last_layer'` (this class) or `'all'`, which returns an
        `AllWeightsLaplace` over every dense and convolutional layer (KFAC or diagonal, with the
        linearized-network predictive).
    """

    def __new__(cls, *args, subset_of_weights="last_layer", **kwargs):
        if subset_of_weights == "all":
            # Not an instance of `cls`, so Python does not call `__init__` again.
            return AllWeightsLaplace(*args, **kwargs)
        if subset_of_weights != "last_layer":
            raise ValueError(
                f"Laplace: subset_of_weights {subset_of_weights!r} is not 'last_layer' or 'all'."
            )
        return super().__new__(cls)

    def __init__(
        self,
        model,
        likelihood="classification",
        hessian_structure="kron",
        prior_precision=1.0,
        sigma_noise=1.0,
        features=None,
        dtype="float64",
        subset_of_weights="last_layer",
    ):
        del subset_of_weights  # read by __new__
        self._init_common(likelihood, hessian_structure, prior_precision, sigma_noise, dtype)
        self.model = model
        self.last = model.layers[-1]
        self._check_last_layer(self.last)
        self._features = features or self._functional_features(model)

    def _functional_features(self, model):
        try:
            inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
            extractor = keras.Model(inputs, self.last.input)
        except (AttributeError, ValueError, TypeError) as error:
            raise ValueError(
                f"Laplace: cannot read the inputs of {model.name!r}'s last layer "
                f"({type(error).__name__}: {error}); for a subclassed model pass "
                "features=fn(x) -> the last layer's inputs."
            ) from None
        return lambda x: extractor(x, training=False)

    # ----------------------------------------------------------------------------------------
    # The MAP and the curvature.

    def _map(self):
        """`theta* = vec([W; b])`, row-major `[D+1, K]`."""
        kernel = np.asarray(keras.ops.convert_to_numpy(self.last.kernel), np.float64)
        bias = getattr(self.last, "bias", None)
        bias = np.zeros(kernel.shape[1]) if bias is None else keras.ops.convert_to_numpy(bias)
        return np.concatenate([kernel, np.asarray(bias, np.float64)[None]], 0)

    def _map_vector(self):
        return self.theta.reshape(-1)

    def _cache(self, x):
        """The last layer's inputs with a column of ones, `phi~ [n, D+1]`."""
        phi = np.asarray(keras.ops.convert_to_numpy(self._features(x)), np.float64)
        phi = phi.reshape(len(phi), -1)
        return np.concatenate([phi, np.ones((len(phi), 1))], 1)

    def fit(self, data, batch_size=256, progress=False):
        """Accumulates the curvature over `data`: a `tf.data.Dataset` of `(x, y)` batches or a
        pair of arrays `(x, y)`. Returns `self`."""
        self.theta = self._map()
        d, k = self.theta.shape
        self.num_outputs = k
        self.sigma_noise = self._checked_noise(self.sigma_noise)  # one an output: K of them
        if self.structure == "full":
            hessian = np.zeros((d, k, d, k), self.dtype)
        elif self.structure == "diag":
            hessian = np.zeros((d, k), self.dtype)
        else:
            factor_a, factor_g = np.zeros((d, d), self.dtype), np.zeros((k, k), self.dtype)
        self._start_fit()
        bar = keras.utils.Progbar(None, unit_name="batch") if progress else None
        for x, y in batches(data, batch_size):
            phi = self._cache(x)
            f = phi @ self.theta
            lam = self._output_curvature(f)
            if self.structure == "full":
                hessian += np.einsum("nd,ne,nkl->dkel", phi, phi, lam, optimize=True)
            elif self.structure == "diag":
                hessian += np.einsum("nd,nkk->dk", phi**2, lam)
            else:
                factor_a += phi.T @ phi
                factor_g += lam.sum(0)
            self._accumulate_fit(f, np.asarray(y))
            self.num_data += len(phi)
            if bar is not None:
                bar.add(1)
        if self.num_data == 0:
            raise ValueError("Laplace.fit: the data held no examples.")
        if self.structure == "kron":
            # The likelihood's curvature enters through G; regression's 1/sigma^2 is applied
            # at use so that the noise can be re-estimated.
            self._eig_a = np.linalg.eigh(factor_a.astype(np.float64))
            if self.likelihood == "regression":  # G = I exactly: keep the outputs' basis
                self._eig_g = (np.ones(k), np.eye(k))
            else:
                self._eig_g = np.linalg.eigh(factor_g.astype(np.float64) / self.num_data)
        elif self.structure == "full":
            flat = hessian.reshape(d * k, d * k).astype(np.float64)
            self._eig_h = np.linalg.eigh((flat + flat.T) / 2)
        else:
            self._diag_h = hessian.reshape(-1).astype(np.float64)
        self.fitted = True
        return self

    # ----------------------------------------------------------------------------------------
    # The posterior precision through its eigenvalues (so prior precision and noise can move).

    def _moments(self, phi):
        """`(f*, Sigma_f)` of features `phi~ [n, D+1]`."""
        return output_moments(
            np,
            self.structure,
            self._state(),
            phi,
            self.prior_precision,
            self._curvature_scale(self.sigma_noise),
        )

    def _precision_eigenvalues(self, prior_precision, sigma_noise):
        return precision_eigenvalues(
            np, self.structure, self._state(), prior_precision, self._curvature_scale(sigma_noise)
        )

    def _state(self):
        """The fitted posterior as named arrays (what `to_model` saves)."""
        if self.structure == "kron":
            (s_a, u_a), (s_g, u_g) = self._eig_a, self._eig_g
            return {
                "theta": self.theta,
                "values_a": s_a,
                "vectors_a": u_a,
                "values_g": s_g,
                "vectors_g": u_g,
            }
        if self.structure == "full":
            return {"theta": self.theta, "values_h": self._eig_h[0], "vectors_h": self._eig_h[1]}
        return {"theta": self.theta, "diag_h": self._diag_h}

    def _set_state(self, state):
        self.theta = np.asarray(state["theta"], np.float64)
        self.num_outputs = self.theta.shape[1]
        if self.structure == "kron":
            self._eig_a = (state["values_a"], state["vectors_a"])
            self._eig_g = (state["values_g"], state["vectors_g"])
        elif self.structure == "full":
            self._eig_h = (state["values_h"], state["vectors_h"])
        else:
            self._diag_h = state["diag_h"]
        self.fitted = True

    def to_model(self, link_approx="probit"):
        """A `keras.Model` computing this posterior's predictive (the probit-approximated class
        probabilities, or the regression's `(mean, stddev)`) from the original inputs, to save
        as a `.keras` file. `keras.models.load_model` reads it back after
        `import blayers.posthoc`, and `Laplace.from_model` turns it into a `Laplace` again."""
        self._check_fitted()
        if link_approx != "probit":
            raise ValueError("Laplace.to_model: the saved predictive uses link_approx='probit'.")
        try:
            inputs, features = self.model.inputs, self.last.input
        except (AttributeError, ValueError) as error:
            raise ValueError(
                f"Laplace.to_model: {self.model.name!r} has no functional graph to build the "
                f"predictive from ({error}); save a functional or sequential model."
            ) from None
        head = LaplacePredictive(
            likelihood=self.likelihood,
            hessian_structure=self.structure,
            num_outputs=self.num_outputs,
            prior_precision=self.prior_precision,
            sigma_noise=(
                self.sigma_noise if np.ndim(self.sigma_noise) == 0 else list(self.sigma_noise)
            ),
            num_data=self.num_data,
            log_likelihood_sum=self.log_likelihood_sum,
            sse=self.sse,
            sse_outputs=None if self.sse_outputs is None else list(self.sse_outputs),
            name="laplace_predictive",
        )
        head.build(tuple(features.shape))
        head.set_state(self._state())
        inputs = inputs[0] if len(inputs) == 1 else inputs
        return keras.Model(inputs, head(features), name=f"{self.model.name}_laplace")

    @classmethod
    def from_model(cls, predictive):
        """The fitted `Laplace` held by a model from `to_model` (e.g. one just loaded)."""
        head = predictive.layers[-1]
        if not isinstance(head, LaplacePredictive):
            raise TypeError(
                f"Laplace.from_model: {predictive.name!r} does not end in a LaplacePredictive "
                "layer (make it with Laplace.to_model)."
            )
        self = cls.__new__(cls)
        self.model, self.last = predictive, head
        self.likelihood, self.structure = head.likelihood, head.hessian_structure
        self.prior_precision = head.prior_precision
        self.sigma_noise = (
            head.sigma_noise if np.ndim(head.sigma_noise) == 0 else np.asarray(head.sigma_noise)
        )
        self.sse_outputs = None if head.sse_outputs is None else np.asarray(head.sse_outputs)
        self.dtype = np.dtype("float64")
        self.num_data, self.log_likelihood_sum, self.sse = (
            head.num_data,
            head.log_likelihood_sum,
            head.sse,
        )
        inputs = predictive.inputs[0] if len(predictive.inputs) == 1 else predictive.inputs
        extractor = keras.Model(inputs, head.input)
        self._features = lambda x: extractor(x, training=False)
        self._set_state(head.state())
        return self

    def joint_functional_covariance(self, x):
        """`f* [n, K]` and the joint covariance of every output of every input,
        `Cov(f_n,k, f_m,l)` as `[n, K, n, K]` (the marginal `functional_variance` is its
        diagonal blocks). With KFAC it never forms the `(D+1)K`-square posterior covariance:
        in the factors' eigenbases `Cov = sum_j u_g,j u_g,j^T (x) Phi' diag(1 / e_.j) Phi'^T`,
        `Phi' = phi~ U_a`, `O(n^2 D K)` (laplace-torch's `joint=True` predictive)."""
        self._check_fitted()
        phi = self._cache(x)
        d, k = self.theta.shape
        inverse = 1.0 / self._precision_eigenvalues(self.prior_precision, self.sigma_noise)
        inverse = inverse.reshape(d, k) if self.structure != "full" else inverse
        if self.structure == "kron":
            rotated = phi @ self._eig_a[1]
            per_g = np.einsum("nd,dj,md->jnm", rotated, inverse, rotated, optimize=True)
            u_g = self._eig_g[1]
            cov = np.einsum("kj,jnm,lj->nkml", u_g, per_g, u_g, optimize=True)
        elif self.structure == "full":
            u = self._eig_h[1]
            posterior = ((u * inverse) @ u.T).reshape(d, k, d, k)
            cov = np.einsum("nd,dkel,me->nkml", phi, posterior, phi, optimize=True)
        else:
            per_k = np.einsum("nd,dk,md->knm", phi, inverse, phi, optimize=True)
            cov = np.einsum("knm,kl->nkml", per_k, np.eye(k))
        return phi @ self.theta, cov

    def sample_functions(self, x, num_samples, seed=0):
        """Joint draws of the outputs of the inputs `x` from the linear model's posterior,
        `[num_samples, n, K]` (one function a draw, not independent per input)."""
        f, cov = self.joint_functional_covariance(x)
        n, k = f.shape
        flat = cov.reshape(n * k, n * k)
        chol = np.linalg.cholesky(flat + 1e-10 * np.mean(np.diag(flat)) * np.eye(n * k))
        eps = np.random.default_rng(seed).normal(size=(num_samples, n * k))
        return f + (eps @ chol.T).reshape(num_samples, n, k)

    def sample(self, num_samples, seed=0):
        """Draws of the last layer's `[D+1, K]` weights (`[W; b]`) from the posterior."""
        self._check_fitted()
        rng = np.random.default_rng(seed)
        d, k = self.theta.shape
        eps = rng.normal(size=(num_samples, d * k))
        eigenvalues = self._precision_eigenvalues(self.prior_precision, self.sigma_noise)
        if self.structure == "diag":
            draws = eps / np.sqrt(eigenvalues)
        else:
            basis = (
                np.kron(self._eig_a[1], self._eig_g[1])
                if self.structure == "kron"
                else (self._eig_h[1])
            )
            draws = (eps / np.sqrt(eigenvalues)) @ basis.T
        return self.theta + draws.reshape(num_samples, d, k)


_STATE_SHAPES = {
    "kron": {"theta": "dk", "values_a": "d", "vectors_a": "dd", "values_g": "k", "vectors_g": "kk"},
    "full": {"theta": "dk", "values_h": "p", "vectors_h": "pp"},
    "diag": {"theta": "dk", "diag_h": "p"},
}


@keras.saving.register_keras_serializable("blayers")
class LaplacePredictive(keras.layers.Layer):
    """The predictive of a fitted last-layer `Laplace`, as a Keras layer on the last layer's
    inputs (made by `Laplace.to_model`; its posterior is saved with the model).

    Classification: probit-approximated class probabilities
    `softmax(f* / sqrt(1 + pi/8 diag(Sigma_f)))`. Regression: `(mean, stddev)` with
    `stddev^2 = diag(Sigma_f) + sigma_noise^2`. Computed in float64.

    Args:
      likelihood: `'classification'` or `'regression'`.
      hessian_structure: `'full'`, `'kron'` or `'diag'`.
      num_outputs: `K`, the last layer's units (read from the state when set by `Laplace`).
      prior_precision, sigma_noise: as in `Laplace`.
      num_data, log_likelihood_sum, sse: the fit's statistics (for the evidence after loading).
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        likelihood="classification",
        hessian_structure="kron",
        num_outputs=None,
        prior_precision=1.0,
        sigma_noise=1.0,
        num_data=0,
        log_likelihood_sum=0.0,
        sse=0.0,
        sse_outputs=None,
        **kwargs,
    ):
        kwargs["dtype"] = "float64"
        super().__init__(**kwargs)
        self.likelihood, self.hessian_structure = likelihood, hessian_structure
        self.num_outputs = num_outputs
        self.prior_precision = float(prior_precision)
        self.sigma_noise = (
            float(sigma_noise) if np.ndim(sigma_noise) == 0 else [float(s) for s in sigma_noise]
        )
        self.num_data, self.log_likelihood_sum, self.sse = (
            int(num_data),
            float(log_likelihood_sum),
            float(sse),
        )
        self.sse_outputs = None if sse_outputs is None else [float(s) for s in sse_outputs]

    def build(self, input_shape):
        d = int(np.prod(input_shape[1:])) + 1
        k = self.num_outputs
        if k is None:
            raise ValueError("LaplacePredictive: num_outputs is unknown before set_state.")
        sizes = {"d": d, "k": k, "p": d * k}
        self._names = list(_STATE_SHAPES[self.hessian_structure])
        for name, dims in _STATE_SHAPES[self.hessian_structure].items():
            shape = tuple(sizes[c] for c in dims)
            setattr(
                self,
                name,
                self.add_weight(
                    name=name, shape=shape, initializer="zeros", trainable=False, dtype="float64"
                ),
            )
        self.built = True

    def set_state(self, state):
        """Writes a `Laplace`'s fitted arrays into the layer's weights."""
        for name in self._names:
            getattr(self, name).assign(np.asarray(state[name], np.float64))

    def state(self):
        """The fitted arrays, as NumPy."""
        return {
            name: np.asarray(keras.ops.convert_to_numpy(getattr(self, name)))
            for name in self._names
        }

    def call(self, features):
        phi = keras.ops.reshape(
            keras.ops.cast(features, "float64"), [keras.ops.shape(features)[0], -1]
        )
        phi = keras.ops.concatenate([phi, keras.ops.ones_like(phi[:, :1])], axis=1)
        state = {name: keras.ops.convert_to_tensor(getattr(self, name)) for name in self._names}
        sigma = np.asarray(self.sigma_noise, np.float64)
        scale = 1.0 / np.square(sigma) if self.likelihood == "regression" else 1.0
        f, cov = output_moments(
            keras.ops, self.hessian_structure, state, phi, self.prior_precision, scale
        )
        return probit_or_gaussian(keras.ops, self.likelihood, f, cov, sigma)

    def get_config(self):
        config = super().get_config()
        config.pop("dtype", None)
        return {
            **config,
            "likelihood": self.likelihood,
            "hessian_structure": self.hessian_structure,
            "num_outputs": self.num_outputs,
            "prior_precision": self.prior_precision,
            "sigma_noise": self.sigma_noise,
            "num_data": self.num_data,
            "log_likelihood_sum": self.log_likelihood_sum,
            "sse": self.sse,
            "sse_outputs": self.sse_outputs,
        }


def output_moments(ops, structure, state, phi, prior_precision, scale):
    """`(f*, Sigma_f)` of features `phi~ [n, D+1]`: `Sigma_f = J P^-1 J^T` through the
    precision's eigendecomposition, with `ops` NumPy or `keras.ops`."""
    theta = state["theta"]
    d, k = theta.shape
    f = ops.matmul(phi, theta)
    inverse = 1.0 / precision_eigenvalues(ops, structure, state, prior_precision, scale)
    if structure == "kron":
        u_g = state["vectors_g"]
        # (phi~^T u_a)^2 weighted by 1 / eigenvalue, in G's eigenbasis.
        inner = ops.matmul(
            ops.square(ops.matmul(phi, state["vectors_a"])), ops.reshape(inverse, [d, k])
        )
        cov = ops.einsum("kg,ng,lg->nkl", u_g, inner, u_g)
    elif structure == "full":
        u = state["vectors_h"]
        posterior = ops.reshape(ops.matmul(u * inverse, ops.transpose(u)), [d, k, d, k])
        cov = ops.einsum("nd,dkel,ne->nkl", phi, posterior, phi)
    else:
        inner = ops.matmul(ops.square(phi), ops.reshape(inverse, [d, k]))
        cov = ops.einsum("nk,kl->nkl", inner, ops.eye(k, dtype=inner.dtype))
    return f, cov
