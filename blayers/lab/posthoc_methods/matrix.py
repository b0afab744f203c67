"""`--method=matrix`: matrix scaling of the logits with off-diagonal and intercept
regularization (Kull et al., 2019)."""

from blayers import posthoc as library
from blayers.lab.posthoc_methods import Calibrator


class MatrixScaling(Calibrator):
    """`softmax(W z + b)` (see `blayers.posthoc.MatrixScaling`).

    Args:
      off_diagonal: ODIR's `lambda`, or `'cv'` (5-fold cross-validation on the calibration part).
      bias: ODIR's `mu` (None: `lambda`).
      fallback: see `Calibrator`.
    """

    name, label = "matrix", "matrix scaling (ODIR)"

    def __init__(self, off_diagonal="cv", bias=None, fallback=True):
        super().__init__(fallback=fallback)
        self.off_diagonal, self.bias = off_diagonal, bias

    def make(self):
        return library.MatrixScaling(self.off_diagonal, self.bias)

    def metrics(self, fit):
        chosen = getattr(self.calibrator, "chosen_off_diagonal", None)
        extra = {} if chosen is None else {"off_diagonal": chosen}
        return {**super().metrics(fit), **extra}
