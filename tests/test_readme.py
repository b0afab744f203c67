"""The README's Python examples run as written (a user copies them first)."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks
    for block in blocks:
        namespace = {}
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - our own README
    # The last example trained on digits with fit: its loss is the per-example ELBO.
    history = namespace["model"].history.history
    assert history["loss"][-1] < 100.0 and history["accuracy"][-1] > 0.9  # not 1e5
    assert np.all(np.isfinite(namespace["prediction"].mean))
