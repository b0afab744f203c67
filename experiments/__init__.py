"""`experiments` in a checkout: an alias of `blayers.experiments`, where the experiment
scripts live (`python -m experiments.uci_regression` is
`python -m blayers.experiments.uci_regression`)."""

from blayers.lab.aliases import alias as _alias

_target = _alias(__name__, "blayers.experiments")


def __getattr__(name):  # `from experiments import report`: the real submodule
    import importlib

    return importlib.import_module(f"blayers.experiments.{name}")
