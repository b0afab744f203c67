"""One traceable random-variable constructor per TFP distribution, generated at import.

`blayers.Normal(loc=0., scale=1.)` returns a `RandomVariable` over `tfp.distributions.Normal`.
Each constructor takes the distribution's own arguments plus

* `sample_shape`: leading sample dimensions of the value (default scalar);
* `value`: an explicit value instead of a draw;
* `seed`: a stateless seed for the (lazy) draw.

Constructions pass through `blayers.trace` interceptors. Joint distributions (whose value is a
structure, not a tensor) and TFP's abstract base classes are left out.
"""

import inspect

import tensorflow_probability as tfp

from blayers.random_variable import RandomVariable
from blayers.tracing import traceable

tfd = tfp.distributions

_EXCLUDED = {"Distribution", "AutoCompositeTensorDistribution"}


def make_constructor(cls):
    """A traceable `RandomVariable` constructor over distribution class `cls` (also for
    blayers' own distributions)."""

    def constructor(*args, sample_shape=(), value=None, seed=None, replica_keys=None, **kwargs):
        return RandomVariable(
            cls(*args, **kwargs),
            sample_shape=sample_shape,
            value=value,
            seed=seed,
            replica_keys=replica_keys,
        )

    constructor.__name__ = cls.__name__
    constructor.__qualname__ = cls.__name__
    constructor.__module__ = __name__
    constructor.__doc__ = (
        f"Random variable over `tfp.distributions.{cls.__name__}`.\n\n"
        "Takes the distribution's arguments plus `sample_shape`, `value`, `seed` and\n"
        "`replica_keys` (see\n"
        "`blayers.RandomVariable`). Traceable by `blayers.trace`.\n\n"
        f"{cls.__name__} arguments:\n{inspect.getdoc(cls.__init__) or ''}"
    )
    return traceable(constructor)


def make_random_variable(distribution_cls):
    """edward2's name for `make_constructor`: a traceable random-variable constructor over a
    distribution class (a user's own, or a TFP one)."""
    return make_constructor(distribution_cls)


def _is_generated(name, obj):
    return (
        inspect.isclass(obj)
        and issubclass(obj, tfd.Distribution)
        and name not in _EXCLUDED
        and not name.startswith("_")
        and not issubclass(obj, tfd.JointDistribution)
    )


__all__ = []
for _name in sorted(dir(tfd)):
    _obj = getattr(tfd, _name)
    if _is_generated(_name, _obj):
        globals()[_name] = make_constructor(_obj)
        __all__.append(_name)
