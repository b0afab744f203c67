"""Run folders: `RunDir` owns every file of a run, `Checkpointer` its checkpoints.

Nothing else opens a run's files: the Loop writes through a `RunDir`, and the launchers, the
report and the experiments read through one. Reading a run loads no TensorFlow (the sweep's
driver and the report stay light); the Checkpointer loads it on first use.
"""

import importlib

from blayers.lab.runs.files import (
    History,
    RunLock,
    RunLockedError,
    checkpoint_prefixes,
    first_line,
    unwritable,
)
from blayers.lab.runs.rundir import ChangedBindingsError, RunDir, set_command, train_seconds

__all__ = [
    "ChangedBindingsError",
    "CheckpointMismatchError",
    "CheckpointWriteError",
    "Checkpointer",
    "History",
    "LongerRunError",
    "RunDir",
    "RunLock",
    "RunLockedError",
    "SaverState",
    "checkpoint_prefixes",
    "first_line",
    "set_command",
    "train_seconds",
    "unwritable",
]

_CHECKPOINTER = (
    "CheckpointMismatchError",
    "CheckpointWriteError",
    "Checkpointer",
    "LongerRunError",
    "SaverState",
)


def __getattr__(name):
    if name in _CHECKPOINTER:
        return getattr(importlib.import_module("blayers.lab.runs.checkpointer"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
