"""The README and the documentation site: their Python examples run as written, the commands
they give name modules and configs that exist, the README stays a short page for users, and no
user-facing text carries development notes."""

import ast
import importlib
import importlib.util
import pathlib
import re

import numpy as np
import pytest
import yaml

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
README = REPOSITORY / "README.md"
DOCS = REPOSITORY / "docs"
PAGES = sorted([README, REPOSITORY / "CHANGELOG.md", *DOCS.rglob("*.md")])
# Generated from runs: their commands name the runs' own folders.
GENERATED = {DOCS / "results" / "report.md"}


def _python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


# A page whose examples build on each other (a walk-through) says so with this comment; the
# others' blocks each run alone.
SHARED_SESSION = "<!-- the examples on this page run in one session -->"


def _run_blocks(path):
    namespaces = []
    shared = SHARED_SESSION in path.read_text()
    for block in _python_blocks(path):
        namespaces.append(namespaces[-1] if shared and namespaces else {})
        exec(compile(block, str(path), "exec"), namespaces[-1])  # noqa: S102 - our own docs
    return namespaces


def _code_lines(block):
    """The block's lines without comments and blank lines, stripped."""
    lines = (line.split("  #")[0].strip() for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_example_is_the_getting_started_one_less_a_loss():
    """The README's example is the getting-started page's first one, line for line in order,
    less its hand-written loss: the fast suite runs that page and checks that it learns
    (`test_getting_started_examples_run_and_fit`); the README's own run is slow."""
    (readme,) = _python_blocks(README)
    page = iter(_code_lines(_python_blocks(DOCS / "getting-started.md")[0]))
    missing = [line for line in _code_lines(readme) if line not in page]
    assert not missing, missing


@pytest.mark.slow  # the getting-started page's run covers it (the test above)
def test_readme_python_example_runs_and_learns():
    (namespace,) = [n for n in _run_blocks(README) if "prediction" in n]
    history = namespace["model"].history.history
    assert history["loss"][-1] < 100.0 and history["accuracy"][-1] > 0.9  # the ELBO, not 1e5
    assert np.all(np.isfinite(namespace["prediction"].mean))


def test_getting_started_examples_run_and_fit():
    namespaces = _run_blocks(DOCS / "getting-started.md")
    (fitted,) = [n for n in namespaces if "prediction" in n]
    history = fitted["model"].history.history
    assert history["loss"][-1] < 100.0 and history["accuracy"][-1] > 0.9  # the ELBO, not 1e5
    assert np.all(np.isfinite(fitted["prediction"].mean))
    # The hand-written loss is the per-example negative ELBO: NLL plus KL / N, finite.
    assert np.isfinite(float(fitted["loss"])) and float(fitted["loss"]) > 0
    # The probabilistic program fitted q(z) to the exact posterior N(0.985, 0.277^2).
    (programs,) = [n for n in namespaces if "posterior" in n]
    assert abs(float(programs["loc"]) - 12.8 / 13) < 0.1
    assert abs(float(programs["tf"].nn.softplus(programs["raw_scale"])) - 13**-0.5) < 0.05


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if p not in (README, DOCS / "getting-started.md") and _python_blocks(p)],
    ids=lambda p: str(p.relative_to(REPOSITORY)),
)
def test_every_other_page_s_python_runs(page):
    """One test a page, so that the test workers share the pages out."""
    _run_blocks(page)


def test_readme_is_short_and_for_users():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    assert max(len(line) for line in lines if "|" in line) < 200  # table cells, not essays


# In docstrings as on pages: issue numbers and the development machine.
DOCSTRING_NOTES = [
    r"\bissue #?\d+",
    r"(?<![\w/])#\d{1,3}\b",
    r"\.\./shared",
    r"development machine",
]
DEVELOPMENT_NOTES = [
    *DOCSTRING_NOTES,
    r"shared with other work",
    r"GPU machine used for measurements",
    r"/work/",
    r"XXX",
]


