"""Post-hoc methods, one file each, found by name.

A method is a subclass of `Method` with a `name`; defining it registers it (and makes it
gin-configurable under its class name: `Laplace.hessian_structure = 'full'`), so
`python -m blayers.posthoc --method=NAME`, `blayers.lab.posthoc.posthoc`, the report and the
uncertainty table all find it here. Every module of this package is imported by `methods()`; a
method defined elsewhere joins when its module is imported (a gin file's `import my_methods`).

The contract, in the order `posthoc` calls it:

* `fit(fit)`: fit on the run (`fit.learner`, `fit.model`, the training set `fit.data.train`)
  and on the calibration part of its test set (`fit.calibration`, with the run's own predictive
  `fit.base` over every input);
* `predictive(fit)`: the method's predictive parameters over `fit.inputs.x` (the test set, then
  the OOD set and the corrupted copies), shaped as the task's (`[S, N, K]` probabilities for
  classification; means and standard deviations for regression); the default is the run's own;
* `metrics(fit)`: extra numbers for the summary's `final` (a fitted temperature, a coverage);
* `notes`: lines saying what the method chose and why, printed and kept in the summary.
"""

import importlib
import pkgutil

import gin
import numpy as np

__all__ = ["Calibrator", "Fit", "Method", "get", "methods"]

_REGISTRY = {}


class Method:
    """A post-hoc method (see the module). Subclasses set `name`, and may set:

    Attributes:
      name: the `--method` name.
      label: its row label in tables.
      tasks: the tasks it applies to.
      needs_deterministic: why it needs a network without random weights (refused on a
        Bayesian run), or None.
      changes_predictive: False for a method that adds numbers but keeps the run's predictive
        (conformal sets), which tables then leave out.
    """

    name = None
    label = None
    tasks = ("classification", "regression")
    needs_deterministic = None
    changes_predictive = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if not name:
            return
        known = _REGISTRY.get(name)
        if known is not None and (known.__module__, known.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):
            raise ValueError(
                f"posthoc method {name!r} is defined twice: {known.__module__}."
                f"{known.__qualname__} and {cls.__module__}.{cls.__qualname__}."
            )
        # Decorated in place: the class itself takes its bindings (`SWAG.epochs = 20`).
        gin.configurable(cls.__name__, module="blayers.posthoc")(cls)
        _REGISTRY[name] = cls

    def __init__(self):
        self.notes = []

    def fit(self, fit):
        """Fits on `fit` (a `Fit`)."""

    def predictive(self, fit):
        """Predictive parameters over `fit.inputs.x`; the run's own by default."""
        return fit.base

    def metrics(self, fit):
        """Extra numbers for the summary's `final`."""
        return {}

    def note(self, text):
        self.notes.append(text)


class Calibrator(Method):
    """A map of the run's predictive logits (the log of its Monte Carlo mean probabilities)
    fitted on the calibration part: subclasses return the library's calibrator from `make()`
    (anything with `fit(logits, labels)` and `predict_proba(logits)`)."""

    tasks = ("classification",)

    def make(self):
        raise NotImplementedError

    def fit(self, fit):
        self.logits = fit.log_mean_probs(fit.base)
        self.calibrator = self.make().fit(self.logits[fit.calibration], fit.y[fit.calibration])

    def predictive(self, fit):
        return [self.calibrator.predict_proba(self.logits)[None]]


def methods():
    """`{name: class}` of every method: this package's modules and any imported elsewhere."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return dict(sorted(_REGISTRY.items()))


def get(name):
    """The method class called `name`, or a ValueError listing the known ones."""
    known = methods()
    if name not in known:
        raise ValueError(
            f"posthoc: no method {name!r}; the methods are {', '.join(known)} (a new one is a "
            "`blayers.lab.posthoc_methods.Method` subclass in its own module)."
        )
    return known[name]


class Fit:
    """What a method fits on: the restored run, its test set split into a calibration and an
    evaluation part, and the run's own predictive over every input.

    Attributes:
      learner, model, task, data: the run's.
      classification: whether the task is classification.
      x, y: the test set's inputs and targets; `calibration`, `evaluation` index them.
      inputs: the test inputs followed by the OOD set and corrupted copies (`inputs.x`).
      num_samples: posterior draws for a predictive.
      base: the run's own predictive parameters over `inputs.x`.
      predict: `predict(model)` gives a model's predictive parameters over `inputs.x`.
    """

    def __init__(self, learner, x, y, calibration, evaluation, inputs, num_samples, predict):
        self.learner, self.model, self.data = learner, learner.model, learner.data
        self.task = learner.data.task
        self.classification = self.task.name == "classification"
        self.x, self.y, self.calibration, self.evaluation = x, y, calibration, evaluation
        self.inputs, self.num_samples, self.predict = inputs, num_samples, predict
        self.base = predict(self.model)

    @staticmethod
    def log_mean_probs(params):
        """`log mean_s p_s [N, K]`, the Monte Carlo predictive's log-probabilities."""
        return np.log(np.mean(params[0], axis=0))
