"""Registration of blayers classes with gin and Keras serialization, in one place.

`configurable(gin_name, module, package)` makes a class both a gin configurable (decorated in
place, so the exported class *is* the configurable) and Keras-serializable under `package`.
Gin wraps `__init__` in a `(*args, **kwargs)` function; Keras 3 reads constructor arguments with
`inspect.getfullargspec`, which does not follow the wrapper, so we restore the signature.

`Registry` is the `get`/`serialize`/`deserialize` trio of initializers, regularizers and
constraints: our names first (the gin name, or the CamelCase class name), then Keras' own.
"""

import inspect
import logging
import os
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


# -- gin files: search path, parsing with validation, operative config ---------------------------

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_KERAS_LAYER_KWARGS = {
    "name",
    "dtype",
    "trainable",
    "autocast",
    "input_shape",
    "input_dim",
    "batch_input_shape",
    "batch_size",
    "activity_regularizer",
    "seed",
}


def config_search_path():
    """Folders searched for gin files, in order: the working directory, `$BLAYERS_CONFIG_PATH`
    (colon-separated), and the project's `configs/`."""
    extra = [p for p in os.environ.get("BLAYERS_CONFIG_PATH", "").split(os.pathsep) if p]
    return [os.getcwd(), *extra, os.path.join(_PACKAGE_ROOT, "configs")]


def find_config_file(name):
    """Path of gin file `name` (a path, or a name like `digits_mlp` or `priors/normal`)."""
    candidates = [name] if name.endswith(".gin") else [name, name + ".gin"]
    if os.path.isabs(name):
        for candidate in candidates:
            if os.path.isfile(candidate):
                return candidate
    for folder in config_search_path():
        for candidate in candidates:
            path = os.path.join(folder, candidate)
            if os.path.isfile(path):
                return path
    raise ValueError(f"No gin file {name!r} in the search path {config_search_path()}.")


def _binding_location(files, selector, param):
    """`file:line` of the first line binding `selector.param` (for error messages)."""
    short = selector.split(".")[-1]
    pattern = re.compile(rf"^\s*(\S+/)?([\w.]*\.)?{re.escape(short)}\.{re.escape(param)}\s*=")
    for path in files:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if pattern.match(line):
                    return f'In file "{path}", line {number}'
    return "In a --gin_param binding"


def _accepted_parameters(fn_or_cls):
    """Parameter names `fn_or_cls` accepts, or None when it takes arbitrary `**kwargs`.

    For a class, `**kwargs` are followed up the MRO (each `__init__` passing them on to its
    parent) down to `keras.layers.Layer`, whose own keyword arguments end the chain.
    """
    if not inspect.isclass(fn_or_cls):
        parameters = inspect.signature(fn_or_cls).parameters.values()
        if any(p.kind == p.VAR_KEYWORD for p in parameters):
            return None
        return {p.name for p in parameters}
    names = set()
    for cls in fn_or_cls.__mro__:
        if cls is keras.layers.Layer:
            return names | _KERAS_LAYER_KWARGS
        if "__init__" not in vars(cls):
            continue
        parameters = inspect.signature(vars(cls)["__init__"]).parameters.values()
        names |= {
            p.name
            for p in parameters
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"
        }
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            return names
    return None


def validate_bindings(files=()):
    """Fails on a binding naming a parameter its configurable does not take, with the file and
    line (gin itself accepts any name for a configurable that has `**kwargs`)."""
    for (_, selector), params in gin.config._CONFIG.items():
        configurable_ = gin.config._REGISTRY.get_match(selector)
        if configurable_ is None:
            continue  # a macro
        accepted = _accepted_parameters(configurable_.wrapped)
        if accepted is None:
            continue
        for param in params:
            if param not in accepted:
                raise ValueError(
                    f"Unknown parameter '{param}' of {configurable_.name}; it takes "
                    f"{sorted(accepted)}.\n  {_binding_location(files, selector, param)}"
                )


class _QuietGinSearch(logging.Filter):
    """Drops gin's 'Path not found' errors, logged for every search-path miss of an include."""

    def filter(self, record):
        return not record.pathname.endswith(os.path.join("gin", "resource_reader.py"))


logging.getLogger().addFilter(_QuietGinSearch())


def parse(gin_files=(), gin_params=()):
    """Parses gin files (names found on the search path, later files override earlier ones)
    and then `gin_params` bindings, and validates every binding before anything runs."""
    # Import the framework's configurables (data sources, models, trainer) before parsing.
    from blayers import data, models, objectives, trainer  # noqa: F401

    for folder in config_search_path():
        gin.add_config_file_search_path(folder)
    paths = [find_config_file(name) for name in gin_files]
    gin.parse_config_files_and_bindings(paths, list(gin_params))
    validate_bindings(paths)
    return paths


def write_operative_config(model_dir):
    """Writes `operative_config.gin`: every gin parameter the run used (gin.tf's hook does not
    import on TF 2.21, so we write it ourselves)."""
    with open(os.path.join(model_dir, "operative_config.gin"), "w") as f:
        f.write(gin.operative_config_str())


def _register_externals():
    """Keras learning-rate schedules usable as `make_optimizer.schedule = @cosine_decay`."""
    schedules = keras.optimizers.schedules
    for name, cls in (
        ("cosine_decay", schedules.CosineDecay),
        ("exponential_decay", schedules.ExponentialDecay),
        ("polynomial_decay", schedules.PolynomialDecay),
    ):
        gin.external_configurable(cls, name=name, module="keras.optimizers.schedules")


_register_externals()
