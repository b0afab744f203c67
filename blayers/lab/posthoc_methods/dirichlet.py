"""`--method=dirichlet`: Dirichlet calibration with ODIR (Kull et al., 2019)."""

from blayers import posthoc as library
from blayers.lab.posthoc_methods.matrix import MatrixScaling


class DirichletScaling(MatrixScaling):
    """`softmax(W log p + b)` (see `blayers.posthoc.DirichletScaling`); `MatrixScaling`'s
    arguments."""

    name, label = "dirichlet", "Dirichlet calibration (ODIR)"

    def __init__(self, off_diagonal="cv", bias=None, fallback=True):
        # Every argument passed on, so `MatrixScaling`'s own bindings do not reach this class.
        super().__init__(off_diagonal=off_diagonal, bias=bias, fallback=fallback)

    def make(self):
        return library.DirichletScaling(self.off_diagonal, self.bias)
