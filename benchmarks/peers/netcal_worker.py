"""netcal side of the calibration comparison (its own virtual environment, CPU PyTorch).

Reads a case file written by `calibration_compare.py`: the held-out softmax probabilities
(netcal takes probabilities and works on their logarithms, which softmax maps back to the same
predictive) and labels of a calibration part and an evaluation part. Fits netcal 1.4's
temperature scaling and its multiclass logistic calibration (vector scaling: a weight and a
bias per class), both by maximum likelihood (`method='mle'`), its one-vs-rest histogram
binning (10 equal-width bins) and isotonic regression, and measures netcal's ECE (15
equal-width bins) of each probability array it is handed. Saves the calibrated probabilities
and prints `RESULT {json}`: the temperature and the ECEs."""

import json
import sys

import numpy as np
import torch
from netcal.binning import HistogramBinning, IsotonicRegression
from netcal.metrics import ECE
from netcal.scaling import LogisticCalibration, TemperatureScaling

torch.set_num_threads(2)


def main(path, out_path):
    case = np.load(path)
    cal, y_cal, ev = case["probs_cal"], case["y_cal"], case["probs_eval"]
    temperature = TemperatureScaling(method="mle")
    temperature.fit(cal, y_cal)
    vector = LogisticCalibration(method="mle")
    vector.fit(cal, y_cal)
    histogram = HistogramBinning(bins=10)
    histogram.fit(cal, y_cal)
    isotonic = IsotonicRegression()
    isotonic.fit(cal, y_cal)
    arrays = {
        "histogram_eval": histogram.transform(ev),
        "isotonic_eval": isotonic.transform(ev),
        "temperature_cal": temperature.transform(cal),
        "temperature_eval": temperature.transform(ev),
        "vector_cal": vector.transform(cal),
        "vector_eval": vector.transform(ev),
    }
    np.savez(out_path, **arrays)
    metric = ECE(bins=15)
    eces = {
        key[len("ece_") :]: float(metric.measure(case[key], case["y_eval"]))
        for key in case.files
        if key.startswith("ece_")
    }
    # netcal's weight multiplies the log-probabilities: T = 1 / weight.
    result = {"temperature": float(1.0 / np.ravel(temperature.weights)[0]), "ece": eces}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
