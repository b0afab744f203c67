"""`--method=histogram`: one-vs-rest histogram binning (Zadrozny & Elkan, 2001)."""

from blayers import posthoc as library
from blayers.lab.posthoc_methods import Calibrator


class HistogramBinning(Calibrator):
    """Each class's probability replaced by its bin's frequency on the calibration part,
    renormalized (see `blayers.posthoc.HistogramBinning` for the arguments; `fallback`: see
    `Calibrator`)."""

    name, label = "histogram", "histogram binning"

    def __init__(self, num_bins=10, prior_strength=2.0, floor=1e-4, fallback=True):
        super().__init__(fallback=fallback)
        self.settings = {"num_bins": num_bins, "prior_strength": prior_strength, "floor": floor}

    def make(self):
        return library.HistogramBinning(**self.settings)
