"""Monte Carlo evaluation of a model on a `Data` test set (and its OOD set).

Each of `num_samples` passes over the test set draws fresh weights; per pass we keep only the
predictive parameters (class probabilities, or a Normal mean and stddev per target), so memory
grows with `num_samples * test size * outputs`, never with activations.
"""

import numpy as np
import tensorflow as tf

from blayers import metrics as metrics_lib
from blayers import objectives

__all__ = ["evaluate", "predictive_samples"]


def _parameters_fn(model, task):
    @tf.function
    def parameters(x):
        distribution = objectives.predictive_distribution(model(x, training=False), task)
        if task == "classification":
            return (distribution.probs_parameter(),)
        return distribution.mean(), distribution.stddev()

    return parameters


def predictive_samples(model, dataset, task, num_samples, batch_size=500):
    """Arrays `[num_samples, n, ...]` of predictive parameters over an unbatched dataset."""
    parameters = _parameters_fn(model, task)
    batched = dataset.batch(batch_size)
    draws = []
    for _ in range(num_samples):
        parts = [parameters(x if not isinstance(x, tuple) else x[0]) for x in batched]
        draws.append([np.concatenate([p[i].numpy() for p in parts]) for i in range(len(parts[0]))])
    return [np.stack([d[i] for d in draws]) for i in range(len(draws[0]))]


def _targets(dataset):
    return np.concatenate([y.numpy() for _, y in dataset.batch(4096)])


def evaluate(model, data, num_samples=10, batch_size=500):
    """Metrics of `model` on `data.test` with `num_samples` posterior draws.

    Returns `(metrics, arrays)`: a dict of floats, and the arrays plots need
    (`probs`/`labels` or `means`/`stddevs`/`targets`/`inputs`).
    """
    targets = _targets(data.test)
    if data.task == "density":
        return _evaluate_density(model, data, targets, num_samples, batch_size)
    if data.task == "classification":
        (probs,) = predictive_samples(model, data.test, data.task, num_samples, batch_size)
        ood_probs = None
        if data.ood is not None:
            (ood_probs,) = predictive_samples(model, data.ood, data.task, num_samples, batch_size)
        result = metrics_lib.classification_metrics(probs, targets, ood_probs)
        return result, {"probs": probs, "labels": targets}
    means, stddevs = predictive_samples(model, data.test, data.task, num_samples, batch_size)
    result = metrics_lib.regression_metrics(means, stddevs, targets, data.target_scale)
    inputs = np.concatenate([x.numpy() for x, _ in data.test.batch(4096)])
    arrays = {
        "means": means,
        "stddevs": stddevs,
        "targets": targets,
        "inputs": inputs,
        "scale": data.target_scale,
        "shift": data.target_mean,
    }
    return result, arrays


def _evaluate_density(model, data, targets, num_samples, batch_size):
    """Test NLL of a density model: `-log mean_s p_s(x)` over `num_samples` passes (one pass
    suffices for a deterministic flow), in nats and bits per dimension."""

    if hasattr(model, "density_metrics"):  # e.g. a VAE: ELBO and importance weighting
        x = np.concatenate([x.numpy() for x, _ in data.test.batch(4096)])
        result = model.density_metrics(x, num_samples)
        if "entropy" in data.reference:
            result["nll_minus_true_entropy"] = result["test_nll"] - data.reference["entropy"]
        return result, {"density_model": model, "targets": targets, "inputs": x}

    @tf.function
    def log_prob(x):
        return model(x, training=False).distribution.log_prob(x)

    batched = data.test.batch(batch_size)
    passes = [np.concatenate([log_prob(x).numpy() for x, _ in batched]) for _ in range(num_samples)]
    stacked = np.stack(passes).astype(np.float64)
    log_density = np.logaddexp.reduce(stacked, axis=0) - np.log(num_samples)
    dims = int(np.prod(data.input_shape))
    nll = float(-log_density.mean())
    result = {"test_nll": nll, "bits_per_dim": nll / (dims * np.log(2.0))}
    if "levels" in data.reference:  # dequantized data in [0, 1): bits per discrete pixel
        result["bits_per_pixel_discrete"] = result["bits_per_dim"] + np.log2(
            data.reference["levels"]
        )
    if "entropy" in data.reference:
        result["nll_minus_true_entropy"] = nll - data.reference["entropy"]
    return result, {
        "density_model": model,
        "targets": targets,
        "inputs": np.concatenate([x.numpy() for x, _ in data.test.batch(4096)]),
    }
