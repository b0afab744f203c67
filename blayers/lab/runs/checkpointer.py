"""The one Checkpointer of every learner: save, keep N, newest-intact restore.

A learner's `state()` is either a `tf.train.Checkpoint` (eager learners) or a `SaverState`
(a v1 `tf.compat.v1.train.Saver` in a session: the Mesh TensorFlow learner). The Checkpointer
decides where and when; the state only writes and reads its bytes (dopamine's Checkpointer and
Orbax's `CheckpointManager` are the models).

* Checkpoints are `checkpoints/ckpt-<step>`; the newest `keep` are kept, older ones deleted
  after a newer one is written whole.
* Writes are atomic at the checkpoint level: a checkpoint counts once its `.index` exists, and
  the state file (`checkpoint`, relative paths) is replaced atomically after each save.
* `restore` tries checkpoints newest first, from the files themselves (the state file may be
  the damaged part, and a copied or moved folder has another path). A checkpoint that cannot
  be read (a kill mid-write, a bad disk) is skipped with a warning naming it and kept as
  `*.damaged`; one that reads but does not fit the model (a folder of another model) raises
  `CheckpointMismatchError` and nothing is touched.
"""

import glob
import logging as std_logging
import os
import shutil

import tensorflow as tf
from absl import logging

from blayers.lab.runs.files import (
    checkpoint_number,
    checkpoint_prefixes,
    first_line,
    write_text,
)

__all__ = [
    "CheckpointMismatchError",
    "CheckpointWriteError",
    "Checkpointer",
    "SaverState",
    "checkpoint_prefixes",
]

PREFIX = "ckpt"


class _UnusedValues(std_logging.Filter):
    """Drops TensorFlow's "Value in checkpoint could not be found in the restored object"
    warnings, one per value, printed when a restore is garbage-collected: the Checkpointer
    asserts that every object of the model was restored and raises `CheckpointMismatchError`
    for another model's checkpoint (naming the variable), so they only repeat that error
    thirty times."""

    def filter(self, record):
        return "could not be found in the restored object" not in record.getMessage()


std_logging.getLogger("tensorflow").addFilter(_UnusedValues())


class CheckpointMismatchError(ValueError):
    """The folder's checkpoint is intact but belongs to another model."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a read-only folder); its partial files
    are gone and the older checkpoints are intact."""


class LongerRunError(CheckpointMismatchError):
    """The folder's checkpoints are past the requested length, and none is of that step."""


def _quarantine(prefix):
    for path in glob.glob(prefix + ".*"):
        if not path.endswith(".damaged"):
            os.replace(path, path + ".damaged")


def _delete(prefix):
    for path in glob.glob(prefix + ".*"):
        if not path.endswith(".damaged"):
            os.remove(path)


def _is_mismatch(error):
    """A checkpoint that was read but does not fit the model: a variable of another shape, or
    objects the model does not have. Anything else (an `OpError`, a short read) is damage."""
    if isinstance(error, AssertionError):
        return True
    text = str(error)
    if isinstance(error, tf.errors.OpError):  # a v1 Saver's: another shape, a missing key
        return "requires shapes" in text or "not found in checkpoint" in text
    return isinstance(error, ValueError) and any(
        word in text for word in ("shape", "incompatible", "Unresolved object")
    )


class SaverState:
    """A v1 `tf.compat.v1.train.Saver` and its session, as a learner's checkpointable state.

    Args:
      saver: the Saver (`save_relative_paths=True`, `max_to_keep=None`: the Checkpointer keeps).
      session: the session whose variables it saves and restores.
      graph: the Saver's graph.
    """

    def __init__(self, saver, session, graph):
        self.saver, self.session, self.graph = saver, session, graph

    def write(self, prefix):
        with self.graph.as_default():
            self.saver.save(self.session, prefix, write_meta_graph=False, write_state=False)

    def read(self, prefix):  # a v1 restore fails on any mismatch itself
        with self.graph.as_default():
            self.saver.restore(self.session, prefix)


class _ObjectState:
    """A `tf.train.Checkpoint` with `SaverState`'s interface."""

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint

    def write(self, prefix):
        self.checkpoint.write(prefix)

    def read(self, prefix):
        self.checkpoint.read(prefix).assert_existing_objects_matched()


def _as_state(state):
    return _ObjectState(state) if isinstance(state, tf.train.Checkpoint) else state


