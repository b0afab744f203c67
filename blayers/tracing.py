"""Tracing: intercept the construction of random variables.

Every random-variable constructor in `blayers` (`blayers.Normal`, ..., and the distributions the
trainable initializers build) is *traceable*. Inside `with blayers.trace(interceptor):` each
construction `f(*args, **kwargs)` is routed through `interceptor(f, *args, **kwargs)`, which may
build the variable differently or record it. While an interceptor runs it is removed from the
stack; one that builds the variable with `traceable(f)(...)` hands the construction on to the
interceptors outside it, so they compose (`tape`, `condition`, `take_mean` and
`blayers.make_log_joint` all do).

This is Edward2's interception mechanism (Tran et al., 2018), used here for test-time behaviour
(`take_mean`: weights fixed at their posterior mean) and, later, for probabilistic programs
(`condition`, `tape`).
"""

import collections
import contextlib
import functools
import threading

__all__ = ["condition", "posterior_mean", "take_mean", "tape", "trace", "traceable"]


class _Stack(threading.local):
    def __init__(self):
        self.interceptors = []


_STACK = _Stack()


@contextlib.contextmanager
def trace(interceptor):
    """Routes random-variable constructions through `interceptor(f, *args, **kwargs)`.

    Args:
      interceptor: callable taking the raw constructor `f` and its arguments and returning a
        `RandomVariable` (usually by calling `f`, possibly with other arguments).

    Example:
      ```python
      with blayers.trace(blayers.take_mean):
          y = model(x)   # every weight at its posterior mean
      ```
    """
    if not callable(interceptor):
        raise TypeError(f"trace() needs a callable interceptor, got {interceptor!r}.")
    _STACK.interceptors.append(interceptor)
    try:
        yield
    finally:
        _STACK.interceptors.pop()


def traceable(func):
    """Decorates a random-variable constructor so that `trace` can intercept it."""

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        if not _STACK.interceptors:
            return func(*args, **kwargs)
        interceptor = _STACK.interceptors.pop()
        try:
            return interceptor(func, *args, **kwargs)
        finally:
            _STACK.interceptors.append(interceptor)

    return wrapped


def take_mean(f, *args, **kwargs):
    """Interceptor fixing each random variable's value at its distribution's mean.

    Estimators that see a fixed kernel value compute the ordinary deterministic layer with it,
    so a network of Bayesian layers under `take_mean` is the network at its posterior mean.
    Distributions without an analytic mean (TFP raises `NotImplementedError`) keep a sample.
    """
    from blayers.random_variable import fixed_at

    rv = traceable(f)(*args, **kwargs)  # outer interceptors see the construction too
    try:
        return fixed_at(rv, "mean")
    except NotImplementedError:
        return rv


def posterior_mean():
    """Context manager: predictions with every weight at its (variational) posterior mean.

    Equivalent to `trace(take_mean)`. Python-level, so it applies to eager calls `model(x)` and to
    functions traced inside it; a `tf.function` (or `model.predict`) traced earlier outside keeps
    its sampled behaviour. `blayers.predict(..., posterior_mean=True)` handles this for you.
    """
    return trace(take_mean)


def condition(**values):
    """Interceptor factory fixing named random variables at given values.

    `with trace(condition(w=w0)):` sets the value of every variable constructed with
    `name='w'` (its distribution keeps its name) to `w0`.
    """

    def interceptor(f, *args, **kwargs):
        name = kwargs.get("name")
        if name in values and kwargs.get("value") is None:
            kwargs["value"] = values[name]
        return traceable(f)(*args, **kwargs)

    return interceptor


def unique_key(mapping, name):
    """`name`, or `name_1`, `name_2`, ... : the first key not yet in `mapping`."""
    key, i = name, 1
    while key in mapping:
        key, i = f"{name}_{i}", i + 1
    return key


@contextlib.contextmanager
def tape():
    """Records every random variable constructed inside, in order, keyed by name.

    Yields an `OrderedDict` `name -> RandomVariable`, the name being the constructor's `name`
    argument (a layer's weight: `'<layer>/kernel'`; a layer's output: its `output_name`), else
    the distribution's; a repeated name gets a numeric suffix.
    """
    recorded = collections.OrderedDict()

    def record(f, *args, **kwargs):
        rv = traceable(f)(*args, **kwargs)
        recorded[unique_key(recorded, kwargs.get("name") or rv.distribution.name)] = rv
        return rv

    with trace(record):
        yield recorded
