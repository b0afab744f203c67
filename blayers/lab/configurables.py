"""The lab's gin registration of the library, in one place.

The library (`import blayers`) records its configurable classes and functions in
`blayers.registry` and imports no gin; importing this module makes each a gin configurable, now
and for every class registered later (a user's own `@register` layer):

* a class is decorated in place, so the exported class *is* the configurable:
  `DenseFlipout.units = 7` changes `blayers.layers.DenseFlipout()`. Gin wraps `__init__` in a
  `(*args, **kwargs)` function; Keras 3 reads constructor arguments with
  `inspect.getfullargspec`, which does not follow the wrapper, so the signature is restored.
* a function's module attribute becomes gin's wrapper, so the library's own calls
  (`regularizers.get('prior')` calls `prior()`) honour `prior.regularizer = ...`.

Every lab module that parses or reads gin imports this (`blayers.lab.config` does).
"""

import importlib
import inspect

import gin
import keras

from blayers import constraints, initializers, layers, objectives, regularizers  # noqa: F401
from blayers.registry import on_configurable

__all__ = ["unapplied_layer_bindings"]


def _make_configurable(item):
    if inspect.isclass(item.obj):
        original = inspect.signature(item.obj.__init__)
        gin.configurable(item.name, module=item.module)(item.obj)  # in place for a class
        item.obj.__init__.__signature__ = original
        return
    wrapped = gin.configurable(item.name, module=item.module)(item.obj)
    setattr(importlib.import_module(item.owner), item.attribute, wrapped)


on_configurable(_make_configurable)


def _plain(value):
    """`value` with tuples as lists, if it is plain data (numbers, strings, None, lists)."""
    if isinstance(value, (tuple, list)):
        items = [_plain(v) for v in value]
        return None if any(i is _NOT_PLAIN for i in items) else items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _NOT_PLAIN


_NOT_PLAIN = object()


def unapplied_layer_bindings(model):
    """Gin bindings of layer classes that did not take effect in `model`.

    Gin lets a caller's explicit argument win over a binding: `mlp` passes `units` to each
    `DenseFlipout` itself, so `DenseFlipout.units = 'ten'` would change nothing, silently. For
    every unscoped binding of a layer class with plain-data values, each layer of exactly that
    class in `model` must report the bound value in its `get_config()`. Returns one line per
    binding that did not apply (empty when all did).
    """
    classes = {}
    for (scope, selector), params in gin.config._CONFIG.items():
        if scope:
            continue
        configurable_ = gin.config._REGISTRY.get_match(selector)
        wrapped = configurable_.wrapped if configurable_ is not None else None
        if inspect.isclass(wrapped) and issubclass(wrapped, keras.layers.Layer):
            classes[configurable_.wrapped] = (configurable_.name, params)
    if not classes:
        return []
    problems = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if type(layer) not in classes:
            continue
        name, params = classes[type(layer)]
        config = layer.get_config()
        for param, bound in params.items():
            bound_plain = _plain(bound)
            if param not in config or bound_plain is _NOT_PLAIN:
                continue
            actual = _plain(config[param])
            if actual is not _NOT_PLAIN and actual != bound_plain:
                problems.append(
                    f"{name}.{param} = {bound!r}, but layer '{layer.name}' has {param}="
                    f"{config[param]!r}"
                )
    return sorted(set(problems))
