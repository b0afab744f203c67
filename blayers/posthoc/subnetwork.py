"""Subnetwork Laplace (Daxberger et al., 2021, "Bayesian Deep Learning via Subnetwork
Inference"): a full-covariance Laplace approximation over a few of a trained network's weights,
every other weight at its trained value.

The subnetwork `S` is the `num_weights` weights of largest marginal posterior variance under a
diagonal Laplace over every dense and convolutional layer (the paper's "largest variance"
selection), or the flat indices a user gives (in the order of `AllWeightsLaplace`'s weights:
layer by layer, each `[W; b]` row-major). Its posterior is `N(theta*_S, (H_S + delta I)^-1)`
with `H_S = sum_n J_nS^T Lambda_n J_nS` the generalized Gauss-Newton matrix of the subnetwork
(`J_nS` the output Jacobian in its weights), and the predictive is the linearized network's,
`f(x) ~ N(f*(x), J_S P_S^-1 J_S^T)`, probit or Monte Carlo for classification.
"""

import numpy as np

from blayers.posthoc.all_weights import AllWeightsLaplace
from blayers.posthoc.batches import batches, input_batches
from blayers.posthoc.laplace_base import _LaplaceBase

__all__ = ["SubnetworkLaplace"]


class SubnetworkLaplace(_LaplaceBase):
    """A full-covariance Laplace over a subnetwork of a trained Keras model (module docstring).

    Args:
      model: as `AllWeightsLaplace` takes it (its last layer dense and linear).
      likelihood: `'classification'` or `'regression'`.
      num_weights: the subnetwork's size when `indices` is None.
      indices: flat indices of the weights to keep (None: the largest marginal variances).
      prior_precision: `delta` of the prior `N(0, I / delta)`; the diagonal Laplace that selects
        the subnetwork uses it too.
      sigma_noise: the regression's noise standard deviation.
      exclude: layer names left out (at their trained values, never selected).
    """

    structures = ("full",)

    def __init__(
        self,
        model,
        likelihood="classification",
        num_weights=1000,
        indices=None,
        prior_precision=1.0,
        sigma_noise=1.0,
        exclude=(),
    ):
        self._init_common(likelihood, "full", prior_precision, sigma_noise, "float64")
        self.model = model
        self._network = AllWeightsLaplace(
            model, likelihood, "diag", prior_precision, sigma_noise, exclude=exclude
        )
        self.num_weights = int(num_weights)
        # Ascending (the Jacobian's columns come block by block, in weight order).
        self.indices = None if indices is None else np.unique(np.asarray(indices, int))
        if self.indices is None and self.num_weights < 1:
            raise ValueError(f"SubnetworkLaplace: num_weights must be >= 1, got {num_weights}.")

    def _jacobian(self, x):
        """`f* [n, K]` and the output Jacobian in the subnetwork's weights `[n, K, S]`."""
        f, parts = self._network._forward(x)
        columns = []
        for (a, g), (block, local) in zip(parts, self._by_block, strict=True):
            if not len(local):
                continue
            rows, outs = np.unravel_index(local, block)
            # d f_k / d Theta[i, o] = sum_t a[t, i] g[k, t, o]
            columns.append(np.einsum("nts,nkts->nks", a[:, :, rows], g[:, :, :, outs]))
        return f, np.concatenate(columns, -1)

    def fit(self, data, batch_size=256, progress=False):
        """Selects the subnetwork (a diagonal Laplace pass over `data`, unless `indices` were
        given), then accumulates its full GGN over `data`. Returns `self`."""
        network = self._network
        if self.indices is None:
            network.fit(data, batch_size, progress)
            variance = 1.0 / network._precision_eigenvalues(self.prior_precision, self.sigma_noise)
            count = min(self.num_weights, variance.size)
            self.indices = np.sort(np.argsort(-variance, kind="stable")[:count])
        else:
            network.thetas = [block.weights() for block in network.blocks]
        shapes = [theta.shape for theta in network.thetas]
        sizes = np.cumsum([0, *[int(np.prod(s)) for s in shapes]])
        if self.indices.size == 0 or self.indices.min() < 0 or self.indices.max() >= sizes[-1]:
            raise ValueError(
                f"SubnetworkLaplace: indices must be non-empty flat weight indices in "
                f"[0, {sizes[-1]})."
            )
        self._by_block = [
            (shape, self.indices[(self.indices >= lo) & (self.indices < hi)] - lo)
            for shape, lo, hi in zip(shapes, sizes[:-1], sizes[1:], strict=True)
        ]
        self.theta = np.concatenate([t.reshape(-1) for t in network.thetas])[self.indices]
        hessian = np.zeros((self.indices.size, self.indices.size))
        self._start_fit()
        for x, y in batches(data, batch_size):
            f, jacobian = self._jacobian(x)
            # J^T Lambda J as a curvature product then one GEMM: the three-operand einsum ran
            # as one loop over n K^2 S^2 terms (seconds a batch for a few hundred weights).
            weighted = np.einsum("nkl,nlr->nkr", self._output_curvature(f), jacobian)
            size = jacobian.shape[-1]
            hessian += jacobian.reshape(-1, size).T @ weighted.reshape(-1, size)
            self._accumulate_fit(f, np.asarray(y))
            self.num_data += len(f)
        if self.num_data == 0:
            raise ValueError("SubnetworkLaplace.fit: the data held no examples.")
        self.num_outputs = f.shape[1]
        self._eig_h = np.linalg.eigh((hessian + hessian.T) / 2)
        self.fitted = True
        return self

    def _map_vector(self):
        return self.theta

    def _precision_eigenvalues(self, prior_precision, sigma_noise):
        return np.maximum(self._eig_h[0], 0) * self._curvature_scale(sigma_noise) + prior_precision

    def _cache(self, x, batch_size=256):
        fs, jacobians = [], []
        for batch in input_batches(x, batch_size):
            f, jacobian = self._jacobian(batch)
            fs.append(f)
            jacobians.append(jacobian)
        return np.concatenate(fs), np.concatenate(jacobians)

    def _moments(self, cache):
        f, jacobian = cache
        u = self._eig_h[1]
        inverse = 1.0 / self._precision_eigenvalues(self.prior_precision, self.sigma_noise)
        rotated = jacobian @ u  # [n, K, S] in the precision's eigenbasis
        return f, np.einsum("nks,s,nls->nkl", rotated, inverse, rotated, optimize=True)
