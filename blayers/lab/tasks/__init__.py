"""Tasks: what a model's outputs mean and how a run is judged.

A task object owns the output layout a model builder must produce (`output_size`), the
likelihood `p(y | outputs)` the trainer maximizes (`likelihood`, `negative_log_likelihood`), the
test-time evaluation and its metrics (`evaluate`), and the plots of a finished run (`plot`). The
trainer and the evaluation never branch on a task's name: a new kind of task
(sequence-to-sequence, control, point process) is one new `Task` subclass in one module here.

Data sources name their task (`Data(task='classification')` or a `Task` instance); `get` turns a
name into an instance.
"""

from blayers.lab.tasks.base import Task, get, register_task
from blayers.lab.tasks.classification import Classification
from blayers.lab.tasks.density import Density, DensityModel
from blayers.lab.tasks.point_process import PointProcess, PointProcessModel, VariationalInference
from blayers.lab.tasks.regression import Regression
from blayers.lab.tasks.sequence import SequenceToSequence

__all__ = [
    "Classification",
    "Density",
    "DensityModel",
    "PointProcess",
    "PointProcessModel",
    "Regression",
    "SequenceToSequence",
    "Task",
    "VariationalInference",
    "get",
    "register_task",
]
