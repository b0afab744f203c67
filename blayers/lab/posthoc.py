"""Post-hoc uncertainty for a finished run: `python -m blayers.posthoc --model_dir=RUN
--method=NAME`, NAME one of the methods in `blayers.lab.posthoc_methods` (one file each).

The run's model is rebuilt from its `operative_config.gin` and restored from the checkpoint of
its final step (read only: a damaged one is skipped, never renamed; the summary names the
checkpoint scored); a run still training is refused. The run folder is read, never changed,
except for `posthoc/<method>/` (`posthoc/<method>-<hash>/` for each other setting of extra gin
files and bindings, with its `command.json`), which gets a `metrics.json` shaped like the
run's own (the same metric names under `final`, the run's model on the same examples under
`base`, and each corrupted set's numbers for both under `shift`; what the method chose under
`notes`) and the task's plots.

The test set is split once (`split_seed`): `calibration_fraction` of it fits what needs
held-out data (a calibration map, a conformal quantile, Laplace's prior precision); both the
run's model and the method are scored on the rest (and, for classification, on the run's OOD
set and the rest's corrupted copies). The Laplace curvature and SWAG's continued training use
the training set. `posthoc`'s arguments and each method's own are gin parameters
(`--gin_param="posthoc.split_seed = 1"`, `--gin_param="Conformal.alpha = 0.05"`,
`--gin_param="Laplace.hessian_structure = 'full'"`).
"""

import os
import time

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from blayers import metrics as metrics_lib
from blayers.lab import cli_env, posthoc_methods, runs
from blayers.lab.tasks.base import features, targets
from blayers.posthoc.batches import input_batches

__all__ = ["build", "posthoc", "restore", "split_indices", "train_in_memory"]


def split_indices(n, calibration_fraction=0.5, split_seed=0):
    """The test set's calibration and evaluation indices (of its `n` examples in order), as
    `posthoc` splits them: what an outside tool scores to compare with a method's numbers."""
    order = np.random.default_rng(split_seed).permutation(n)
    cut = round(calibration_fraction * n)
    if not 0 < cut < n:
        raise ValueError(
            f"posthoc: calibration_fraction={calibration_fraction} leaves no calibration or no "
            f"evaluation examples of the {n} test examples."
        )
    return order[:cut], order[cut:]


def _split(dataset, n, fraction, seed):
    """Indices of the calibration and evaluation parts, and the examples as arrays."""
    x, y = next(iter(dataset.batch(max(n, 1))))
    return (*split_indices(n, fraction, seed), x.numpy(), y.numpy())


def _dataset(x, y=None):
    return tf.data.Dataset.from_tensor_slices(x if y is None else (x, y))


def _probs64(distribution):
    """A categorical's probabilities computed in float64 (float32 ones saturate at 0 and 1,
    which leaves `log 0` in the logits a calibration map is fitted to), and its logits (for
    the logit OOD scores)."""
    logits = tf.cast(distribution.logits_parameter(), tf.float64)
    return tf.nn.softmax(logits), logits


