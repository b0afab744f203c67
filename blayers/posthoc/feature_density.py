"""Out-of-distribution scores from a classifier's penultimate features: the Mahalanobis distance
to the nearest class mean under a shared covariance (Lee et al., 2018, "A Simple Unified
Framework for Detecting Out-of-Distribution Samples and Adversarial Attacks") and the feature
density of a Gaussian discriminant analysis with one covariance a class (Mukhoti et al., 2023,
"Deep Deterministic Uncertainty: A New Simple Baseline", DDU).

Both are fitted on the training set's features and labels; `score(features)` is higher for
inputs that look out of distribution, as `blayers.metrics.ood_scores`.
"""

import weakref

import keras
import numpy as np
import tensorflow as tf
from scipy.special import logsumexp

from blayers import pipelines

__all__ = ["FeatureDensity", "MahalanobisScore", "feature_ood_scores", "penultimate_features"]


def _check(name, features, labels):
    features = np.asarray(features, np.float64)
    labels = np.asarray(labels).reshape(-1).astype(int)
    if features.ndim != 2 or labels.shape != features.shape[:1]:
        raise ValueError(
            f"{name}.fit: features must be [n, d] and labels [n]; got {features.shape} and "
            f"{labels.shape}."
        )
    return features, labels


class MahalanobisScore:
    """`min_c (f - mu_c)^T Sigma^{-1} (f - mu_c)`: class means `mu_c` and one covariance
    `Sigma = 1/n sum_i (f_i - mu_{y_i})(f_i - mu_{y_i})^T` of the training features (Lee et al.,
    2018), `jitter` times the mean variance added to its diagonal.

    Args:
      jitter: relative diagonal regularization (features of ReLU networks are often rank
        deficient).
    """

    def __init__(self, jitter=1e-6):
        self.jitter = float(jitter)
        self.means = self.precision = None

    def fit(self, features, labels):
        features, labels = _check(type(self).__name__, features, labels)
        classes = np.unique(labels)
        self.classes = classes
        self.means = np.stack([features[labels == c].mean(0) for c in classes])
        centred = features - self.means[np.searchsorted(classes, labels)]
        covariance = centred.T @ centred / len(features)
        covariance += (
            self.jitter
            * max(np.trace(covariance) / len(covariance), 1e-12)
            * np.eye(len(covariance))
        )
        self.precision = np.linalg.inv(covariance)
        return self

    def distances(self, features):
        """Squared Mahalanobis distances to every class mean `[n, C]`."""
        if self.means is None:
            raise ValueError(f"{type(self).__name__}: call fit(features, labels) first.")
        features = np.asarray(features, np.float64)
        projected = features @ self.precision  # (f - mu)^T P (f - mu), without an [n, C, d]
        own = np.sum(projected * features, -1)
        means = np.sum((self.means @ self.precision) * self.means, -1)
        return np.maximum(own[:, None] - 2.0 * projected @ self.means.T + means[None], 0.0)

    def score(self, features):
        """The OOD score: the distance to the nearest class mean."""
        return self.distances(features).min(-1)


class FeatureDensity:
    """`log q(f) = log sum_c pi_c N(f; mu_c, Sigma_c)`: a Gaussian discriminant analysis of the
    training features, one mean and (unbiased) covariance a class and class frequencies
    `pi_c` (DDU, Mukhoti et al., 2023); the OOD score is `-log q(f)`.

    Args:
      jitter: the smallest relative diagonal regularization; it grows tenfold until every
        class covariance has a Cholesky factor (DDU's own fallback).
    """

    def __init__(self, jitter=1e-6):
        self.jitter = float(jitter)
        self.means = None

    def fit(self, features, labels):
        features, labels = _check(type(self).__name__, features, labels)
        classes = np.unique(labels)
        self.classes = classes
        self.log_priors = np.log(np.array([np.mean(labels == c) for c in classes]))
        self.means, self.cholesky = [], []
        for c in classes:
            part = features[labels == c]
            mean = part.mean(0)
            centred = part - mean
            covariance = centred.T @ centred / max(len(part) - 1, 1)
            self.means.append(mean)
            self.cholesky.append(self._factor(covariance))
        self.means = np.stack(self.means)
        return self

    def _factor(self, covariance):
        scale = max(np.trace(covariance) / len(covariance), 1e-12)
        jitter = self.jitter
        while True:
            try:
                return np.linalg.cholesky(covariance + jitter * scale * np.eye(len(covariance)))
            except np.linalg.LinAlgError:
                jitter *= 10.0
                if jitter > 1.0:
                    raise ValueError(
                        "FeatureDensity: a class covariance stays singular with jitter 1."
                    ) from None

    def class_log_densities(self, features):
        """`log pi_c + log N(f; mu_c, Sigma_c)` `[n, C]`."""
        if self.means is None:
            raise ValueError("FeatureDensity: call fit(features, labels) first.")
        features = np.asarray(features, np.float64)
        d = features.shape[1]
        columns = []
        for mean, chol, log_prior in zip(self.means, self.cholesky, self.log_priors):
            whitened = np.linalg.solve(chol, (features - mean).T)
            log_det = 2.0 * np.sum(np.log(np.diag(chol)))
            columns.append(
                log_prior - 0.5 * (np.sum(whitened**2, 0) + log_det + d * np.log(2 * np.pi))
            )
        return np.stack(columns, -1)

    def log_density(self, features):
        return logsumexp(self.class_log_densities(features), axis=-1)

    def score(self, features):
        """The OOD score: the negative log feature density."""
        return -self.log_density(features)


