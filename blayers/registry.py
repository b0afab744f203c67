"""Registration of blayers classes with gin and Keras serialization, in one place.

This is the bottom of the package: it imports nothing of blayers, and every other module may
import it.

* `configurable(gin_name, module, package)` makes a class both a gin configurable (decorated in
  place, so the exported class *is* the configurable) and Keras-serializable under `package`.
  Gin wraps `__init__` in a `(*args, **kwargs)` function; Keras 3 reads constructor arguments
  with `inspect.getfullargspec`, which does not follow the wrapper, so the signature is restored.
* `register_layer` is the one decorator a layer needs: gin, Keras serialization, and the public
  names of `blayers.layers` (`LAYERS`, which `blayers.layers` exports and `get_layer` reads).
* `Registry` is the `get`/`serialize`/`deserialize` trio of initializers, regularizers and
  constraints: our names first (the gin name, or the CamelCase class name), then Keras' own.
"""

import inspect
import re

import gin
import keras

__all__ = [
    "LAYERS",
    "ArgsDoc",
    "Registry",
    "configurable",
    "get_layer",
    "register_layer",
    "unapplied_layer_bindings",
]

LAYER_PACKAGE = "blayers.layers"
LAYERS = {}  # class name -> class, every layer registered with `register_layer`


def configurable(gin_name, module, package):
    """Class decorator: gin configurable `module.gin_name` and Keras-serializable in `package`."""

    def decorator(cls):
        original = inspect.signature(cls.__init__)
        cls = keras.saving.register_keras_serializable(package)(cls)
        cls = gin.configurable(gin_name, module=module)(cls)
        cls.__init__.__signature__ = original
        return cls

    return decorator


def register_layer(cls):
    """Registers a layer class once for everything: a gin configurable in place (so
    `DenseFlipout.units = 7` changes `blayers.layers.DenseFlipout()`), Keras serialization under
    `blayers.layers>`, and a public name of `blayers.layers` (also for `get_layer` and gin-only
    models)."""
    if cls.__name__ in LAYERS and LAYERS[cls.__name__] is not cls:
        raise ValueError(f"A layer named {cls.__name__!r} is registered already.")
    cls = configurable(cls.__name__, LAYER_PACKAGE, LAYER_PACKAGE)(cls)
    LAYERS[cls.__name__] = cls
    return cls


def get_layer(name_or_class):
    """A layer class from a class, a callable, or a name: registered blayers layers first
    (`'DenseFlipout'`), then `keras.layers` (`'Dense'`)."""
    if isinstance(name_or_class, type) or (
        callable(name_or_class) and not isinstance(name_or_class, str)
    ):
        return name_or_class
    cls = LAYERS.get(str(name_or_class))
    if cls is None:
        cls = getattr(keras.layers, str(name_or_class), None)
    if isinstance(cls, type) and issubclass(cls, keras.layers.Layer):
        return cls
    raise ValueError(
        f"Unknown layer {name_or_class!r}: not a blayers layer ({', '.join(sorted(LAYERS))}) "
        "nor a keras.layers class."
    )


def _snake_case(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Registry:
    """Named classes of one kind (`'initializer'`, ...) with Keras' registry as the fallback.

    Args:
      kind: word used in error messages.
      package: the Keras serialization package and gin module of the registered classes.
      keras_get: Keras' `get` for the same kind (`keras.initializers.get`).
      keras_examples: a few Keras names, quoted in the error for an unknown name.
    """

    def __init__(self, kind, package, keras_get, keras_examples):
        self.kind, self.package = kind, package
        self._keras_get, self._keras_examples = keras_get, keras_examples
        self.classes = {}

    def register(self, gin_name):
        """Class decorator: gin configurable `gin_name`, Keras-serializable, and gettable."""

        def decorator(cls):
            cls = configurable(gin_name, self.package, self.package)(cls)
            self.classes[gin_name] = cls
            return cls

        return decorator

    def get(self, identifier):
        """An instance from None, a name, a config dict, or an object (returned as is)."""
        if identifier is None:
            return None
        if isinstance(identifier, str):
            key = identifier if identifier in self.classes else _snake_case(identifier)
            if key in self.classes:
                return self.classes[key]()
            try:
                return self._keras_get(identifier)
            except ValueError:
                raise ValueError(
                    f"Unknown {self.kind} {identifier!r}. blayers {self.kind}s: "
                    f"{sorted(self.classes)}; or a Keras {self.kind} name such as "
                    f"{self._keras_examples}."
                ) from None
        if isinstance(identifier, dict):
            return self.deserialize(identifier)
        if callable(identifier):
            return identifier
        raise ValueError(f"Could not interpret {self.kind} identifier: {identifier!r}.")

    @staticmethod
    def serialize(obj):
        return None if obj is None else keras.saving.serialize_keras_object(obj)

    @staticmethod
    def deserialize(config):
        return keras.saving.deserialize_keras_object(config)


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


class ArgsDoc:
    """Mixin: a family's shared `Args:` section (`_args_doc`) is appended to the docstring of
    each subclass that has none of its own, so every public class documents its arguments,
    written once per family."""

    _args_doc = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls._args_doc and "Args:" not in (cls.__doc__ or ""):
            cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + cls._args_doc
