"""Registration of blayers classes with gin and Keras serialization, in one place.

`configurable(gin_name, module, package)` makes a class both a gin configurable (decorated in
place, so the exported class *is* the configurable) and Keras-serializable under `package`.
Gin wraps `__init__` in a `(*args, **kwargs)` function; Keras 3 reads constructor arguments with
`inspect.getfullargspec`, which does not follow the wrapper, so we restore the signature.

`Registry` is the `get`/`serialize`/`deserialize` trio of initializers, regularizers and
constraints: our names first (the gin name, or the CamelCase class name), then Keras' own.
"""

import inspect
import re

import gin
import keras

__all__ = ["Registry", "configurable"]


def configurable(gin_name, module, package):
    def decorator(cls):
        original = inspect.signature(cls.__init__)
        cls = keras.saving.register_keras_serializable(package)(cls)
        cls = gin.configurable(gin_name, module=module)(cls)
        cls.__init__.__signature__ = original
        return cls

    return decorator


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
