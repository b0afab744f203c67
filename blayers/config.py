"""Registration of blayers classes with gin and Keras serialization, in one place.

`configurable(gin_name, module, package)` makes a class both a gin configurable (decorated in
place, so the exported class *is* the configurable) and Keras-serializable under `package`.
Gin wraps `__init__` in a `(*args, **kwargs)` function; Keras 3 reads constructor arguments with
`inspect.getfullargspec`, which does not follow the wrapper, so we restore the signature.
"""

import inspect

import gin
import keras

__all__ = ["configurable"]


def configurable(gin_name, module, package):
    def decorator(cls):
        original = inspect.signature(cls.__init__)
        cls = keras.saving.register_keras_serializable(package)(cls)
        cls = gin.configurable(gin_name, module=module)(cls)
        cls.__init__.__signature__ = original
        return cls

    return decorator
