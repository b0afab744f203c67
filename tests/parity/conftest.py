import pathlib

import pytest

HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(items):
    """edward2's translated tests run with the slow suite (`-m slow`): about 240 small tests
    whose promises the library's own tests check in the fast one."""
    for item in items:
        if HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)
