"""The Experiment base: one paper figure or table as a plan of runs, a summary of their results
and its entry in the reproduction report, with one generic command line.

A new experiment is at most three files: `experiments/<name>.py` (a subclass, its
`EXPERIMENT = <Subclass>()` and `if __name__ == "__main__": EXPERIMENT.main()`), and its gin
pair `configs/<name>.gin` / `configs/<name>_smoke.gin`. The report finds it by its
`EXPERIMENT` (or a module's `REPORT_ENTRIES`); nothing else is edited.
"""

import dataclasses
import sys

from absl import app, flags

from blayers.lab import cli_env
from blayers.launch import sweep

__all__ = ["Experiment", "ReportEntry", "main"]

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class ReportEntry:
    """One figure or table of the paper (or a comparison) in the reproduction report.

    Attributes:
      key: a short id (`'fig8'`).
      title: the heading.
      paper: what the paper reports, or why there is no number.
      order: the entry's place in the report (the paper's order).
      gin_prefixes: runs whose gin file starts with one of these belong here.
      experiments: experiment modules whose roots belong here.
      compare: `(metric key, paper value, gin file it applies to, label)` rows.
      command: the command that fills the entry.
    """

    key: str
    title: str
    paper: str
    order: float = 100.0
    gin_prefixes: tuple = ()
    experiments: tuple = ()
    compare: tuple = ()
    command: str = ""


class Experiment:
    """A grid of runs through `blayers.launch.sweep` (resume, failures and Ctrl-C are the sweep's),
    summarized into tables and figures in `--root`.

    Subclasses set `name` (the module's), `gin_file` (the default config), `report` (a
    `ReportEntry`) and define `define_options()` (their own flags), `plan(**options)` ->
    `[(run name, {binding: value text})]` and `summarize(root, results)` -> rows (writing
    the tables and figures). An experiment whose runs are not one grid overrides `run`.
    """

    name = ""
    gin_file = None
    default_root = None
    report = None
    quiet = True  # the runs' progress bars off in the sweep's output

    def define_options(self):
        """The experiment's own flags, named as `plan`'s (or `run`'s) keyword arguments."""

    def options(self):
        """The values of the flags `define_options` defined, `{name: value}`."""
        return {name: FLAGS[name].value for name in self._options}

    def check(self, root, **options):
        """Raises `app.UsageError` for flags that cannot work (a data folder that is not
        there), before the command line loads TensorFlow; nothing by default."""
        del root, options

    def plan(self, **options):
        raise NotImplementedError(f"{type(self).__name__} has no plan.")

    def summarize(self, root, results):
        raise NotImplementedError(f"{type(self).__name__} does not summarize.")

    def run(self, root, gin_file=None, gin_params=(), parallel=1, **options):
        """Trains every run of the plan (skipping finished ones), then summarizes; exits as
        the sweep does when it was stopped. Returns the rows."""
        results, stopped = sweep.run_experiment_grid(
            self.plan(**options),
            root,
            gin_file or self.gin_file,
            list(gin_params),
            parallel,
            quiet=self.quiet,
        )
        rows = self.summarize(root, results)
        if stopped:
            sweep.exit_stopped(root, stopped)
        return rows

    def define_flags(self):
        """`--root`, `--gin_file`, `--gin_param`, `--parallel`, then the experiment's own
        (defined only when run as a script, so that importing several experiment modules in
        one process defines no flag twice)."""
        flags.DEFINE_string("root", self.default_root or f"runs/{self.name}", "Folder of runs.")
        if self.gin_file is not None:
            flags.DEFINE_string("gin_file", self.gin_file, "Gin file of every run.")
        flags.DEFINE_multi_string("gin_param", [], "Gin bindings of every run.")
        flags.DEFINE_integer("parallel", 1, "Runs at a time.")
        flags.DEFINE_bool(
            "refuse_gin_imports",
            False,
            "Refuse gin files or bindings that import Python modules (checked before any run "
            "starts, and passed to every trainer): gin files are code.",
        )
        before = set(FLAGS)
        self.define_options()
        self._options = sorted(set(FLAGS) - before)

    def main(self):
        """The command line: `python -m blayers.experiments.<name> --root=... [flags]`."""
        self.define_flags()

        def run(argv):
            del argv
            from blayers.lab.gin_files import GinImportsRefused

            gin_file = FLAGS.gin_file if self.gin_file is not None else None
            sweep.REFUSE_GIN_IMPORTS = FLAGS.refuse_gin_imports
            self.check(FLAGS.root, **self.options())  # a usage error before TensorFlow loads
            if FLAGS.refuse_gin_imports:
                from blayers.lab.gin_files import refuse_imports_of

                try:
                    refuse_imports_of([gin_file] if gin_file else [], FLAGS.gin_param)
                except GinImportsRefused as error:
                    raise app.UsageError(str(error)) from None
            if cli_env.is_cli():
                cli_env.import_tensorflow_quietly()
            try:
                self.run(FLAGS.root, gin_file, FLAGS.gin_param, FLAGS.parallel, **self.options())
            except GinImportsRefused as error:
                raise app.UsageError(str(error)) from None
            if sweep.FAILED_RUNS:  # named as they ended; the status says the call failed
                print(
                    f"{len(sweep.FAILED_RUNS)} run(s) failed (each folder's log.txt says why); "
                    "the tables hold the others.",
                    file=sys.stderr,
                )
                sys.exit(1)

        cli_env.run_app(run, sys.modules[type(self).__module__].__doc__)


def main(experiment):
    """`experiment.main()`: the generic command line of an experiment module."""
    experiment.main()
