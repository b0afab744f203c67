"""Bayesian layers, one module per family.

`dense`, `convolutional`, `recurrent`, `attention`, `embeddings`, `dropout`,
`gp` (exact, sparse, random features, SNGP's head, kernels), `stochastic_output`, `reversible`,
`vector_quantizer`, and the rest of edward2's families: `ensemble` (the member-major batch),
`batch_ensemble`, `rank1`, `variational_dropout`, `hierarchical`, `ncp`, `spectral_norm`,
`heteroscedastic`, `discrete_flows`, `quantile` (non-crossing quantile outputs), and the
later efficient ensembles and evidential outputs: `packed` (Packed-Ensembles), `masksembles`,
`mimo` and `evidential`. The dense layers, MC dropout, the sparse GP and the
Gaussian likelihood take `replicas=R` (many independent models as one, `blayers.replicas`).
The estimators' forward passes live once in `estimators` and the weight-distribution mechanism
in `base`.
`point_process.PoissonProcess` is a random variable over patterns whose rate is a layer (not a
layer itself: a pattern has a random size).

The public names of this package are the layers registered with `blayers.registry.
register_layer` (the `@register` decorator of `base`): one decorator makes a new layer a name
here, a gin configurable and Keras-serializable. A new family module is added to `_FAMILIES`.
"""

import importlib

from blayers.layers.base import BayesianLayer, NestedLayers, SeededLayer
from blayers.registry import LAYERS as _LAYERS

_FAMILIES = (
    "dense",
    "convolutional",
    "recurrent",
    "attention",
    "embeddings",
    "dropout",
    "gp",
    "stochastic_output",
    "reversible",
    "vector_quantizer",
    "ensemble",
    "batch_ensemble",
    "rank1",
    "variational_dropout",
    "hierarchical",
    "ncp",
    "spectral_norm",
    "heteroscedastic",
    "discrete_flows",
    "quantile",
    "packed",
    "masksembles",
    "mimo",
    "evidential",
    "bayesian_linear_model",
    "posterior_network",
    "neural_process",
)
for _family in _FAMILIES:
    importlib.import_module(f"blayers.layers.{_family}")
del _family

from blayers.layers.point_process import PoissonProcess
from blayers.layers.reversible import ReversibleLayer

globals().update(_LAYERS)


def __getattr__(name):  # a layer registered after this import (a user's, an experiment's)
    try:
        return _LAYERS[name]
    except KeyError:
        raise AttributeError(f"module 'blayers.layers' has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(_LAYERS))


# Base classes to subclass, then every registered layer.
__all__ = [  # noqa: PLE0604
    "BayesianLayer",
    "NestedLayers",
    "PoissonProcess",
    "ReversibleLayer",
    "SeededLayer",
    *sorted(_LAYERS),
]
