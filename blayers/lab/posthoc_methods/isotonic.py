"""`--method=isotonic`: one-vs-rest isotonic regression (Zadrozny & Elkan, 2002)."""

from blayers import posthoc as library
from blayers.lab.posthoc_methods import Calibrator


class IsotonicRegression(Calibrator):
    """Each class's probability mapped by a monotone fit to the calibration part, renormalized.

    Args:
      floor: the smallest calibrated probability (see `blayers.posthoc.IsotonicCalibration`).
      fallback: see `Calibrator`.
    """

    name, label = "isotonic", "isotonic regression"

    def __init__(self, floor=1e-3, fallback=True):
        super().__init__(fallback=fallback)
        self.floor = floor

    def make(self):
        return library.IsotonicCalibration(floor=self.floor)
