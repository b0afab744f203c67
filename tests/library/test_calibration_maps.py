"""Matrix and Dirichlet scaling, histogram binning and isotonic regression against their
references on the same logits: scikit-learn's multinomial logistic regression (the same convex
likelihood), scipy's binned statistics and scikit-learn's isotonic regression (netcal itself,
in its own environment, is compared in `benchmarks/peers/calibration_compare.py`)."""

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
from scipy.special import log_softmax, softmax

from blayers import metrics
from blayers.posthoc import (
    DirichletScaling,
    HistogramBinning,
    IsotonicCalibration,
    MatrixScaling,
    TemperatureScaling,
)
from blayers.posthoc.calibration import _linear_nll, _linear_nll_hessian


def _overconfident(n=1200, k=4, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) * 2.0
    logits[np.arange(n), labels] += 2.0
    logits[:, 0] += 0.7  # a biased class: what vector and matrix scaling fix beyond a temperature
    return 3.0 * logits, labels


def _nll(probs, labels):
    return metrics.nll(probs[None], labels)


def test_odir_objective_s_gradient_matches_finite_differences():
    logits, labels = _overconfident(200, 3)
    rng = np.random.default_rng(1)
    params = np.concatenate([np.eye(3).ravel() + 0.1 * rng.normal(size=9), rng.normal(size=3)])
    error = scipy.optimize.check_grad(
        lambda p: _linear_nll(p, logits / 3, labels, 0.7, 0.3)[0],
        lambda p: _linear_nll(p, logits / 3, labels, 0.7, 0.3)[1],
        params,
    )
    assert error < 1e-5


def test_odir_objective_s_hessian_matches_finite_differences_of_its_gradient():
    logits, labels = _overconfident(200, 3)
    rng = np.random.default_rng(2)
    params = np.concatenate([np.eye(3).ravel() + 0.1 * rng.normal(size=9), rng.normal(size=3)])
    gradient = lambda p: _linear_nll(p, logits / 3, labels, 0.7, 0.3)[1]
    step = 1e-6
    numeric = np.stack(
        [
            (gradient(params + step * e) - gradient(params - step * e)) / (2 * step)
            for e in np.eye(12)
        ]
    )
    np.testing.assert_allclose(
        _linear_nll_hessian(params, logits / 3, labels, 0.7, 0.3), numeric, atol=1e-7
    )


def test_cross_validation_scores_each_penalty_s_optimum_on_nearly_separable_data():
    """Logits that nearly separate the calibration labels (a logistic regression's on
    scikit-learn's digits) put a weak penalty's optimum far out: a fit stopped early is
    regularized by the stop, and cross-validation ranked such fits above the optimum it then
    kept (it chose the weakest penalty, which more than doubles the held-out NLL here). Each
    candidate's fit is the penalized optimum (zero gradient), and the choice is the candidate
    whose optima score best on the held-out folds."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    digits = load_digits()
    x, y = digits.data / 16.0, digits.target
    network = LogisticRegression(C=0.1, max_iter=2000).fit(x[:1200], y[:1200])
    logits, labels = network.decision_function(x[1200:1500]), y[1200:1500]
    test_logits, test_labels = network.decision_function(x[1500:]), y[1500:]
    for value in (1e-4, 1.0):
        params = MatrixScaling._fit_params(logits, labels, value, value)
        assert np.max(np.abs(_linear_nll(params, logits, labels, value, value)[1])) < 1e-7
    scaler = MatrixScaling().fit(logits, labels)
    order = np.random.default_rng(0).permutation(len(labels))
    scores = {}
    for value in scaler.grid:
        scores[value] = 0.0
        for part in np.array_split(order, 5):
            train = np.setdiff1d(order, part)
            params = MatrixScaling._fit_params(logits[train], labels[train], value, value)
            scores[value] += _linear_nll(params, logits[part], labels[part], 0, 0)[0]
    assert scaler.chosen_off_diagonal == min(scores, key=scores.get) > scaler.grid[0]
    weakest = MatrixScaling(off_diagonal=scaler.grid[0]).fit(logits, labels)
    chosen_nll = _nll(scaler.predict_proba(test_logits), test_labels)
    assert chosen_nll < 0.5 * _nll(weakest.predict_proba(test_logits), test_labels)


@pytest.mark.parametrize("cls", [MatrixScaling, DirichletScaling])
def test_unregularized_maps_reach_logistic_regression_s_optimum(cls):
    """Without ODIR both are multinomial logistic regression on the logits (matrix) or the
    log-probabilities (Dirichlet): scikit-learn's unpenalized fit is the same optimum."""
    from sklearn.linear_model import LogisticRegression

    logits, labels = _overconfident()
    ours = cls(off_diagonal=0.0, bias=0.0).fit(logits, labels)
    features = logits if cls is MatrixScaling else log_softmax(logits, -1)
    reference = LogisticRegression(C=np.inf, max_iter=10000, tol=1e-12).fit(features, labels)
    ours_nll = _nll(ours.predict_proba(logits), labels)
    reference_nll = _nll(reference.predict_proba(features), labels)
    assert ours_nll == pytest.approx(reference_nll, abs=1e-6)
    np.testing.assert_allclose(
        ours.predict_proba(logits), reference.predict_proba(features), atol=2e-3
    )


