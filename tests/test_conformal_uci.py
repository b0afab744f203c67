"""`benchmarks/conformal_uci.py` on a small UCI-format folder: blayers' split-conformal, CQR
and CV+ intervals equal MAPIE's on the same predictions, the CV+ folds trained as replicas."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import conformal_uci


@pytest.mark.slow  # nine small trainings; the unit tests compare each method with MAPIE
def test_the_table_matches_mapie_on_a_small_uci_folder(toy_uci, tmp_path):
    table = conformal_uci.main(
        [
            f"--uci_dir={toy_uci}",
            "--datasets=toy",
            "--splits=2",
            "--steps=150",
            "--folds=3",
            f"--out={tmp_path / 'conformal.json'}",
        ]
    )["toy"]
    assert table["splits"] == 2
    for method in conformal_uci.METHODS:
        assert table[f"{method}/max_difference"] < 1e-9, method
        coverage, _ = table[f"{method}/coverage"]
        assert coverage == table[f"{method}/mapie_coverage"][0]
        assert 0.0 < coverage <= 1.0 and table[f"{method}/width"][0] > 0
    text = (tmp_path / "conformal.md").read_text()
    assert "| toy | 2 | CV+ |" in text and np.isfinite(table["cqr/width"][0])
