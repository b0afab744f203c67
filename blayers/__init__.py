"""blayers: Bayesian Layers (Tran, Dusenberry, van der Wilk, Hafner, 2019) for Keras 3.

Layers over distributions of functions, as drop-in Keras layers:

    import blayers
    model = keras.Sequential([blayers.layers.DenseFlipout(64, activation="relu"),
                              blayers.layers.DenseFlipout(10)])
    loss = nll + sum(model.losses) / num_examples     # KL terms in model.losses

Public API: `RandomVariable`, one constructor per TFP distribution (`blayers.Normal`, ...),
`trace` / `take_mean` / `posterior_mean` / `condition` / `tape`, `predict`, `set_seed`, and the
subpackages `layers`, `initializers`, `regularizers`, `constraints`.
"""

import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from blayers import constraints, initializers, layers, regularizers
from blayers.distributions import *
from blayers.distributions import __all__ as _distribution_names
from blayers.predict import Prediction, predict
from blayers.random_variable import RandomVariable
from blayers.seeds import set_seed
from blayers.tracing import condition, posterior_mean, take_mean, tape, trace, traceable

__version__ = "0.1.0"
__all__ = [  # noqa: PLE0604
    "RandomVariable",
    "trace",
    "traceable",
    "take_mean",
    "posterior_mean",
    "condition",
    "tape",
    "predict",
    "Prediction",
    "set_seed",
    "layers",
    "initializers",
    "regularizers",
    "constraints",
    *_distribution_names,
]
