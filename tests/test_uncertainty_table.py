"""The uncertainty-methods table (`benchmarks/uncertainty_table.py`): its rows average the
shifted sets per severity, its summary is a mean and standard error over seeds, and (slow) the
whole pipeline of trainer runs and post-hoc methods runs end to end on the smoke configs."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import uncertainty_table


def _metrics(accuracy):
    return {key: accuracy if key == "accuracy" else 0.5 for key in uncertainty_table.METRICS}


def test_rows_average_each_severity_over_the_corruptions_and_seeds_summarize():
    shift = {"clean": {"accuracy": 1.0, "nll": 0.0}}
    for severity in uncertainty_table.SEVERITIES:
        shift[f"gaussian_noise_{severity}"] = {"accuracy": 0.9 - 0.1 * severity, "nll": severity}
        shift[f"contrast_{severity}"] = {"accuracy": 0.7 - 0.1 * severity, "nll": 3 * severity}
    row = uncertainty_table._row(_metrics(0.9), shift, 10.0, 1.5)
    assert row["accuracy_s1"] == pytest.approx(0.7) and row["nll_s1"] == pytest.approx(2.0)
    assert row["accuracy_s5"] == pytest.approx(0.3) and row["nll_s5"] == pytest.approx(10.0)
    assert row["train_seconds"] == 10.0 and row["fit_seconds"] == 1.5
    cases = [
        {
            "dataset": "digits",
            "seed": seed,
            "rows": {
                m: uncertainty_table._row(_metrics(a), shift, 1.0, 0.0)
                for m in uncertainty_table.METHODS
            },
        }
        for seed, a in enumerate([0.8, 0.9, 1.0])
    ]
    table = uncertainty_table.summarize(cases)
    mean, se = table["digits"]["flipout"]["accuracy"]
    assert table["digits"]["seeds"] == 3
    assert mean == pytest.approx(0.9) and se == pytest.approx(
        np.std([0.8, 0.9, 1.0], ddof=1) / 3**0.5
    )
    text = uncertainty_table.markdown(table)
    assert "| digits | deep ensemble of 5 | 0.900 ± 0.058 |" in text
    assert "| digits | MAP | 0.700 / 2.00 |" in text


@pytest.mark.slow
def test_the_table_runs_end_to_end_on_the_smoke_configs(tmp_path):
    table = uncertainty_table.main(
        [
            "--smoke",
            "--seeds=1",
            "--members=2",
            f"--work_dir={tmp_path / 'runs'}",
            f"--out={tmp_path / 'table.json'}",
        ]
    )
    assert (tmp_path / "table.md").exists()
    for name in ("digits", "mnist5k"):
        rows = {m: {k: v[0] for k, v in table[name][m].items()} for m in uncertainty_table.METHODS}
        for method, row in rows.items():
            assert all(np.isfinite(v) for v in row.values()), (name, method, row)
            assert 0.1 < row["accuracy"] <= 1.0 and row["accuracy_s5"] <= row["accuracy"]
        assert rows["temperature"]["accuracy"] == rows["map"]["accuracy"]  # argmax kept
        assert rows["temperature"]["nll"] != rows["map"]["nll"]
        # the ensemble's other member trains in its post-hoc fit, as a replica
        assert rows["ensemble"]["fit_seconds"] > rows["temperature"]["fit_seconds"]
        assert rows["swag"]["fit_seconds"] > 0