class Checkpointer:
    """Saves and restores a learner's state in `directory`, keeping the newest `keep`.

    Args:
      directory: the run's `checkpoints/` folder.
      state: a `tf.train.Checkpoint`, or a `SaverState`.
      keep: checkpoints kept on disk (at least 1).
    """

    def __init__(self, directory, state, keep=3):
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep_checkpoints must be a positive integer, got {keep!r}.")
        self.directory, self.state, self.keep = directory, _as_state(state), keep

    @property
    def latest(self):
        """The newest checkpoint's prefix, or None."""
        prefixes = checkpoint_prefixes(self.directory)
        return prefixes[0] if prefixes else None

    def latest_step(self):
        latest = self.latest
        return None if latest is None else checkpoint_number(latest)

    def save(self, step):
        """Writes `ckpt-<step>`, then forgets checkpoints beyond the newest `keep`."""
        os.makedirs(self.directory, exist_ok=True)
        prefix = os.path.join(self.directory, f"{PREFIX}-{int(step)}")
        _delete(prefix)  # a checkpoint of this step from a run that was rolled back
        try:
            self.state.write(prefix)
        except Exception as error:  # a full disk comes as TensorFlow's error or an OSError
            _delete(prefix)
            for temporary in glob.glob(prefix + "_temp*"):  # TensorFlow's staging folder
                shutil.rmtree(temporary, ignore_errors=True)
            older = [p for p in checkpoint_prefixes(self.directory) if p != prefix]
            raise CheckpointWriteError(
                f"Could not write the checkpoint {prefix} ({type(error).__name__}: "
                f"{first_line(error)}); its partial files were removed. The newest intact "
                f"checkpoint is {older[0] if older else '(none)'}: free space (or make the "
                "folder writable) and re-run the same command to resume from it."
            ) from error
        prefixes = checkpoint_prefixes(self.directory)
        for old in prefixes[self.keep :]:
            _delete(old)
        self._write_state_file(prefixes[: self.keep])
        return prefix

    def save_unless_current(self, step):
        """Saves unless a checkpoint of `step` is on disk already (a finished run re-run)."""
        steps = {checkpoint_number(p) for p in checkpoint_prefixes(self.directory)}
        if int(step) not in steps:
            self.save(step)

    def restore(self, max_step=None, read_only=False):
        """Restores the newest intact checkpoint; returns its prefix, or None when there is none.

        Damaged checkpoints are skipped with a warning and renamed `*.damaged`, never deleted;
        the state file is rewritten to list the intact ones.

        Args:
          max_step: the run's requested length. Checkpoints past it (a longer run in the same
            folder, stopped early) are left alone, and the one of exactly `max_step` is
            restored: evaluating a later model as this length's would misstate it. Without
            one, `LongerRunError` names both lengths and nothing is touched.
          read_only: damaged checkpoints are skipped but neither renamed nor dropped from the
            state file (a reader of another's run: the post-hoc methods).
        """
        if not os.path.isdir(self.directory):
            return None
        prefixes = checkpoint_prefixes(self.directory)
        later = []
        if max_step is not None:
            later = [p for p in prefixes if checkpoint_number(p) > max_step]
            prefixes = [p for p in prefixes if checkpoint_number(p) <= max_step]
            if later and not any(checkpoint_number(p) == max_step for p in prefixes):
                raise LongerRunError(
                    f"{os.path.dirname(self.directory)} holds a longer run (checkpoints up to "
                    f"step {checkpoint_number(later[0])}) and no checkpoint of step {max_step}, "
                    f"the length asked for (train.train_steps = {max_step}); its kept "
                    f"checkpoints: {', '.join(os.path.basename(p) for p in later + prefixes)}. "
                    "Scoring the later model as this length would misstate it: nothing in the "
                    "folder was changed. Ask for a length at or past the newest checkpoint, or "
                    "use a new --model_dir."
                )
        restored, intact = None, list(later)
        for prefix in prefixes:
            if restored is None:
                try:
                    self.state.read(prefix)
                except Exception as error:  # noqa: BLE001 - sorted below: damage or mismatch
                    if _is_mismatch(error):  # read, but not this model: refuse, touch nothing
                        raise CheckpointMismatchError(
                            f"The checkpoint {prefix} does not fit this model: "
                            f"{first_line(error)}\nThe folder holds a run of another model (a "
                            "changed model binding, or another config): nothing in it was "
                            "changed. Use a new --model_dir, or the original configuration."
                        ) from None
                    logging.warning(
                        "Checkpoint %s is damaged (%s: %s); falling back to an older one.%s",
                        prefix,
                        type(error).__name__,
                        first_line(error),
                        ""
                        if read_only
                        else f" Its files are kept as {os.path.basename(prefix)}.*.damaged.",
                    )
                    if not read_only:
                        _quarantine(prefix)
                    continue
                restored = prefix
            intact.append(prefix)
        if read_only:
            return restored
        if intact:
            self._write_state_file(intact)
        else:
            state = os.path.join(self.directory, "checkpoint")
            if os.path.exists(state):
                os.replace(state, state + ".damaged")
        return restored

    def _write_state_file(self, prefixes):
        """TensorFlow's `checkpoint` state file (TensorBoard and `tf.train.latest_checkpoint`
        read it), relative paths, written to a temporary name, then renamed."""
        if not prefixes:
            return
        names = [os.path.basename(p) for p in reversed(prefixes)]
        lines = [f'model_checkpoint_path: "{names[-1]}"']
        lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
        write_text(os.path.join(self.directory, "checkpoint"), "\n".join(lines) + "\n")
