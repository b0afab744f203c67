"""Learners: what a training step means, under the one Loop (`blayers.lab.loop`).

* `SupervisedLearner`: the ELBO of a Keras model on a data set's task (the default); with
  replicated data (`@uci_replicas()`), many independent models (splits, grid points, seeds,
  ensemble members) as one.
* `VariationalProgramLearner`: the ELBO of a model program and a posterior program.
* `SGMCMCLearner`: SG-MCMC (SGLD, SGHMC, cyclical) over a deterministic network's weights,
  with burn-in, thinning and the kept samples in the checkpoint.
* `MeshLearner`: the Mesh TensorFlow Bayesian Transformer (graph mode, model parallel).
* `PlanetLearner`: Bayesian PlaNet (collects episodes, trains a world model, plans).

Chosen in gin by `train.learner = @PlanetLearner()`; each imports only what it needs, so
importing this package loads the heavy ones (Mesh TensorFlow, dm-control) on first use.
"""

import importlib

from blayers.lab.learners.base import Learner

__all__ = [
    "Learner",
    "MeshLearner",
    "PlanetLearner",
    "SGMCMCLearner",
    "SupervisedLearner",
    "VariationalProgramLearner",
]

_MODULES = {
    "SupervisedLearner": "supervised",
    "VariationalProgramLearner": "supervised",
    "SGMCMCLearner": "sgmcmc",
    "MeshLearner": "mesh",
    "PlanetLearner": "planet",
}


def __getattr__(name):
    if name in _MODULES:
        return getattr(importlib.import_module(f"blayers.lab.learners.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
