"""torch-uncertainty side of the uncertainty-metrics comparison (its own virtual environment,
CPU PyTorch).

Reads a case file written by `metrics_compare.py`: a predictive's probabilities and labels,
and per OOD score (higher = OOD) the in-distribution and OOD values. Measures with
torch-uncertainty 0.13 AUGRC, AURC, the classwise and adaptive calibration errors (15 bins),
the SmoothECE (reflected kernel) and, per score, the FPR at 95% TPR, and prints
`RESULT {json}`."""

import json
import sys

import numpy as np
import torch
from torch_uncertainty.metrics import (
    AUGRC,
    AURC,
    FPR95,
    AdaptiveCalibrationError,
    ClasswiseCalibrationError,
    SmoothCalibrationError,
)

torch.set_num_threads(2)


def _measure(metric, *args):
    metric.update(*args)
    return float(metric.compute())


def main(path):
    case = np.load(path)
    probs = torch.tensor(case["probs"], dtype=torch.float64)
    labels = torch.tensor(case["labels"], dtype=torch.long)
    k = probs.shape[1]
    result = {
        "augrc": _measure(AUGRC(), probs, labels),
        "aurc": _measure(AURC(), probs, labels),
        "classwise_ece": _measure(ClasswiseCalibrationError(num_classes=k), probs, labels),
        "adaptive_ece": _measure(
            AdaptiveCalibrationError(task="multiclass", num_classes=k, num_bins=15), probs, labels
        ),
        # Its kernel grid is float32 (float64 inputs fail in index_add_).
        "smooth_ece": _measure(
            SmoothCalibrationError(kernel_type="reflected"), probs.float(), labels
        ),
        "fpr95": {},
    }
    for key in case.files:
        if key.startswith("in_"):
            name = key[len("in_") :]
            inside, outside = case[key], case[f"out_{name}"]
            scores = torch.tensor(np.r_[inside, outside], dtype=torch.float64)
            truth = torch.tensor(np.r_[np.zeros(len(inside)), np.ones(len(outside))]).long()
            result["fpr95"][name] = _measure(FPR95(pos_label=1), scores, truth)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
