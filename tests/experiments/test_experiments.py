"""The experiments' smoke configs run end to end through the trainer (slow: about a minute
each; `python -m pytest -n 2 -m slow tests`)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from blayers.lab.data.synthetic import markov_entropy_rate

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
@pytest.mark.slow  # an end-to-end run
def test_deep_gp_uci_writes_table_beside_published_numbers(tmp_path):
    from experiments import deep_gp_uci

    kwargs = {
        "uci_dir": str(UCI_ROOT),
        "root": str(tmp_path),
        "datasets": ["bostonHousing"],
        "depths": ["1"],
        "splits": "0-1",
        "gin_params": [
            "train.train_steps = 20",
            "deep_gp.num_inducing = 10",
            "SupervisedLearner.num_eval_samples = 2",
        ],
        "parallel": 2,
    }
    rows = deep_gp_uci.run_experiment(**kwargs)
    assert len(rows) == 1 and rows[0]["splits"] == 2 and rows[0]["published_ll"] == -2.40
    table = (tmp_path / "results.md").read_text()
    assert "| bostonHousing | SVGP | 2 of 20 |" in table and "test LL (published)" in table
    assert "References:" in table and "own random splits" in table
    assert (tmp_path / "svgp" / "bostonHousing_splits0-1" / "checkpoints").is_dir()
    # Finished runs are reused: a second call trains nothing and gives the same numbers.
    assert deep_gp_uci.run_experiment(**kwargs)[0]["test_ll"] == rows[0]["test_ll"]
    assert "skipped (finished)" in (tmp_path / "svgp" / "runs.md").read_text()


@pytest.mark.slow  # two trainer runs
def test_uci_regression_trains_each_stage_as_one_run(tmp_path, toy_uci, monkeypatch):
    """Each method with its protocol, each stage of a data set one run of replicas: MC
    dropout's grid search (every split and grid point of the validation stage in one run, then
    the test runs, each split with its best pair, in one), Flipout's, SVGP's and DGP-3's splits
    in one run each; the training time counts both stages; a re-run trains nothing."""
    from experiments import uci_regression

    monkeypatch.setattr(uci_regression, "DROPOUT_RATES", (0.01, 0.1))
    monkeypatch.setitem(uci_regression.TAU_GRID, "toy", (4.0, 8.0))
    kwargs = {
        "uci_dir": str(toy_uci),
        "root": str(tmp_path / "runs"),
        "methods": ["mc_dropout", "flipout", "svgp", "dgp3"],
        "datasets": ["toy"],
        "splits": "0-1",
        "gin_params": [
            "mc_dropout: SupervisedLearner.batch_size = 16",
            "svgp: train.train_steps = 5",
            "svgp: deep_gp.num_inducing = 5",
            "dgp3: train.train_steps = 2",
            "dgp3: deep_gp.num_inducing = 5",
        ],
        "epochs": "mc_dropout:3,flipout:2",
    }
    rows = uci_regression.run_experiment(**kwargs)
    assert [r["method"] for r in rows] == ["mc_dropout", "flipout", "svgp", "dgp3"]
    svgp = tmp_path / "runs" / "svgp" / "toy"
    svgp_bindings = json.loads((svgp / "bindings.json").read_text())
    assert svgp_bindings["deep_gp.depth"] == "1"
    assert svgp_bindings["SupervisedLearner.batch_size"] == "54"  # full batches
    assert json.loads((svgp / "metrics.json").read_text())["step"] == 5
    # DGP-3 trains from Salimbeni & Deisenroth's start, bound before the user's bindings (which
    # may override it) and recorded in its row's setting; SVGP's start is blayers' own.
    protocol = [
        "deep_gp.inner_mean = 'identity'",
        "deep_gp.length_scale = 'sqrt_width'",
        "deep_gp.inner_variational_scale = 1e-5",
        "deep_gp.noise_variance = 0.01",
    ]
    dgp3_command = json.loads((tmp_path / "runs" / "dgp3" / "toy" / "command.json").read_text())
    params = dgp3_command["gin_param"]
    first = params.index(protocol[0])
    assert params[first : first + 4] == protocol
    assert params.index("train.train_steps = 2") > first + 3  # the user's come after
    settings = {r["method"]: r["setting"]["gin_params"] for r in rows}
    assert settings["dgp3"][:4] == protocol and len(settings["dgp3"]) == 6
    assert settings["svgp"] == ["train.train_steps = 5", "deep_gp.num_inducing = 5"]
    assert all(r["splits"] == 2 and np.isfinite(r["test_ll"]) for r in rows)
    flipout = tmp_path / "runs" / "flipout" / "toy"
    flipout_bindings = json.loads((flipout / "bindings.json").read_text())
    # 54 rows in batches of 32: one full batch an epoch, two epochs.
    assert flipout_bindings["train.train_steps"] == "4"
    assert flipout_bindings["uci_replicas.splits"] == "[0, 1]"
    assert flipout_bindings["mlp.hidden_units"] == "(50,)"
    flipout_metrics = json.loads((flipout / "metrics.json").read_text())
    assert [r["name"] for r in flipout_metrics["replicas"]] == ["split0[]seed0", "split1[]seed0"]
    folder = tmp_path / "runs" / "mc_dropout"
    validation = json.loads((folder / "validation" / "toy" / "metrics.json").read_text())
    assert validation["num_replicas"] == 8  # 2 splits x 4 grid points
    best = {}
    for replica in validation["replicas"]:
        split = replica["name"].split("[")[0]
        ll = replica["final"]["test_log_likelihood"]
        if split not in best or ll > best[split][0]:
            best[split] = (ll, [replica["hparams"]["dropout_rate"], replica["hparams"]["tau"]])
    selected = json.loads((folder / "selected.json").read_text())
    assert selected == {f"toy_{k}": v for k, (_, v) in best.items()}
    test = json.loads((folder / "toy" / "metrics.json").read_text())
    assert [r["name"].split("[")[0] for r in test["replicas"]] == ["split0", "split1"]
    assert rows[0]["test_ll"] == pytest.approx(
        np.mean([r["final"]["test_log_likelihood"] for r in test["replicas"]])
    )
    # Re-running trains nothing and gives the same table.
    again = uci_regression.run_experiment(**kwargs)
    assert [r["test_ll"] for r in again] == [r["test_ll"] for r in rows]
    # Epochs count batches of the published 128 (54 rows: one an epoch).
    bindings = json.loads((folder / "toy" / "bindings.json").read_text())
    assert bindings["train.train_steps"] == "3" and "uci_replicas.chosen" in bindings
    # The training time counts both stages of the grid search.
    assert validation["train_seconds"] > 0 and test["train_seconds"] > 0
    assert rows[0]["train_hours"] == pytest.approx(
        (validation["train_seconds"] + test["train_seconds"]) / 3600
    )
    assert rows[1]["train_hours"] == pytest.approx(flipout_metrics["train_seconds"] / 3600)
    results = (tmp_path / "runs" / "results.md").read_text()
    assert "| training |" in results and "for the 4 rows" in results
    # A method run on its own adds to the same table: the other methods' rows stay.
    again = uci_regression.run_experiment(**{**kwargs, "methods": ["flipout"]})
    assert [(r["method"], r["test_ll"]) for r in again] == [
        (r["method"], r["test_ll"]) for r in rows
    ]
    assert "for the 4 rows" in (tmp_path / "runs" / "results.md").read_text()
    # A cell trained a split a call (`--splits`) ends as the same row: each call's run has a
    # name of its own, and the table accumulates the splits.
    for split in ("1", "0"):
        piecewise = uci_regression.run_experiment(
            **{**kwargs, "methods": ["svgp"], "splits": split, "root": str(tmp_path / "pieces")}
        )
    assert (tmp_path / "pieces" / "svgp" / "toy_splits0" / "metrics.json").exists()
    assert piecewise[0]["splits"] == 2 and piecewise[0]["of_splits"] == 2
    for key in ("test_ll", "rmse"):
        assert [s[key] for s in piecewise[0]["per_split"].values()] == pytest.approx(
            [s[key] for s in rows[2]["per_split"].values()], rel=1e-4
        )


@pytest.mark.parametrize("module", ["uci_regression", "deep_gp_uci"])
def test_uci_experiments_name_a_missing_folder_and_the_data_source(tmp_path, toy_uci, module):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            f"experiments.{module}",
            f"--uci_dir={tmp_path / 'absent'}",
            f"--root={tmp_path / 'runs'}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{tmp_path / 'absent'}' does not exist" in result.stderr
    assert "UCI_Datasets" in result.stderr and "index_train_K.txt" in result.stderr
    assert not (tmp_path / "runs").exists()
    # A folder without the data set names what it holds instead.
    from experiments.uci_regression import checked_uci_dir

    with pytest.raises(Exception, match=r"no data set 'yacht'.*\['toy'\]"):
        checked_uci_dir(str(toy_uci), ["toy", "yacht"])
    assert checked_uci_dir(str(toy_uci), ["toy"]) == str(toy_uci)


def test_uci_regression_flags_parse():
    from experiments.uci_regression import method_gin_params, parse_epochs, select

    assert parse_epochs("300") == {"mc_dropout": 300, "flipout": 300, "deep_ensemble": 300}
    assert parse_epochs("flipout:20") == {"flipout": 20} and parse_epochs(None) == {}
    with pytest.raises(ValueError, match="svgp:3"):
        parse_epochs("svgp:3")
    params = ["a.b = 1", "svgp: c.d = 2", "dgp2:e.f = 3", "x = 'http://u'"]
    assert method_gin_params(params, "svgp") == ["a.b = 1", "c.d = 2", "x = 'http://u'"]
    keys = {
        "r1": ("yacht", 0, (0.1, 0.5)),
        "r2": ("yacht", 0, (0.05, 0.5)),
        "r3": ("yacht", 1, (0.1, 1.0)),
    }
    results = [
        ("r1", {}, "finished", {"test_log_likelihood": -2.0}),
        ("r2", {}, "finished", {"test_log_likelihood": -1.0}),
        ("r3", {}, "failed (exit 1)", None),
    ]
    assert select(results, keys) == {("yacht", 0): (0.05, 0.5)}


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
        str(tmp_path), "bayesian_planet_smoke", ["train.train_steps = 20"], ["0"], 2
    )
    assert [r["model"] for r in rows] == ["Bayesian", "deterministic"]
    assert all(np.isfinite(r["eval_return"]) and r["seeds"] == 1 for r in rows)
    for name in ("score.png", "weight_kl.png", "open_loop.png", "results.md"):
        assert (tmp_path / name).exists(), name


@pytest.mark.slow  # an end-to-end run
def test_cox_process_experiment_writes_its_table(tmp_path):
    """Both patterns (1-D and 2-D) through the experiment script at a few steps: the table of
    held-out log-likelihoods per event and each run's intensity plot."""
    from experiments import cox_process

    rows = cox_process.run_experiment(
        str(tmp_path),
        ["coal", "brambles"],
        1,
        "cox_process_smoke",
        [
            "train.train_steps = 5",
            "VariationalProgramLearner.num_eval_samples = 5",
            "cox_process.num_inducing = 8",
        ],
        2,
    )
    assert [r["pattern"] for r in rows] == ["coal", "brambles"]
    for row in rows:
        assert all(np.isfinite(row[key][0]) for _, key in cox_process.METRICS)
    table = (tmp_path / "results.md").read_text()
    assert "| coal | 1 |" in table and "kernel intensity" in table
    assert (tmp_path / "brambles_split0" / "intensity.png").exists()


