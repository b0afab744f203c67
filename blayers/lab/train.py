"""Train a model from gin files: `python -m blayers.train` (or `blayers-train`).

    python -m blayers.train --gin_file=digits_mlp --model_dir=runs/digits \
        --gin_param="mlp.dense_layer = 'DenseReparameterization'"

Gin files are found by name on the search path (`configs/`, see `blayers.lab.config`); later files
and `--gin_param` bindings override earlier ones; an unknown name fails before training with its
file and line. Re-running the same command resumes from the last checkpoint in `--model_dir`.
"""

import json
import os
import shlex
import sys

from absl import app, flags, logging

from blayers.lab import cli_env

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin files (names on the search path, or paths).")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings, applied after the files.")
flags.DEFINE_string("model_dir", None, "Output folder (checkpoints, metrics, plots, logs).")
flags.DEFINE_enum(
    "strategy",
    "cpu",
    ["cpu", "gpu", "mirrored", "multi_worker", "tpu", "mesh"],
    "tf.distribute strategy, or `mesh`: Mesh TensorFlow model parallelism (train_mesh).",
)
flags.DEFINE_string("mesh_shape", None, "--strategy=mesh: e.g. 'model:2' or 'batch:2,model:4'.")
flags.DEFINE_string("layout", None, "--strategy=mesh: layout rules, e.g. 'heads:model;d_ff:model'.")
flags.DEFINE_string("tpu", None, "TPU name or address for --strategy=tpu.")
flags.DEFINE_integer(
    "num_cpu_devices", None, "Split the CPU into this many logical devices (mirrored tests)."
)


def format_metrics(metrics):
    return "\n".join(f"  {key:30s} {value:.4f}" for key, value in sorted(metrics.items()))


def main(argv):
    del argv
    # Import after absl parsed flags: TF and the configurables load here.
    from blayers.lab import config, strategy, trainer

    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TF's and gin's INFO chatter off by default
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required.")
    _write_command(FLAGS.model_dir)
    try:
        config.parse(FLAGS.gin_file, FLAGS.gin_param)
    except ValueError as error:
        logging.error("Bad gin configuration:\n%s", error)
        sys.exit(2)
    if FLAGS.strategy == "mesh":
        _run_mesh()
        return
    if config.binds("train_planet"):
        _run_planet()
        return
    dist = strategy.get_strategy(FLAGS.strategy, FLAGS.tpu, FLAGS.num_cpu_devices)
    print(
        f"Strategy {type(dist).__name__} with {dist.num_replicas_in_sync} replica(s); "
        f"model_dir {FLAGS.model_dir}."
    )
    _train_and_report(lambda: trainer.train(FLAGS.model_dir, strategy=dist))


def _write_command(model_dir):
    """`command.json` in the run folder: the command line that made it (the reproduction report,
    `python -m experiments.report`, prints it beside each number)."""
    os.makedirs(model_dir, exist_ok=True)
    record = {
        "command": " ".join(
            shlex.quote(a) for a in ["python", "-m", "blayers.train", *sys.argv[1:]]
        ),
        "gin_file": list(FLAGS.gin_file),
        "gin_param": list(FLAGS.gin_param),
    }
    with open(os.path.join(model_dir, "command.json"), "w") as f:
        json.dump(record, f, indent=1)


def _train_and_report(train_fn):
    """Runs `train_fn()` and prints its final metrics; a failure becomes a logged error and an
    exit code: 3 a non-finite loss, 4 a locked run folder or changed bindings on resume, 2 a
    bad argument found while building (a binding, a shape)."""
    from blayers.lab import run_files, trainer

    try:
        metrics = train_fn()
    except FloatingPointError as error:  # NonFiniteLossError, and the mesh and agent loops'
        logging.error("%s", error)
        sys.exit(3)
    except (run_files.RunLockedError, trainer.ChangedBindingsError) as error:
        logging.error("%s", error)
        sys.exit(4)
    except ValueError as error:
        logging.error("Bad configuration:\n%s", error)
        sys.exit(2)
    print(f"\nFinal metrics ({FLAGS.model_dir}):\n{format_metrics(metrics)}")
    print(json.dumps({"model_dir": FLAGS.model_dir, "final": metrics}))


def _run_planet():
    """The PlaNet agent (`blayers.lab.control.planet.train_planet`), configured by gin."""
    from blayers.lab.control import planet

    print(f"PlaNet agent; model_dir {FLAGS.model_dir}.")
    _train_and_report(lambda: planet.train_planet(FLAGS.model_dir))


def _run_mesh():
    """The Mesh TensorFlow loop (`blayers.lab.mesh.trainer.train_mesh`), configured by gin; the
    `--mesh_shape` and `--layout` flags override its bindings."""
    from blayers.lab import strategy
    from blayers.lab.mesh import trainer as mesh_trainer

    if FLAGS.num_cpu_devices:
        strategy.split_cpu(FLAGS.num_cpu_devices)
    overrides = {k: v for k, v in (("mesh_shape", FLAGS.mesh_shape), ("layout", FLAGS.layout)) if v}
    print(
        f"Mesh TensorFlow {overrides or '(shape and layout from gin)'}; model_dir {FLAGS.model_dir}."
    )
    _train_and_report(lambda: mesh_trainer.train_mesh(FLAGS.model_dir, **overrides))


def run():
    """Console-script entry point (`blayers-train`)."""
    app.run(main)


if __name__ == "__main__":
    cli_env.prepare()  # `python -m blayers.lab.train`: before main() loads TensorFlow
    run()
