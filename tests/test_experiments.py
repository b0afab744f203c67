"""The experiments' smoke configs run end to end through the trainer (slow: about a minute
each; `python -m pytest -n 2 -m slow tests`)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from blayers.data.synthetic import markov_entropy_rate

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _train(config, model_dir, *params):
    result = subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [
            sys.executable,
            "-m",
            "blayers.train",
            f"--gin_file={config}",
            f"--model_dir={model_dir}",
            "--gin_param=train.progress = False",
            *[f"--gin_param={p}" for p in params],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((pathlib.Path(model_dir) / "metrics.json").read_text())["final"]


@pytest.mark.slow
def test_bayesian_rnn_smoke_learns_the_markov_chain(tmp_path):
    metrics = _train("bayesian_rnn_smoke", tmp_path)
    uniform = float(__import__("math").log(8))
    optimum = markov_entropy_rate(vocab_size=8)
    assert optimum < metrics["nll"] < optimum + 0.5 * (uniform - optimum)
    assert metrics["perplexity"] > 1 and metrics["ece"] < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("bayesian", [True, False])
def test_resnet_smoke_bayesian_and_deterministic(tmp_path, bayesian):
    metrics = _train("resnet50_smoke", tmp_path, f"resnet.bayesian = {bayesian}")
    assert metrics["accuracy"] > 0.8 and metrics["nll"] < 0.8


@pytest.mark.slow
def test_main_job_sweep(tmp_path):
    result = subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [
            sys.executable,
            "-m",
            "launch.sweep",
            "--gin_file=digits_mlp",
            "--sweep",
            "mlp.dense_layer=['DenseFlipout', 'Dense']",
            "--parallel",
            "2",
            "--root",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "results.md").read_text()
    assert "DenseFlipout" in table and "| accuracy | nll | ece |" in table
    for run in ("dense_layer-DenseFlipout", "dense_layer-Dense"):
        final = json.loads((tmp_path / run / "metrics.json").read_text())["final"]
        assert final["accuracy"] > 0.9


UCI_ROOT = ROOT.parent / "shared" / "data" / "uci"


@pytest.mark.skipif(not UCI_ROOT.exists(), reason="../shared/data/uci not present")
def test_deep_gp_uci_writes_table_beside_published_numbers(tmp_path):
    from experiments import deep_gp_uci

    kwargs = {
        "uci_dir": str(UCI_ROOT),
        "root": str(tmp_path),
        "datasets": ["yacht"],
        "depths": ["1"],
        "splits": 2,
        "gin_file": "deep_gp_uci",
        "gin_params": [
            "train.train_steps = 20",
            "deep_gp.num_inducing = 10",
            "train.num_eval_samples = 2",
        ],
        "parallel": 2,
    }
    rows = deep_gp_uci.run_experiment(**kwargs)
    assert len(rows) == 1 and rows[0]["splits"] == 2 and rows[0]["mc_dropout_ll"] == -1.25
    table = (tmp_path / "results.md").read_text()
    assert "| yacht | DGP-1 | 2 |" in table and "MC dropout LL" in table
    assert "-1.25 +- 0.01" in table and "References:" in table and "own random splits" in table
    assert (tmp_path / "yacht_depth1_split1" / "checkpoints").is_dir()  # the trainer's runs
    # Finished runs are reused: a second call trains nothing and gives the same numbers.
    assert deep_gp_uci.run_experiment(**kwargs)[0]["test_ll"] == rows[0]["test_ll"]
    assert "skipped (finished)" in (tmp_path / "runs.md").read_text()


@pytest.mark.slow
def test_realnvp_smoke_approaches_the_true_entropy(tmp_path):
    metrics = _train("realnvp_2d_smoke", tmp_path)
    assert 0.0 < metrics["nll_minus_true_entropy"] < 1.0
    assert (tmp_path / "density.png").exists()


@pytest.mark.slow
def test_bayesian_transformer_smoke_approaches_the_channel_optimum(tmp_path):
    metrics = _train("bayesian_transformer_smoke", tmp_path)
    uniform = float(__import__("math").log(16))
    optimum = metrics["token_nll_optimum"]
    assert optimum < metrics["token_nll"] < optimum + 0.3 * (uniform - optimum)
    assert metrics["bleu_beam"] > 50 and metrics["token_ece"] < 0.15
    assert 0 <= metrics["sequence_calibration_error"] <= 1
    assert (tmp_path / "sequence_reliability.png").exists()


@pytest.mark.slow
def test_bayesian_transformer_lm_smoke_learns_english_characters(tmp_path):
    metrics = _train("bayesian_transformer_lm_smoke", tmp_path)
    assert metrics["nll"] < 2.6 and metrics["ece"] < 0.1  # uniform over 104 characters: 4.64


@pytest.mark.slow
def test_bayesian_planet_experiment_writes_the_figures_and_table(tmp_path):
    pytest.importorskip("dm_control")
    from experiments import bayesian_planet

    rows = bayesian_planet.run_experiment(
        str(tmp_path), "bayesian_planet_smoke", ["train_planet.train_steps = 20"], ["0"], 2
    )
    assert [r["model"] for r in rows] == ["Bayesian", "deterministic"]
    assert all(np.isfinite(r["eval_return"]) and r["seeds"] == 1 for r in rows)
    for name in ("score.png", "weight_kl.png", "open_loop.png", "results.md"):
        assert (tmp_path / name).exists(), name


def test_cox_process_experiment_writes_its_table(tmp_path):
    """Both patterns (1-D and 2-D) through the experiment script at a few steps: the table of
    held-out log-likelihoods per event and each run's intensity plot."""
    from experiments import cox_process

    rows = cox_process.run_experiment(
        str(tmp_path),
        ["coal", "brambles"],
        1,
        "cox_process_smoke",
        ["train.train_steps = 5", "train.num_eval_samples = 5", "cox_process.num_inducing = 8"],
        2,
    )
    assert [r["pattern"] for r in rows] == ["coal", "brambles"]
    for row in rows:
        assert all(np.isfinite(row[key][0]) for _, key in cox_process.METRICS)
    table = (tmp_path / "results.md").read_text()
    assert "| coal | 1 |" in table and "kernel intensity" in table
    assert (tmp_path / "brambles_split0" / "intensity.png").exists()


