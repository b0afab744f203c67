r"""Train a model from gin files: `python -m blayers.train` (or `blayers-train`).

    python -m blayers.train --gin_file=digits_mlp --model_dir=runs/digits \
        --gin_param="mlp.dense_layer = 'DenseReparameterization'"

Gin files are found by name on the search path (`configs/`, see `blayers.lab.config`); later files
and `--gin_param` bindings override earlier ones; an unknown name fails before training with its
file and line. Re-running the same command resumes from the last checkpoint in `--model_dir`.
"""

import json
import os
import shlex
import signal
import sys
import threading

from absl import app, flags, logging

from blayers.lab import cli_env

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin files (names on the search path, or paths).")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings, applied after the files.")
flags.DEFINE_string("model_dir", None, "Output folder (checkpoints, metrics, plots, logs).")
flags.DEFINE_bool(
    "refuse_gin_imports",
    False,
    "Refuse gin files or bindings that import Python modules or use dynamic registration "
    "(gin files are code: use this for configs from elsewhere).",
)
flags.DEFINE_enum(
    "strategy",
    None,
    ["cpu", "gpu", "mirrored", "multi_worker", "tpu", "mesh"],
    "tf.distribute strategy for the config's learner (default: the learner's own: one device, "
    "or MeshLearner's mesh); `mesh` names Mesh TensorFlow, which only MeshLearner runs on.",
)
flags.DEFINE_string(
    "mesh_shape", None, "MeshLearner's mesh, e.g. 'model:2' (binds MeshLearner.mesh_shape)."
)
flags.DEFINE_string(
    "layout", None, "MeshLearner's layout rules, e.g. 'heads:model' (binds MeshLearner.layout)."
)
flags.DEFINE_string("tpu", None, "TPU name or address for --strategy=tpu.")
flags.DEFINE_integer(
    "num_cpu_devices", None, "Split the CPU into this many logical devices (mirrored tests)."
)


def format_metrics(metrics):
    return "\n".join(f"  {key:30s} {value:.4f}" for key, value in sorted(metrics.items()))


def main(argv):
    del argv
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TF's and gin's INFO chatter off by default
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required.")
    if FLAGS.refuse_gin_imports:
        from blayers.lab import gin_files

        try:
            gin_files.refuse_imports_of(FLAGS.gin_file, FLAGS.gin_param)
        except ValueError as error:
            logging.error("Bad gin configuration:\n%s", error)
            sys.exit(2)
    from blayers.lab import runs  # loads no TensorFlow

    problem = runs.unwritable(FLAGS.model_dir)
    if problem:  # said at once, not after TensorFlow's seconds of loading
        _cannot_write(problem)
    # Import after absl parsed flags: TF and the configurables load here (quietly, from a
    # command line).
    cli_env.import_tensorflow_quietly()
    from blayers.lab import config, loop, strategy

    _set_command()
    # The mesh flags are bindings of the mesh learner (a resume may change them).
    mesh_params = [
        f"MeshLearner.{name} = {value!r}"
        for name, value in (("mesh_shape", FLAGS.mesh_shape), ("layout", FLAGS.layout))
        if value
    ]
    try:
        config.parse(
            FLAGS.gin_file,
            [*FLAGS.gin_param, *mesh_params],
            refuse_imports=FLAGS.refuse_gin_imports,
        )
    except ValueError as error:
        logging.error("Bad gin configuration:\n%s", error)
        sys.exit(2)
    name = FLAGS.strategy
    if name in (None, "mesh"):  # the learner's own devices
        if FLAGS.num_cpu_devices:
            strategy.split_cpu(FLAGS.num_cpu_devices)
        dist = name
    else:
        dist = strategy.get_strategy(name, FLAGS.tpu, FLAGS.num_cpu_devices)
        print(
            f"Strategy {type(dist).__name__} with {dist.num_replicas_in_sync} replica(s); "
            f"model_dir {FLAGS.model_dir}."
        )
    _train_and_report(lambda: loop.train(FLAGS.model_dir, strategy=dist))


def _cannot_write(reason):
    """The run folder's one line and exit status 1."""
    logging.error(
        "Could not write the run folder %s: %s\nWhat it held before is intact; fix this "
        "(space, permissions, a shorter path) and re-run the same command: it resumes.",
        FLAGS.model_dir,
        reason,
    )
    sys.exit(1)


def _set_command():
    """The command line for `command.json`, which the Loop writes once the run is accepted
    (the reproduction report, `python -m blayers.experiments.report`, prints it beside each number)."""
    from blayers.lab import runs

    runs.set_command(
        {
            "command": " ".join(
                shlex.quote(a) for a in ["python", "-m", "blayers.train", *sys.argv[1:]]
            ),
            "gin_file": list(FLAGS.gin_file),
            "gin_param": list(FLAGS.gin_param),
        }
    )


def _train_and_report(train_fn):
    """Runs `train_fn()` and prints its final metrics; a stop or a failure becomes one line and
    an exit code: 130 or 143 stopped by Ctrl-C or SIGTERM (checkpoint saved), 1 the folder
    could not be written (read-only, a full disk, a name too long), 3 a non-finite loss, 4 a locked run folder, changed bindings on resume or a
    folder of another model, 2 a bad argument found while building (a binding, a shape)."""
    from blayers.lab import loop, runs

    def late_signal(signum, frame):
        if loop.stopping():  # a stop is completing: a second signal (a sweep's) adds nothing
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)  # before the Loop took over: as by default
        os.kill(os.getpid(), signum)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, late_signal)
    try:
        metrics = train_fn()
    except loop.Stopped as stopped:  # one line, and the shell's status for that signal
        # Ignored, not handled, from here to the exit: Python's shutdown sets a handled
        # signal back to its default, and a late one (a sweep's SIGTERM) would then kill it.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        print(
            f"Stopped by signal {stopped.signal} at step {stopped.step}; checkpoint saved in "
            f"{FLAGS.model_dir}. Re-run the same command to resume.",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + int(stopped.signal))
    except FloatingPointError as error:  # the Loop's NonFiniteLossError
        logging.error("%s", error)
        sys.exit(3)
    except (
        runs.RunLockedError,
        runs.ChangedBindingsError,
        runs.CheckpointMismatchError,
    ) as error:
        logging.error("%s", error)
        sys.exit(4)
    except OSError as error:  # the folder: read-only, a full disk, a name the OS refuses
        _cannot_write(runs.first_line(error))
    except (ValueError, TypeError) as error:
        from blayers.lab import config

        bindings = config.bindings_in_error(error)
        if not bindings and isinstance(error, TypeError):
            raise  # a bug, not a binding: its traceback
        named = "\nThe gin bindings of the configurables it names:\n  " + "\n  ".join(bindings)
        logging.error("Bad configuration:\n%s%s", error, named if bindings else "")
        sys.exit(2)
    print(f"\nFinal metrics ({FLAGS.model_dir}):\n{format_metrics(metrics)}")
    print(json.dumps({"model_dir": FLAGS.model_dir, "final": metrics}))


def run():
    """Console-script entry point (`blayers-train`)."""
    cli_env.run_app(main, __doc__)


if __name__ == "__main__":
    cli_env.prepare()  # `python -m blayers.lab.train`: before main() loads TensorFlow
    run()
