"""The estimator benchmarks run end to end on tiny sizes: the dense one's independent runs in
fresh processes and their medians, the XLA vector-width comparison's two widths, and the mesh
session's two settings of graph rewrites."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from blayers import xla_cpu

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script, *args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_dense_benchmark_takes_the_median_of_runs_in_fresh_processes(tmp_path):
    path = tmp_path / "dense.json"
    tiny = ["--units=32", "--input_dim=32", "--batch=8", "--repeats=2", "--rounds=1"]
    _run("dense_estimators.py", *tiny, "--processes=3", f"--out={path}")
    result = json.loads(path.read_text())
    table = (tmp_path / "dense.md").read_text().splitlines()
    assert len(table) == 2 + 4  # header, rule, Dense and the three estimators
    for name in ("DenseReparameterization", "DenseFlipout", "DenseLocalReparameterization"):
        row = result["estimators"][name]
        assert len(row["ratio_to_dense_per_run"]) == 3
        assert row["ratio_to_dense"] == pytest.approx(
            np.median(row["ratio_to_dense_per_run"]), abs=1e-3
        )
        assert all(r > 0 for r in row["ratio_to_dense_per_run"])
    wide = "--xla_cpu_prefer_vector_width=512" if xla_cpu.has_avx512() else ""
    assert result["machine"]["xla_flags"] == wide  # the command lines' width, recorded


@pytest.mark.slow
@pytest.mark.skipif(not xla_cpu.has_avx512(), reason="compares XLA's widths on AVX-512 only")
def test_vector_width_benchmark_times_both_widths(tmp_path):
    path = tmp_path / "width.json"
    _run("xla_vector_width.py", "--pairs=1", "--repeats=1", "--rounds=1", f"--out={path}")
    result = json.loads(path.read_text())
    assert set(result["runs"]) == {"256", "512"}
    for kernel in ("threefry words", "box-muller", "softplus and square", "KL"):
        assert all(v > 0 for v in result["kernels_ms"][kernel].values())
    assert set(result["ratio_to_dense"]["DenseFlipout"]) == {"256", "512"}


@pytest.mark.slow
def test_mesh_graph_rewrites_benchmark_times_both_sessions(tmp_path):
    """Both settings of `MeshLearner.graph_rewrites` on the smoke model split over two logical
    CPUs: each phase timed, and a rerun of the learner's default repeats its losses."""
    path = tmp_path / "mesh.json"
    _run("mesh_graph_rewrites.py", "--cases=smoke_model2", "--steps=4", f"--out={path}")
    row = json.loads(path.read_text())["table"]["smoke_model2"]
    assert set(row) == {"off", "on"}
    for setting in row.values():
        assert all(setting[k] > 0 for k in ("build_s", "first_step_s", "step_ms"))
    assert row["off"]["reruns_identical"]
    assert "| smoke_model2 | off |" in (tmp_path / "mesh.md").read_text()
