"""What the Laplace approximations share: the likelihood's curvature in the outputs, the
evidence and its optimum over the prior precision (and noise), and the predictives from a
Gaussian over the outputs. `Laplace` (last layer) and `AllWeightsLaplace` build on it."""

import math
import types

import numpy as np
import scipy.optimize
from scipy.special import log_softmax, softmax

from blayers import metrics
from blayers.posthoc.batches import arrays

__all__ = ["precision_eigenvalues", "probit_or_gaussian"]

_LIKELIHOODS = ("classification", "regression", "heteroscedastic")

# The heteroscedastic network's smallest noise scale, as the regression task's likelihood.
MIN_SCALE = 1e-3


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def heteroscedastic_parts(ops, f, cov):
    """A heteroscedastic Gaussian's predictive from the outputs `f = [mu, rho]` (`[n, 2K]`,
    `sigma = softplus(rho) + MIN_SCALE`) and their covariance: the mean `mu*` and the standard
    deviation of `y = mu + sigma(rho) eps`, `Var(mu) + E[sigma(rho)^2]`, the expectation to
    second order in `rho`'s variance,
    `E[sigma^2] ~ sigma*^2 + Var(rho) (sigma'^2 + sigma sigma'')`."""
    k = f.shape[-1] // 2
    variance = ops.diagonal(cov, axis1=1, axis2=2)
    mu, rho = f[:, :k], f[:, k:]
    slope = 0.5 * (1.0 + ops.tanh(0.5 * rho))  # softplus' = sigmoid
    scale = ops.softplus(rho) + MIN_SCALE
    noise = ops.square(scale) + variance[:, k:] * (ops.square(slope) + scale * slope * (1 - slope))
    return mu, ops.sqrt(variance[:, :k] + noise)


# The operations `probit_or_gaussian` needs, in NumPy (the saved predictives pass `keras.ops`).
_NUMPY = types.SimpleNamespace(
    diagonal=np.diagonal,
    sqrt=np.sqrt,
    softmax=softmax,
    tanh=np.tanh,
    square=np.square,
    softplus=lambda x: np.logaddexp(0.0, x),
)
_STRUCTURES = ("full", "kron", "diag")


