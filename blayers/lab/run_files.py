"""The files of a run folder that must survive a crash: the run lock, the history log, and the
checkpoints (restored from the newest intact one).

* `RunLock`: `model_dir/LOCK` names the process training in the folder (PID, host, start). A
  second trainer on the same folder refuses to start; a lock whose holder is dead (same host,
  PID gone) is taken over.
* `History`: append-only JSON lines; on resume it keeps the records up to the restored step and
  drops a torn last line (a kill during a write) with a warning.
* `restore_newest_intact`: tries the checkpoints newest first and falls back past damaged ones
  (truncated `.data`, empty `.index`, an empty or unreadable `checkpoint` state file), naming
  each damaged file; damaged files are renamed `*.damaged`, never deleted.
"""

import glob
import json
import os
import re
import socket
import time

import tensorflow as tf
from absl import logging

__all__ = ["History", "RunLock", "RunLockedError", "restore_newest_intact"]


class RunLockedError(RuntimeError):
    """Another live process is training in this `model_dir`."""


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
                if holder and (holder.get("host") != me["host"] or _pid_alive(holder["pid"])):
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


def _checkpoint_number(prefix):
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def _candidates(directory):
    """Checkpoint prefixes in `directory`, newest first, from the files themselves (the state
    file may be the damaged part)."""
    prefixes = {path[: -len(".index")] for path in glob.glob(os.path.join(directory, "*.index"))}
    return sorted(prefixes, key=_checkpoint_number, reverse=True)


def _quarantine(prefix):
    for path in glob.glob(prefix + ".*"):
        if not path.endswith(".damaged"):
            os.replace(path, path + ".damaged")


def restore_newest_intact(checkpoint, directory):
    """Restores `checkpoint` from the newest intact checkpoint in `directory`.

    Returns the restored prefix, or None when there is none. Damaged checkpoints are skipped
    with a warning naming the file, and renamed `*.damaged`; the `checkpoint` state file is
    rewritten to list the intact ones, so `tf.train.CheckpointManager` continues from there.
    """
    if not os.path.isdir(directory):
        return None
    restored, intact = None, []
    for prefix in _candidates(directory):
        if restored is None:
            try:
                checkpoint.restore(prefix).assert_existing_objects_matched()
            except Exception as error:  # noqa: BLE001 - any failure to read it means damage
                message = str(error).strip().splitlines()[0] if str(error).strip() else ""
                logging.warning(
                    "Checkpoint %s is damaged (%s: %s); falling back to an older one. Its files "
                    "are kept as %s.*.damaged.",
                    prefix,
                    type(error).__name__,
                    message[:200],
                    os.path.basename(prefix),
                )
                _quarantine(prefix)
                continue
            restored = prefix
        intact.append(prefix)
    state = os.path.join(directory, "checkpoint")
    if intact:
        tf.compat.v1.train.update_checkpoint_state(
            directory, intact[0], all_model_checkpoint_paths=list(reversed(intact))
        )
    elif os.path.exists(state):
        os.replace(state, state + ".damaged")
    return restored
