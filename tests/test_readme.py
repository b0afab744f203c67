"""The README's Python examples run as written (a user copies them first)."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks
    namespaces = []
    for block in blocks:
        namespaces.append({})
        exec(compile(block, str(README), "exec"), namespaces[-1])  # noqa: S102 - our own README
    # The example that trained on digits with fit: its loss is the per-example ELBO.
    (namespace,) = [n for n in namespaces if "prediction" in n]
    history = namespace["model"].history.history
    assert history["loss"][-1] < 100.0 and history["accuracy"][-1] > 0.9  # not 1e5
    assert np.all(np.isfinite(namespace["prediction"].mean))
    # The probabilistic-programs example fitted q(z) to the exact posterior N(0.985, 0.277^2).
    (programs,) = [n for n in namespaces if "posterior" in n]
    assert abs(float(programs["loc"]) - 12.8 / 13) < 0.1
    assert abs(float(programs["tf"].nn.softplus(programs["raw_scale"])) - 13**-0.5) < 0.05
