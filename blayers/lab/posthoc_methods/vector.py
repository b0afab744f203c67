"""`--method=vector`: a scale and a bias per class on the logits (Guo et al., 2017)."""

from blayers import posthoc as library
from blayers.lab.posthoc_methods import Calibrator


class VectorScaling(Calibrator):
    """`softmax(w * z + b)`, fitted by the calibration part's NLL."""

    name, label = "vector", "vector scaling"

    def make(self):
        return library.TemperatureScaling(vector=True)
