"""The command line's environment for TensorFlow, set before TensorFlow loads.

TensorFlow reads `TF_CPP_MIN_LOG_LEVEL` once, when it loads (and prints a few lines about
oneDNN and CUDA drivers before its logging is even set up). `import blayers` loads nothing
heavy, so the command lines call `prepare()` first: `python -m blayers.train` (or
`blayers-train`) in `blayers.train.run`, the experiment scripts in `experiments/__init__.py`
(`prepare_if_cli`: that package is also imported by tests). The library never calls it.

`prepare()` also gives the process a temporary folder of its own, `blayers-<pid>` under the
system's (`tempfile.tempdir`): TensorFlow's autograph writes a `__autograph_generated_file*.py`
per converted function there and deletes it at exit, which a `kill -9` prevents. Each command
line removes the folders of blayers processes that are gone, so nothing piles up.

On the CPU (the default strategy) the CLI sets level 3, which also hides the
`cuInit ... UNKNOWN ERROR (303)` line TensorFlow prints on a machine without a GPU; with a GPU,
TPU or multi-worker strategy it sets 2 (warnings off, errors shown). A value the user set wins.
On an AVX-512 CPU it also asks XLA's CPU compiler for 512-bit vectors
(`blayers.xla_cpu.prefer_wide_vectors`: the fused kernels of a Bayesian layer's step run
10-25% faster), unless `XLA_FLAGS` already names a vector width.
The CLI also loads TensorFlow with the process's stderr silenced, which drops those
start-up lines (an import error still raises, and its traceback is printed afterwards). This
module imports nothing heavy itself.
"""

import atexit
import contextlib
import logging
import os
import shutil
import sys
import tempfile

from blayers import xla_cpu

__all__ = [
    "help_text",
    "import_tensorflow_quietly",
    "is_cli",
    "pid_alive",
    "prepare",
    "prepare_if_cli",
    "private_tempdir",
    "quiet_tensorflow",
    "run_app",
]

# A trailing dot: every module under it (`experiments.` is the checkout's alias).
_CLI_MODULES = ("blayers.train", "blayers.experiments.", "experiments.")
_CLI_SCRIPTS = ("blayers-train",)


def is_cli(orig_argv=None, argv=None):
    """True when this process runs the blayers training CLI (or an experiment script)."""
    orig_argv = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
    argv = list(sys.argv if argv is None else argv)
    for i, arg in enumerate(orig_argv[:-1]):
        module = orig_argv[i + 1]
        if arg == "-m" and any(
            module == m or (m.endswith(".") and module.startswith(m)) for m in _CLI_MODULES
        ):
            return True
    return bool(argv) and os.path.basename(argv[0]) in _CLI_SCRIPTS


def prepare_if_cli(load_tensorflow=True):
    """`prepare()` when this process runs a blayers command line, else nothing. The commands'
    flags are defined without TensorFlow, so their `--help` does not load it."""
    if is_cli():
        prepare(help_loads_tensorflow=False, load_tensorflow=load_tensorflow)


def prepare(help_loads_tensorflow=True, load_tensorflow=True):
    """Quiets TensorFlow's C++ log for a command line and gives it a temporary folder of its
    own (see the module docstring). `help_loads_tensorflow=False`: the command's `--help`
    imports no TensorFlow (its flags are defined without it), so it is not loaded for one.
    `load_tensorflow=False`: the command loads it later (`import_tensorflow_quietly`), once
    its flags are checked, so that a usage error answers in a second."""
    if not help_loads_tensorflow and any(arg in _HELP for arg in sys.argv[1:]):
        return  # `--help` of a command whose flags load no TensorFlow: none to quiet
    private_tempdir()
    on_cpu = not any(a.startswith("--strategy=") and a.split("=", 1)[1] != "cpu" for a in sys.argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3" if on_cpu else "2")
    xla_cpu.prefer_wide_vectors()  # before anything compiles with XLA, which reads it once
    if load_tensorflow:
        import_tensorflow_quietly()


def import_tensorflow_quietly():
    """Imports TensorFlow with its start-up log (absl's lines before `InitializeLog`, which no
    log level silences) sent nowhere; nothing once it is loaded."""
    if "tensorflow" not in sys.modules:
        _import_tensorflow_quietly()


def pid_alive(pid):
    """Whether process `pid` runs on this host (the run lock's test too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def private_tempdir():
    """`tempfile.tempdir = <system temp>/blayers-<pid>`, after removing the folders of
    blayers processes that no longer run (a `kill -9` leaves autograph's files behind)."""
    if os.path.basename(tempfile.gettempdir()).startswith("blayers-"):
        return  # done already in this process
    system = tempfile.gettempdir()
    for name in os.listdir(system):
        if name.startswith("blayers-") and name[8:].isdigit() and not pid_alive(int(name[8:])):
            shutil.rmtree(os.path.join(system, name), ignore_errors=True)
    own = os.path.join(system, f"blayers-{os.getpid()}")
    os.makedirs(own, exist_ok=True)
    tempfile.tempdir = own
    atexit.register(shutil.rmtree, own, ignore_errors=True)


def quiet_tensorflow():
    """TensorFlow for a process that only writes summaries (a sweep's driver, the report):
    loaded without its start-up log and with its C++ log at errors only while it loads (the
    `cuInit` line of a CPU machine included); the process's own environment, which its
    trainers inherit, is left as it was."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    previous = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        _import_tensorflow_quietly()
        import tensorflow as tf

        tf.config.list_physical_devices()  # device discovery (cuInit) while still quiet
    finally:
        if previous is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return sys.modules["tensorflow"]


def _import_tensorflow_quietly():
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


_HELP = ("--help", "-h", "-?", "--helpshort")
_OWN_FLAG_MODULES = ("blayers", "experiments", "launch")


def help_text(doc, argv0=None):
    """`doc`, then every flag the command itself defines (blayers', the experiment's, the
    script's), each with its help and default; absl's and TensorFlow's own are left to
    `--helpfull`."""
    from absl import flags

    argv0 = argv0 or sys.argv[0]
    parts = [(doc or "").strip(), ""]
    for module, module_flags in sorted(flags.FLAGS.flags_by_module_dict().items()):
        own = module in ("__main__", argv0) or module.split(".")[0] in _OWN_FLAG_MODULES
        if own and module_flags:
            parts.append(flags.FLAGS.module_help(module))
            parts.append("")
    parts.append("--helpfull lists every flag, absl's and TensorFlow's included.")
    return "\n".join(parts)


def run_app(main, doc):
    """absl's `app.run(main)`, with a `--help` (`-h`, `--helpshort`) that prints `doc` and the
    command's own flags with their defaults on stdout and exits 0 (absl's lists only the
    main module's flags, which are defined elsewhere here, and exits 1)."""
    from absl import app

    if any(arg in _HELP for arg in sys.argv[1:]):
        print(help_text(doc))
        sys.exit(0)
    app.run(main)


@contextlib.contextmanager
def dropped_records(logger, drop):
    """Within the block, `logger` drops the records for which `drop(record)` is true (a known,
    harmless message a library repeats), and only those."""

    class _Drop(logging.Filter):
        def filter(self, record):
            return not drop(record)

    quiet = _Drop()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
