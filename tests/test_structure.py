"""The package's shape: a one-way import graph, imports without side effects, one registration
of a layer, declared layer contracts, and documented arguments."""

import ast
import inspect
import os
import pathlib
import subprocess
import sys

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers import constraints, initializers, layers, regularizers
from blayers.lab import configurables, tasks  # noqa: F401 - gin names of the library
from blayers.layers.base import BayesianLayer, register
from blayers.layers.estimators import FlipoutEstimator
from blayers.registry import get_layer

PACKAGE = pathlib.Path(blayers.__file__).resolve().parent
REPOSITORY = PACKAGE.parent
PACKAGES = ("blayers", "launch", "experiments")  # every importable package of the repository


def _module_name(path):
    relative = path.relative_to(REPOSITORY).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path, modules):
    """Every blayers module `path` imports, at module level or inside functions."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
    found = set()
    dynamic = any(
        isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "import_module"
        for n in ast.walk(tree)
    )
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            # `from blayers import constraints` needs the module blayers.constraints; it
            # depends on the package blayers itself only for names that are not modules.
            names = submodules + ([base] if len(submodules) < len(node.names) else [])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.JoinedStr):  # f"blayers.layers.{family}": every family
                prefix = "".join(v.value for v in arg.values if isinstance(v, ast.Constant))
                names = [m for m in modules if m.startswith(prefix)]
        elif dynamic and isinstance(node, ast.Constant) and node.value in modules:
            names = [node.value]  # a module named in a table that import_module reads
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != _module_name(path):
                found.add(name)
    return found


def _import_graph():
    paths = {
        _module_name(p): p for package in PACKAGES for p in (REPOSITORY / package).rglob("*.py")
    }
    return {name: _imports(path, paths) for name, path in paths.items()}


def test_import_graph_has_no_cycle():
    """No cycle anywhere in the repository: module-level, function-level and importlib
    imports, across the library, the lab, the launchers and the experiments."""
    graph = _import_graph()
    # A package's __init__ importing its own submodules is how Python packages work; a cycle
    # through any other edge is a real one.
    edges = {
        name: {t for t in targets if not t.startswith(name + ".")}
        for name, targets in graph.items()
    }
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycle = stack[stack.index(target) :] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    # The walk sees every kind of import: from-imports, function-level imports, importlib.
    assert "blayers.registry" in graph["blayers.layers.base"]
    assert "blayers.layers.dense" in graph["blayers.layers"]
    assert "blayers.layers" in graph["blayers.lab.models.vae"]
    assert "blayers.layers" in graph["blayers"]  # the lazy table of blayers/__init__.py


def _is_lab(name):
    """The application on top: the lab, the launchers and the experiments (in the `blayers`
    namespace, and the checkout's top-level aliases of them)."""
    return name.split(".")[0] != "blayers" or name.startswith(
        ("blayers.lab", "blayers.launch", "blayers.experiments")
    )


def test_the_library_does_not_import_the_lab():
    """The library (`blayers`, less `blayers.lab`) imports nothing of the lab, the launchers
    or the experiments; the only exceptions are the command lines' entries, `blayers.train` and
    `python -m blayers.posthoc`, which start the lab's CLIs. The bottom imports nothing of
    blayers."""
    graph = _import_graph()
    crossing = {
        name: sorted(t for t in targets if _is_lab(t))
        for name, targets in graph.items()
        if not _is_lab(name)
    }
    assert {n: t for n, t in crossing.items() if t} == {
        "blayers.train": ["blayers.lab.cli_env", "blayers.lab.train"],
        "blayers.posthoc.__main__": ["blayers.lab.posthoc_cli"],
    }
    assert graph["blayers.registry"] == set()
    # Parsing gin is the command lines'; the Loop is what training runs (post-hoc methods
    # rebuild a run's learner in the Loop's `Context`).
    assert sorted(n for n, t in graph.items() if "blayers.lab.config" in t) == [
        "blayers.lab.posthoc_cli",
        "blayers.lab.train",
    ]
    assert sorted(n for n, t in graph.items() if "blayers.lab.loop" in t) == [
        "blayers.lab.config",
        "blayers.lab.posthoc",
        "blayers.lab.train",
    ]


def test_the_loop_knows_no_learner_and_only_runs_touches_a_run_folder():
    """The Loop imports no learner but the default one (the supervised learner, when
    `train.learner` is unbound), and no learner imports the Loop; no code outside
    `blayers/lab/runs/` names a run folder's files (launchers, report and experiments read
    runs through `RunDir`)."""
    graph = _import_graph()
    learners = {n for n in graph if n.startswith("blayers.lab.learners.")}
    assert sorted(t for t in graph["blayers.lab.loop"] if t in learners) == [
        "blayers.lab.learners.supervised"
    ]
    assert not any("blayers.lab.loop" in graph[n] for n in learners)
    names = {
        "LOCK",
        "bindings.json",
        "checkpoints",
        "command.json",
        "experiment.json",
        "history.jsonl",
        "metrics.json",
        "operative_config.gin",
    }
    found = []
    for path in sorted(REPOSITORY.rglob("*.py")):
        relative = path.relative_to(REPOSITORY).as_posix()
        if relative.startswith(("blayers/lab/runs/", "tests/", ".")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{relative}:{node.lineno} {node.value!r}")
    assert found == []


def test_one_decorator_registers_a_layer_everywhere():
    @register
    class ScaledIdentity(keras.layers.Layer):
        """Multiplies by a constant.

        Args:
          factor: the constant.
        """

        def __init__(self, factor=2.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def call(self, x):
            return x * self.factor

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

    assert layers.ScaledIdentity is ScaledIdentity  # a public name of blayers.layers
    assert get_layer("ScaledIdentity") is ScaledIdentity  # model builders and gin-only models
    gin.parse_config("ScaledIdentity.factor = 3.0")
    assert ScaledIdentity().factor == 3.0  # gin
    gin.clear_config()
    model = keras.Sequential([keras.Input((2,)), ScaledIdentity(5.0)])
    restored = keras.models.model_from_json(model.to_json())  # Keras serialization
    assert restored.layers[0].factor == 5.0 and type(restored.layers[0]) is ScaledIdentity


def test_public_layers_come_from_the_registry():
    from blayers.registry import LAYERS

    assert set(LAYERS) <= set(dir(layers))
    assert get_layer("StandardNormalBase") is layers.StandardNormalBase
    for name in ("DenseFlipout", "Conv2DFlipout", "LSTMCellFlipout", "GaussianProcess"):
        assert getattr(layers, name) is LAYERS[name]
    with pytest.raises(ValueError, match="Unknown layer 'Dnse'"):
        get_layer("Dnse")


def test_layer_contract_names_a_missing_estimator_or_linear_map():
    class NoEstimator(BayesianLayer):
        def __init__(self, kernel_initializer="trainable_normal", **kwargs):
            super().__init__(**kwargs)
            self._configure_weight("kernel", kernel_initializer, None, None)

        def build(self, input_shape):
            self.add_bayesian_weight("kernel", (input_shape[-1], 2))

        def call(self, x):
            self.call_weights()
            return self.apply_kernel(x)

    with pytest.raises(NotImplementedError, match="_linear"):  # a deterministic kernel
        NoEstimator("glorot_uniform")(np.ones((1, 3), "float32"))
    with pytest.raises(TypeError, match="FlipoutEstimator"):  # a random one
        NoEstimator()(np.ones((1, 3), "float32"))

    class NoEstimatorButLinear(NoEstimator):
        def _linear(self, x, kernel):
            return tf.matmul(x, kernel)

    with pytest.raises(TypeError, match="FlipoutEstimator"):
        NoEstimatorButLinear()(np.ones((1, 3), "float32"))

    class Flipped(FlipoutEstimator, NoEstimatorButLinear):
        pass

    assert Flipped()(np.ones((1, 3), "float32")).shape == (1, 2)


_LAYER_KWARGS = {"activity_regularizer", "trainable", "dtype", "autocast", "name"}


def _public_classes():
    for module in (layers, initializers, regularizers, constraints, tasks):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                yield f"{module.__name__}.{name}", obj


@pytest.mark.parametrize("name, cls", list(_public_classes()), ids=lambda v: str(v))
def test_every_public_class_documents_its_arguments(name, cls):
    params = [
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p.name != "self"
        and p.name not in _LAYER_KWARGS
    ]
    if not params:
        return
    doc = inspect.getdoc(cls) or ""
    assert "Args:" in doc, f"{name} has no Args: section"
    undocumented = [p for p in params if p not in doc]
    assert not undocumented, f"{name} does not document {undocumented}"


def test_cli_environment_is_set_only_for_the_cli():
    from blayers.lab import cli_env

    assert cli_env.is_cli(["python", "-m", "blayers.train", "--model_dir=x"], ["-m"])
    assert cli_env.is_cli(["python", "/usr/bin/blayers-train"], ["/usr/bin/blayers-train"])
    assert cli_env.is_cli(["python", "-m", "experiments.deep_gp_uci"], ["-m"])
    assert cli_env.is_cli(["python", "-m", "blayers.experiments.deep_gp_uci"], ["-m"])
    assert not cli_env.is_cli(["python", "-m", "pytest"], ["pytest"])
    assert not cli_env.is_cli(["python", "script.py"], ["script.py"])


def test_the_command_lines_ask_xla_for_wide_vectors_on_avx512():
    """`cli_env.prepare()` (the training CLI's and the experiments' first step) sets the
    vector width `blayers.xla_cpu` picks, before it loads TensorFlow (which is not needed to
    see it: `load_tensorflow=False`, as the experiments prepare)."""
    from blayers import xla_cpu

    code = (
        "import os, sys; from blayers.lab import cli_env; "
        "cli_env.prepare(load_tensorflow=False); assert 'tensorflow' not in sys.modules; "
        "print('XLA_FLAGS=' + os.environ.get('XLA_FLAGS', ''))"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env
    )
    flags = out.stdout.strip().splitlines()[-1]
    wide = "XLA_FLAGS=--xla_cpu_prefer_vector_width=512"
    assert flags == (wide if xla_cpu.has_avx512() else "XLA_FLAGS="), flags


def test_the_architecture_map_matches_the_code():
    """`docs/architecture.md` names every learner (and no other), the post-hoc methods, the
    command-line entries that the import-graph test allows to start the lab, and the files an
    estimator takes."""
    import re

    from blayers.lab import learners

    root = pathlib.Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "architecture.md").read_text()
    concrete = set(learners.__all__) - {"Learner"}
    named = set(re.findall(r"\b(\w+Learner)\b", doc))
    assert concrete <= named, concrete - named
    assert named <= concrete | {"Learner", "KerasLearner"}, named - concrete
    for entry in ("blayers/train.py", "blayers/posthoc/__main__.py", "posthoc/", "posthoc_cli"):
        assert entry in doc, entry
    # A post-hoc method is one file (tests/lab/test_posthoc_cli.py finds one added elsewhere).
    assert "| a post-hoc method | `blayers/lab/posthoc_methods/<method>.py` (1) |" in doc
    assert "posthoc_methods/" in doc
    families = sorted(
        path.name
        for path in (root / "blayers" / "layers").glob("*.py")
        if "(FlipoutEstimator, " in path.read_text()
    )
    row = next(line for line in doc.splitlines() if line.startswith("| an estimator |"))
    count = int(re.search(r"\((\d+)\) \|", row).group(1))
    assert count == 1 + len(families), (count, families)
    for name in families:
        assert f"`{name}`" in row, name


def test_every_module_the_docs_name_is_reachable_from_import_blayers():
    """`blayers.objectives.NegativeLogLikelihood()` as the docs write it works after a bare
    `import blayers`: every `blayers.<name>` in the docs and README resolves as an attribute."""
    import re

    import blayers

    root = pathlib.Path(__file__).resolve().parents[1]
    texts = [p.read_text() for p in (root / "docs").glob("*.md")]
    texts.append((root / "README.md").read_text())
    names = {m for text in texts for m in re.findall(r"\bblayers\.([a-z_]+)\b", text)}
    names -= {"lab", "train", "launch", "experiments"}  # the application on top (`-m blayers.X`)
    missing = sorted(n for n in names if not hasattr(blayers, n))
    assert not missing, missing