def test_uci_split_selection():
    from experiments.uci_regression import parse_splits

    assert parse_splits(None, 20) == list(range(20)) == parse_splits("all", 20)
    assert parse_splits("2", 20) == [2]  # split 2, not the first two
    assert parse_splits("3,7", 20) == [3, 7]
    assert parse_splits("0-2,9", 20) == [0, 1, 2, 9]
    with pytest.raises(ValueError, match="do not exist"):
        parse_splits("18-21", 20)
    with pytest.raises(ValueError, match="cannot read"):
        parse_splits("a-b", 20)


def test_uci_table_says_at_or_above_within_one_standard_error(tmp_path):
    from experiments.uci_regression import duration_text, summarize, write_tables

    def finals(lls):
        return [
            (f"r{i}", None, "finished", {"test_log_likelihood": v, "rmse": 1.0})
            for i, v in enumerate(lls)
        ]

    keys = {f"r{i}": ("concrete", i, None) for i in range(4)}
    # Published -2.93. Mean -2.95 with standard error 0.0258: within one SE, at or above.
    (near,) = summarize("mc_dropout", finals([-2.90, -2.92, -2.98, -3.00]), keys)
    assert near["meets_published_ll"] and near["published_ll_gap"] == pytest.approx(-0.02)
    (far,) = summarize("mc_dropout", finals([-3.05, -3.06, -3.05, -3.06]), keys)
    assert not far["meets_published_ll"]
    table = write_tables([near, far], str(tmp_path))
    assert "| yes |" in table and "| no (-0.12) |" in table
    near["train_hours"], far["train_hours"] = 0.25, 1.5
    write_tables([near, far], str(tmp_path))
    results = (tmp_path / "results.md").read_text()
    assert "| 15 min |" in results and "| 1.5 h |" in results and "1.8 h for the 2 rows" in results
    assert [duration_text(h) for h in (None, 20 / 3600, 0.5)] == ["", "20 s", "30 min"]