@gin.configurable(module="blayers.lab.posthoc", denylist=["learner", "run", "method"])
def posthoc(learner, run, method, calibration_fraction=0.5, split_seed=0, num_samples=None):
    """Fits `method` on the restored run and returns `(summary, arrays)`.

    Both the run's model (`base`) and the method (`final`) are scored on the evaluation part
    of the test set by the task's own scoring; for classification also on the run's OOD set
    (`ood_auroc_*`) and on the evaluation part of its corrupted copies (`corrupted_*`, and the
    per-set table in the arrays), as the trainer does.

    Args:
      learner: the run's built and restored `SupervisedLearner` (an `SGMCMCLearner`'s run is
        scored through its kept samples, `learner.predictive()`).
      run: its `RunDir`.
      method: a method's name (`posthoc_methods.methods()`) or a `Method` instance; a name is
        built with its gin bindings (`Laplace.prior_precision = 'val_nll'`).
      calibration_fraction: the share of the test set used to fit (the rest scores).
      split_seed: seeds the test set's split.
      num_samples: posterior draws for a Bayesian model's predictive and for SWAG (default the
        run's `num_eval_samples`).
    """
    if isinstance(method, str):
        method = posthoc_methods.get(method)()
    name = method.name
    data, model, task = learner.data, learner.model, learner.data.task
    if task.name not in method.tasks:
        raise ValueError(
            f"posthoc: method {name!r} is for {' and '.join(method.tasks)} runs; this run's "
            f"task is {task.name}."
        )
    if method.needs_deterministic:
        _refuse_random_weights(model, type(method).__name__, method.needs_deterministic)
    num_samples = num_samples or learner.num_eval_samples
    calibration, evaluation, x, y = _split(
        data.test, data.num_test, calibration_fraction, split_seed
    )
    classification = task.name == "classification"
    # Every input any score needs, predicted in one pass per model or draw: the whole test
    # set, then the OOD set and the corrupted copies of the evaluation part.
    inputs = _Inputs(x)
    if classification and data.ood is not None:
        inputs.add("ood", np.concatenate(list(input_batches(data.ood.batch(4096), None))))
    for key, dataset in (data.corrupted or {}).items() if classification else ():
        inputs.add(key, features(dataset)[evaluation], targets(dataset)[evaluation])

    def predict(model_, draws=None, replicas=None):
        parameters = _probs64 if classification else None
        return task.predictive_samples(
            model_,
            _dataset(inputs.x),
            draws or num_samples,
            learner.eval_batch_size,
            parameters=parameters,
            replicas=replicas,
        )

    def score(params):
        """`(metrics, arrays)` of predictive parameters over `inputs`."""
        test = [p[:, : len(x)] for p in params]
        if not classification:
            means, stddevs = (p[:, evaluation] for p in test)
            return metrics_lib.regression_metrics(
                means, stddevs, y[evaluation], data.target_scale
            ), {
                "means": means,
                "stddevs": stddevs,
                "targets": y[evaluation],
                "inputs": x[evaluation],
                "scale": data.target_scale,
                "shift": data.target_mean,
            }
        probs, logits = params[0], params[1] if len(params) > 1 else None
        ood = inputs.part(probs, "ood") if "ood" in inputs.parts else None
        corrupted = {
            key: (inputs.part(probs, key), inputs.labels[key])
            for key in inputs.parts
            if key != "ood"
        }
        with_logits = logits is not None and ood is not None
        return task.score(
            test[0][:, evaluation],
            y[evaluation],
            ood,
            corrupted,
            logits=test[1][:, evaluation] if with_logits else None,
            ood_logits=inputs.part(logits, "ood") if with_logits else None,
        )

    fit = posthoc_methods.Fit(learner, x, y, calibration, evaluation, inputs, num_samples, predict)
    base, base_arrays = score(fit.base)
    start = time.perf_counter()
    with _expected_retracing():
        method.fit(fit)
        params = method.predictive(fit)
    fit_seconds = time.perf_counter() - start
    final, arrays = score(params) if params is not fit.base else (dict(base), base_arrays)
    if classification and "ood" in inputs.parts:
        # The network's own features: the same for the run and any method that keeps them.
        begin, end = inputs.parts["ood"]
        scores = task.feature_scores(model, data, x[evaluation], inputs.x[begin:end])
        base.update(scores)
        final.update({k: v for k, v in scores.items() if k not in final})
    final.update(method.metrics(fit))
    for line in method.notes:
        logging.info("%s", line)
    summary = {
        "status": "finished",
        "method": name,
        "label": method.label or name,
        "notes": list(method.notes),
        "run": run.path,
        "checkpoint": getattr(learner, "scored_checkpoint", None),
        "num_calibration": len(calibration),
        "num_evaluation": len(evaluation),
        "fit_seconds": fit_seconds,
        "base": base,
        "final": final,
    }
    if "corruptions" in arrays:  # each shifted set's own numbers, for both predictives
        summary["shift"] = {"base": base_arrays["corruptions"], "final": arrays["corruptions"]}
    return summary, arrays


def _expected_retracing():
    """Without TensorFlow's warning that a function traced again: an ensemble's members each
    trace their own predictive graph, by design, not by a leak."""
    return cli_env.dropped_records(
        tf.get_logger(), lambda record: "triggered tf.function retracing" in record.getMessage()
    )


