"""`--method=temperature`: one temperature on the logits (Guo et al., 2017)."""

from blayers import posthoc as library
from blayers.lab.posthoc_methods import Calibrator


class Temperature(Calibrator):
    """`softmax(z / T)`, `T` fitted by the calibration part's NLL (accuracy unchanged)."""

    name, label = "temperature", "temperature scaling"
    checked = False

    def make(self):
        return library.TemperatureScaling()

    def metrics(self, fit):
        return {"temperature": self.calibrator.temperature}  # nothing to fall back to
