"""`--method=mc_batchnorm`: Monte Carlo batch normalization (Teye et al., 2018)."""

import numpy as np

from blayers import posthoc as library
from blayers.lab.posthoc_methods import Method
from blayers.lab.tasks.base import features


class MCBatchNorm(Method):
    """Each of the predictive's draws normalizes with a random training mini-batch's statistics
    (of the run's batch size, or `batch_size`), as the network saw during training
    (`blayers.posthoc.MCBatchNorm`); the run's trained statistics are restored afterwards. For
    networks with `BatchNormalization` layers (the ResNets); others are refused.

    Args:
      batch_size: the mini-batch size (default: the run's `SupervisedLearner.batch_size`).
      seed: seeds the mini-batches.
    """

    name, label = "mc_batchnorm", "MC-BatchNorm"
    needs_batch_norm = True  # a table trains its network with batch norm first

    def __init__(self, batch_size=None, seed=0):
        super().__init__()
        self.batch_size, self.seed = batch_size, seed

    def fit(self, fit):
        train = features(fit.data.train)
        self.mcbn = library.MCBatchNorm(
            fit.model, train, self.batch_size or fit.learner.batch_size, self.seed
        )
        self.note(
            f"MC-BatchNorm: {len(self.mcbn.layers)} normalization layers, mini-batches of "
            f"{self.mcbn.batch_size}."
        )

    def predictive(self, fit):
        draws = [fit.predict(fit.model, 1) for _ in self.mcbn.draws(fit.num_samples)]
        return [np.concatenate([d[i] for d in draws]) for i in range(len(draws[0]))]