def feature_ood_scores(model, train, test, ood, batch_size=500, max_elements=5e7):
    """`{name: (in-distribution scores, OOD scores)}` of `MahalanobisScore` (`mahalanobis`) and
    `FeatureDensity` (`feature_density`) fitted on the penultimate features of `train`
    (`(x, labels)`, x as `penultimate_features` takes it) and applied to inputs `test` and
    `ood`; `{}` for a model without a last
    layer to read. The density is left out when its class covariances would hold more than
    `max_elements` numbers (a thousand classes of 2,048 features)."""
    x_train, y_train = train
    features = penultimate_features(model, x_train, batch_size)
    if features is None:
        return {}
    inside = penultimate_features(model, test, batch_size)
    outside = penultimate_features(model, ood, batch_size)
    classes, d = len(np.unique(y_train)), features.shape[1]
    scorers = {"mahalanobis": MahalanobisScore}
    if classes * d * d <= max_elements:
        scorers["feature_density"] = FeatureDensity
    result = {}
    for name, cls in scorers.items():
        scorer = cls().fit(features, y_train)
        result[name] = (scorer.score(inside), scorer.score(outside))
    return result


_EXTRACTORS = weakref.WeakKeyDictionary()


def _one_batch(extractor, inputs):
    """A batch's features `[b, d]`; an efficient ensemble's member-major batch (`E` copies of
    the batch, BatchEnsemble, rank-1) gives its members' mean."""
    features = keras.ops.convert_to_numpy(extractor(inputs))
    rows = int(keras.ops.shape(inputs)[0])
    features = features.reshape(len(features), -1)
    if len(features) != rows and len(features) % rows == 0:
        features = features.reshape(len(features) // rows, rows, -1).mean(0)
    return features


def penultimate_features(model, x, batch_size=500):
    """The inputs of `model`'s last layer for inputs `x` (an array, or a batched `tf.data`
    dataset of inputs or `(inputs, labels)`) of a functional or sequential Keras model (a
    stochastic layer below gives one draw), or None when the model has no such layer to read."""
    extractor = _EXTRACTORS.get(model)
    if extractor is None:  # one feature model (and its traced predict) per network
        try:
            inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
            feature_model = keras.Model(inputs, model.layers[-1].input)
        except (AttributeError, ValueError, TypeError, IndexError):
            return None
        # Traced once: op by op, the network's passes cost several times their maths (an
        # evaluation reads the training set's features again), and `predict`'s set-up more.
        extractor = tf.function(
            lambda x: feature_model(x, training=False), reduce_retracing=True, autograph=False
        )
        _EXTRACTORS[model] = extractor
    if hasattr(x, "element_spec"):  # a dataset: already batched
        batches = (b[0] if isinstance(b, tuple) else b for b in pipelines.untuned(x))
        spec = x.element_spec[0] if isinstance(x.element_spec, tuple) else x.element_spec
    else:
        batches = (x[i : i + batch_size] for i in range(0, len(x), batch_size))
        spec = tf.TensorSpec((None,) + np.shape(x)[1:], tf.as_dtype(np.asarray(x[:1]).dtype))
    # One trace for every batch size (the training, test and OOD sets, their last batches).
    extractor.get_concrete_function(
        tf.nest.map_structure(lambda s: tf.TensorSpec((None,) + tuple(s.shape[1:]), s.dtype), spec)
    )
    features = np.concatenate([_one_batch(extractor, b) for b in batches]).astype(np.float64)
    return features.reshape(len(features), -1)
