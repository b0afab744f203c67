"""Split conformal prediction against MAPIE on the same predictions: MAPIE wraps a fixed
predictor (the probabilities or means given by index), so both libraries see identical scores
and must return identical sets and intervals."""

import mapie.classification as mapie_classification
import mapie.regression as mapie_regression
import numpy as np
import pytest
from scipy.special import softmax
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from blayers.posthoc import SplitConformalClassifier, SplitConformalRegressor


class _FixedClassifier(ClassifierMixin, BaseEstimator):
    """`predict_proba(X)` = the given probabilities of rows `X[:, 0]`."""

    def __init__(self, probs):
        self.probs = probs

    def fit(self, x, y):
        self.classes_ = np.arange(self.probs.shape[1])
        return self

    def predict_proba(self, x):
        return self.probs[np.asarray(x)[:, 0].astype(int)]

    def predict(self, x):
        return self.predict_proba(x).argmax(1)


class _FixedRegressor(RegressorMixin, BaseEstimator):
    def __init__(self, means):
        self.means = means

    def fit(self, x, y):
        self.n_features_in_ = 1
        return self

    def predict(self, x):
        return self.means[np.asarray(x)[:, 0].astype(int)]


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_lac_sets_are_mapie_s(alpha):
    rng = np.random.default_rng(0)
    n, k = 700, 6
    logits = rng.normal(size=(n, k)) * 2.0
    probs = softmax(logits, -1)
    labels = np.array([rng.choice(k, p=p) for p in probs])
    index = np.arange(n)[:, None]
    cal, test = slice(0, 400), slice(400, n)
    ours = SplitConformalClassifier(alpha=alpha, method="lac").fit(probs[cal], labels[cal])
    estimator = _FixedClassifier(probs).fit(index, labels)
    theirs = mapie_classification.SplitConformalClassifier(
        estimator, confidence_level=1 - alpha, conformity_score="lac", prefit=True
    )
    theirs.conformalize(index[cal], labels[cal])
    _, sets = theirs.predict_set(index[test])
    np.testing.assert_array_equal(ours.predict_set(probs[test]), sets[:, :, 0])


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_absolute_residual_intervals_are_mapie_s(alpha):
    rng = np.random.default_rng(1)
    n = 600
    means = rng.normal(size=n)
    targets = means + rng.standard_t(4, size=n)
    index = np.arange(n)[:, None]
    cal, test = slice(0, 350), slice(350, n)
    ours = SplitConformalRegressor(alpha=alpha).fit(means[cal], targets[cal])
    estimator = _FixedRegressor(means).fit(index, targets)
    theirs = mapie_regression.SplitConformalRegressor(
        estimator, confidence_level=1 - alpha, conformity_score="absolute", prefit=True
    )
    theirs.conformalize(index[cal], targets[cal])
    _, intervals = theirs.predict_interval(index[test])
    lower, upper = ours.predict_interval(means[test])
    np.testing.assert_allclose(lower, intervals[:, 0, 0], rtol=1e-10)
    np.testing.assert_allclose(upper, intervals[:, 1, 0], rtol=1e-10)


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_randomized_aps_sets_are_mapie_s_given_the_same_uniforms(alpha):
    """Romano et al.'s randomized APS: MAPIE keeps the label that crosses the threshold when
    `u >= V = (cumsum - q) / p`; blayers scores every label `cumsum - u p` against `q`. The two
    rules agree given the same `u`, so with MAPIE's draws (a fresh `RandomState(seed)` at
    calibration and again at prediction) the sets must be identical, empty sets included."""
    seed = 3
    rng = np.random.default_rng(2)
    n, k = 900, 8
    probs = softmax(rng.normal(size=(n, k)) * 4.0, -1)  # confident: some sets come out empty
    labels = np.array([rng.choice(k, p=p) for p in probs])
    index = np.arange(n)[:, None]
    cal, test = slice(0, 500), slice(500, n)
    ours = SplitConformalClassifier(alpha=alpha, method="aps", randomized=True)
    ours._rng = np.random.RandomState(seed)  # MAPIE's generator, in place of blayers' own
    ours.fit(probs[cal], labels[cal])
    ours._rng = np.random.RandomState(seed)
    our_sets = ours.predict_set(probs[test])
    estimator = _FixedClassifier(probs).fit(index, labels)
    theirs = mapie_classification.SplitConformalClassifier(
        estimator,
        confidence_level=1 - alpha,
        conformity_score="aps",
        prefit=True,
        random_state=seed,
    )
    theirs.conformalize(index[cal], labels[cal])
    _, sets = theirs.predict_set(
        index[test], conformity_score_params={"include_last_label": "randomized"}
    )
    np.testing.assert_allclose(
        ours.quantile, theirs._mapie_classifier.conformity_score_function_.quantiles_[0]
    )
    np.testing.assert_array_equal(our_sets, sets[:, :, 0])
    assert (our_sets.sum(1) == 0).any()  # empty sets occur, and match too


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_raps_sets_are_mapie_s_given_its_tuned_penalty_and_calibration_part(alpha):
    """RAPS (Angelopoulos et al., 2021). MAPIE tunes `k_star` and `lambda_star` on a held-out
    stratified tenth of the calibration set (its `size_raps` is overwritten by
    `set_external_attributes`, so the default `StratifiedShuffleSplit` test size applies) and
    calibrates on the rest; blayers takes `k_reg` and `lam` as given. Given MAPIE's values, its
    calibration part (in its order) and its uniforms, the threshold and the sets must be
    identical."""
    from mapie.conformity_scores import RAPSConformityScore
    from sklearn.model_selection import StratifiedShuffleSplit

    seed = 3
    rng = np.random.default_rng(2)
    n, k = 1500, 8
    probs = softmax(rng.normal(size=(n, k)) * 2.0, -1)
    labels = np.array([rng.choice(k, p=p) for p in probs])
    index = np.arange(n)[:, None]
    cal, test = slice(0, 1000), slice(1000, n)
    theirs = mapie_classification.SplitConformalClassifier(
        _FixedClassifier(probs).fit(index, labels),
        confidence_level=1 - alpha,
        conformity_score=RAPSConformityScore(),
        prefit=True,
        random_state=seed,
    )
    theirs.conformalize(index[cal], labels[cal])
    _, sets = theirs.predict_set(
        index[test], conformity_score_params={"include_last_label": "randomized"}
    )
    score = theirs._mapie_classifier.conformity_score_function_
    part, held_out = next(
        StratifiedShuffleSplit(n_splits=1, random_state=seed).split(index[cal], labels[cal])
    )
    np.testing.assert_array_equal(score.X_raps[:, 0], index[cal][held_out, 0])
    k_star, lambda_star = int(np.ravel(score.k_star)[0]), float(np.ravel(score.lambda_star)[0])
    assert 1 <= k_star < k and lambda_star > 0  # the penalty is in play

    def calibrated(method, **kwargs):
        ours = SplitConformalClassifier(alpha=alpha, method=method, randomized=True, **kwargs)
        ours._rng = np.random.RandomState(seed)  # MAPIE's generator, in place of blayers' own
        ours.fit(probs[cal][part], labels[cal][part])
        ours._rng = np.random.RandomState(seed)
        return ours, ours.predict_set(probs[test])

    ours, our_sets = calibrated("raps", k_reg=k_star, lam=lambda_star)
    np.testing.assert_allclose(ours.quantile, score.quantiles_[0])
    np.testing.assert_array_equal(our_sets, sets[:, :, 0])
    _, aps_sets = calibrated("aps")
    assert (aps_sets != our_sets).any()  # the penalty changes sets, so the check can fail


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_cqr_intervals_are_mapie_s(alpha, symmetric):
    """Conformalized quantile regression on the same lower, upper (and, for MAPIE, median)
    quantile predictions: identical intervals, with one correction for both ends or one each
    (MAPIE's `symmetric_correction`)."""
    from blayers.posthoc import ConformalizedQuantileRegressor

    rng = np.random.default_rng(4)
    n = 800
    x = rng.uniform(-2, 2, n)
    targets = np.sin(x) + (0.2 + 0.3 * np.abs(x)) * rng.normal(size=n)
    lower, upper = np.sin(x) - 0.4 * (1 + np.abs(x)), np.sin(x) + 0.3 * (1 + np.abs(x))
    index = np.arange(n)[:, None]
    cal, test = slice(0, 500), slice(500, n)
    ours = ConformalizedQuantileRegressor(alpha=alpha, symmetric=symmetric)
    ours.fit(lower[cal], upper[cal], targets[cal])
    estimators = [
        _FixedRegressor(v).fit(index, targets) for v in (lower, upper, (lower + upper) / 2)
    ]
    theirs = mapie_regression.ConformalizedQuantileRegressor(
        estimators, confidence_level=1 - alpha, prefit=True
    )
    theirs.conformalize(index[cal], targets[cal])
    _, intervals = theirs.predict_interval(index[test], symmetric_correction=symmetric)
    our_lower, our_upper = ours.predict_interval(lower[test], upper[test])
    np.testing.assert_allclose(our_lower, intervals[:, 0, 0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(our_upper, intervals[:, 1, 0], rtol=1e-10, atol=1e-12)
    # Adaptive: wider where the quantiles are wide, and covering on held-out data.
    inside = (targets[test] >= our_lower) & (targets[test] <= our_upper)
    assert abs(inside.mean() - (1 - alpha)) < 4 * np.sqrt(alpha * (1 - alpha) / 300) + 1 / 501


@pytest.mark.parametrize("method", ["plus", "minmax"])
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_cv_plus_intervals_are_mapie_s(method, alpha):
    """CV+ and CV-minmax from K ridge models, each trained without its fold: blayers
    aggregates the same folds' predictions MAPIE's CrossConformalRegressor makes itself."""
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import KFold

    from blayers.posthoc import CrossConformalRegressor

    rng = np.random.default_rng(5)
    n, d, k = 300, 4, 5
    x = rng.normal(size=(n, d))
    y = x @ rng.normal(size=d) + rng.standard_t(3, size=n)
    x_test = rng.normal(size=(60, d))
    folds = np.empty(n, int)
    out_of_fold = np.empty(n)
    fold_predictions = []
    cv = KFold(k)
    for fold, (train, held_out) in enumerate(cv.split(x)):
        model = Ridge(alpha=1.0).fit(x[train], y[train])
        folds[held_out] = fold
        out_of_fold[held_out] = model.predict(x[held_out])
        fold_predictions.append(model.predict(x_test))
    ours = CrossConformalRegressor(alpha=alpha, method=method).fit(out_of_fold, y, folds)
    lower, upper = ours.predict_interval(np.stack(fold_predictions))
    theirs = mapie_regression.CrossConformalRegressor(
        Ridge(alpha=1.0), confidence_level=1 - alpha, method=method, cv=cv
    )
    theirs.fit_conformalize(x, y)
    _, intervals = theirs.predict_interval(x_test)
    np.testing.assert_allclose(lower, intervals[:, 0, 0], rtol=1e-9)
    np.testing.assert_allclose(upper, intervals[:, 1, 0], rtol=1e-9)