def test_uci_split_selection():
    from experiments.deep_gp_uci import parse_splits

    assert parse_splits(None, 20) == list(range(20))
    assert parse_splits("2", 20) == [0, 1]  # the first N
    assert parse_splits("3,7", 20) == [3, 7]
    assert parse_splits("0-2,9", 20) == [0, 1, 2, 9]
    with pytest.raises(ValueError, match="do not exist"):
        parse_splits("18-21", 20)
    with pytest.raises(ValueError, match="cannot read"):
        parse_splits("a-b", 20)


def test_uncertainty_baselines_experiment_writes_its_table(tmp_path):
    """All six methods through the comparison script at a few steps: one row each, with the
    ensembles' parameter overhead small and the mean-field BNN's about 2x."""
    from experiments import uncertainty_baselines

    rows = uncertainty_baselines.run_experiment(
        str(tmp_path),
        list(uncertainty_baselines.METHODS),
        "uncertainty_baselines_smoke",
        ["train.train_steps = 4", "train.num_eval_samples = 2", "train.log_every = 2"],
        2,
    )
    by_method = {r["method"]: r for r in rows}
    assert set(by_method) == set(uncertainty_baselines.METHODS)
    for row in rows:
        assert 0.0 <= row["accuracy"] <= 1.0 and np.isfinite(row["nll"])
        assert 0.0 <= row["ood_auroc_entropy"] <= 1.0 and row["train_seconds"] > 0
    assert (
        1.0
        < by_method["batch_ensemble"]["parameter_ratio"]
        < by_method["rank1"]["parameter_ratio"]
        < 1.2
    )
    assert 1.9 < by_method["flipout"]["parameter_ratio"] < 2.1
    table = (tmp_path / "results.md").read_text()
    assert "| Rank-1 BNN (4) |" in table and "OOD AUROC" in table


@pytest.mark.slow
def test_uncertainty_baselines_smoke_methods_learn(tmp_path):
    """The smoke config's full training: every method classifies the digits and tells noise
    images from them."""
    from experiments import uncertainty_baselines

    rows = uncertainty_baselines.run_experiment(
        str(tmp_path), list(uncertainty_baselines.METHODS), "uncertainty_baselines_smoke", [], 2
    )
    for row in rows:
        assert row["accuracy"] > 0.9, row
        assert row["nll"] < 0.5 and row["ood_auroc_entropy"] > 0.8, row


def test_experiment_modules_import_together():
    """Tests import several experiment scripts into one process: their command-line flags are
    defined only when a script runs, never twice."""
    import importlib

    for path in sorted((ROOT / "experiments").glob("*.py")):
        if path.stem != "__init__":
            importlib.import_module(f"experiments.{path.stem}")
