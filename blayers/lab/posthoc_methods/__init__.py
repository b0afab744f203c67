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
        gin.configurable(cls.__name__, module=cls.__module__)(cls)
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
    (anything with `fit(logits, labels)` and `predict_proba(logits)`).

    A map with many parameters overfits a small calibration part (vector scaling's scales grow
    without bound on a part the network classifies almost perfectly), so by default
    (`fallback=True`) the map is checked by 5-fold cross-validation on the calibration part
    against temperature scaling, the simpler map, and kept only when its cross-validated NLL
    is lower by more than one standard error of the paired per-example difference; otherwise
    temperature scaling is used (`notes` says why, `fell_back` is 1).

    Args:
      fallback: check the map against temperature scaling and fall back to it.
    """

    tasks = ("classification",)
    checked = True  # temperature scaling itself is not checked against itself

    def __init__(self, fallback=True):
        super().__init__()
        self.fallback = bool(fallback)

    def make(self):
        """The library's calibrator of this method (a subclass says which)."""
        raise NotImplementedError(f"{type(self).__name__}.make")  # abstract; intentional

    def fit(self, fit):
        from blayers import posthoc as library

        self.logits = fit.log_mean_probs(fit.base)
        logits, labels = self.logits[fit.calibration], fit.y[fit.calibration].astype(int)
        self.fell_back = False
        if self.fallback and self.checked:
            mine = _cross_validated_nlls(self.make, logits, labels)
            theirs = _cross_validated_nlls(library.TemperatureScaling, logits, labels)
            difference = mine - theirs
            se = float(np.std(difference, ddof=1) / np.sqrt(len(difference)))
            if not np.mean(difference) < -se:
                self.fell_back = True
                self.note(
                    f"{type(self).__name__}: temperature scaling used instead: on the "
                    f"calibration part's 5-fold cross-validation the map's NLL is "
                    f"{np.mean(mine):.4g} against temperature scaling's {np.mean(theirs):.4g} "
                    f"(difference {np.mean(difference):.3g}, standard error {se:.2g}: not lower "
                    f"by a standard error); {len(labels)} calibration examples do not support "
                    "its parameters."
                )
                self.calibrator = library.TemperatureScaling().fit(logits, labels)
                return
        self.calibrator = self.make().fit(logits, labels)

    def predictive(self, fit):
        return [self.calibrator.predict_proba(self.logits)[None]]

    def metrics(self, fit):
        return {"fell_back": float(self.fell_back)} if self.fallback and self.checked else {}


def _cross_validated_nlls(make, logits, labels, folds=5):
    """Per-example NLLs of calibrators from `make()` fitted on 4 folds and scored on the fifth."""
    order = np.random.default_rng(0).permutation(len(labels))
    nlls = np.empty(len(labels))
    for part in np.array_split(order, folds):
        rest = np.setdiff1d(order, part)
        probs = make().fit(logits[rest], labels[rest]).predict_proba(logits[part])
        nlls[part] = -np.log(np.maximum(probs[np.arange(len(part)), labels[part]], 1e-300))
    return nlls


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
      base: the run's own predictive parameters over `inputs.x` (`learner.predictive()`: an
        SG-MCMC run's averages its kept samples).
      predict: `predict(model)` gives a model's predictive parameters over `inputs.x`
        (`predict(model, replicas=R)`: `R` replicas' as one, draw-major `[draws x R, n, ...]`).
    """

    def __init__(self, learner, x, y, calibration, evaluation, inputs, num_samples, predict):
        self.learner, self.model, self.data = learner, learner.model, learner.data
        self.task = learner.data.task
        self.classification = self.task.name == "classification"
        self.x, self.y, self.calibration, self.evaluation = x, y, calibration, evaluation
        self.inputs, self.num_samples, self.predict = inputs, num_samples, predict
        model, draws = learner.predictive()  # an SG-MCMC run's: its kept samples
        self.base = predict(model, draws)

    @staticmethod
    def log_mean_probs(params):
        """`log mean_s p_s [N, K]`, the Monte Carlo predictive's log-probabilities."""
        return np.log(np.mean(params[0], axis=0))