class _Inputs:
    """The test inputs followed by named extra parts, and how to cut predictions back apart."""

    def __init__(self, x):
        self.x, self.parts, self.labels = x, {}, {}

    def add(self, key, x, labels=None):
        self.parts[key] = (len(self.x), len(self.x) + len(x))
        self.x = np.concatenate([self.x, x.astype(self.x.dtype)])
        if labels is not None:
            self.labels[key] = labels

    def part(self, values, key):
        begin, end = self.parts[key]
        return values[:, begin:end]


def _refuse_random_weights(model, method, why):
    """A method that needs a deterministic network, refused on a run with random weights."""
    from blayers.layers.base import BayesianLayer

    bayesian = [
        layer.name
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, BayesianLayer) and layer.random_weight_names()
    ]
    if bayesian:
        raise ValueError(
            f"posthoc: {method} {why}; this run's model has random weights in {bayesian[:3]} "
            "(train with deterministic layers, e.g. mlp.dense_layer = 'Dense'; a Bayesian "
            "run's own predictive is already a posterior: the calibration maps, conformal and "
            "ensemble take it)."
        )


def restore(model_dir):
    """The run's learner, built from the parsed operative config and restored from its newest
    checkpoint, and its `RunDir`."""
    from blayers.lab.learners.supervised import SupervisedLearner

    run = runs.RunDir(model_dir)
    refusal = run.unscorable()
    if refusal:
        raise ValueError(f"posthoc: {refusal}")
    from blayers.lab.learners.sgmcmc import SGMCMCLearner

    reference = gin.query_parameter("train.learner") if _bound("train.learner") else None
    name = getattr(getattr(reference, "configurable", None), "name", "SupervisedLearner")
    supervised = {"SupervisedLearner": SupervisedLearner, "SGMCMCLearner": SGMCMCLearner}
    if reference is not None and name not in supervised:
        raise ValueError(
            f"posthoc: {model_dir} was trained by {name}; post-hoc methods need a "
            "SupervisedLearner (or SGMCMCLearner) run."
        )
    learner = supervised[name]()
    learner.check_bindings = False  # checked when the run trained; see the class attribute
    build(learner, _query("train.seed", 0), _query("train.train_steps", 1), run)
    # Read only: the run's own step (not a longer run's later checkpoint), nothing renamed.
    step = (run.metrics() or {}).get("step")
    restored = run.checkpointer(learner.state()).restore(max_step=step, read_only=True)
    if restored is None:
        raise ValueError(f"posthoc: {model_dir} has no intact checkpoint to restore.")
    learner.scored_checkpoint = os.path.basename(restored)
    learner.scored_checkpoint_path = restored
    if step is not None and not restored.endswith(f"-{step}"):
        logging.warning(
            "posthoc: %s's checkpoint of step %s (its metrics) is damaged; scoring %s instead.",
            model_dir,
            step,
            learner.scored_checkpoint,
        )
    return learner, run


def build(learner, seed, steps, run=None):
    """Builds `learner` in the Loop's `Context` (the default strategy), as a run would."""
    from blayers.lab import loop

    learner.build(loop.Context(run, tf.distribute.get_strategy(), None, seed, steps))


def train_in_memory(learner, steps):
    """Steps a built `learner` to `steps` as the Loop does (several steps a graph call), with
    no run folder: what a method trains is part of its fit. A non-finite step stops it with
    a ValueError naming the step and, for replicas, the replica."""
    from blayers.lab import loop
    from blayers.lab.learners.base import non_finite

    while learner.step < steps:
        learner.begin_phase()
        while learner.step < steps:
            done = learner.train_steps(min(loop.STEPS_PER_EXECUTION, steps - learner.step))
            if done.count == 0:
                break
            if non_finite(done.last):
                culprit = getattr(learner, "bad_replica", -1)
                raise ValueError(
                    f"posthoc: a non-finite loss at step {learner.step}"
                    + (f" (replica {culprit})" if culprit >= 0 else "")
                    + "."
                )


def _query(name, default):
    """A gin parameter's value, with a macro (`%seed`) evaluated."""
    if not _bound(name):
        return default
    value = gin.query_parameter(name)
    if isinstance(value, gin.config.ConfigurableReference):
        value = value.scoped_configurable_fn()
    return value


def _bound(name):
    try:
        gin.query_parameter(name)
    except ValueError:
        return False
    return True
