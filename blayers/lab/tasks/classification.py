"""Classification: the model's last axis holds class logits; a Categorical likelihood."""

import json
import os

import numpy as np
import tensorflow_probability as tfp

from blayers import metrics as metrics_lib
from blayers.lab import plots
from blayers.lab.tasks.base import Task, register_task, targets

tfd = tfp.distributions

__all__ = ["Classification"]


@register_task
class Classification(Task):
    """Integer labels in `[0, num_classes)`; outputs are logits (or a `RandomVariable`).

    Metrics (`num_samples` posterior draws, Monte Carlo predictive `mean_s p_s(y | x)`):
    accuracy, NLL, ECE (15 bins), Brier, mean entropy and mutual information, and the OOD AUROC
    by entropy and by mutual information when `data.ood` is given. With `data.corrupted`
    (shifted copies of the test set), `corrupted_accuracy`, `corrupted_nll` and `corrupted_ece`
    average over every corruption and severity; each set's own numbers go to
    `corruptions.json` and `corruptions.png`. Plots: `reliability.png` (and those two).
    """

    name = "classification"
    integer_targets = True

    def output_size(self, data):
        return data.num_classes

    def likelihood_from_tensor(self, outputs):
        return tfd.Categorical(logits=outputs)

    def predictive_parameters(self, distribution):
        return (distribution.probs_parameter(),)

    def evaluate(self, model, data, num_samples=10, batch_size=500):
        def predict(dataset):
            return self.predictive_samples(
                model, dataset, num_samples, batch_size, parameters=probs_and_logits
            )

        # Draws in this order (test, OOD, shifted sets), so seeded runs keep their numbers.
        probs, *logits = predict(data.test)
        ood_probs, *ood_logits = predict(data.ood) if data.ood is not None else (None,)
        corrupted = {
            key: (predict(dataset)[0], targets(dataset))
            for key, dataset in (data.corrupted or {}).items()
        }
        result, arrays = self.score(
            probs,
            targets(data.test),
            ood_probs,
            corrupted,
            logits=logits[0] if logits else None,
            ood_logits=ood_logits[0] if ood_logits else None,
        )
        if data.ood is not None:
            result.update(self.feature_scores(model, data, data.test.batch(batch_size)))
        return result, arrays

    # The training examples the feature scores' Gaussians are fitted on (at most).
    feature_fit_examples = 10000

    def feature_scores(self, model, data, test_inputs, ood_inputs=None, batch_size=500):
        """The OOD AUROC and FPR at 95% TPR of the penultimate-feature scores (Mahalanobis,
        DDU's feature density; `blayers.posthoc.feature_density`), fitted on up to
        `feature_fit_examples` training examples: `ood_auroc_mahalanobis`,
        `ood_auroc_feature_density`, ... (none for a model whose last layer's input cannot
        be read)."""
        from blayers.posthoc import feature_density

        train = data.train.take(self.feature_fit_examples)
        ood = data.ood.batch(batch_size) if ood_inputs is None else ood_inputs
        scores = feature_density.feature_ood_scores(
            model, (train.batch(batch_size), targets(train)), test_inputs, ood, batch_size
        )
        result = {}
        for name, (inside, outside) in scores.items():
            result[f"ood_auroc_{name}"] = metrics_lib.ood_auroc(inside, outside)
            result[f"ood_fpr95_{name}"] = metrics_lib.fpr_at_tpr(inside, outside)
        return result

    def score(self, probs, labels, ood_probs=None, corrupted=None, logits=None, ood_logits=None):
        """`(metrics, arrays)` of predictive samples `probs [S, n, K]` against `labels [n]`, with
        the OOD scores' AUROCs from `ood_probs [S, m, K]` (and the logit scores' from `logits`
        and `ood_logits`, when the predictive has logits) and the shift table from `corrupted`
        (`{name: (probs, labels)}`). Shared by `evaluate` and the post-hoc methods, so both
        report the same names."""
        result = metrics_lib.classification_metrics(
            probs, labels, ood_probs, logits=logits, ood_logits=ood_logits
        )
        arrays = {"probs": probs, "labels": labels}
        if corrupted:
            table = {"clean": _shift_metrics(probs, labels)}
            for key, (shifted, shifted_labels) in corrupted.items():
                table[key] = _shift_metrics(shifted, shifted_labels)
            for metric in ("accuracy", "nll", "ece"):
                values = [v[metric] for k, v in table.items() if k != "clean"]
                result[f"corrupted_{metric}"] = float(np.mean(values))
            arrays["corruptions"] = table
        return result, arrays

    def plot(self, model, data, arrays, model_dir):
        path = os.path.join(model_dir, "reliability.png")
        label = arrays.get("label")  # the run and model, or the post-hoc method
        plots.reliability_diagram(arrays["probs"], arrays["labels"], path, name=label)
        paths = [path]
        if "corruptions" in arrays:
            table_path = os.path.join(model_dir, "corruptions.json")
            with open(table_path, "w") as f:
                json.dump(arrays["corruptions"], f, indent=1, sort_keys=True)
            curves = os.path.join(model_dir, "corruptions.png")
            plots.corruption_curves(arrays["corruptions"], curves)
            paths.append(curves)
        return paths


def probs_and_logits(distribution):
    """A categorical's probabilities and logits (the logit OOD scores, energy and max logit,
    need the logits: softmax forgets their shift); probabilities alone for a distribution
    without logits."""
    probs = distribution.probs_parameter()
    if not hasattr(distribution, "logits_parameter"):
        return (probs,)
    return probs, distribution.logits_parameter()


def _shift_metrics(probs, labels):
    return {
        "accuracy": metrics_lib.accuracy(probs, labels),
        "nll": metrics_lib.nll(probs, labels),
        "ece": metrics_lib.ece(probs, labels),
    }
