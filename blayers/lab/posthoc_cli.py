"""The command line of `blayers.lab.posthoc`: `python -m blayers.posthoc --model_dir=RUN
--method=laplace` (see that module). Writes `RUN/posthoc/<method>/metrics.json` and the task's
plots, and prints the run's metrics beside the post-hoc ones."""

import hashlib
import json
import os
import shlex
import sys

from absl import app, flags, logging

from blayers.lab import cli_env

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A finished run's folder.")
flags.DEFINE_string(
    "method",
    None,
    "The post-hoc method: temperature, vector, matrix, dirichlet, histogram, isotonic, "
    "conformal, laplace, swag, ensemble (with Ensemble.members, the other runs' folders), or "
    "one a gin file's `import` defines (blayers.lab.posthoc_methods).",
)
flags.DEFINE_multi_string("gin_file", [], "Extra gin files (after the run's operative config).")
flags.DEFINE_multi_string("gin_param", [], "Extra gin bindings, e.g. 'Conformal.alpha = 0.05'.")
flags.DEFINE_bool(
    "refuse_gin_imports",
    False,
    "Refuse a run whose operative_config.gin (or an extra gin file or binding) imports Python "
    "modules: gin runs them while it parses (a run folder from elsewhere is code).",
)


def output_folder(model_dir, method, gin_files=(), gin_params=()):
    """`RUN/posthoc/<method>` at the defaults; `RUN/posthoc/<method>-<8 hex digits>` of the
    extra gin files and bindings otherwise, so each setting keeps its own output (its
    `command.json` says which)."""
    folder = os.path.join(model_dir, "posthoc", method)
    if not gin_files and not gin_params:
        return folder
    setting = json.dumps({"gin_file": list(gin_files), "gin_param": list(gin_params)})
    return f"{folder}-{hashlib.sha256(setting.encode()).hexdigest()[:8]}"


def main(argv):
    del argv
    from blayers.lab import runs  # reading a run folder loads no TensorFlow
    from blayers.lab.runs import files

    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if not FLAGS.model_dir or not FLAGS.method:
        raise app.UsageError("--model_dir and --method are required.")
    run = runs.RunDir(FLAGS.model_dir)
    operative = run.file(run.OPERATIVE_CONFIG)
    if not os.path.exists(operative):  # said before TensorFlow loads (seconds)
        raise app.UsageError(f"{FLAGS.model_dir} has no {run.OPERATIVE_CONFIG}: not a run folder.")
    if FLAGS.refuse_gin_imports:
        from blayers.lab import gin_files

        try:
            gin_files.refuse_imports_of([operative, *FLAGS.gin_file], FLAGS.gin_param)
        except ValueError as error:
            logging.error("%s", error)
            sys.exit(2)
    refusal = run.unscorable()  # a run still training, unfinished or of replicas: at once
    if refusal:
        logging.error("posthoc: %s", refusal)
        sys.exit(2)
    cli_env.prepare(help_loads_tensorflow=False)  # before TensorFlow loads
    from blayers.lab import config, posthoc_methods
    from blayers.lab import posthoc as posthoc_lib

    try:
        config.parse(
            [operative, *FLAGS.gin_file],
            FLAGS.gin_param,
            refuse_imports=FLAGS.refuse_gin_imports,
        )
        method = posthoc_methods.get(FLAGS.method)()  # an unknown name fails before the restore
        learner, run = posthoc_lib.restore(FLAGS.model_dir)
        summary, arrays = posthoc_lib.posthoc(learner, run, method)
    except ValueError as error:
        logging.error("%s", error)
        sys.exit(2)
    out = runs.RunDir(output_folder(FLAGS.model_dir, FLAGS.method, FLAGS.gin_file, FLAGS.gin_param))
    os.makedirs(out.path, exist_ok=True)
    out.write_metrics(summary)
    files.write_json(
        out.file(out.COMMAND),
        {
            "command": " ".join(
                shlex.quote(a) for a in ["python", "-m", "blayers.posthoc", *sys.argv[1:]]
            ),
            "method": FLAGS.method,
            "gin_file": list(FLAGS.gin_file),
            "gin_param": list(FLAGS.gin_param),
        },
    )
    arrays["label"] = f"{os.path.basename(os.path.normpath(FLAGS.model_dir))} + {FLAGS.method}"
    learner.data.task.plot(learner.model, learner.data, arrays, out.path)
    width = max(len(k) for k in summary["final"])
    print(f"{'metric':{width}s}  {'run':>10s}  {FLAGS.method:>12s}")
    for key, value in sorted(summary["final"].items()):
        base = summary["base"].get(key)
        base = f"{base:10.4f}" if isinstance(base, float) else f"{'':10s}"
        print(f"{key:{width}s}  {base}  {value:12.4f}")
    for line in summary["notes"]:
        print(line)
    print(f"Scored {summary.get('checkpoint')}; wrote {out.path}.")
    print(json.dumps({"model_dir": out.path, "final": summary["final"]}))


def run():
    """Entry point of `python -m blayers.posthoc`."""
    cli_env.run_app(main, __doc__)