def test_uci_grid_choices_keep_earlier_invocations_choices(tmp_path):
    """`selected.json` gains each call's choices: a later call on another data set keeps the
    earlier ones, and a split chosen again is replaced."""
    from experiments import uci_regression

    uci_regression.write_selected(tmp_path, {("energy", 0): (0.005, 0.75)})
    uci_regression.write_selected(tmp_path, {("yacht", 0): (0.01, 0.5), ("energy", 0): (0.1, 0.25)})
    selected = json.loads((tmp_path / "selected.json").read_text())
    assert selected == {"energy_split0": [0.1, 0.25], "yacht_split0": [0.01, 0.5]}


def test_uci_tables_keep_earlier_invocations_rows(tmp_path, toy_uci):
    """Methods and data sets run one call at a time end in one table: an earlier call's rows
    stay unless the same cell is trained again, and are compared with the published numbers
    afresh; a `results.json` that is not such a table stops the run before it trains."""
    from absl import app

    from experiments import deep_gp_uci
    from experiments.uci_regression import (
        EXPERIMENT,
        earlier_rows,
        merge_rows,
        with_published,
        write_tables,
    )

    def row(method, dataset, ll):
        return {"dataset": dataset, "method": method, "splits": 20, "test_ll": ll,
                "test_ll_se": 0.01, "rmse": 1.0, "rmse_se": 0.1}  # fmt: skip

    assert earlier_rows(str(tmp_path)) == []
    stale = {**row("flipout", "yacht", -1.3), "published_ll": 0.0, "published_ll_gap": -1.3}
    stale["meets_published_ll"] = False  # as if an older table had compared it with 0
    write_tables(
        [stale, row("svgp", "yacht", -0.4), with_published(row("svgp", "wine", -1))], tmp_path
    )
    earlier = earlier_rows(str(tmp_path))
    merged = merge_rows([with_published(row("svgp", "yacht", -0.3))], earlier)
    assert [(r["dataset"], r["method"], r["test_ll"]) for r in merged] == [
        ("wine", "svgp", -1.0),
        ("yacht", "flipout", -1.3),
        ("yacht", "svgp", -0.3),  # trained again: the new row
    ]
    flipout = merged[1]  # Hernandez-Lobato & Adams' VI on yacht: -3.44
    assert flipout["published_ll"] == -3.44 and flipout["meets_published_ll"]
    (tmp_path / "results.json").write_text('{"not": "rows"}')
    with pytest.raises(ValueError, match=r"results.json: row 0 .*move the file away"):
        earlier_rows(str(tmp_path))
    for experiment in (EXPERIMENT, deep_gp_uci.EXPERIMENT):
        with pytest.raises(app.UsageError, match="--root: .*results.json"):
            experiment.run(str(tmp_path), uci_dir=str(toy_uci), datasets=["toy"])


