"""`RunDir`: the one owner of a run folder's files. Learners, the Loop, the launchers, the
report and the experiments read and write a run only through it.

    model_dir/
      LOCK                  the process training here (`RunLock`)
      bindings.json         the gin bindings of the accepted run (a resume refuses changes)
      command.json          the command line that made it (written once the run is accepted)
      operative_config.gin  every gin parameter the run used, and its gin imports
      history.jsonl         one record per log interval and per evaluation (`History`)
      metrics.json          the summary: status, step, final metrics, what the learner adds
      checkpoints/          `Checkpointer`: ckpt-<step>, newest `keep` kept
      tensorboard/          scalars, and every plot as an image
      *.png                 the learner's plots
"""

import contextlib
import os

from absl import logging

from blayers.lab.runs import files
from blayers.lab.runs.files import checkpoint_prefixes

__all__ = [
    "ChangedBindingsError",
    "RunDir",
    "set_command",
    "train_seconds",
]


class ChangedBindingsError(ValueError):
    """A resumed run's gin bindings differ from those it was started with."""


_COMMAND = {}


def set_command(record):
    """The command line's record (`command`, `gin_file`, `gin_param`), written to
    `command.json` by `RunDir.accept` once a run is accepted (a refused invocation changes
    nothing)."""
    _COMMAND.clear()
    _COMMAND.update(record)


def _current_bindings():
    """`{'selector.param': value text}` of every gin binding in force (scope-qualified)."""
    import gin

    out = {}
    for (scope, selector), params in gin.config._CONFIG.items():
        name = selector.split(".")[-1]
        prefix = f"{scope}/{name}" if scope else name
        for param, value in params.items():
            out[f"{prefix}.{param}"] = repr(value)
    return out


def _operative_bindings(path):
    """`{'selector.param': value text}` of the parameters an `operative_config.gin` records
    (in `_current_bindings`' form), or None when it is missing or does not parse. Parsed
    without running anything: gin's parser alone runs no imports."""
    import gin
    from gin import config_parser

    try:
        with open(path) as f:
            text = f.read()
        statements = list(
            config_parser.ConfigParser(text, gin.config.ParserDelegate(skip_unknown=True))
        )
    except Exception:  # noqa: BLE001 - any failure means the record cannot be used
        return None
    out = {}
    for statement in statements:
        if type(statement).__name__ != "BindingStatement":
            continue
        if not statement.arg_name:  # a macro, as gin keeps it: `seed/macro.value`
            out[f"{statement.selector}/macro.value"] = repr(statement.value)
            continue
        name = statement.selector.split(".")[-1]
        prefix = f"{statement.scope}/{name}" if statement.scope else name
        out[f"{prefix}.{statement.arg_name}"] = repr(statement.value)
    return out or None


