"""What only a new Python process shows, from one such process (TensorFlow takes seconds to
start: one process for these promises, not one each): a bare `import blayers` that loads
nothing heavy and changes nothing, a saved model of blayers layers that loads after it,
TensorFlow's own Cholesky warnings (which the test workers silence), and the fused kernels'
draws under the XLA vector width the test worker did not read (XLA reads it once a process)."""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from blayers import layers, xla_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_IMPORT_PROBE = """
import json, logging, os, sys
before_env, filters = dict(os.environ), list(logging.getLogger().filters)


class NoArgv(list):
    def _read(self, *args):
        raise AssertionError("sys.argv was read")

    __getitem__ = __iter__ = __len__ = __contains__ = _read


import blayers  # a bare import loads nothing heavy
bare = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "gin"))
import tensorflow, keras, tensorflow_probability  # noqa: E401 - what any user has loaded
loaded = set(sys.modules)
argv, sys.argv = sys.argv, NoArgv()
blayers.layers.DenseFlipout, blayers.Normal, blayers.predict, blayers.metrics  # the library
from blayers import constraints, initializers, programs, regularizers, tracing  # noqa: F401
sys.argv = argv
print("import " + json.dumps({
    "bare": bare,
    "new": sorted(m for m in set(sys.modules) - loaded
                  if m.split(".")[0] in ("gin", "absl", "launch", "experiments")
                  or m.startswith(("blayers.lab", "blayers.launch", "blayers.experiments"))
                  or m == "blayers.train"),
    "env": sorted(set(os.environ.items()) ^ set(before_env.items())),
    "filters": len(logging.getLogger().filters) - len(filters),
}), flush=True)
"""

_SAVED_MODEL_PROBE = """
keras.saving.load_model(sys.argv[1])
print("loaded", flush=True)
"""

# A GP layer whose K_ZZ needs more than its first jitter (inducing inputs repeated: singular).
_NEEDY_GP_PROBE = """
import numpy as np
from blayers.layers import SparseGaussianProcess
rng = np.random.RandomState(0)
duplicated = np.repeat(rng.randn(4, 1), 5, 0).astype("float32")
layer = SparseGaussianProcess(1, num_inducing=20, jitter=1e-9, max_jitter_tries=6,
    inducing_inputs_initializer=keras.initializers.Constant(duplicated))
x = rng.randn(8, 1).astype("float32")
sys.stderr.write("FIRST CALL\\n")  # TensorFlow's log and ours share the file descriptor
sys.stderr.flush()
for call in range(20):
    if call == 1:
        sys.stderr.write("AFTER THE FIRST CALL\\n")
        sys.stderr.flush()
    out = layer(x)
sys.stderr.write("GP DONE\\n")
sys.stderr.flush()
assert np.all(np.isfinite(out.distribution.mean().numpy()))
print("level", int(layer.jitter_level), flush=True)
"""

# The fused kernels' outputs on fixed inputs, saved to the .npz path given.
_WIDTH_PROBE = """
def width_probe(path):
    import numpy as np
    import tensorflow as tf
    from blayers import fused

    x = tf.linspace(-30.0, 30.0, 1 << 16)
    words = fused.random_words(1 << 16, tf.constant([7, 11], tf.int64))
    value, square = fused.softplus_and_square(x)
    np.savez(
        path,
        words=words.numpy(),
        normal=fused.box_muller(words, None, tf.constant([1 << 16])).numpy(),
        softplus=value.numpy(),
        kl=fused.normal_kl(x, square + 0.1, 0.0, 2.0).numpy(),
    )
"""


def _width_here():
    """The vector width this process's XLA read: its environment's (set before any test
    compiled: importing the benchmarks' helpers asks for 512 as the command lines do), or
    XLA's default, 256."""
    named = re.search(rf"{xla_cpu.FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(named.group(1)) if named else 256


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    """A user's new Python process with TensorFlow's default logging (and, on an AVX-512 CPU,
    the XLA vector width the test worker did not read): the import probe's report, a saved
    model of blayers layers loaded after `import blayers` (its layers registered when first
    used), the needy GP's calls and the width probe's draws. Returns (stdout lines, stderr,
    the draws' path or None)."""
    folder = tmp_path_factory.mktemp("fresh")
    path = str(folder / "model.keras")
    keras.Sequential([keras.Input((3,)), layers.DenseFlipout(2)]).save(path)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    draws = None
    code = _IMPORT_PROBE + _SAVED_MODEL_PROBE + _NEEDY_GP_PROBE
    if xla_cpu.has_avx512():
        other = 512 if _width_here() == 256 else 256
        env["XLA_FLAGS"] = f"{xla_cpu.FLAG}={other}"
        draws = str(folder / f"{other}.npz")
        code += _WIDTH_PROBE + "width_probe(sys.argv[2])\n"
    out = subprocess.run(
        [sys.executable, "-c", code, path, *([draws] if draws else [])],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines(), out.stderr, draws


def test_importing_the_library_loads_no_lab_and_changes_nothing(fresh_process):
    """`import blayers` alone loads no TensorFlow; using the library reads no argv, imports
    neither gin nor absl (beyond what TensorFlow itself loaded) nor any lab module, sets no
    environment variable and installs no logging filter."""
    lines, stderr, _ = fresh_process
    reports = [line for line in lines if line.startswith("import ")]
    assert len(reports) == 1, stderr[-3000:]
    assert json.loads(reports[0][len("import ") :]) == {
        "bare": [],
        "new": [],
        "env": [],
        "filters": 0,
    }


def test_a_saved_model_loads_after_importing_the_layers(fresh_process):
    lines, stderr, _ = fresh_process
    assert "loaded" in lines, stderr[-3000:]


def test_jitter_retries_warn_once_per_run_not_once_per_call(fresh_process):
    """TensorFlow's Cholesky kernel logs a warning for every failed try; a GP layer whose matrix
    needs more than its first jitter starts later calls at the jitter that worked (a weight of
    the layer, so checkpoints keep it): the first call warns, the 19 after it never do."""
    lines, stderr, _ = fresh_process
    assert "level 2" in lines
    calls = stderr.split("FIRST CALL\n", 1)[1].split("GP DONE\n")[0]
    first, _, later = calls.partition("AFTER THE FIRST CALL")
    assert later, stderr[-2000:]
    warning = "Cholesky decomposition was not successful"
    assert first.count(warning) >= 1 and later.count(warning) == 0, stderr[-2000:]


def test_the_vector_width_the_command_lines_ask_for_keeps_every_seeded_draw(
    fresh_process, tmp_path
):
    """The CLIs' 512-bit XLA vectors (`blayers.xla_cpu`) change code generation, not the
    maths: the same words bit for bit, the same normals and softplus to float32 rounding. The
    width the test worker's environment names runs here, the other in the new process. A CPU
    without AVX-512 is never asked for 512-bit vectors (the command lines' environment keeps
    XLA's default): nothing to compare there."""
    if not xla_cpu.has_avx512():
        environ = {}
        assert not xla_cpu.prefer_wide_vectors(environ) and environ == {}
        return
    _, _, other = fresh_process
    namespace = {}
    exec(_WIDTH_PROBE, namespace)  # noqa: S102 - the probe the new process ran
    here = tmp_path / "here.npz"
    namespace["width_probe"](str(here))
    ours, theirs = np.load(here), np.load(other)
    np.testing.assert_array_equal(ours["words"], theirs["words"])
    for name in ("normal", "softplus", "kl"):
        np.testing.assert_allclose(ours[name], theirs[name], rtol=2e-6, atol=1e-6)