def test_strong_odir_shrinks_matrix_scaling_to_vector_scaling():
    logits, labels = _overconfident()
    odir = MatrixScaling(off_diagonal=1e6, bias=0.0).fit(logits, labels)
    off_diagonal = odir.matrix[~np.eye(4, dtype=bool)]
    assert np.max(np.abs(off_diagonal)) < 1e-4
    vector = TemperatureScaling(vector=True).fit(logits, labels)
    assert _nll(odir.predict_proba(logits), labels) == pytest.approx(
        _nll(vector.predict_proba(logits), labels), abs=1e-4
    )


def test_cross_validated_maps_improve_held_out_nll_of_an_overconfident_model():
    logits, labels = _overconfident(2000)
    cal, ev = slice(0, 1000), slice(1000, None)
    base = _nll(softmax(logits[ev], -1), labels[ev])
    for cls in (MatrixScaling, DirichletScaling):
        scaler = cls().fit(logits[cal], labels[cal])
        assert scaler.chosen_off_diagonal in scaler.grid
        assert _nll(scaler.predict_proba(logits[ev]), labels[ev]) < 0.7 * base
        restored = cls.from_config(scaler.get_config())
        np.testing.assert_array_equal(restored.predict_proba(logits), scaler.predict_proba(logits))
    for scaler in (HistogramBinning(), IsotonicCalibration()):
        scaler.fit(logits[cal], labels[cal])
        probs = scaler.predict_proba(logits[ev])
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12)
        assert np.all(probs > 0)  # the floor: a finite NLL everywhere
        assert _nll(probs, labels[ev]) < 0.7 * base


def test_histogram_binning_is_the_one_vs_rest_bin_frequency_renormalized():
    logits, labels = _overconfident(600, 3)
    probs = softmax(logits, -1)
    ours = HistogramBinning(num_bins=10, prior_strength=0.0, floor=0.0).fit(logits, labels)
    edges = np.linspace(0, 1, 11)
    expected = np.empty_like(probs)
    for k in range(3):
        freq, _, _ = scipy.stats.binned_statistic(
            probs[:, k], (labels == k).astype(float), "mean", bins=edges
        )
        centres = (edges[:-1] + edges[1:]) / 2
        freq = np.where(np.isnan(freq), centres, freq)  # empty bins keep their centre
        index = np.clip(np.digitize(probs[:, k], edges, right=True) - 1, 0, 9)
        expected[:, k] = freq[index]
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(ours.predict_proba(logits), expected, atol=1e-12)
    # Shrinkage: a bin's value moves from its frequency towards its mean confidence.
    shrunk = HistogramBinning(prior_strength=50.0, floor=0.0).fit(logits, labels)
    raw = ours.maps[0]
    assert np.all(np.abs(shrunk.maps[0] - raw) <= np.abs(raw - shrunk.maps[0]) + 1e-12)
    assert not np.allclose(shrunk.maps[0], raw)


def test_isotonic_calibration_is_scikit_learn_s_fit_per_class_renormalized():
    from sklearn.isotonic import IsotonicRegression

    logits, labels = _overconfident(600, 3)
    probs = softmax(logits, -1)
    ours = IsotonicCalibration(floor=0.0).fit(logits[:400], labels[:400])
    expected = np.stack(
        [
            IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip")
            .fit(probs[:400, k], labels[:400] == k)
            .predict(probs[400:, k])
            for k in range(3)
        ],
        -1,
    )
    keep = expected.sum(-1) > 0
    expected[keep] /= expected[keep].sum(-1, keepdims=True)
    np.testing.assert_allclose(ours.predict_proba(logits[400:])[keep], expected[keep], atol=1e-12)
    for k in range(3):  # each class's map is non-decreasing in its probability
        grid = np.linspace(0, 1, 101)
        assert np.all(np.diff(ours.maps[k].predict(grid)) >= 0)


def test_maps_refuse_bad_input():
    with pytest.raises(ValueError, match=r"MatrixScaling.fit: logits must be \[n, K\]"):
        MatrixScaling().fit(np.zeros(5), np.zeros(5))
    with pytest.raises(ValueError, match="not all finite"):
        DirichletScaling().fit(np.array([[-np.inf, 0.0]]), np.array([1]))
    with pytest.raises(ValueError, match="labels must lie in"):
        HistogramBinning().fit(np.zeros((3, 2)), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="off_diagonal must be 'cv' or >= 0"):
        MatrixScaling(off_diagonal=-1.0)
    with pytest.raises(ValueError, match="call fit"):
        IsotonicCalibration().predict_proba(np.zeros((2, 2)))
