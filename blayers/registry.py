"""Registration of blayers classes with Keras serialization and the lab's configuration, in one
place.

This is the bottom of the package: it imports nothing of blayers, and every other module may
import it. It imports no gin either: the library records here what may be configured, and the
lab (`blayers.lab.configurables`) makes those gin configurables when it is imported.

* `configurable(gin_name, module, package)` makes a class Keras-serializable under `package` and
  records it as configurable `module.gin_name`.
* `configurable_function(gin_name, module)` records a function (a default prior, a KL schedule)
  as configurable; the lab replaces the module's attribute by gin's wrapper, so the library's
  own calls (`regularizers.get('prior')`) see the bindings.
* `register_layer` is the one decorator a layer needs: Keras serialization, the configurable,
  and the public names of `blayers.layers` (`LAYERS`, which `blayers.layers` exports and
  `get_layer` reads).
* `Registry` is the `get`/`serialize`/`deserialize` trio of initializers, regularizers and
  constraints: our names first (the gin name, or the CamelCase class name), then Keras' own.
"""

import dataclasses
import re

import keras

__all__ = [
    "CONFIGURABLES",
    "LAYERS",
    "ArgsDoc",
    "Configurable",
    "Registry",
    "configurable",
    "configurable_function",
    "get_layer",
    "on_configurable",
    "register_layer",
]

LAYER_PACKAGE = "blayers.layers"
LAYERS = {}  # class name -> class, every layer registered with `register_layer`


@dataclasses.dataclass(frozen=True)
class Configurable:
    """A library class or function the lab may configure: gin name `module.name`; a function
    is found again as attribute `attribute` of Python module `owner`."""

    obj: object
    name: str
    module: str
    owner: str = None
    attribute: str = None


CONFIGURABLES = []  # every Configurable, in registration order
_LISTENERS = []


def on_configurable(listener):
    """Calls `listener(configurable)` for every recorded configurable, now and from now on (the
    lab's gin registration; classes registered after it, e.g. a user's own layer, are seen)."""
    _LISTENERS.append(listener)
    for item in CONFIGURABLES:
        listener(item)


def _record(item):
    CONFIGURABLES.append(item)
    for listener in _LISTENERS:
        listener(item)


def configurable(gin_name, module, package):
    """Class decorator: Keras-serializable in `package`, configurable as `module.gin_name`."""

    def decorator(cls):
        cls = keras.saving.register_keras_serializable(package)(cls)
        _record(Configurable(cls, gin_name, module))
        return cls

    return decorator


def configurable_function(gin_name, module):
    """Function decorator: configurable as `module.gin_name` (see the module docstring)."""

    def decorator(fn):
        _record(Configurable(fn, gin_name, module, owner=fn.__module__, attribute=fn.__name__))
        return fn

    return decorator


def register_layer(cls):
    """Registers a layer class once for everything: Keras serialization under `blayers.layers>`,
    a configurable (with the lab, `DenseFlipout.units = 7` changes
    `blayers.layers.DenseFlipout()`), and a public name of `blayers.layers` (also for
    `get_layer` and gin-only models)."""
    if cls.__name__ in LAYERS and LAYERS[cls.__name__] is not cls:
        raise ValueError(f"A layer named {cls.__name__!r} is registered already.")
    LAYERS[cls.__name__] = cls
    return configurable(cls.__name__, LAYER_PACKAGE, LAYER_PACKAGE)(cls)


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
        """The Keras config of `obj` (None for None): what `get_config` stores."""
        return None if obj is None else keras.saving.serialize_keras_object(obj)

    @staticmethod
    def deserialize(config):
        """The object a `serialize` config describes (blayers' and Keras' names alike)."""
        return keras.saving.deserialize_keras_object(config)


class ArgsDoc:
    """Mixin: a family's shared `Args:` section (`_args_doc`) is appended to the docstring of
    each subclass that has none of its own, so every public class documents its arguments,
    written once per family."""

    _args_doc = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls._args_doc and "Args:" not in (cls.__doc__ or ""):
            cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + cls._args_doc
