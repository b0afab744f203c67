"""The application side of gin: the config search path, parsing with validation, and the
operative config of a run.

Importing this module imports the framework's configurables (the library's, through
`blayers.lab.configurables`, then data sources, models, tasks, the loop and the learners), so
every name a gin file may use is registered before parsing. Nothing in the library imports it back: it sits at
the top with the CLIs (`blayers.train`, `launch.sweep`, experiment scripts).
"""

import contextlib
import inspect
import io
import logging
import os
import re
import tokenize

import gin
import keras

from blayers.lab import (  # noqa: F401 - registers configurables
    configurables,
    data,
    loop,
    models,
    tasks,
)
from blayers.lab import gin_files as gin_files_lib
from blayers.lab.control import env, planner  # noqa: F401 - PlaNet's configurables
from blayers.lab.gin_files import (
    config_search_path,
    find_config_file,
    gin_imports,
    shipped_configs,
)
from blayers.lab.learners import mesh, planet, supervised  # noqa: F401 - the learners

__all__ = [
    "config_search_path",
    "find_config_file",
    "gin_imports",
    "parse",
    "shipped_configs",
    "validate_bindings",
]

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


@contextlib.contextmanager
def _quiet_gin_search():
    """Gin logs its include misses on the root logger; filter them only while parsing."""
    root, quiet = logging.getLogger(), _QuietGinSearch()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def _first_unparsable(paths):
    """The first file that does not tokenize, with the line of its unclosed bracket."""
    for path in paths:
        with open(path) as f:
            text = f.read()
        opened = []  # lines of the brackets still open
        try:
            for token in tokenize.generate_tokens(io.StringIO(text).readline):
                if token.type == tokenize.OP and token.string in "([{":
                    opened.append(token.start[0])
                elif token.type == tokenize.OP and token.string in ")]}" and opened:
                    opened.pop()
        except tokenize.TokenError as error:
            line = opened[-1] if opened else error.args[1][0]
            return f"{path}, line {line}: {text.splitlines()[line - 1].strip()!r}"
    return "none (a --gin_param binding)"


def parse(gin_files=(), gin_params=(), refuse_imports=False):
    """Parses gin files (names found on the search path, later files override earlier ones)
    and then `gin_params` bindings, and validates every binding before anything runs.

    Gin files are code: an `import` in one runs that module, and `from __gin__ import
    dynamic_registration` lets a binding call any function. Run only configs you trust;
    `refuse_imports=True` (`--refuse_gin_imports`) refuses every import, naming its file and
    line, before anything is parsed. The operative config lists the imports a run used."""
    for folder in config_search_path():
        gin.add_config_file_search_path(folder)
    paths = [find_config_file(name) for name in gin_files]
    if refuse_imports:
        gin_files_lib.refuse_imports(paths, gin_params)
    with _quiet_gin_search():
        try:
            gin.parse_config_files_and_bindings(paths, list(gin_params))
        except tokenize.TokenError as error:  # an unclosed bracket: gin names no file
            raise ValueError(
                f"Unbalanced brackets or an unterminated string ({error.args[0]}) in one of "
                f"{', '.join(paths) or '(no files)'} or the --gin_param bindings; the first "
                f"file that does not parse alone: {_first_unparsable(paths)}"
            ) from None
    validate_bindings(paths)
    return paths