class _LaplaceBase:
    """What every Laplace approximation here shares: the likelihood's curvature, the evidence
    and its optimum, and the predictives from the outputs' Gaussian `N(f*, Sigma_f)`.

    A subclass keeps the fitted posterior and provides `_cache(x)` (what the predictive needs of
    inputs `x`, computed once), `_moments(cache)` (`f*, Sigma_f`), `_map_vector()` (the MAP
    weights, flat) and `_precision_eigenvalues(delta, sigma)` (of the posterior precision)."""

    structures = _STRUCTURES

    def _init_common(self, likelihood, hessian_structure, prior_precision, sigma_noise, dtype):
        if likelihood not in _LIKELIHOODS:
            raise ValueError(f"Laplace: likelihood {likelihood!r} is not one of {_LIKELIHOODS}.")
        if hessian_structure not in self.structures:
            raise ValueError(
                f"{type(self).__name__}: hessian_structure {hessian_structure!r} is not one of "
                f"{self.structures}."
            )
        self.likelihood, self.structure = likelihood, hessian_structure
        self.prior_precision = self._checked_precision(prior_precision)
        self.sigma_noise = self._checked_noise(sigma_noise)
        self.dtype = np.dtype(dtype)
        self.fitted = False

    def _checked_precision(self, prior_precision):
        """A positive float (one precision for every weight); a subclass with per-layer
        precisions also takes one a layer."""
        if np.ndim(prior_precision) != 0:
            raise ValueError(
                f"{type(self).__name__}: prior_precision must be one number, got "
                f"{prior_precision!r} (per-layer precisions: AllWeightsLaplace)."
            )
        if not float(prior_precision) > 0:
            raise ValueError(f"{type(self).__name__}: prior_precision must be > 0.")
        return float(prior_precision)

    # Per-output noise scales the likelihood's curvature output by output, which KFAC's and
    # the diagonal's eigenbases keep (the Gaussian's output curvature is the identity).
    per_output_noise_structures = ("kron", "diag")

    def _checked_noise(self, sigma_noise):
        """A positive float, or for regression with `'kron'` or `'diag'` one an output."""
        if np.ndim(sigma_noise) == 0:
            if not float(sigma_noise) > 0:
                raise ValueError(f"{type(self).__name__}: sigma_noise must be > 0.")
            return float(sigma_noise)
        sigma = np.asarray(sigma_noise, np.float64).reshape(-1)
        if self.likelihood != "regression" or self.structure not in (
            self.per_output_noise_structures
        ):
            raise ValueError(
                f"{type(self).__name__}: one noise an output is for regression with "
                f"hessian_structure in {self.per_output_noise_structures} (for a Gaussian "
                "likelihood 'kron' is exact, as 'full' is)."
            )
        if not np.all(sigma > 0):
            raise ValueError(f"{type(self).__name__}: every sigma_noise must be > 0.")
        if getattr(self, "num_outputs", None) not in (None, len(sigma)):
            raise ValueError(
                f"{type(self).__name__}: {len(sigma)} noise scales for {self.num_outputs} outputs."
            )
        return sigma

    def _prior_terms(self, delta):
        """`(delta ||theta*||^2, p log delta)` of the evidence (a sum over layers for per-layer
        precisions)."""
        theta = self._map_vector()
        return delta * float(np.sum(theta**2)), theta.size * math.log(delta)

    @staticmethod
    def _check_last_layer(layer):
        kernel = getattr(layer, "kernel", None)
        if kernel is None or len(kernel.shape) != 2:
            raise ValueError(
                f"Laplace: the last layer {layer.name!r} ({type(layer).__name__}) is not "
                "a dense layer with a 2-D kernel."
            )
        activation = getattr(getattr(layer, "activation", None), "__name__", "linear")
        if activation not in ("linear", "softmax"):
            raise ValueError(
                f"Laplace: the last layer {layer.name!r} has activation {activation!r}; "
                "it must be linear (or softmax, read as logits)."
            )

    def _heteroscedastic_fisher(self, f):
        """The Fisher of `N(mu, sigma(rho)^2)` in `[mu, rho]`: `1 / sigma^2` and
        `2 sigma'(rho)^2 / sigma^2`, diagonal `[n, 2K]` (the expected Hessian of the NLL, PSD
        where the Hessian itself need not be)."""
        k = f.shape[1] // 2
        rho = f[:, k:]
        scale = np.logaddexp(0.0, rho) + MIN_SCALE
        return np.concatenate([1.0 / scale**2, 2.0 * _sigmoid(rho) ** 2 / scale**2], 1)

    def _output_curvature(self, f):
        """`Lambda_n` per example `[n, K, K]` (regression: for unit noise)."""
        if self.likelihood == "heteroscedastic":
            return np.einsum("nk,kl->nkl", self._heteroscedastic_fisher(f), np.eye(f.shape[1]))
        if self.likelihood == "regression":
            return np.broadcast_to(np.eye(f.shape[1]), (len(f), f.shape[1], f.shape[1]))
        p = softmax(f, -1)
        return np.einsum("nk,kl->nkl", p, np.eye(p.shape[1])) - np.einsum("nk,nl->nkl", p, p)

    def _output_curvature_root(self, f):
        """`L_n` with `L_n L_n^T = Lambda_n`, `[n, K, K]`: for a softmax
        `L = diag(sqrt p) - p sqrt(p)^T` (exact, as `sum p = 1`); the identity for regression."""
        if self.likelihood == "heteroscedastic":
            root = np.sqrt(self._heteroscedastic_fisher(f))
            return np.einsum("nk,kl->nkl", root, np.eye(f.shape[1]))
        if self.likelihood == "regression":
            return np.broadcast_to(np.eye(f.shape[1]), (len(f), f.shape[1], f.shape[1]))
        p = softmax(f.astype(np.float64), -1)
        root = np.sqrt(p)
        return np.einsum("nk,kl->nkl", root, np.eye(p.shape[1])) - np.einsum("nk,nl->nkl", p, root)

    def _start_fit(self):
        self.num_data, self.log_likelihood_sum, self.sse = 0, 0.0, 0.0
        self.sse_outputs = None

    def _accumulate_fit(self, f, y):
        if self.likelihood == "classification":
            y = y.reshape(-1).astype(int)
            self.log_likelihood_sum += float(np.sum(log_softmax(f, -1)[np.arange(len(y)), y]))
        elif self.likelihood == "heteroscedastic":
            if f.shape[1] % 2:
                raise ValueError(
                    f"Laplace: a heteroscedastic network outputs a mean and a raw scale a "
                    f"target ([n, 2K]); its last layer has {f.shape[1]} outputs."
                )
            k = f.shape[1] // 2
            scale = np.logaddexp(0.0, f[:, k:]) + MIN_SCALE
            z = (y.reshape(len(f), k) - f[:, :k]) / scale
            self.log_likelihood_sum += float(
                np.sum(-0.5 * z**2 - np.log(scale) - 0.5 * math.log(2 * math.pi))
            )
        else:
            squares = np.sum(np.square(y.reshape(f.shape) - f), 0)
            self.sse += float(np.sum(squares))
            self.sse_outputs = squares if self.sse_outputs is None else self.sse_outputs + squares

    def _curvature_scale(self, sigma_noise):
        return 1.0 / np.square(sigma_noise) if self.likelihood == "regression" else 1.0

    def log_likelihood(self, sigma_noise=None):
        """`log p(D | theta*)` over the fitted data."""
        self._check_fitted()
        if self.likelihood in ("classification", "heteroscedastic"):
            return self.log_likelihood_sum
        sigma = self.sigma_noise if sigma_noise is None else sigma_noise
        n_out = self.num_data * self.num_outputs
        if np.ndim(sigma):  # one noise an output: each output's own squared errors
            if self.sse_outputs is None:
                raise ValueError(
                    f"{type(self).__name__}: the per-output squared errors are unknown (a "
                    "posterior saved without them); refit to use per-output noise."
                )
            return float(
                np.sum(-0.5 * self.sse_outputs / np.square(sigma) - self.num_data * np.log(sigma))
                - 0.5 * n_out * math.log(2 * math.pi)
            )
        return -0.5 * self.sse / sigma**2 - n_out * (math.log(sigma) + 0.5 * math.log(2 * math.pi))

    def log_marginal_likelihood(self, prior_precision=None, sigma_noise=None):
        """The Laplace approximation of the evidence `log p(D | delta, sigma)`."""
        self._check_fitted()
        delta = self.prior_precision if prior_precision is None else prior_precision
        delta = self._checked_precision(delta)
        sigma = self._checked_noise(self.sigma_noise if sigma_noise is None else sigma_noise)
        eigenvalues = self._precision_eigenvalues(delta, sigma)
        quadratic, log_delta = self._prior_terms(delta)
        return (
            self.log_likelihood(sigma)
            - 0.5 * quadratic
            - 0.5 * (float(np.sum(np.log(eigenvalues))) - log_delta)
        )

    def optimize_prior_precision(self, method="marglik", val_data=None, grid=None):
        """Sets the prior precision (and, for regression by `'marglik'`, the noise) to maximize
        the evidence (`'marglik'`), or to minimize the NLL of `val_data` (`'val_nll'`, over a
        log grid). Returns the prior precision."""
        self._check_fitted()
        if method == "marglik":
            if self.likelihood == "regression":

                def objective(params):
                    return -self.log_marginal_likelihood(math.exp(params[0]), math.exp(params[1]))

                if np.ndim(self.sigma_noise):  # one noise an output: L-BFGS over K + 1 logs

                    def objective(params):
                        return -self.log_marginal_likelihood(
                            math.exp(params[0]), np.exp(params[1:])
                        )

                    start = np.r_[math.log(self.prior_precision), np.log(self.sigma_noise)]
                    result = scipy.optimize.minimize(
                        objective, start, method="L-BFGS-B", bounds=[(-12.0, 12.0)] * len(start)
                    )
                    self.prior_precision = float(math.exp(result.x[0]))
                    self.sigma_noise = np.exp(result.x[1:])
                    return self.prior_precision
                start = [math.log(self.prior_precision), math.log(self.sigma_noise)]
                result = scipy.optimize.minimize(
                    objective, start, method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-9}
                )
                self.prior_precision, self.sigma_noise = (float(v) for v in np.exp(result.x))
            else:
                result = scipy.optimize.minimize_scalar(
                    lambda log_delta: -self.log_marginal_likelihood(math.exp(log_delta)),
                    bounds=(-12.0, 12.0),
                    method="bounded",
                    options={"xatol": 1e-6},
                )
                self.prior_precision = float(math.exp(result.x))
        elif method == "val_nll":
            if val_data is None:
                raise ValueError("Laplace: method='val_nll' needs val_data.")
            grid = np.logspace(-4, 4, 41) if grid is None else np.asarray(grid, np.float64)
            x_val, y_val = arrays(val_data)
            cache = self._cache(x_val)  # the network runs once; only the posterior moves
            nlls = []
            for delta in grid:
                self.prior_precision = float(delta)
                nlls.append(self._nll(cache, y_val))
            self.prior_precision = float(grid[int(np.argmin(nlls))])
        else:
            raise ValueError(f"Laplace: method {method!r} is not 'marglik' or 'val_nll'.")
        return self.prior_precision

    # ----------------------------------------------------------------------------------------
    # Predictions.

    def _check_fitted(self):
        if not self.fitted:
            raise ValueError("Laplace: call fit(data) first.")

    def functional_variance(self, x):
        """`f* [n, K]` and the covariance of the outputs `Sigma_f [n, K, K]`."""
        self._check_fitted()
        return self._moments(self._cache(x))

    def predict(self, x, link_approx="probit", num_samples=100, seed=0):
        """The predictive of inputs `x`.

        Classification: class probabilities `[n, K]` by the probit approximation
        (`link_approx='probit'`) or a Monte Carlo average of `softmax(f)` over `num_samples`
        draws of `f ~ N(f*, Sigma_f)` (`'mc'`). Regression: `(mean, stddev)` of the Gaussian
        predictive, `stddev^2 = diag(Sigma_f) + sigma_noise^2`. Heteroscedastic regression
        (a network of `[mu, rho]` outputs a target): `(mean, stddev)` of `y = mu +
        sigma(rho) eps` (`heteroscedastic_parts`).
        """
        self._check_fitted()
        return self._predictive(self._cache(x), link_approx, num_samples, seed)

    def _predictive(self, cache, link_approx="probit", num_samples=100, seed=0):
        f, cov = self._moments(cache)
        if self.likelihood != "classification" or link_approx == "probit":
            return probit_or_gaussian(_NUMPY, self.likelihood, f, cov, self.sigma_noise)
        if link_approx == "mc":
            rng = np.random.default_rng(seed)
            chol = np.linalg.cholesky(cov + 1e-10 * np.eye(cov.shape[-1]))
            eps = rng.normal(size=(num_samples, *f.shape))
            draws = f + np.einsum("nkl,snl->snk", chol, eps)
            return np.mean(softmax(draws, -1), 0)
        raise ValueError(f"Laplace: link_approx {link_approx!r} is not 'probit' or 'mc'.")

    def nll(self, x, y):
        """Mean negative log predictive density of `(x, y)`."""
        self._check_fitted()
        return self._nll(self._cache(x), y)

    def _nll(self, cache, y):
        y = np.asarray(y)
        if self.likelihood == "classification":
            return metrics.nll(self._predictive(cache)[None], y.reshape(-1).astype(int))
        mean, stddev = self._predictive(cache)
        return metrics.nlpd(mean[None], stddev[None], y.reshape(mean.shape))


