"""Post-hoc uncertainty for a finished run: `python -m blayers.posthoc --model_dir=RUN
--method=temperature|conformal|laplace|swag|ensemble`.

The run's model is rebuilt from its `operative_config.gin` and restored from the checkpoint of
its final step (read only: a damaged one is skipped, never renamed; the summary names the
checkpoint scored); a run still training is refused. The run folder is read, never changed,
except for `posthoc/<method>/` (`posthoc/<method>-<hash>/` for each other setting of extra gin
files and bindings, with its `command.json`), which gets a `metrics.json` shaped like the run's own (the same metric names under `final`, the run's model
on the same examples under `base`, and each corrupted set's numbers for both under `shift`)
and the task's plots.

The test set is split once (`split_seed`): `calibration_fraction` of it fits what needs held-out
data (the temperature, the conformal quantile); both the run's model and the post-hoc method
are scored on the rest (and, for classification, on the run's OOD set and the rest's corrupted
copies). `ensemble` mixes the run with other finished runs of the same model. The Laplace
curvature and SWAG's continued training use the training set. Every argument of `posthoc` is
a gin parameter (`--gin_param="posthoc.alpha = 0.05"`,
`--gin_param="Laplace.hessian_structure = 'full'"`).
"""

import os
import time

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from blayers import metrics as metrics_lib
from blayers import posthoc as posthoc_lib
from blayers.lab import runs
from blayers.lab.tasks.base import features, targets
from blayers.posthoc.batches import input_batches

__all__ = ["METHODS", "posthoc", "restore"]

METHODS = ("temperature", "conformal", "laplace", "swag", "ensemble")

# The configurable versions (`Laplace.hessian_structure = 'full'` binds these, not the library's
# own classes, which know nothing of gin).
_Laplace = gin.external_configurable(posthoc_lib.Laplace, module="blayers.posthoc")
_SWAG = gin.external_configurable(posthoc_lib.SWAG, module="blayers.posthoc")


def _split(dataset, n, fraction, seed):
    """Indices of the calibration and evaluation parts, and the examples as arrays."""
    x, y = next(iter(dataset.batch(max(n, 1))))
    order = np.random.default_rng(seed).permutation(n)
    cut = round(fraction * n)
    if not 0 < cut < n:
        raise ValueError(
            f"posthoc: calibration_fraction={fraction} leaves no calibration or no evaluation "
            f"examples of the {n} test examples."
        )
    return order[:cut], order[cut:], x.numpy(), y.numpy()


def _dataset(x, y=None):
    return tf.data.Dataset.from_tensor_slices(x if y is None else (x, y))


def _probs64(distribution):
    """A categorical's probabilities computed in float64: float32 ones saturate at 0 and 1,
    which leaves `log 0` in the logits a temperature is fitted to."""
    return (tf.nn.softmax(tf.cast(distribution.logits_parameter(), tf.float64)),)


def _log_mean_probs(probs):
    """`log mean_s p_s`, the Monte Carlo predictive's log-probabilities `[n, K]`."""
    return np.log(np.mean(probs, axis=0))


