"""The files of a run folder that must survive a crash: the run lock, the history log, and the
checkpoints (restored from the newest intact one).

* `RunLock`: `model_dir/LOCK` names the process training in the folder (PID, host, start). A
  second trainer on the same folder refuses to start; a lock whose holder is dead (same host,
  PID gone) is taken over.
* `History`: append-only JSON lines; on resume it keeps the records up to the restored step and
  drops a torn last line (a kill during a write) with a warning.
* `restore_newest_intact`: tries the checkpoints newest first and falls back past damaged ones
  (truncated `.data`, empty `.index`, an empty or unreadable `checkpoint` state file), naming
  each damaged file; damaged files are renamed `*.damaged`, never deleted. A checkpoint that
  reads but does not fit the model (another model's folder) is refused with
  `CheckpointMismatchError` and nothing is touched. Checkpoints are found from their files,
  not from the state file's paths, so a copied or moved run folder restores its own.
  `SaverCheckpoint` adapts a v1 `tf.compat.v1.train.Saver` (the mesh loop's) to it.
* `check_bindings` / `write_bindings`: a resumed run refuses gin bindings that changed since
  the run was started, naming each, before anything in the folder is touched.
* `set_command` / `write_command`: `command.json`, the command line that made the run, written
  only once the run is accepted (locked, bindings checked), so a refused invocation changes
  nothing.
"""

import glob
import json
import os
import re
import signal
import socket
import threading
import time

import tensorflow as tf
from absl import logging

from blayers.lab.cli_env import pid_alive

__all__ = [
    "ChangedBindingsError",
    "CheckpointMismatchError",
    "History",
    "RunLock",
    "RunLockedError",
    "SaverCheckpoint",
    "StopRequest",
    "check_bindings",
    "checkpoint_prefixes",
    "restore_newest_intact",
    "set_command",
    "write_bindings",
    "write_command",
]


class RunLockedError(RuntimeError):
    """Another live process is training in this `model_dir`."""


class ChangedBindingsError(ValueError):
    """A resumed run's gin bindings differ from those it was started with."""


class CheckpointMismatchError(ValueError):
    """The folder's checkpoint is intact but belongs to another model."""


class RunLock:
    """An exclusive lock on a run folder, held for the life of a training run.

    Args:
      model_dir: the run folder; the lock is the file `LOCK` in it.
    """

    def __init__(self, model_dir):
        self.path = os.path.join(model_dir, "LOCK")
        self.held = False

    def _holder(self):
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None  # being written, or torn: treated as stale below

    def acquire(self):
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder and holder.get("pid") == os.getpid() and holder.get("host") == me["host"]:
                    raise RunLockedError(
                        f"{os.path.dirname(self.path)} is already being trained by this process."
                    ) from None
                if holder and (holder.get("host") != me["host"] or pid_alive(holder["pid"])):
                    raise RunLockedError(
                        f"Another trainer holds {self.path} (PID {holder.get('pid')} on host "
                        f"{holder.get('host')}, since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder['started']))})"
                        ". Two trainers on one model_dir would interleave its checkpoints and "
                        "logs: stop that one, or use another --model_dir. (If it is dead on "
                        "another host, delete the LOCK file.)"
                    ) from None
                logging.warning(
                    "Taking over the lock of a dead trainer (%s): %s", holder, self.path
                )
                try:
                    os.remove(self.path)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise RunLockedError(f"Could not take the lock {self.path}.")

    def release(self):
        if self.held:
            holder = self._holder()
            if holder is None or holder.get("pid") == os.getpid():
                try:
                    os.remove(self.path)
                except FileNotFoundError:
                    pass
            self.held = False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


class History:
    """Append-only JSON lines (`history.jsonl`), truncated to the restored step on resume.

    Args:
      path: the file.
      resume_step: records after this step (a run killed after its last checkpoint) are
        dropped, so the resumed run logs them again.
    """

    def __init__(self, path, resume_step):
        self.path = path
        self.records = []
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().split("\n")
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    logging.warning(
                        "Dropping a torn line %d of %s (the run was killed while writing it): %r",
                        number,
                        path,
                        line[:80],
                    )
                    continue
                if record.get("step", 0) <= resume_step:
                    self.records.append(record)
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.records)

    def add(self, record):
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()

    def put(self, record):
        """`add`, replacing a record of the same kind at the same step (an evaluation repeated
        by a re-run of a finished run) instead of appending a duplicate."""
        key = (record.get("kind"), record.get("step"))
        kept = [r for r in self.records if (r.get("kind"), r.get("step")) != key]
        if len(kept) == len(self.records):
            return self.add(record)
        self.records = [*kept, record]
        _write_atomically(self.path, "".join(json.dumps(r) + "\n" for r in self.records))


def _checkpoint_number(prefix):
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def checkpoint_prefixes(directory):
    """Checkpoint prefixes in `directory`, newest first, from the files themselves (the state
    file may be the damaged part, and holds absolute paths of another folder once the run
    folder is copied or moved)."""
    prefixes = {path[: -len(".index")] for path in glob.glob(os.path.join(directory, "*.index"))}
    return sorted(prefixes, key=_checkpoint_number, reverse=True)