def test_uci_cells_accumulate_splits_trained_a_few_at_a_time(tmp_path, capsys):
    """A cell trained on some splits, then on others at the same setting, ends as one row over
    all of them (mean +- standard error and training time over the union; a split trained
    again takes its new scores); at another setting the new row replaces the old, saying so."""
    from experiments.uci_regression import (
        merge_rows,
        run_dataset,
        run_name,
        splits_label,
        summarize,
        with_setting,
        write_tables,
    )

    def call(splits, lls, setting=("train.train_steps = 9",)):
        results = [(f"r{k}", None, "finished", {"test_log_likelihood": ll, "rmse": -ll})
                   for k, ll in zip(splits, lls)]  # fmt: skip
        keys = {f"r{k}": ("concrete", k, None) for k in splits}
        rows = summarize("dgp2", results, keys, {"concrete": 60.0 * len(splits)})
        return with_setting(rows, str(toy_dir), list(setting), None)

    from tests.conftest import write_uci_folder

    toy_dir = tmp_path / "uci"
    write_uci_folder(toy_dir, name="concrete")
    (first,) = call([0, 1], [-3.0, -3.2])
    assert first["splits"] == 2 and first["of_splits"] == 2
    (rerun,) = call([1], [-3.1])
    (row,) = merge_rows([rerun], [first])
    assert row["splits"] == 2 and row["test_ll"] == pytest.approx(-3.05)  # split 1 anew
    assert row["test_ll_se"] == pytest.approx(np.std([-3.0, -3.1], ddof=1) / np.sqrt(2))
    assert row["train_hours"] == pytest.approx(120.0 / 3600)  # 60 s a split, twice
    assert row["published_ll"] == -3.18  # bayesian_benchmarks' DGP-2 on concrete
    # Partial cells say of how many splits.
    (part,) = call([0], [-3.0])
    part["of_splits"] = 20
    write_tables([part], str(tmp_path / "t"))
    assert "| concrete | DGP-2 | 1 of 20 |" in (tmp_path / "t" / "results.md").read_text()
    # Another setting: the new row replaces the old one.
    (other,) = call([0], [-2.0], setting=("train.train_steps = 5",))
    (row,) = merge_rows([other], [first])
    assert row["splits"] == 1 and row["test_ll"] == -2.0
    assert "replaces the earlier row (2 splits" in capsys.readouterr().out
    # A subset's run has a name of its own, and names its data set.
    assert splits_label([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert run_name("wine", range(20), 20) == "wine"
    assert run_name("wine", [0, 1, 2, 5], 20) == "wine_splits0-2,5"
    assert run_dataset("validation/wine_splits0-2,5") == "wine" == run_dataset("wine")


def test_uci_calls_on_one_root_at_the_same_time_keep_each_other_s_rows(
    tmp_path, toy_uci, monkeypatch
):
    """The table is read again, under a lock, when a call ends: rows another call added while
    this one trained stay."""
    from experiments import uci_regression

    def row(method, ll):
        return uci_regression.row_from_splits("toy", method, {"0": {"test_ll": ll, "rmse": 1.0}})

    def trains(method, uci_dir, root, *args):
        # Meanwhile another invocation on the same root finishes DGP-2.
        uci_regression.write_tables(
            uci_regression.merge_rows([row("dgp2", -1.0)], uci_regression.earlier_rows(root)),
            root,
        )
        return [row(method, -2.0)], False

    monkeypatch.setattr(uci_regression, "run_method", trains)
    rows = uci_regression.run_experiment(str(toy_uci), str(tmp_path), ["svgp"], ["toy"])
    assert [(r["method"], r["test_ll"]) for r in rows] == [("svgp", -2.0), ("dgp2", -1.0)]
    table = json.loads((tmp_path / "results.json").read_text())
    assert {r["method"] for r in table} == {"svgp", "dgp2"}


@pytest.mark.slow  # an end-to-end run
def test_uncertainty_baselines_experiment_writes_its_table(tmp_path):
    """All six methods through the comparison script at a few steps: one row each, with the
    ensembles' parameter overhead small and the mean-field BNN's about 2x."""
    from experiments import uncertainty_baselines

    rows = uncertainty_baselines.run_experiment(
        str(tmp_path),
        list(uncertainty_baselines.METHODS),
        "uncertainty_baselines_smoke",
        ["train.train_steps = 4", "SupervisedLearner.num_eval_samples = 2", "train.log_every = 2"],
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


def test_a_stopped_experiment_exits_130_without_a_traceback(capsys):
    from launch import sweep

    with pytest.raises(SystemExit) as info:
        sweep.exit_stopped("runs/x")
    assert info.value.code == 130
    err = capsys.readouterr().err
    assert err.count("Stopped") == 1 and "re-run the same command" in err
    with pytest.raises(SystemExit) as info:
        sweep.exit_stopped("runs/x", 15)  # SIGTERM
    assert info.value.code == 143


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "ctrl_c"])
def test_cox_experiment_on_sigterm_reports_each_run_once_and_exits_cleanly(tmp_path, how):
    """SIGTERM to the Cox process experiment, or a terminal's Ctrl-C (SIGINT to the whole
    process group, then the sweep's forwarded SIGTERM): each running trainer checkpoints and
    releases its LOCK, its status is printed once, the script exits with 143 or 130 and no
    traceback."""
    import os
    import signal
    import time

    command = [
        sys.executable,
        "-m",
        "experiments.cox_process",
        "--gin_file=cox_process_smoke",
        "--patterns=coal",
        "--splits=1",
        "--gin_param=train.train_steps = 100000",
        "--gin_param=train.checkpoint_every = 5",
        f"--root={tmp_path}",
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal gives it
    )
    deadline = time.time() + 240
    while time.time() < deadline and not list(tmp_path.glob("*/checkpoints/ckpt-*.index")):
        time.sleep(0.5)
    if how == "sigterm":
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=180)
    assert process.returncode == (143 if how == "sigterm" else 130), output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert output.count("stopped (checkpointed") == 1, output[-3000:]
    assert not list(tmp_path.glob("*/LOCK"))


def test_uci_training_time_sums_every_finished_run_s_history(tmp_path):
    from experiments.uci_regression import train_seconds

    def run(path, records):
        path.mkdir(parents=True)
        (path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    run(tmp_path / "concrete", [{"kind": "train", "step": 300, "steps_per_second": 10.0}])
    run(  # two logging windows, an evaluation between them (not counted)
        tmp_path / "validation" / "concrete",
        [
            {"kind": "train", "step": 100, "steps_per_second": 10.0},
            {"kind": "eval", "step": 100},
            {"kind": "train", "step": 300, "steps_per_second": 20.0},
        ],
    )
    run(tmp_path / "validation" / "yacht", [{"kind": "train", "step": 9, "steps_per_second": 1}])
    results = [
        ("concrete", None, "skipped (finished)", {}),
        ("validation/concrete", None, "finished", {}),
        ("validation/yacht", None, "failed (exit 1)", {}),  # not counted
    ]
    seconds = train_seconds(str(tmp_path), results, lambda name: name.split("/")[-1])
    assert seconds == {"concrete": pytest.approx(300 / 10.0 + 100 / 10.0 + 200 / 20.0)}