@gin.configurable(module="blayers.lab.posthoc", denylist=["learner", "run"])
def posthoc(
    learner,
    run,
    method,
    calibration_fraction=0.5,
    split_seed=0,
    num_samples=None,
    alpha=0.1,
    conformal_method="aps",
    vector_scaling=False,
    laplace_prior="marglik",
    swag_epochs=10,
    swag_learning_rate=0.01,
    swag_max_rank=20,
    members=(),
):
    """Fits `method` on the restored run and returns `(summary, arrays)`.

    For classification, both the run's model (`base`) and the method (`final`) are also scored
    on the run's OOD set (`ood_auroc_*`) and on the evaluation part of its corrupted copies of
    the test set (`corrupted_*`, and the per-set table in the arrays), as the trainer does.

    Args:
      learner: the run's built and restored `SupervisedLearner`.
      run: its `RunDir`.
      method: one of `METHODS`.
      calibration_fraction: the share of the test set used to fit (the rest scores).
      split_seed: seeds the test set's split.
      num_samples: posterior draws for a Bayesian model's predictive and for SWAG (default the
        run's `num_eval_samples`).
      alpha: conformal miscoverage (sets and intervals cover `1 - alpha`).
      conformal_method: `'lac'`, `'aps'` or `'raps'` for classification sets.
      vector_scaling: per-class scale and bias instead of one temperature.
      laplace_prior: how the prior precision is chosen: `'marglik'` or `'val_nll'` (on the
        calibration part).
      swag_epochs, swag_learning_rate, swag_max_rank: SWAG's continued training (SGD at a
        constant rate, one collection per epoch) and its rank.
      members: for `'ensemble'`, the other runs' folders (same model and data, other seeds);
        the predictive is the equal mixture of this run and those (a deep ensemble,
        Lakshminarayanan et al., 2017).
    """
    if method not in METHODS:
        raise ValueError(f"posthoc: method {method!r} is not one of {METHODS}.")
    data, model, task = learner.data, learner.model, learner.data.task
    if task.name not in ("classification", "regression"):
        raise ValueError(f"posthoc: the {task.name} task has no post-hoc methods here.")
    num_samples = num_samples or learner.num_eval_samples
    calibration, evaluation, x, y = _split(
        data.test, data.num_test, calibration_fraction, split_seed
    )
    classification = task.name == "classification"
    if method in ("temperature", "laplace") and not classification:
        raise ValueError(f"posthoc: method {method!r} is for classification runs.")
    if method == "ensemble" and not members:
        raise ValueError(
            "posthoc: method 'ensemble' needs the other runs: "
            "--gin_param=\"posthoc.members = ['RUN2', 'RUN3']\"."
        )
    # Every input any score needs, predicted in one pass per model or draw: the whole test
    # set, then the OOD set and the corrupted copies of the evaluation part.
    inputs = _Inputs(x)
    if classification and data.ood is not None:
        inputs.add("ood", np.concatenate(list(input_batches(data.ood.batch(4096), None))))
    for key, dataset in (data.corrupted or {}).items() if classification else ():
        inputs.add(key, features(dataset)[evaluation], targets(dataset)[evaluation])

    def predictive(model_):
        parameters = _probs64 if classification else None
        return task.predictive_samples(
            model_, _dataset(inputs.x), num_samples, learner.eval_batch_size, parameters=parameters
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
        probs = params[0]
        ood = inputs.part(probs, "ood") if "ood" in inputs.parts else None
        corrupted = {
            key: (inputs.part(probs, key), inputs.labels[key])
            for key in inputs.parts
            if key != "ood"
        }
        return task.score(test[0][:, evaluation], y[evaluation], ood, corrupted)

    base_params = predictive(model)
    base, base_arrays = score(base_params)
    start = time.perf_counter()
    extra = {}
    if method == "temperature":
        logits = _log_mean_probs(base_params[0])
        scaler = posthoc_lib.TemperatureScaling(vector=vector_scaling)
        scaler.fit(logits[calibration], y[calibration])
        params = [scaler.predict_proba(logits)[None]]
        extra = {"temperature": scaler.temperature} if not vector_scaling else {}
    elif method == "laplace":
        _refuse_random_weights(model, "Laplace", "linearizes a deterministic network at its MAP")
        laplace = _Laplace(model, "classification")
        laplace.fit(data.train.batch(learner.eval_batch_size))
        if laplace_prior == "val_nll":
            laplace.optimize_prior_precision("val_nll", val_data=(x[calibration], y[calibration]))
        else:
            laplace.optimize_prior_precision(laplace_prior)
        params = [laplace.predict(inputs.x)[None]]
        extra = {"prior_precision": laplace.prior_precision}
    elif method == "swag":
        params = _swag(
            learner, inputs.x, num_samples, swag_epochs, swag_learning_rate, swag_max_rank
        )
    elif method == "ensemble":
        draws = [base_params]
        for member in members:
            try:
                member_learner, _ = restore(member)
            except runs.CheckpointMismatchError as error:
                raise ValueError(
                    f"posthoc: the ensemble member {member} is not a run of this model "
                    f"({run.path}'s): {runs.first_line(error)}"
                ) from None
            draws.append(predictive(member_learner.model))
        params = [np.concatenate(parts) for parts in zip(*draws)]
        extra = {"ensemble_size": len(draws)}
    else:
        params = base_params
    fit_seconds = time.perf_counter() - start
    if method == "conformal":
        final, arrays = dict(base), base_arrays
        final.update(
            _conformal(
                classification,
                [p[:, : len(x)] for p in base_params],
                calibration,
                evaluation,
                y,
                alpha,
                conformal_method,
                data.target_scale,
            )
        )
    else:
        final, arrays = score(params)
    final.update(extra)
    summary = {
        "status": "finished",
        "method": method,
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


def _conformal(classification, params, calibration, evaluation, y, alpha, method, scale):
    if classification:
        probs = np.mean(params[0], 0)
        conformal = posthoc_lib.SplitConformalClassifier(alpha=alpha, method=method)
        conformal.fit(probs[calibration], y[calibration])
        sets = conformal.predict_set(probs[evaluation])
        covered = sets[np.arange(len(evaluation)), y[evaluation].astype(int)]
        return {
            "conformal_coverage": float(np.mean(covered)),
            "conformal_set_size": float(np.mean(np.sum(sets, -1))),
            "conformal_target_coverage": 1.0 - alpha,
        }
    means, stddevs = metrics_lib.mixture_moments(params[0], params[1])
    conformal = posthoc_lib.SplitConformalRegressor(alpha=alpha)
    conformal.fit(means[calibration], y[calibration], stddevs[calibration])
    lower, upper = conformal.predict_interval(means[evaluation], stddevs[evaluation])
    inside = (y[evaluation] >= lower) & (y[evaluation] <= upper)
    return {
        "conformal_coverage": float(np.mean(inside)),
        "conformal_width": float(np.mean(upper - lower) * scale),
        "conformal_target_coverage": 1.0 - alpha,
    }


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
            "run's own predictive is already a posterior: temperature, conformal and "
            "ensemble take it)."
        )


def _swag(learner, inputs, num_samples, epochs, learning_rate, max_rank):
    import keras

    model, task, data = learner.model, learner.data.task, learner.data
    _refuse_random_weights(model, "SWAG", "continues training a deterministic network")
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
        loss=lambda y_true, outputs: task.negative_log_likelihood(outputs, y_true),
    )
    swag = _SWAG(model, max_rank=max_rank)
    train = data.train.shuffle(data.num_train, seed=0).batch(learner.batch_size)
    swag.fit(train, epochs=epochs, verbose=0, shuffle=False)  # the dataset shuffles
    draws = []
    for _ in swag.draws(num_samples):
        draws.append(task.predictive_samples(model, _dataset(inputs), 1, learner.eval_batch_size))
    swag.assign_swa()
    return [np.concatenate([d[i] for d in draws]) for i in range(len(draws[0]))]