def _quarantine(prefix):
    for path in glob.glob(prefix + ".*"):
        if not path.endswith(".damaged"):
            os.replace(path, path + ".damaged")


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


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def restore_newest_intact(checkpoint, directory):
    """Restores `checkpoint` from the newest intact checkpoint in `directory`.

    Returns the restored prefix, or None when there is none. Damaged checkpoints are skipped
    with a warning naming the file, and renamed `*.damaged`; the `checkpoint` state file is
    rewritten to list the intact ones, so `tf.train.CheckpointManager` continues from there.
    """
    if not os.path.isdir(directory):
        return None
    restored, intact = None, []
    for prefix in checkpoint_prefixes(directory):
        if restored is None:
            try:
                checkpoint.restore(prefix).assert_existing_objects_matched()
            except Exception as error:  # noqa: BLE001 - sorted below: damage or mismatch
                if _is_mismatch(error):  # read, but not this model: refuse, touch nothing
                    raise CheckpointMismatchError(
                        f"The checkpoint {prefix} does not fit this model: "
                        f"{_first_line(error)}\nThe folder holds a run of another model (a "
                        "changed model binding, or another config): nothing in it was changed. "
                        "Use a new --model_dir, or the original configuration."
                    ) from None
                # The bytes cannot be read: a kill mid-write, a bad disk.
                logging.warning(
                    "Checkpoint %s is damaged (%s: %s); falling back to an older one. Its files "
                    "are kept as %s.*.damaged.",
                    prefix,
                    type(error).__name__,
                    _first_line(error),
                    os.path.basename(prefix),
                )
                _quarantine(prefix)
                continue
            restored = prefix
        intact.append(prefix)
    state = os.path.join(directory, "checkpoint")
    if intact:  # relative paths: the folder may be copied or moved
        tf.compat.v1.train.update_checkpoint_state(
            directory,
            os.path.basename(intact[0]),
            all_model_checkpoint_paths=[os.path.basename(p) for p in reversed(intact)],
        )
    elif os.path.exists(state):
        os.replace(state, state + ".damaged")
    return restored


class StopRequest:
    """Turns the first Ctrl-C (SIGINT) or SIGTERM into a request to stop after the current step,
    so the checkpoint is written outside any TensorFlow call; a second Ctrl-C interrupts at
    once."""

    def __init__(self):
        self.requested = False
        self.signal = None
        self._previous = {}

    def _handle(self, signum, frame):
        self.requested, self.signal = True, signum
        signal.signal(signum, self._previous[signum])

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False


class SaverCheckpoint:
    """A v1 `tf.compat.v1.train.Saver` in a session, restorable by `restore_newest_intact`.

    Args:
      saver: the Saver (made with `save_relative_paths=True`).
      session: the session whose variables it restores.
      graph: the Saver's graph.
    """

    def __init__(self, saver, session, graph):
        self.saver, self.session, self.graph = saver, session, graph

    def restore(self, prefix):
        with self.graph.as_default():
            self.saver.restore(self.session, prefix)
        return self

    def assert_existing_objects_matched(self):  # a v1 restore fails on any mismatch itself
        return self


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


def check_bindings(model_dir, resumable=()):
    """Refuses to resume `model_dir` (it has checkpoints) with gin bindings other than those
    it was started with (`bindings.json`): a restored optimizer would silently ignore a new
    learning rate, a restored model a new width, and the operative config would misstate the
    run. Only the bindings in `resumable` (schedule lengths, cadences) may change. Touches
    nothing; call it before restoring."""
    path = os.path.join(model_dir, "bindings.json")
    prefixes = checkpoint_prefixes(os.path.join(model_dir, "checkpoints"))
    if not prefixes or not os.path.exists(path):
        return
    with open(path) as f:
        previous = json.load(f)
    current = _current_bindings()
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
            f"{model_dir} holds a run (checkpoint {os.path.basename(prefixes[0])}) trained with "
            "other gin bindings; resuming would not apply these changes:\n  "
            + "\n  ".join(lines)
            + "\nNothing in the folder was changed. Use a new --model_dir, or the original "
            "bindings."
            + (f" (Only {', '.join(resumable)} may change on resume.)" if resumable else "")
        )


def write_bindings(model_dir):
    """`bindings.json`: the gin bindings of the accepted run (see `check_bindings`)."""
    _write_json(os.path.join(model_dir, "bindings.json"), _current_bindings(), sort_keys=True)


_COMMAND = {}


def set_command(record):
    """The command line's record (`command`, `gin_file`, `gin_param`) for `write_command`."""
    _COMMAND.clear()
    _COMMAND.update(record)


def write_command(model_dir):
    """`command.json`: the command line that made the run (the reproduction report prints it
    beside each number), once the run is accepted; nothing when no command line set one."""
    if _COMMAND:
        _write_json(os.path.join(model_dir, "command.json"), dict(_COMMAND))


def _write_json(path, value, **kwargs):
    _write_atomically(path, json.dumps(value, indent=1, **kwargs))


def _write_atomically(path, text):
    """A kill mid-write leaves the previous file, never a torn one."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as f:
        f.write(text)
    os.replace(temporary, path)
