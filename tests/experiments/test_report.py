"""The reproduction report and the records it reads: `command.json` of a trainer run,
`experiment.json` of an experiment, and a sweep's HParams summaries."""

import json
import os

import pytest

from experiments import report
from launch import sweep


def _fake_run(directory, gin_file, final, png=True):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "metrics.json"), "w") as f:
        json.dump({"final": final, "train_seconds": 12.5}, f)
    with open(os.path.join(directory, "command.json"), "w") as f:
        json.dump(
            {
                "command": f"python -m blayers.train --gin_file={gin_file} --model_dir=x",
                "gin_file": [gin_file],
                "gin_param": [],
            },
            f,
        )
    if png:
        with open(os.path.join(directory, "curve.png"), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\nfake")


def test_report_places_runs_and_experiments_beside_the_paper(tmp_path):
    _fake_run(tmp_path / "planet", "bayesian_planet_cheetah", {"eval_return": 600.0})
    _fake_run(tmp_path / "rnn", "bayesian_rnn_smoke", {"nll": 1.1, "ece": 0.03})
    _fake_run(tmp_path / "mystery", "something_else", {"x": 1.0}, png=False)
    ub = tmp_path / "ub"
    _fake_run(ub / "rank1", "uncertainty_baselines_smoke", {"accuracy": 0.97})
    with open(ub / "experiment.json", "w") as f:
        json.dump(
            {
                "command": "python -m experiments.uncertainty_baselines --root=ub",
                "gin_file": "uncertainty_baselines_smoke",
            },
            f,
        )
    (ub / "results.md").write_text("| method | accuracy |\n|---|---|\n| Rank-1 BNN (4) | 0.970 |\n")
    assigned = report.write_report(str(tmp_path), str(tmp_path / "report"))
    assert [os.path.basename(r["dir"]) for r in assigned["fig10"][0]] == ["planet"]
    assert [os.path.basename(r["dir"]) for r in assigned["fig1"][0]] == ["rnn"]
    assert len(assigned["ub"][1]) == 1 and not assigned["ub"][0]  # the run is the experiment's
    assert [os.path.basename(r["dir"]) for r in assigned["other"][0]] == ["mystery"]
    text = (tmp_path / "report.md").read_text()
    assert "| cheetah-run return (eval_return) | 600 | 614 |" in text
    assert "python -m experiments.uncertainty_baselines --root=ub" in text
    assert "| Rank-1 BNN (4) | 0.970 |" in text
    assert "Not run under" in text and "--gin_file=resnet50_smoke" in text  # empty items say so
    page = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in page and "<td>0.970</td>" in page
    assert "http" not in page.split("<h1>")[0]  # offline: no remote stylesheet or script


def _fake_experiment(root, module, runs, own_pngs=()):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "experiment.json"), "w") as f:
        json.dump({"command": f"python -m experiments.{module} --root=x", "gin_file": module}, f)
    for name in own_pngs:
        with open(os.path.join(root, name), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\nfake")
    for name, pngs in runs.items():
        _fake_run(os.path.join(root, name), f"{module}_smoke", {"x": 1.0}, png=False)
        for png in pngs:
            with open(os.path.join(root, name, png), "wb") as f:
                f.write(b"\x89PNG\r\n\x1a\nfake")


def test_report_files_each_experiment_and_shows_its_own_figures(tmp_path):
    """UCI regression has its own entry (not Figure 5's); the Cox process shows every data
    set's intensity; PlaNet its Bayesian-vs-deterministic score first; a round-off zero is 0."""
    _fake_experiment(tmp_path / "uci", "uci_regression", {"yacht_flipout": ["intensity.png"]})
    cox = {name: ["intensity.png", "training_curves.png"] for name in ("brambles", "cells", "coal")}
    _fake_experiment(tmp_path / "cox", "cox_process", cox)
    _fake_experiment(
        tmp_path / "planet",
        "bayesian_planet",
        {"bayesian_seed0": ["open_loop.png"]},
        own_pngs=("score.png", "weight_kl.png"),
    )
    _fake_run(tmp_path / "ub_run", "uncertainty_baselines_smoke", {"mutual_information": 3.7e-18})
    assigned = report.write_report(str(tmp_path), str(tmp_path / "report"))
    assert len(assigned["uci"][1]) == 1 and not assigned["fig5"][1]
    text = (tmp_path / "report.md").read_text()
    for name in ("brambles", "cells", "coal"):
        assert f"cox/{name}/intensity.png" in text
    planet = text[text.index("Experiment `planet`") :]
    assert planet.index("planet/score.png") < planet.index("open_loop.png")
    assert "| mutual_information | 0 |" in text
    assert "shared" not in text and "issue" not in text.lower()


def test_paper_value_marked_when_the_config_differs(tmp_path):
    _fake_run(tmp_path / "bt", "bayesian_transformer_smoke", {"bleu_beam": 70.0})
    report.write_report(str(tmp_path), str(tmp_path / "r"))
    assert (
        "43.9 (for bayesian_transformer_wmt14, not this config)" in (tmp_path / "r.md").read_text()
    )


def test_sweep_logs_its_grid_to_hparams(tmp_path):
    tf = pytest.importorskip("tensorflow")
    results = [
        ("a", {"mlp.hidden_units": "(8,)"}, "finished", {"accuracy": 0.9, "nll": 0.3}),
        ("b", {"mlp.hidden_units": "(16,)"}, "finished", {"accuracy": 0.95, "nll": 0.2}),
        ("c", {"mlp.hidden_units": "(32,)"}, "failed (exit 3)", {}),
    ]
    sweep.write_hparams(results, str(tmp_path))
    sessions = set(os.listdir(tmp_path / "hparams"))
    assert {"a", "b"} <= sessions and "c" not in sessions  # finished runs only
    tags = set()
    for event_file in os.listdir(tmp_path / "hparams" / "b"):
        for event in tf.compat.v1.train.summary_iterator(
            str(tmp_path / "hparams" / "b" / event_file)
        ):
            tags |= {v.tag for v in event.summary.value}
    assert {"accuracy", "nll", "_hparams_/session_start_info"} <= tags


def test_the_report_discovers_a_new_experiment(tmp_path, monkeypatch):
    """An experiment module with its `EXPERIMENT` (an `Experiment` with a report entry) is found
    by the report without any list naming it, in the paper's order."""
    from blayers import experiments

    (tmp_path / "my_figure.py").write_text(
        "from blayers.experiments.base import Experiment, ReportEntry\n\n\n"
        "class MyFigure(Experiment):\n"
        "    name = 'my_figure'\n"
        "    report = ReportEntry('fig3', 'Figure 3: mine', 'No number.', order=3,\n"
        "                         experiments=('my_figure',))\n\n\n"
        "EXPERIMENT = MyFigure()\n"
    )
    monkeypatch.setattr(experiments, "__path__", [*experiments.__path__, str(tmp_path)])
    keys = [entry.key for entry in report.discover()]
    assert keys.index("fig1") < keys.index("fig3") < keys.index("fig4")
    assert keys.count("fig3") == 1


def test_post_hoc_outputs_sit_under_their_run_beside_its_model(tmp_path):
    """`RUN/posthoc/<method>/` is not a run of its own with no command: the report shows it
    under its run, its command, the checkpoint scored, and each metric beside the run's."""
    _fake_run(tmp_path / "rnn", "bayesian_rnn_smoke", {"nll": 1.1})
    out = tmp_path / "rnn" / "posthoc" / "temperature"
    out.mkdir(parents=True)
    (out / "metrics.json").write_text(
        json.dumps(
            {
                "method": "temperature",
                "checkpoint": "ckpt-30",
                "notes": ["T chosen on 180 digits."],
                "base": {"nll": 1.1, "ece": 0.08},
                "final": {"nll": 0.9, "ece": 0.02, "temperature": 1.7},
            }
        )
    )
    (out / "command.json").write_text(
        json.dumps({"command": "python -m blayers.posthoc --model_dir=rnn --method=temperature"})
    )
    assigned = report.write_report(str(tmp_path), str(tmp_path / "report"))
    assert [os.path.basename(r["dir"]) for r in assigned["fig1"][0]] == ["rnn"]
    assert not assigned["other"][0]  # not a loose run
    text = (tmp_path / "report.md").read_text()
    # The label of the method's class in the registry, and what the method said it chose.
    assert "#### Post-hoc `temperature` (temperature scaling, ckpt-30)" in text
    assert "T chosen on 180 digits." in text
    assert "| ece | 0.08 | 0.02 |" in text and "| temperature |  | 1.7 |" in text
    assert "no command.json" not in text
    assert "<td>0.08</td><td>0.02</td>" in (tmp_path / "report.html").read_text()
