import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import gc
import math

import gin
import numpy as np
import pytest

import blayers

if os.environ.get("PYTEST_XDIST_WORKER"):
    import tensorflow as tf

    # `-n 2` on two cores: each worker its share of the cores, one intra-op and one inter-op
    # thread, as the sweeps run trainers side by side (`blayers.launch.local.trainer_env`).
    # TensorFlow's default, a thread per core in each pool of each worker, oversubscribes the
    # CPU: the same tests took up to twice as long with two intra-op threads, and about 8%
    # longer with two inter-op threads (measured interleaved, 4 runs of 2 sets of test files).
    # A test process it starts keeps TensorFlow's default. (The controller of `-n 2` runs no
    # test: it does not load TensorFlow, seconds of a core while its workers start.)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # The same share for NumPy's and SciPy's OpenBLAS and scikit-learn's OpenMP (loaded with
    # TensorFlow's Keras): a thread per core each, they ran the Laplace, conformal and
    # calibration tests beside the other worker's test (more threads than cores, OpenBLAS's
    # waiting threads spinning) in 15-25% more time with the CPU time halved (interleaved runs
    # of those files), up to 4x for a scikit-learn cross-validation.
    import threadpoolctl

    threadpoolctl.threadpool_limits(1)


# The order test folders run in: their longest tests first, so that with `-n 2` the last tests
# each worker holds are short ones (pytest-xdist gives each worker a queue of two or more; a
# long one last left the other worker idle for up to a minute).
_ORDER = {"tests": 0, "lab": 1, "experiments": 2, "launch": 3, "library": 4, "parity": 5}


def pytest_collection_modifyitems(items):
    """The top-level files (documentation examples, fresh-process and packaging checks, the
    benchmark harness), then the lab's end-to-end runs, then the library's many short tests;
    within a folder, pytest's order (stable sort)."""
    items.sort(key=lambda item: _ORDER.get(item.path.parent.name, 4))


@pytest.fixture(autouse=True)
def _freeze_what_earlier_tests_left():
    """A test worker's heap grows to gigabytes of TensorFlow objects; Python's full collections
    scan all of it, again and again. Before each test the survivors of the earlier ones move to
    the permanent generation (`gc.freeze`), so the test's collections scan only its own objects
    (8 s of a 190 s share of the suite); objects freed by reference counting are still freed,
    and each test's cyclic garbage is collected before the next one starts. (Collections that
    took 6-35 s were tf.data iterators waiting for their autotuner: `blayers.pipelines`.)"""
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True)
def _seed_and_clean_gin():
    blayers.set_seed(0)
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def autograph_conversions(monkeypatch):
    """The list of blayers functions (qualified names) that autograph converts while the test
    runs: blayers traces its functions as written, since converting them cost seconds a
    process."""
    from tensorflow.python.autograph.impl import api

    converted = []
    convert = api._convert_actual

    def recording(entity, program_ctx):
        if getattr(entity, "__module__", "").startswith("blayers"):
            converted.append(entity.__qualname__)
        return convert(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", recording)
    return converted


def sigma_tolerance(standard_error, sigmas=5.0):
    """Tolerance of `sigmas` standard errors (tests of Monte Carlo estimates)."""
    return sigmas * standard_error


def check_moments(draws, mean, var, sigmas=5.0):
    """Monte Carlo mean and variance of `draws` (first axis: draws) against closed forms, to
    `sigmas` standard errors (the variance's from its chi-square spread)."""
    n = len(draws)
    draws = np.asarray(draws, np.float64)
    assert np.all(np.abs(draws.mean(0) - mean) < sigmas * np.sqrt(var / n) + 1e-6)
    assert np.all(np.abs(draws.var(0, ddof=1) - var) < sigmas * var * math.sqrt(2 / (n - 1)) + 1e-6)


def graph_draws(fn, count, dtype="float32", indexed=False):
    """`count` calls of `fn` (no arguments; TensorFlow's random state gives each call fresh
    noise; `indexed`: the call's index, an int32 scalar tensor, e.g. for a stateless seed)
    stacked on a new first axis, as one graph loop: `fn` traced once, and no Python call a
    draw (a `tf.function` called 2,000 times took seconds)."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def draws():
        return tf.map_fn(
            lambda i: tf.convert_to_tensor(fn(i) if indexed else fn()),
            tf.range(count),
            fn_output_signature=tf.as_dtype(dtype),
            parallel_iterations=1,  # the draws in order, one after another
        )

    return draws().numpy()


def epochs_of(x, y, epochs, batch_size=32, seed=0):
    """`epochs` passes over `(x, y)`, each in a new random order, as one `tf.data.Dataset`:
    `model.fit(epochs_of(x, y, 150, 200))` takes the steps of `model.fit(x, y, epochs=150,
    batch_size=200)` in one Keras epoch. Keras starts each epoch's input pipeline anew, which
    on a slow CPU costs 0.1-0.2 s an epoch: most of a small model's fit."""
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed)
    return data.batch(batch_size).repeat(epochs)


def run_module_noting_tensorflow(module, *args, cwd=None, timeout=120):
    """`python -m module *args` in a new process, printing at exit whether TensorFlow was
    loaded (`tensorflow loaded: False`): the command lines load it with stderr silenced, so an
    import log would not show it."""
    import subprocess
    import sys

    argv = [module, *args]
    code = (
        "import atexit, runpy, sys;"
        "atexit.register(lambda: print('tensorflow loaded:', 'tensorflow' in sys.modules));"
        f"sys.argv = {argv!r};"
        f"sys.orig_argv = {[sys.executable, '-m', *argv]!r};"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return subprocess.run(  # noqa: PLW1510 - callers assert the return code
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def write_uci_folder(root, name="toy", rows=60, splits=2, seed=0):
    """A data set in the 20-split format (`data.txt`, index files) under `root/name`: y = sin of
    the first of 3 features plus noise, 90/10 random splits."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    y = 3.0 * np.sin(x[:, 0]) + 0.1 * rng.normal(size=rows) + 10.0
    folder = root / name
    folder.mkdir(parents=True)
    np.savetxt(folder / "data.txt", np.column_stack([x, y]))
    np.savetxt(folder / "index_features.txt", [0, 1, 2], fmt="%d")
    np.savetxt(folder / "index_target.txt", [3], fmt="%d")
    np.savetxt(folder / "n_splits.txt", [splits], fmt="%d")
    for k in range(splits):
        order = rng.permutation(rows)
        cut = int(0.9 * rows)
        np.savetxt(folder / f"index_train_{k}.txt", order[:cut], fmt="%d")
        np.savetxt(folder / f"index_test_{k}.txt", order[cut:], fmt="%d")
    return folder


@pytest.fixture
def toy_uci(tmp_path):
    """A folder holding one small data set, `toy`, in the UCI 20-split format (2 splits)."""
    root = tmp_path / "uci"
    write_uci_folder(root)
    return root


def shuffled_digits():
    """scikit-learn's digits in a fixed random order, features in [0, 1]: `(x, y)` (its own
    order puts other writers at the end)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    return (digits.data[order] / 16.0).astype("float32"), digits.target[order]
