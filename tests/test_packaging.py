"""The wheel: built from the sources alone, it carries every config, the bundled data and the
experiments, and installed into a fresh virtual environment it runs the main job's smoke config
and an experiment from an empty working directory (no checkout on the path)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import venv
import zipfile

import pytest

import blayers

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
# What a source distribution holds: the build reads nothing else.
SOURCES = (
    "blayers",
    "configs",
    "experiments",
    "launch",
    "setup.py",
    "setup.cfg",
    "pyproject.toml",
    "README.md",
    "CHANGELOG.md",
    "LICENSE",
    "MANIFEST.in",
)


def _build_wheel(tmp_path):
    """Builds the wheel from a copy of the sources (so the build leaves nothing in the
    repository) with the setuptools already installed (no download)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPOSITORY / name
        if path.is_dir():
            shutil.copytree(
                path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        elif path.exists():
            shutil.copy(path, source / name)
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(dist),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = dist.glob("blayers-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_carries_configs_data_and_experiments(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = sorted(
        p.relative_to(REPOSITORY / "configs").as_posix()
        for p in (REPOSITORY / "configs").rglob("*.gin")
    )
    assert configs and all(f"blayers/lab/configs/{c}" in names for c in configs), configs
    patterns = sorted((REPOSITORY / "blayers/lab/data/point_patterns").glob("*.csv"))
    assert patterns and all(f"blayers/lab/data/point_patterns/{p.name}" in names for p in patterns)
    for package in ("experiments", "launch"):  # inside the blayers namespace, not at the top
        modules = sorted((REPOSITORY / "blayers" / package).glob("*.py"))
        assert modules and all(f"blayers/{package}/{m.name}" in names for m in modules), package
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"blayers"}, tops  # no top-level package of a common name
    # The version is read from the package (one place).
    assert wheel.name.startswith(f"blayers-{blayers.__version__}-")
    # Nothing of the development tree (tests, benchmarks, docs) goes into the package.
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "docs")]


@pytest.mark.slow
def test_installed_wheel_runs_the_main_job_from_an_empty_directory(wheel, tmp_path):
    environment = tmp_path / "venv"
    # The dependencies are those already installed; the wheel itself goes in alone.
    venv.create(environment, system_site_packages=True, with_pip=True)
    python = environment / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BLAYERS_CONFIG_PATH")}

    def run(*args, returncode=0):
        result = subprocess.run(
            [*args], check=False, cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == returncode, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    # The installed copy is the one imported, not the checkout beside the system packages.
    where = run(
        python,
        "-c",
        "import blayers, blayers.experiments, blayers.launch; "
        "print(blayers.__file__, blayers.experiments.__file__, blayers.launch.__file__)",
    )
    assert str(REPOSITORY) not in where and where.count(str(environment)) == 3, where
    # The main job (README), on its smoke config: a sweep whose runs are `python -m
    # blayers.train` processes of the environment's Python.
    out = run(
        environment / "bin" / "blayers-sweep",
        "--gin_file=digits_mlp_smoke",
        "--sweep",
        "mlp.dense_layer=['DenseFlipout', 'Dense']",
        "--root=runs",
    )
    assert "DenseFlipout" in out and "accuracy" in out, out
    assert len(list((work / "runs").glob("*/metrics.json"))) == 2
    run(
        environment / "bin" / "blayers-train",
        "--gin_file=priors/scale_mixture",
        "--gin_file=digits_mlp_smoke",
        "--model_dir=single",
    )
    assert (work / "single" / "reliability.png").exists()
    assert "--splits" in run(python, "-m", "blayers.experiments.cox_process", "--help")
    assert "--sweep" in run(python, "-m", "blayers.launch.sweep", "--help")


def test_the_changelog_s_newest_release_is_the_package_version():
    text = (REPOSITORY / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, flags=re.MULTILINE)
    assert "## [Unreleased]" in text and releases, "Keep a Changelog sections"
    assert releases[0] == blayers.__version__
    # The build reads the version from the package, nowhere else.
    assert "version = attr: blayers.__version__" in (REPOSITORY / "setup.cfg").read_text()