def test_no_development_notes_in_user_facing_text():
    offenders = []
    for page in PAGES:
        text = page.read_text()
        offenders += [
            f"{page.name}: {m.group(0)!r}"
            for p in DEVELOPMENT_NOTES
            for m in re.finditer(p, text, flags=re.IGNORECASE)
        ]
    # Docstrings and the names of tests are read by users too.
    for path in [
        *REPOSITORY.glob("blayers/**/*.py"),
        *REPOSITORY.glob("experiments/*.py"),
        *REPOSITORY.glob("launch/*.py"),
    ]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node) or ""
                offenders += [
                    f"{path.name}: {m.group(0)!r}"
                    for p in DOCSTRING_NOTES
                    for m in re.finditer(p, doc, flags=re.IGNORECASE)
                ]
    for path in REPOSITORY.glob("tests/**/test_*.py"):
        offenders += [
            f"{path.name}: {name}"
            for name in re.findall(r"def (test_\w*issue\w*)", path.read_text())
        ]
    assert not offenders, offenders


def _commands(page):
    """The shell commands of a page's bash blocks (continuation lines joined)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
        commands += [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    return commands


def test_commands_name_modules_and_configs_that_exist():
    from blayers.lab.config import find_config_file

    checked = 0
    for page in PAGES:
        if page in GENERATED:
            continue
        text = page.read_text()
        for module in re.findall(r"python -m ([\w.]*\w)", text):
            if module.split(".")[0] in ("blayers", "experiments", "launch"):
                assert importlib.util.find_spec(module), f"{page.name}: python -m {module}"
                checked += 1
        for name in re.findall(r"--gin_file=([\w/]+)", text):
            if name not in ("NAME", "<smoke"):
                find_config_file(name)  # raises, naming the search path
                checked += 1
    assert checked > 50


def test_every_tfds_data_set_of_a_config_is_on_the_data_page():
    page = (DOCS / "data.md").read_text()
    named = set()
    for config in (REPOSITORY / "configs").glob("*.gin"):
        text = config.read_text()
        named |= set(re.findall(r"tfds_\w+\.name = '([\w/-]+)'", text))
        named |= set(re.findall(r"tfds_\w+\.ood = '([\w/-]+)'", text))
    assert named >= {"cifar10", "imagenet2012", "wmt14_translate/fr-en"}
    assert not [n for n in named if f"`{n}`" not in page], named


def _nav_files(nav):
    for entry in nav:
        if isinstance(entry, str):
            yield entry
        else:
            for value in entry.values():
                yield from ([value] if isinstance(value, str) else _nav_files(value))


def test_every_page_is_in_the_site_s_navigation_and_every_reference_module_documented():
    config = yaml.safe_load((REPOSITORY / "mkdocs.yml").read_text())
    nav = set(_nav_files(config["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    # Pieces included into other pages: mkdocs.yml's exclude_docs lists them.
    snippets = {line.strip() for line in config["exclude_docs"].splitlines() if line.strip()}
    assert pages - snippets == nav, (pages - snippets) ^ nav
    # Every public name (`__all__`) of each module in the API reference has a docstring.
    undocumented = []
    for page in (DOCS / "reference").glob("*.md"):
        for module_name in re.findall(r"^::: ([\w.]+)$", page.read_text(), flags=re.MULTILINE):
            module = importlib.import_module(module_name)
            assert module.__doc__, module_name
            for name in getattr(module, "__all__", ()):
                value = getattr(module, name)
                if callable(value) and not (getattr(value, "__doc__", None) or "").strip():
                    undocumented.append(f"{module_name}.{name}")
    assert not undocumented, undocumented


def test_ci_runs_the_readme_s_test_command_and_builds_the_docs():
    ci = (REPOSITORY / ".ci" / "run").read_text()
    readme_commands = [c.split("#")[0].strip() for c in _commands(README)]
    (fast,) = [c for c in readme_commands if c.startswith("python -m pytest") and "not slow" in c]
    assert fast in ci.splitlines()
    assert "'.[test,docs]'" in ci and "mkdocs build --strict" in ci


def test_every_included_snippet_ships_with_the_repository():
    # The site includes files by path (pymdownx.snippets); an included file that git ignores
    # exists on the machine that wrote it and nowhere else, and the site build fails from a clone.
    ignored = [
        line.strip().rstrip("/")
        for line in (REPOSITORY / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for page in PAGES:
        for included in re.findall(r'^--8<-- "([^"]+)"', page.read_text(), flags=re.MULTILINE):
            assert (REPOSITORY / included).is_file(), f"{page.name} includes missing {included}"
            for pattern in ignored:
                anchored = pattern.lstrip("/")
                assert not (
                    included == anchored
                    or included.startswith(anchored + "/")
                    or pathlib.PurePath(included).match(anchored)
                ), f"{page.name} includes {included}, which .gitignore ignores ({pattern})"