def restore(model_dir):
    """The run's learner, built from the parsed operative config and restored from its newest
    checkpoint, and its `RunDir`."""
    from blayers.lab import loop
    from blayers.lab.learners.supervised import SupervisedLearner

    run = runs.RunDir(model_dir)
    holder = run.held_elsewhere()
    if holder:
        raise ValueError(
            f"posthoc: {model_dir} is still training (PID {holder.get('pid')} on "
            f"{holder.get('host')} holds its LOCK); its newest checkpoint is not the run. "
            "Score it once it finished."
        )
    if not run.final():
        raise ValueError(f"posthoc: {model_dir} holds no finished run (no metrics.json).")
    reference = gin.query_parameter("train.learner") if _bound("train.learner") else None
    name = getattr(getattr(reference, "configurable", None), "name", "SupervisedLearner")
    if reference is not None and name != "SupervisedLearner":
        raise ValueError(
            f"posthoc: {model_dir} was trained by {name}; post-hoc methods need a "
            "SupervisedLearner run."
        )
    learner = SupervisedLearner()
    if learner.replicated:
        raise ValueError(
            f"posthoc: {model_dir} trained {len(learner.data)} replicas as one model (its data "
            "are replicas, SupervisedLearner.data); post-hoc methods take a run of one model."
        )
    learner.check_bindings = False  # checked when the run trained; see the class attribute
    seed, steps = _query("train.seed", 0), _query("train.train_steps", 1)
    learner.build(loop.Context(run, tf.distribute.get_strategy(), None, seed, steps))
    # Read only: the run's own step (not a longer run's later checkpoint), nothing renamed.
    step = (run.metrics() or {}).get("step")
    restored = run.checkpointer(learner.state()).restore(max_step=step, read_only=True)
    if restored is None:
        raise ValueError(f"posthoc: {model_dir} has no intact checkpoint to restore.")
    learner.scored_checkpoint = os.path.basename(restored)
    if step is not None and not restored.endswith(f"-{step}"):
        logging.warning(
            "posthoc: %s's checkpoint of step %s (its metrics) is damaged; scoring %s instead.",
            model_dir,
            step,
            learner.scored_checkpoint,
        )
    return learner, run


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
