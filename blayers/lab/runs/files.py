"""The files of a run folder that must survive a crash: the lock, the history log, and
atomic JSON records. `blayers.lab.runs.RunDir` is their one user.

* `RunLock`: `model_dir/LOCK` names the process training in the folder (PID, host, start). A
  second process on the same folder refuses to start; a lock whose holder is dead (same host,
  PID gone) is taken over.
* `History`: append-only JSON lines; on resume it keeps the records up to the restored step and
  drops a torn last line (a kill during a write) with a warning.
* `write_json` / `read_json`: a kill mid-write leaves the previous file, never a torn one.
"""

import glob
import json
import os
import re
import socket
import time

from absl import logging

from blayers.lab.cli_env import pid_alive

__all__ = [
    "History",
    "RunLock",
    "RunLockedError",
    "checkpoint_prefixes",
    "first_line",
    "read_json",
    "unwritable",
    "write_json",
]


class RunLockedError(RuntimeError):
    """Another live process is training in this `model_dir`."""


def first_line(error):
    """The first line of an error's message (at most 300 characters), or its type's name."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def _identity(folder):
    """`[device, inode]` of a folder: a copy has another, a path through a symlink or a bind
    mount the same."""
    stat = os.stat(folder)
    return [stat.st_dev, stat.st_ino]


class RunLock:
    """An exclusive lock on a run folder, held for the life of a training run.

    Args:
      model_dir: the run folder; the lock is the file `LOCK` in it.
    """

    def __init__(self, model_dir):
        self.path = os.path.join(model_dir, "LOCK")
        self.held = False

    def holder(self):
        """The holder's record (`pid`, `host`, `started`), or None (no lock, or a torn one)."""
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def state(self, holder=None):
        """`(state, holder)` of the LOCK file: `'free'` (none, or torn), `'own'` (this
        process), `'copied'` (made in another folder on this host: a copy's, locking nothing
        here), `'live'` (a live process here, or any on another host) or `'dead'`."""
        holder = self.holder() if holder is None else holder
        if not holder or not isinstance(holder.get("pid"), int):
            return "free", holder
        host, folder = socket.gethostname(), os.path.dirname(self.path)
        if holder.get("host") != host:
            return "live", holder  # nothing here can tell whether it still runs
        if holder.get("inode") not in (None, _identity(folder)):
            return "copied", holder
        if holder["pid"] == os.getpid():
            return "own", holder
        return ("live" if pid_alive(holder["pid"]) else "dead"), holder

    def acquire(self):
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "folder": os.path.realpath(os.path.dirname(self.path)),
            "inode": _identity(os.path.dirname(self.path)),
            "started": time.time(),
        }
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                state, holder = self.state()
                if state == "own":
                    raise RunLockedError(
                        f"{os.path.dirname(self.path)} is already being trained by this process."
                    ) from None
                if state == "live":
                    raise RunLockedError(
                        f"Another trainer holds {self.path} (PID {holder.get('pid')} on host "
                        f"{holder.get('host')}, since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder['started']))})"
                        ". Two trainers on one model_dir would interleave its checkpoints and "
                        "logs: stop that one, or use another --model_dir. (If it is dead on "
                        "another host, delete the LOCK file.)"
                    ) from None
                if state == "copied":  # a copied folder: the lock was the original's
                    logging.warning(
                        "%s was copied from %s with its LOCK (held there by PID %s on %s); "
                        "it does not lock this folder: taking it.",
                        os.path.dirname(self.path),
                        holder.get("folder"),
                        holder.get("pid"),
                        holder.get("host"),
                    )
                else:
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
            holder = self.holder()
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


def read_lines(path):
    """The JSON records of a JSON-lines file; a torn line (a kill during a write) is skipped
    with a warning. `[]` for a missing file."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            logging.warning(
                "Dropping a torn line %d of %s (the run was killed while writing it): %r",
                number,
                path,
                line[:80],
            )
    return records


class History:
    """Append-only JSON lines (`history.jsonl`), truncated to the restored step on resume.

    Args:
      path: the file.
      resume_step: records after this step (a run killed after its last checkpoint) are
        dropped, so the resumed run logs them again.
    """

    def __init__(self, path, resume_step):
        self.path = path
        self.records = [r for r in read_lines(path) if r.get("step", 0) <= resume_step]
        write_text(path, "".join(json.dumps(r) + "\n" for r in self.records))

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
        write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.records))


def write_text(path, text):
    """A kill mid-write leaves the previous file, never a torn one."""
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):  # a full disk: no half-written file left behind
            os.remove(temporary)
        raise


def write_json(path, value, **kwargs):
    write_text(path, json.dumps(value, indent=1, **kwargs))


def read_json(path):
    """The JSON value in `path`, or None (missing or unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def checkpoint_number(prefix):
    """The step of a checkpoint prefix (`ckpt-120` -> 120; -1 without one)."""
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def checkpoint_prefixes(directory):
    """Checkpoint prefixes in `directory`, newest first, found from their `.index` files (the
    state file may be the damaged part, and holds another folder's paths once a run folder is
    copied or moved)."""
    prefixes = {path[: -len(".index")] for path in glob.glob(os.path.join(directory, "*.index"))}
    return sorted(prefixes, key=checkpoint_number, reverse=True)


def unwritable(model_dir):
    """Why the run folder `model_dir` cannot be made or written, as far as the file system
    tells before anything loads: a file where a folder must be, a folder this user cannot
    write, a name longer than the OS allows. None when it looks writable (the run's own writes
    still report what this cannot foresee: a full disk, a folder removed meanwhile)."""
    path = os.path.abspath(model_dir)
    existing = path
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user"
    try:
        longest = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    for name in os.path.relpath(path, existing).split(os.sep):
        if len(os.fsencode(name)) > longest:
            return f"File name too long ({len(os.fsencode(name))} bytes, at most {longest})"
    return None
