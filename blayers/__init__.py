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
`set_kl_scale` (the per-example ELBO in `model.fit`), and every module of the library as an
attribute (`blayers.layers`, `blayers.objectives`, `blayers.metrics`, `blayers.posthoc`, ...).

This package is the library. `import blayers` reads no argv, sets no environment variable,
writes nothing and imports neither gin nor absl: each name loads its module on first use (so
`import blayers` alone does not even load TensorFlow). A model saved with blayers layers loads
after `import blayers.layers` (which registers them with Keras serialization). The experiment framework (gin
configuration, tasks, data, models, the trainer and the command line `python -m blayers.train`)
is the lab, `blayers.lab`, on top of the library.
"""

import importlib

__version__ = "0.1.0"

# Public name -> the module that defines it (modules themselves map to None).
_NAMES = {
    "RandomVariable": "blayers.random_variable",
    "TransformedRandomVariable": "blayers.layers.reversible",
    "trace": "blayers.tracing",
    "traceable": "blayers.tracing",
    "take_mean": "blayers.tracing",
    "posterior_mean": "blayers.tracing",
    "condition": "blayers.tracing",
    "tape": "blayers.tracing",
    "make_log_joint": "blayers.programs",
    "make_log_joint_fn": "blayers.programs",
    "make_random_variable": "blayers.distributions",
    "predict": "blayers.predict",
    "Prediction": "blayers.predict",
    "set_seed": "blayers.seeds",
    "set_kl_scale": "blayers.objectives",
    "bayesianize": "blayers.convert",
}
_SUBMODULES = {
    "constraints": "blayers.constraints",
    "convert": "blayers.convert",
    "distributions": "blayers.distributions",
    "initializers": "blayers.initializers",
    "layers": "blayers.layers",
    "losses": "blayers.losses",
    "metrics": "blayers.metrics",
    "objectives": "blayers.objectives",
    "optimizers": "blayers.optimizers",
    "posthoc": "blayers.posthoc",
    "programs": "blayers.programs",
    "random_variable": "blayers.random_variable",
    "regularizers": "blayers.regularizers",
    "registry": "blayers.registry",
    "replicas": "blayers.replicas",
    "sampling": "blayers.sampling",
    "sgmcmc": "blayers.sgmcmc",
    "seeds": "blayers.seeds",
    "tracing": "blayers.tracing",
    "xla_cpu": "blayers.xla_cpu",
}
_DISTRIBUTIONS = "blayers.distributions"


def _load():
    """Imports the whole library and binds every public name here (for `dir` and `*`)."""
    for name in [*_SUBMODULES, *_NAMES]:
        globals()[name] = __getattr__(name)
    distributions = importlib.import_module(_DISTRIBUTIONS)
    for name in distributions.__all__:
        globals()[name] = getattr(distributions, name)
    return [*_NAMES, *_SUBMODULES, *distributions.__all__]


def __getattr__(name):  # PEP 562: a public name loads the module that defines it, on first use
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name == "__all__":
        value = _load()
    elif not name.startswith("_") and name[:1].isupper():  # a distribution's constructor
        value = getattr(importlib.import_module(_DISTRIBUTIONS), name, None)
        if value is None:
            raise AttributeError(f"module 'blayers' has no attribute {name!r}")
    else:
        raise AttributeError(f"module 'blayers' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__getattr__("__all__")})
