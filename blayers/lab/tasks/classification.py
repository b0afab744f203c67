"""Classification: the model's last axis holds class logits; a Categorical likelihood."""

import os

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
    by entropy and by mutual information when `data.ood` is given. Plot: `reliability.png`.
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
        (probs,) = self.predictive_samples(model, data.test, num_samples, batch_size)
        ood_probs = None
        if data.ood is not None:
            (ood_probs,) = self.predictive_samples(model, data.ood, num_samples, batch_size)
        labels = targets(data.test)
        result = metrics_lib.classification_metrics(probs, labels, ood_probs)
        return result, {"probs": probs, "labels": labels}

    def plot(self, model, data, arrays, model_dir):
        path = os.path.join(model_dir, "reliability.png")
        plots.reliability_diagram(arrays["probs"], arrays["labels"], path)
        return [path]
