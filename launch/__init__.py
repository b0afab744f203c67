"""`launch` in a checkout: an alias of `blayers.launch`, where the launchers live
(`python -m launch.sweep` is `python -m blayers.launch.sweep`, `blayers-sweep`)."""

from blayers.lab.aliases import alias as _alias

_target = _alias(__name__, "blayers.launch")


def __getattr__(name):  # `from launch import sweep`: the real submodule
    import importlib

    return importlib.import_module(f"blayers.launch.{name}")