class RunDir:
    """A run folder.

    Args:
      path: the folder (made when a run writes to it).
    """

    LOCK, BINDINGS, COMMAND = "LOCK", "bindings.json", "command.json"
    HISTORY, METRICS, OPERATIVE_CONFIG = "history.jsonl", "metrics.json", "operative_config.gin"
    CHECKPOINTS, TENSORBOARD, EXPERIMENT = "checkpoints", "tensorboard", "experiment.json"

    def __init__(self, path):
        self.path = str(path)
        self.history = None
        self._writer = None

    def __repr__(self):
        return f"RunDir({self.path!r})"

    def file(self, name):
        """The path of `name` in the folder."""
        return os.path.join(self.path, name)

    # -- reading (launchers, the report, experiments) ------------------------------------------
    def metrics(self):
        """`metrics.json` (a finished run's summary), or None."""
        return files.read_json(self.file(self.METRICS))

    def final(self):
        """The final metrics of a finished run, or None."""
        return (self.metrics() or {}).get("final")

    def command(self):
        """`command.json`, or None."""
        return files.read_json(self.file(self.COMMAND))

    def experiment(self):
        """`experiment.json` (an experiment's root), or None."""
        return files.read_json(self.file(self.EXPERIMENT))

    def records(self, kind=None):
        """The history's records (of `kind`: 'train', 'eval'), torn lines skipped."""
        records = files.read_lines(self.file(self.HISTORY))
        return [r for r in records if kind is None or r.get("kind") == kind]

    def train_seconds(self):
        """`train_seconds` of the history's records."""
        return train_seconds(self.records("train"))

    def is_locked(self):
        """A LOCK file exists (a live trainer, or a dead one's that the next run takes over)."""
        return os.path.exists(self.file(self.LOCK))

    def held_elsewhere(self):
        """The LOCK's holder record when another live process (or one on another host) trains
        here, else None (no lock, a torn one, a dead holder's, a copy's, or this process's)."""
        state, holder = files.RunLock(self.path).state()
        return holder if state == "live" else None

    def unscorable(self):
        """Why the folder's run cannot be scored as one finished model, from its files alone
        (the post-hoc command line says it before TensorFlow loads), or None: another live
        process still trains it (its newest checkpoint is not the run), it never finished (no
        `metrics.json`), or it trained several replicas as one model (`num_replicas`)."""
        holder = self.held_elsewhere()
        if holder:
            return (
                f"{self.path} is still training (PID {holder.get('pid')} on "
                f"{holder.get('host')} holds its LOCK); its newest checkpoint is not the run. "
                "Score it once it finished."
            )
        summary = self.metrics() or {}
        if not summary.get("final"):
            return f"{self.path} holds no finished run (no metrics.json)."
        if summary.get("num_replicas"):
            return (
                f"{self.path} trained {summary['num_replicas']} replicas as one model (its data "
                "are replicas, SupervisedLearner.data); post-hoc methods take a run of one model."
            )
        return None

    @contextlib.contextmanager
    def lock(self):
        """The run lock (a context manager); makes the folder, and removes it again when the
        run fails before writing anything into it (a bad binding, bad data): a refused run
        leaves no empty `model_dir` that a sweep or the report would take for a run."""
        existed = os.path.isdir(self.path)
        os.makedirs(self.path, exist_ok=True)
        try:
            with files.RunLock(self.path) as lock:
                yield lock
        except BaseException:
            if not existed:
                with contextlib.suppress(OSError):
                    os.rmdir(self.path)  # only while empty
            raise

    def check_bindings(self, resumable=()):
        """Refuses to resume a run (it has checkpoints) with gin bindings other than those it
        was started with (`bindings.json`): a restored optimizer would silently ignore a new
        learning rate, a restored model a new width, and the operative config would misstate
        the run. Only the bindings in `resumable` (lengths, cadences) may change. When
        `bindings.json` is missing or unreadable (damaged), the bindings the run recorded in
        `operative_config.gin` are checked instead; with neither, the resume is refused.
        Touches nothing; call it before restoring."""
        prefixes = checkpoint_prefixes(self.file(self.CHECKPOINTS))
        if not prefixes:
            return
        current = _current_bindings()
        previous = files.read_json(self.file(self.BINDINGS))
        source = self.BINDINGS
        if not isinstance(previous, dict):
            recorded = _operative_bindings(self.file(self.OPERATIVE_CONFIG))
            if recorded is None:
                raise ChangedBindingsError(
                    f"{self.path} holds a run (checkpoint {os.path.basename(prefixes[0])}) whose "
                    f"{self.BINDINGS} and {self.OPERATIVE_CONFIG} are both missing or "
                    "unreadable, so a resume cannot check that its gin bindings are the run's "
                    "(a changed learning rate or width would be silently ignored). Nothing in "
                    "the folder was changed. Use a new --model_dir, or restore one of the two "
                    "files."
                )
            logging.warning(
                "%s is missing or unreadable; checking the resume's bindings against the "
                "run's %s instead.",
                self.file(self.BINDINGS),
                self.OPERATIVE_CONFIG,
            )
            # The operative config lists every parameter used (defaults too): compare what
            # both name, and a binding it lacks against the default it recorded (none: unused).
            previous = {k: v for k, v in recorded.items() if k in current}
            current = {k: v for k, v in current.items() if k in recorded}
            source = self.OPERATIVE_CONFIG
        changed = sorted(
            key
            for key in set(previous) | set(current)
            if previous.get(key) != current.get(key) and key not in resumable
        )
        if changed:
            lines = [
                f"{key}: {previous.get(key, '(unset)')} -> {current.get(key, '(unset)')}"
                for key in changed
            ]
            raise ChangedBindingsError(
                f"{self.path} holds a run (checkpoint {os.path.basename(prefixes[0])}) trained "
                f"with other gin bindings (its {source}); resuming would not apply these "
                "changes:\n  "
                + "\n  ".join(lines)
                + "\nNothing in the folder was changed. Use a new --model_dir, or the original "
                "bindings."
                + (f" (Only {', '.join(resumable)} may change on resume.)" if resumable else "")
            )

    def accept(self):
        """The run goes on: `bindings.json` and `command.json` (when a command line set one)."""
        files.write_json(self.file(self.BINDINGS), _current_bindings(), sort_keys=True)
        if _COMMAND:
            files.write_json(self.file(self.COMMAND), dict(_COMMAND))

    def checkpointer(self, state, keep=3):
        """The `Checkpointer` of `state` in `checkpoints/`."""
        from blayers.lab.runs.checkpointer import Checkpointer

        return Checkpointer(self.file(self.CHECKPOINTS), state, keep)

    def open_history(self, resume_step):
        """`history.jsonl`, truncated to `resume_step` (`History`)."""
        self.history = files.History(self.file(self.HISTORY), resume_step)
        return self.history

    @property
    def writer(self):
        """The TensorBoard writer of `tensorboard/`."""
        if self._writer is None:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(self.file(self.TENSORBOARD))
        return self._writer

    def scalars(self, step, prefix, values):
        """TensorBoard scalars `prefix/key` at `step`."""
        import tensorflow as tf

        with self.writer.as_default(step=step):
            for key, value in values.items():
                tf.summary.scalar(f"{prefix}/{key}", value)

    def images(self, step, paths):
        """PNG files as TensorBoard images at `step`."""
        from blayers.lab import plots

        with self.writer.as_default(step=step):
            for path in paths:
                plots.png_to_tensorboard(path)
        self.writer.flush()

    def write_operative_config(self):
        """`operative_config.gin`: every gin parameter the run used."""
        import gin

        files.write_text(self.file(self.OPERATIVE_CONFIG), gin.operative_config_str())

    def write_metrics(self, summary):
        """`metrics.json`, atomically."""
        files.write_json(self.file(self.METRICS), summary)

    def write_experiment(self, record):
        """`experiment.json` of an experiment's root folder."""
        os.makedirs(self.path, exist_ok=True)
        files.write_json(self.file(self.EXPERIMENT), record)

    def close(self):
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def train_seconds(records):
    """Wall-clock seconds of the training steps over the whole run (resumes included), from
    the logged windows (`steps / steps_per_second`); evaluations are not counted."""
    seconds, previous = 0.0, None
    for record in records:
        if record.get("kind") != "train":
            continue
        start = previous if previous is not None and previous < record["step"] else 0
        if record.get("steps_per_second"):
            seconds += (record["step"] - start) / record["steps_per_second"]
        previous = record["step"]
    return seconds
