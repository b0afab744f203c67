"""Mahalanobis and DDU feature-density OOD scores against scikit-learn's covariance estimator
and scipy's Gaussian densities, and on a trained network's features."""

import keras
import numpy as np
import pytest
import scipy.stats
from conftest import epochs_of
from scipy.special import logsumexp
from sklearn.covariance import EmpiricalCovariance

from blayers.posthoc.feature_density import (
    FeatureDensity,
    MahalanobisScore,
    feature_ood_scores,
    penultimate_features,
)


def _clusters(n=600, d=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centres = rng.normal(size=(classes, d)) * 4
    mixing = rng.normal(size=(d, d)) / np.sqrt(d) + np.eye(d)
    return centres[labels] + rng.normal(size=(n, d)) @ mixing, labels


def test_mahalanobis_is_the_tied_covariance_distance_to_the_nearest_mean():
    features, labels = _clusters()
    ours = MahalanobisScore(jitter=0.0).fit(features, labels)
    means = np.stack([features[labels == c].mean(0) for c in range(3)])
    centred = features - means[labels]
    reference = EmpiricalCovariance(assume_centered=True).fit(centred)
    test = np.random.default_rng(1).normal(size=(50, 5)) * 5
    expected = np.stack([reference.mahalanobis(test - m) for m in means], -1)
    np.testing.assert_allclose(ours.distances(test), expected, rtol=1e-9)
    np.testing.assert_allclose(ours.score(test), expected.min(-1), rtol=1e-9)


def test_feature_density_is_the_class_mixture_of_gaussians():
    features, labels = _clusters()
    ours = FeatureDensity(jitter=0.0).fit(features, labels)
    test = np.random.default_rng(2).normal(size=(40, 5)) * 3
    columns = []
    for c in range(3):
        part = features[labels == c]
        normal = scipy.stats.multivariate_normal(part.mean(0), np.cov(part, rowvar=False))
        columns.append(np.log(np.mean(labels == c)) + normal.logpdf(test))
    np.testing.assert_allclose(ours.log_density(test), logsumexp(columns, axis=0), rtol=1e-9)
    np.testing.assert_allclose(ours.score(test), -ours.log_density(test))


def test_a_rank_deficient_class_gets_jitter_not_an_error():
    features, labels = _clusters(d=4)
    features = np.concatenate([features, features[:, :1]], 1)  # a repeated feature: rank 4
    density = FeatureDensity().fit(features, labels)
    assert np.all(np.isfinite(density.score(features)))
    assert np.all(np.isfinite(MahalanobisScore().fit(features, labels).score(features)))
    with pytest.raises(ValueError, match=r"features must be \[n, d\]"):
        FeatureDensity().fit(features[:, 0], labels)


def test_feature_scores_separate_far_inputs_on_a_trained_network():
    features, labels = _clusters(n=900, d=8, classes=3)
    features = features.astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(epochs_of(features, labels, 20), verbose=0)
    assert penultimate_features(model, features[:7]).shape == (7, 16)
    far = (np.random.default_rng(3).normal(size=(300, 8)) * 30).astype("float32")
    scores = feature_ood_scores(model, (features[:600], labels[:600]), features[600:], far)
    from sklearn.metrics import roc_auc_score

    for name in ("mahalanobis", "feature_density"):
        inside, outside = scores[name]
        auroc = roc_auc_score(np.r_[np.zeros(300), np.ones(300)], np.r_[inside, outside])
        assert auroc > 0.95, name

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    assert feature_ood_scores(Subclassed(), (features, labels), features, far) == {}


def test_an_efficient_ensemble_s_member_major_features_are_averaged():
    """BatchEnsemble's layers tile the batch by member: the features are each input's members'
    mean, one row an input."""
    from blayers.layers import DenseBatchEnsemble, EnsembleTile

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(30, 4)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            EnsembleTile(3),
            DenseBatchEnsemble(8, ensemble_size=3, activation="relu"),
            DenseBatchEnsemble(2, ensemble_size=3),
        ]
    )
    features = penultimate_features(model, x, batch_size=7)
    assert features.shape == (30, 8)
    members = keras.ops.convert_to_numpy(model.layers[1](model.layers[0](x))).reshape(3, 30, 8)
    np.testing.assert_allclose(features, members.mean(0), rtol=1e-5, atol=1e-6)
