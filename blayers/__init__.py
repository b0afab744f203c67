"""blayers: Bayesian Layers (Tran, Dusenberry, van der Wilk, Hafner, 2019) for Keras 3.

Layers over distributions of functions, as drop-in Keras layers:

    import blayers
    model = keras.Sequential([blayers.layers.DenseFlipout(64, activation="relu"),
                              blayers.layers.DenseFlipout(10)])
    loss = nll + sum(model.losses) / num_examples     # KL terms in model.losses

Public API: `RandomVariable`, one constructor per TFP distribution (`blayers.Normal`, ...) and
`TransformedRandomVariable` (a variable pushed through a reversible layer),
`trace` / `take_mean` / `posterior_mean` / `condition` / `tape`, `make_log_joint` (and
`programs`: variational inference over a model and a posterior program), `predict`, `set_seed`,
`set_kl_scale` (the per-example ELBO in `model.fit`), and the subpackages `layers`,
`initializers`, `regularizers`, `constraints`.

Importing blayers registers its classes (gin, Keras serialization) and nothing else: it sets no
environment variable and installs no logging filter. Quieting TensorFlow is the CLI's job
(`blayers.cli_env`, which acts only in the `python -m blayers.train` process).
"""

from blayers import cli_env as _cli_env

_cli_env.prepare()  # only in the `blayers.train` CLI process: before TensorFlow loads below

from blayers import constraints, initializers, layers, programs, regularizers
from blayers.distributions import *
from blayers.distributions import __all__ as _distribution_names
from blayers.layers.reversible import TransformedRandomVariable
from blayers.objectives import set_kl_scale
from blayers.predict import Prediction, predict
from blayers.programs import make_log_joint
from blayers.random_variable import RandomVariable
from blayers.seeds import set_seed
from blayers.tracing import condition, posterior_mean, take_mean, tape, trace, traceable

__version__ = "0.1.0"
__all__ = [  # noqa: PLE0604
    "RandomVariable",
    "TransformedRandomVariable",
    "trace",
    "traceable",
    "take_mean",
    "posterior_mean",
    "condition",
    "tape",
    "make_log_joint",
    "programs",
    "predict",
    "Prediction",
    "set_seed",
    "set_kl_scale",
    "layers",
    "initializers",
    "regularizers",
    "constraints",
    *_distribution_names,
]
