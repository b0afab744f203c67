"""The peer harness: the table and comparisons from per-round results, an uninstallable peer
reported with its reason, and one real blayers worker case through the subprocess path."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))

import cases
import run


def test_summary_medians_ratios_and_comparisons():
    names = ["dense_deterministic", "dense_flipout", "svgp_m100"]
    rounds = [
        {
            "blayers": {"dense_deterministic": 10.0, "dense_flipout": 30.0, "svgp_m100": 5.0},
            "tfp_layers": {"dense_deterministic": 12.0, "dense_flipout": 40.0},
            "gpflow": {"svgp_m100": 10.0},
        },
        {
            "blayers": {"dense_deterministic": 20.0, "dense_flipout": 20.0, "svgp_m100": 7.0},
            "tfp_layers": {"dense_deterministic": 12.0, "dense_flipout": 44.0},
            "gpflow": {"svgp_m100": 12.0},
        },
        {
            "blayers": {"dense_deterministic": 12.0, "dense_flipout": 26.0, "svgp_m100": 6.0},
            "tfp_layers": {"dense_deterministic": 12.0, "dense_flipout": "error: boom"},
            "gpflow": {"svgp_m100": 11.0},
        },
    ]
    frameworks = ["blayers", "tfp_layers", "gpflow"]
    table = run.summarize(rounds, frameworks, names)
    assert table["blayers"]["dense_flipout"] == 26.0  # median over rounds
    assert table["tfp_layers"]["dense_flipout"] == 42.0  # the failed round left out
    assert table["tfp_layers"]["svgp_m100"] is None
    text = run.markdown(table, frameworks, names)
    assert "| dense_flipout | 26.0 | 2.17 | 42.0 | 3.50 | n/a | - |" in text
    compared = run.comparisons(table)
    assert abs(compared["dense_flipout_faster_than_tfp_layers"] - (1 - 26 / 42)) < 1e-9
    assert abs(compared["svgp_m100_time_vs_gpflow"] - 6 / 11) < 1e-9


def test_a_peer_that_cannot_install_is_reported(tmp_path):
    python, reason = run.ensure_venv(
        "broken", ["this-package-does-not-exist-blayers==0.0.0"], str(tmp_path), timeout=300
    )
    assert python is None and "pip install failed" in reason
    table = run.summarize(
        [{"broken": {"dense_flipout": f"not available: {reason}"}}], ["broken"], ["dense_flipout"]
    )
    run.LABELS.setdefault("broken", "broken")
    assert "not available: pip install failed" in run.markdown(table, ["broken"], ["dense_flipout"])


# The SVGP case's process takes a second longer than Flipout's: the slow suite runs it.
@pytest.mark.parametrize(
    "case", ["dense_flipout", pytest.param("svgp_m100", marks=pytest.mark.slow)]
)
def test_blayers_worker_times_a_case_in_its_own_process(case):
    results = run.run_worker(
        sys.executable, "blayers", [case, "conv_nonsense"], repeats=1, timeout=600
    )
    assert isinstance(results[case], float) and results[case] > 0
    assert results["conv_nonsense"].startswith("error: not supported")


def test_every_case_is_defined_once():
    names = cases.case_names(["dense", "conv", "svgp"])
    assert len(names) == len(set(names)) == 9
    assert json.dumps(cases.SVGP)  # plain data, written into the JSON report


@pytest.mark.slow
def test_temperature_and_ece_agree_with_netcal(tmp_path):
    """netcal 1.4 in its own environment (created on first use, as the benchmark does) fits
    the same temperature on the same logits and measures the same ECE of the same
    probabilities; vector scaling reaches at least netcal's likelihood on the calibration half."""
    import calibration_compare

    table = calibration_compare.main(
        ["--datasets", "digits", "--seeds", "1", "--out", str(tmp_path / "calibration.json")]
    )["digits"]
    assert table["seeds"] == 1, "netcal did not run"
    assert table["max_relative_difference/temperature"] < 1e-3
    assert table["max_abs_difference/temperature/nll_cal"] < 1e-6
    assert table["max_abs_difference/ece_metric"] < 1e-9
    # The one-vs-rest maps give netcal's probabilities (netcal clips inputs to float eps).
    assert table["max_abs_difference/histogram/probs"] < 1e-9
    assert table["max_abs_difference/isotonic/probs"] < 1e-6
    # Both maximize the same likelihood; blayers' optimum is no worse than netcal's.
    ours, theirs = table["blayers/vector/nll_cal"][0], table["netcal/vector/nll_cal"][0]
    assert ours <= theirs + 1e-4
    # Temperature scaling never raises the NLL of the set it was fitted on.
    assert table["blayers/temperature/nll_cal"][0] <= table["map/nll_cal"][0] + 1e-12


