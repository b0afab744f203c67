"""The checkout's top-level `launch` and `experiments` packages are aliases of
`blayers.launch` and `blayers.experiments`, where the code lives (and what the wheel ships: no
top-level package of a common name clashes with a user's own).

`import launch.local` gives the very module `blayers.launch.local` (one module, one set of
globals: a test's monkeypatch reaches it), and `python -m launch.sweep` runs
`blayers/launch/sweep.py` as `__main__`, as `python -m blayers.launch.sweep` does.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["alias"]


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `<alias>.<name>` as `<target>.<name>`."""

    def __init__(self, alias, target):
        self.alias, self.target = alias, target

    def _real(self, fullname):
        return self.target + fullname[len(self.alias) :]

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.alias + "."):
            return None
        real = importlib.util.find_spec(self._real(fullname))
        if real is None:
            return None
        # The real file as origin: `python -m` sets `sys.argv[0]` and `__file__` from it.
        spec = importlib.util.spec_from_loader(fullname, self, origin=real.origin)
        spec.has_location = real.has_location
        return spec

    def create_module(self, spec):
        return importlib.import_module(self._real(spec.name))

    def exec_module(self, module):
        pass  # the real module ran when it was imported

    def get_code(self, fullname):  # `python -m <alias>.<name>`: the real module's code
        real = importlib.util.find_spec(self._real(fullname))
        return real.loader.get_code(real.name)

    def is_package(self, fullname):
        real = importlib.util.find_spec(self._real(fullname))
        return real.submodule_search_locations is not None


def alias(name, target):
    """Makes package `name` (the caller's) an alias of package `target`: its submodules are
    `target`'s, and so are its attributes."""
    if not any(isinstance(f, _AliasFinder) and f.alias == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(name, target))
    return importlib.import_module(target)
