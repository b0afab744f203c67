"""The application side of gin: the config search path, parsing with validation, and the
operative config of a run.

Importing this module imports the framework's configurables (the library's, through
`blayers.lab.configurables`, then data sources, models, tasks, the loop and the learners), so
every name a gin file may use is registered before parsing. Nothing in the library imports it back: it sits at
the top with the CLIs (`blayers.train`, `launch.sweep`, experiment scripts).
"""

import inspect
import io
import logging
import os
import re
import tokenize

import gin
import keras

from blayers.lab import (  # noqa: F401 - registers configurables
    cli_env,
    configurables,
    data,
    loop,
    models,
    posthoc_methods,
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

posthoc_methods.methods()  # every post-hoc method's settings are gin parameters (`SWAG.epochs`)
from blayers.lab.learners import mesh, planet, sgmcmc, supervised  # noqa: F401 - the learners

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


# The files and bindings of the last `parse`, to name a binding in a later error.
_PARSED = {"files": [], "gin_params": []}


def _binding_location(files, selector, param, gin_params=None):
    """Where `selector.param` is bound, as gin applies it: the last `--gin_param` that binds it,
    else the last line of the files (includes expanded) that does (for error messages)."""
    short = selector.split(".")[-1]
    pattern = re.compile(rf"^\s*(\S+/)?([\w.]*\.)?{re.escape(short)}\.{re.escape(param)}\s*=")
    for number, binding in reversed(list(enumerate(gin_params or (), 1))):
        if pattern.match(binding):
            return f"In --gin_param #{number} {binding.strip()!r}"
    found = None
    for path in gin_files_lib.expanded_files(files):
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if pattern.match(line):
                    found = f'In file "{path}", line {number}: {line.strip()}'
    return found or "In a --gin_param binding"


def bindings_in_error(error):
    """The gin bindings of the configurables an error's call chain names (gin appends `In call
    to configurable 'mlp'` lines), the innermost two (not the root `train`), each with its file and line: a value
    that fails deep in a layer is traced back to the binding that set it. Empty when the
    chain names no bound parameter."""
    names = re.findall(r"In call to configurable '([^']+)'", str(error))
    names = [n for n in names if n != "train"][:2]  # the failing call and its caller
    lines = []
    for name in names:
        for (scope, selector), params in gin.config._CONFIG.items():
            if selector.split(".")[-1] != name.split(".")[-1] or scope:
                continue
            for param, value in params.items():
                where = _binding_location(_PARSED["files"], selector, param, _PARSED["gin_params"])
                lines.append(f"{name}.{param} = {value!r}  ({where})")
    return lines


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
                    f"{sorted(accepted)}.\n  "
                    f"{_binding_location(files, selector, param, _PARSED['gin_params'])}"
                )


def _quiet_gin_search():
    """Gin logs a 'Path not found' error on the root logger for every search-path miss of an
    include; they are dropped only while parsing."""
    return cli_env.dropped_records(
        logging.getLogger(),
        lambda record: record.pathname.endswith(os.path.join("gin", "resource_reader.py")),
    )


def _open_brackets(text, before_line=None):
    """`(lines of the brackets still open, the TokenError or None)` after tokenizing `text`
    (up to the start of `before_line`, when given)."""
    opened = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if before_line is not None and token.start[0] >= before_line:
                break
            if token.type == tokenize.OP and token.string in "([{":
                opened.append(token.start[0])
            elif token.type == tokenize.OP and token.string in ")]}" and opened:
                opened.pop()
    except tokenize.TokenError as error:
        return opened, error
    return opened, None


def _first_unparsable(paths, gin_params=()):
    """The first file (or binding) that does not tokenize, with the line of its unclosed
    bracket."""
    texts = []
    for path in paths:
        with open(path) as f:
            texts.append((path, f.read()))
    texts += [(f"--gin_param #{n}", text) for n, text in enumerate(gin_params, 1)]
    for path, text in texts:
        opened, error = _open_brackets(text)
        if error is not None:
            line = opened[-1] if opened else error.args[1][0]
            return f"{path}, line {line}: {text.splitlines()[line - 1].strip()!r}"
    return "none alone"


def _unclosed_bracket(text, before_line):
    """`(line, text)` of the outermost bracket still open when `before_line` starts, or None."""
    opened, _ = _open_brackets(text, before_line)
    if not opened:
        return None
    return opened[0], text.splitlines()[opened[0] - 1].strip()


def _syntax_error(error, paths, gin_params):
    """One message for gin's SyntaxError: its file and line, and, when a bracket opened on an
    earlier line was never closed (gin then fails on the next binding), that line."""
    where, line = error.filename, error.lineno or 0
    message = str(error.msg if hasattr(error, "msg") else error).strip()
    message = [part.strip() for part in message.splitlines() if part.strip()][-1:] or [""]
    message = message[0]  # gin's own words; the ast module's line before them says nothing
    text = None
    if where and os.path.isfile(where):
        with open(where) as f:
            text = f.read()
    elif len(gin_params) == 1 or (where and where in gin_params):
        text, where = gin_params[-1], "a --gin_param binding"
    head = f'In file "{where}", line {line}' if os.path.isfile(where or "") else f"In {where}"
    shown = (error.text or "").strip()
    lines = [f"{head}: {message}" + (f": {shown}" if shown else "")]
    unclosed = text and _unclosed_bracket(text, line)
    if unclosed:
        lines.append(
            f"  An unclosed bracket on line {unclosed[0]} runs into line {line}: {unclosed[1]}"
        )
    return ValueError("\n".join(lines))


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
                f"file that does not parse alone: {_first_unparsable(paths, gin_params)}"
            ) from None
        except SyntaxError as error:  # gin's, with its file and line
            raise _syntax_error(error, paths, list(gin_params)) from None
    _PARSED.update(files=list(paths), gin_params=list(gin_params))
    validate_bindings(paths)
    return paths