@pytest.mark.slow
def test_metrics_and_ood_scores_agree_with_torch_uncertainty(tmp_path):
    """torch-uncertainty 0.13 in its own environment measures the same probabilities: the
    classwise and adaptive calibration errors and each OOD score's FPR at 95% TPR agree to
    rounding, AUGRC and AURC to rounding under its trapezoid rule (blayers' mean over the
    coverages is O(1/n) from it), SmoothECE to its float32 grid."""
    import metrics_compare

    table = metrics_compare.main(
        ["--datasets", "digits", "--seeds", "1", "--out", str(tmp_path / "metrics.json")]
    )["digits"]
    assert table["seeds"] == 1, "torch-uncertainty did not run"
    for metric in ("augrc", "aurc", "classwise_ece", "adaptive_ece"):
        assert table[f"max_abs_difference/{metric}"] < 1e-6, metric
    assert table["max_abs_difference/smooth_ece"] < 1e-4  # its float32 grid
    scores = [k.split("/")[-1] for k in table if k.startswith("max_abs_difference/fpr95/")]
    assert {"max_softmax", "energy", "mahalanobis", "feature_density"} <= set(scores)
    for score in scores:
        assert table[f"max_abs_difference/fpr95/{score}"] < 1e-6, score
    # On uniform noise, the feature scores see what the softmax does not.
    assert table["blayers/auroc/mahalanobis"] > table["blayers/auroc/max_softmax"]


@pytest.mark.slow
def test_laplace_variants_agree_with_laplace_torch(tmp_path):
    """laplace-torch 0.3 on the same weights at the same precisions: the last-layer joint
    predictive (full GGN), the subnetwork posterior and the per-layer-precision evidence agree
    to the float32 forward pass; KFAC's joint covariance to each library's factor convention."""
    import laplace_variants_compare

    table = laplace_variants_compare.main(
        ["--datasets", "digits", "--seeds", "1", "--out", str(tmp_path / "variants.json")]
    )["digits"]
    assert table["seeds"] == 1, "laplace-torch did not run"
    assert table["joint_full_max_relative_difference"] < 1e-5
    assert table["subnet_max_relative_difference"] < 1e-5
    assert table["evidence_relative_difference"] < 1e-6
    assert table["joint_kron_max_relative_difference"] < 0.05


@pytest.mark.slow
def test_snapshots_and_mc_batchnorm_match_torch_uncertainty(tmp_path, monkeypatch):
    """The same network and schedule trained by each library: blayers' lab run of
    configs/digits_snapshots.gin scored by `--method=snapshots` against torch-uncertainty's
    `CheckpointCollector` at the same cycles' ends, and `blayers.posthoc.MCBatchNorm` against
    its `MCBatchNorm` on the same CNN: each learns, and their NLLs agree within 0.05 (the
    seeds' spread is about 0.01); on one trained network both give the same predictive."""
    import ensembles_compare

    methods = ("snapshots", "mc_batchnorm")
    monkeypatch.setattr(ensembles_compare, "METHODS", methods)
    table = ensembles_compare.main(
        ["--datasets", "digits", "--seeds", "1", "--out", str(tmp_path / "ensembles.json")]
    )["digits"]
    assert table["seeds"] == 1, "torch-uncertainty did not run"
    for method in methods:
        for library in ("blayers", "torch_uncertainty"):
            assert table[f"{method}/{library}/accuracy"][0] > 0.9, (method, library)
        assert abs(table[f"{method}/difference/nll"][0]) < 0.05, method
    # On the same trained CNN and the same batches the two MC-BatchNorms agree up to the batch
    # variance's n / (n - 1) (torch-uncertainty keeps the unbiased one).
    assert table["mc_batchnorm_same_weights/max_abs_difference"] < 1e-3


@pytest.mark.slow
def test_deep_evidential_regression_matches_torch_uncertainty(tmp_path):
    """The same MLP from the same initial weights with blayers' `NormalInverseGamma` and
    torch-uncertainty's `NormalInverseGammaLinear` + `DERLoss` (the same Student-t NLL and
    evidence penalty; blayers' equal to its float64 value to float32 rounding): both learn Friedman's function, and their test NLLs agree within 0.15
    (the seeds' spread is about 0.05)."""
    import evidential_regression_compare

    table = evidential_regression_compare.main(
        ["--datasets", "friedman", "--seeds", "1", "--out", str(tmp_path / "der.json")]
    )["friedman"]
    assert table["seeds"] == 1, "torch-uncertainty did not run"
    for library in ("blayers", "torch_uncertainty"):
        assert table[f"{library}/rmse"][0] < 2.0, library  # the targets' sd is about 5
    assert abs(table["difference/nll"][0]) < 0.15
    assert table["blayers/loss_max_relative_error"] < 1e-5  # the paper's loss, to float32
