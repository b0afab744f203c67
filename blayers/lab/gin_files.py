"""Gin files as text, without the lab: where they are found (the search path) and what they
import (`--refuse_gin_imports`). Only gin is imported here, so the sweep's driver and the
experiments check a config before any trainer starts, without loading TensorFlow."""

import os

import gin

from blayers.lab.runs.files import first_line

__all__ = [
    "GinImportsRefused",
    "config_search_path",
    "find_config_file",
    "gin_imports",
    "refuse_imports",
    "shipped_configs",
]

# An installed package carries the configs as `blayers/lab/configs` (setup.py maps the
# repository's top-level `configs/` there); a checkout has them at the top.
_INSTALLED_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
_CHECKOUT_CONFIGS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs"
)


def shipped_configs():
    """The folder of the configs that ship with blayers (`base.gin`, `digits_mlp.gin`, ...)."""
    return _INSTALLED_CONFIGS if os.path.isdir(_INSTALLED_CONFIGS) else _CHECKOUT_CONFIGS


def config_search_path():
    """Folders searched for gin files, in order: the working directory, `$BLAYERS_CONFIG_PATH`
    (colon-separated), and the configs that ship with blayers (`shipped_configs()`)."""
    extra = [p for p in os.environ.get("BLAYERS_CONFIG_PATH", "").split(os.pathsep) if p]
    return [os.getcwd(), *extra, shipped_configs()]


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


class _Unparsable(Exception):
    """A gin text the import scan cannot read to its end."""


def _statements(text, where):
    """The statements of a gin text, read by gin's parser alone (which runs no imports: gin
    runs them while it parses for real, statement by statement)."""
    from gin import config_parser

    try:
        return list(config_parser.ConfigParser(text, gin.config.ParserDelegate(skip_unknown=True)))
    except Exception as error:  # noqa: BLE001 - reported by the caller, with the place
        raise _Unparsable(f"{where}: does not parse ({first_line(error)})") from None


def _walk(paths, on_error=None):
    """`(path, statements)` of each file in `paths` and its includes, depth first, each file
    once, every file after its own includes (the order gin applies them). A file that cannot
    be read or parsed is passed to `on_error(error)` and yields no statements."""
    order, statements_of = [], {}

    def visit(path):
        if path in statements_of:
            return
        statements_of[path] = []
        try:
            with open(path) as f:
                statements_of[path] = _statements(f.read(), path)
        except (_Unparsable, OSError, UnicodeDecodeError) as error:
            if on_error:
                on_error(error)
        for statement in statements_of[path]:
            if type(statement).__name__ == "IncludeStatement":
                beside = os.path.join(os.path.dirname(path), statement.filename)
                try:
                    visit(
                        beside if os.path.exists(beside) else find_config_file(statement.filename)
                    )
                except ValueError:
                    pass  # gin names the missing include when it parses
        order.append(path)

    for path in paths:
        visit(path)
    return [(path, statements_of[path]) for path in order]


def gin_imports(paths, gin_params=()):
    """Every `import` (Python modules gin runs at parse time, and `from __gin__ import
    dynamic_registration`, which lets a binding call any Python function) in the gin files,
    their includes, and the bindings: `['file:line: statement', ...]`. Gin files are code; this
    is what `--refuse_gin_imports` refuses. A file or binding the scan cannot parse is listed
    too (`'file: does not parse (...)'`): gin would run the imports before its error."""
    found = []
    for path, statements in _walk(paths, on_error=lambda error: found.append(str(error))):
        for statement in statements:
            if type(statement).__name__ == "ImportStatement":
                line = statement.location.line_num
                found.append(f"{path}:{line}: {statement.location.line_content.strip()}")
    for number, binding in enumerate(gin_params, 1):
        try:
            statements = _statements(binding, f"--gin_param #{number} {binding!r}")
        except _Unparsable as error:
            found.append(str(error))
            continue
        for statement in statements:
            if type(statement).__name__ == "ImportStatement":
                found.append(f"--gin_param #{number}: {statement.location.line_content.strip()}")
    return found


def expanded_files(paths):
    """`paths` with every `include` in place (depth first, each file once), in the order gin
    parses them: a later file's binding overrides an earlier one's."""
    return [path for path, _ in _walk(paths)]


class GinImportsRefused(ValueError):
    """`--refuse_gin_imports` found an import (or a text it cannot scan)."""


def refuse_imports(paths, gin_params=()):
    """Raises ValueError listing every gin import in `paths` and `gin_params` (and every text
    the scan cannot parse); `--refuse_gin_imports` of every command calls it before gin runs
    anything."""
    imports = gin_imports(paths, gin_params)
    if imports:
        raise GinImportsRefused(
            "--refuse_gin_imports: these gin imports would run Python code at parse time, "
            "and a file the scan cannot read to its end is refused with them (gin would run "
            "its imports before reaching the error; gin files are code: run only configs "
            "you trust):\n  " + "\n  ".join(imports)
        )


def refuse_imports_of(gin_files, gin_params=()):
    """`refuse_imports` of the gin files named as a command line names them (names on the
    search path, or paths): a command checks its `--refuse_gin_imports` with this before it
    loads TensorFlow (the refusal in a fraction of a second, not after the seconds that takes);
    an unknown name is left to the command's own parse, which names it."""
    paths = []
    for name in gin_files:
        try:
            paths.append(find_config_file(name))
        except ValueError:
            pass
    refuse_imports(paths, gin_params)