def precision_eigenvalues(ops, structure, state, prior_precision, scale):
    """The eigenvalues of `P = scale H + delta I` (flat, in the order of `theta`'s `[D+1, K]`
    for `'kron'` and `'diag'`), with `ops` NumPy or `keras.ops`."""
    if structure == "kron":
        outer = ops.outer(ops.maximum(state["values_a"], 0), ops.maximum(state["values_g"], 0))
        # A per-output scale [K] multiplies G's eigenvalues: its eigenbasis is the outputs'.
        return ops.reshape(outer * scale, [-1]) + prior_precision
    if structure == "full":
        return ops.maximum(state["values_h"], 0) * scale + prior_precision
    if np.ndim(scale):
        return ops.reshape(ops.reshape(state["diag_h"], [-1, len(scale)]) * scale, [-1]) + (
            prior_precision
        )
    return state["diag_h"] * scale + prior_precision


def probit_or_gaussian(ops, likelihood, f, cov, sigma_noise):
    """The saved predictives' last step, from the output moments `f [n, K]`, `Sigma_f [n, K, K]`:
    probit-approximated class probabilities `softmax(f / sqrt(1 + pi/8 diag(Sigma_f)))`, or a
    regression's `(mean, stddev)` with `stddev^2 = diag(Sigma_f) + sigma_noise^2`."""
    if likelihood == "heteroscedastic":
        return heteroscedastic_parts(ops, f, cov)
    variance = ops.diagonal(cov, axis1=1, axis2=2)
    if likelihood == "regression":
        return f, ops.sqrt(variance + np.square(sigma_noise))
    return ops.softmax(f / ops.sqrt(1.0 + math.pi / 8.0 * variance), axis=-1)
