"""`--method=laplace`: a Laplace approximation around the run's MAP (Daxberger et al., 2021)."""

import numbers

import numpy as np

from blayers import posthoc as library
from blayers.lab.posthoc_methods import Method


def _nlls(predictive, targets):
    """Per-example `-log p(y)` of class probabilities `[n, K]`, or of a Gaussian predictive's
    `(mean, stddev)` (summed over the target's dimensions)."""
    if isinstance(predictive, tuple):
        mean, stddev = predictive
        z = (targets.reshape(mean.shape) - mean) / stddev
        return np.sum(0.5 * z**2 + np.log(stddev) + 0.5 * np.log(2 * np.pi), -1)
    labels = targets.astype(int)
    return -np.log(np.maximum(predictive[np.arange(len(labels)), labels], 1e-300))


class Laplace(Method):
    """A Gaussian posterior over the last layer's weights (or all of them) with the
    generalized Gauss-Newton curvature of the training set, and its probit predictive; for a
    regression run, the heteroscedastic Gaussian's (a network of a mean and a raw scale a
    target, the regression task's layout) and its Gaussian predictive.

    The prior precision `delta` of `N(0, I / delta)`: by default (`'auto'`) the evidence's
    optimum, checked on the calibration part against the precision that minimizes that part's
    NLL: when the evidence's predictive is worse there by more than two standard errors of the
    paired per-example difference, the held-out choice is used (and `notes` says which was
    chosen and why). The evidence is only right for a network trained as the MAP of a Gaussian
    prior (weight decay; `mlp.prior_precision`): a network trained without one is not the mode
    of any such posterior, and its evidence optimum is often far too wide.

    Args:
      prior_precision: `'auto'`, `'marglik'` (the evidence), `'val_nll'` (the calibration
        part's NLL over a log grid) or a number.
      hessian_structure: `'kron'`, `'full'` or `'diag'` (a subnetwork's is full).
      subset_of_weights: `'last_layer'`, `'all'` or `'subnetwork'` (`SubnetworkLaplace`: a
        full covariance over the `num_weights` weights of largest diagonal-Laplace variance).
      num_weights: the subnetwork's size.
      link_approx: `'probit'` or `'mc'`.
    """

    name, label = "laplace", "last-layer Laplace (KFAC)"
    needs_deterministic = "linearizes a deterministic network at its MAP"

    def __init__(
        self,
        prior_precision="auto",
        hessian_structure="kron",
        subset_of_weights="last_layer",
        link_approx="probit",
        num_weights=1000,
    ):
        super().__init__()
        if not isinstance(prior_precision, numbers.Real) and prior_precision not in (
            "auto",
            "marglik",
            "val_nll",
        ):
            raise ValueError(
                "Laplace.prior_precision must be 'auto', 'marglik', 'val_nll' or a number, got "
                f"{prior_precision!r}."
            )
        self.prior_precision, self.link_approx = prior_precision, link_approx
        self.settings = {
            "hessian_structure": hessian_structure,
            "subset_of_weights": subset_of_weights,
        }
        self.num_weights = num_weights
        if subset_of_weights == "subnetwork":
            self.label = f"subnetwork Laplace ({num_weights} weights)"
        elif subset_of_weights == "all":
            self.label = f"all-weights Laplace ({hessian_structure})"
        elif hessian_structure != "kron":
            self.label = f"last-layer Laplace ({hessian_structure})"

    def fit(self, fit):
        likelihood = "classification" if fit.classification else "heteroscedastic"
        if self.settings["subset_of_weights"] == "subnetwork":
            laplace = library.SubnetworkLaplace(fit.model, likelihood, num_weights=self.num_weights)
        else:
            laplace = library.Laplace(fit.model, likelihood, **self.settings)
        laplace.fit(fit.data.train.batch(fit.learner.eval_batch_size))
        self.laplace = laplace
        x_cal, y_cal = fit.x[fit.calibration], fit.y[fit.calibration]
        if isinstance(self.prior_precision, numbers.Real):
            laplace.prior_precision = float(self.prior_precision)
            self.choice = "given"
            return
        if self.prior_precision in ("marglik", "val_nll"):
            laplace.optimize_prior_precision(self.prior_precision, val_data=(x_cal, y_cal))
            self.choice = self.prior_precision
            return
        evidence = laplace.optimize_prior_precision("marglik")
        nll_evidence = _nlls(laplace.predict(x_cal, self.link_approx), y_cal)
        held_out = laplace.optimize_prior_precision("val_nll", val_data=(x_cal, y_cal))
        nll_held_out = _nlls(laplace.predict(x_cal, self.link_approx), y_cal)
        difference = nll_evidence - nll_held_out
        se = float(np.std(difference, ddof=1) / np.sqrt(len(difference)))
        worse = float(np.mean(difference))
        if worse > 2.0 * se:
            self.choice = "val_nll"
            self.note(
                f"Laplace: prior precision {held_out:.3g} by the calibration part's NLL: the "
                f"evidence's optimum {evidence:.3g} gives an NLL {worse:.3g} higher there "
                f"(more than 2 standard errors, {se:.2g}): the evidence's posterior is too "
                "wide for this network's predictive."
            )
        else:
            laplace.prior_precision = evidence
            self.choice = "marglik"
            self.note(
                f"Laplace: prior precision {evidence:.3g} by the evidence; on the calibration "
                f"part its NLL is within 2 standard errors of the best precision's "
                f"({held_out:.3g}): {worse:.3g} higher, standard error {se:.2g}."
            )

    def predictive(self, fit):
        predictive = self.laplace.predict(fit.inputs.x, self.link_approx)
        if isinstance(predictive, tuple):  # regression: the task's means and stddevs
            return [part[None] for part in predictive]
        return [predictive[None]]

    def metrics(self, fit):
        return {
            "prior_precision": float(self.laplace.prior_precision),
            "prior_precision_by_evidence": float(self.choice == "marglik"),
        }
