"""The `Data` record every source returns, and the helpers sources share."""

import dataclasses

import numpy as np
import tensorflow as tf

from blayers import pipelines
from blayers.lab import tasks as tasks_lib

__all__ = [
    "Data",
    "Replica",
    "from_arrays",
    "standardize",
    "standardized_regression",
]


@dataclasses.dataclass(frozen=True)
class Replica:
    """One of the independent models `SupervisedLearner` trains as one (replicated data,
    `blayers.lab.data.Replicas`): its data (a split, or a split's validation part), its own seed,
    and its hyperparameters (`{'dropout_rate': 0.05, 'tau': 0.1}`), read by the model builder
    (`replicas=`); `name` labels its metrics. Replicas that name the same `ensemble` are its
    members: evaluated together, their predictives a uniform mixture (a deep ensemble,
    Lakshminarayanan et al., 2017), scored under the ensemble's name."""

    name: str
    data: "Data"
    seed: int = 0
    hparams: dict = dataclasses.field(default_factory=dict)
    ensemble: str | None = None


@dataclasses.dataclass
class Data:
    """A supervised data set, ready for the trainer.

    Attributes:
      name: a short name for logs and tables.
      task: a `blayers.lab.tasks.Task` or its name: `'classification'` (integer labels),
        `'regression'` (float targets, shape [d]) or `'density'` (targets are the points
        themselves; the model outputs a random variable). The task owns the output layout, the
        likelihood, the metrics and the plots.
      train, test: unbatched `tf.data.Dataset`s of `(features, target)` pairs. The record
        turns tf.data's autotuning off on them (and on `ood` and `corrupted`), for every
        pipeline built on them, unless a dataset's options set it: `blayers.pipelines`
        says why.
      num_train, num_test: their sizes (the ELBO divides the KL by `num_train`).
      input_shape: shape of one example's features.
      num_classes: classes (classification) or None.
      target_dim: regression target size (1 for scalar targets), or None.
      ood: optional unbatched dataset of out-of-distribution features (OOD AUROC).
      corrupted: optional `{name: unbatched dataset of (features, target)}`, shifted copies of
        the test set (`'<corruption>_<severity>'`), reported by the classification task.
      reference: known quantities for reports, e.g. `{'entropy': ...}` of a synthetic density.
      target_mean, target_scale: regression targets were standardized as
        `(y - target_mean) / target_scale`; metrics are reported in the original units.
      augment: optional `fn(features, target, seed) -> (features, target)` the trainer applies
        to each training example as it is drawn, e.g. fresh dequantization noise every epoch
        or random crops (`blayers.lab.data.augment`).
        `seed` is a stateless seed (int64, shape [2]) fixed by the run's seed, the epoch and the
        example, so a resumed run replays the same draws; use `tf.random.stateless_*` ops.
      detokenize: for token sequences, `fn(ids) -> str` (a subword vocabulary's decoder), used
        to score decodes with BLEU; None writes the ids themselves.
    """

    name: str
    task: tasks_lib.Task
    train: tf.data.Dataset
    test: tf.data.Dataset
    num_train: int
    num_test: int
    input_shape: tuple
    num_classes: int | None = None
    target_dim: int | None = None
    ood: tf.data.Dataset | None = None
    corrupted: dict | None = None
    target_mean: float = 0.0
    target_scale: float = 1.0
    reference: dict = dataclasses.field(default_factory=dict)
    augment: object = None
    detokenize: object = None

    def __post_init__(self):
        try:
            self.task = tasks_lib.get(self.task)
        except ValueError as error:
            raise ValueError(f"Data {self.name!r}: {error}") from None
        if self.num_train <= 0:
            raise ValueError(f"Data {self.name!r} has no training examples.")
        if self.num_test is not None and self.num_test <= 0:  # found now, not after training
            raise ValueError(f"Data {self.name!r} has no test examples (num_test = 0).")
        # Every pipeline built on these (each phase's batches, each evaluation's) inherits it.
        self.train, self.test, self.ood = map(pipelines.untuned, (self.train, self.test, self.ood))
        if self.corrupted:
            self.corrupted = {k: pipelines.untuned(v) for k, v in self.corrupted.items()}

    @property
    def num_outputs(self):
        """Size of the model's output the task expects (`task.output_size`): class logits, a
        mean and a raw scale per regression target, or the points' dimension."""
        return self.task.output_size(self)


def standardize(train, *others):
    """Standardizes arrays with the training set's mean and stddev (per column)."""
    mean = train.mean(axis=0)
    scale = train.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return (mean, scale), [(a - mean) / scale for a in (train, *others)]


def _check_arrays(name, x_train, y_train, x_test, y_test, num_classes, integer_targets):
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValueError(
            f"Data {name!r}: train features are {x_train.shape[1:]} an example but test "
            f"features {x_test.shape[1:]} (shapes {x_train.shape} and {x_test.shape})."
        )
    if integer_targets:
        for split, y in (("train", y_train), ("test", y_test)):
            if y.ndim != 1:
                hint = (
                    " (one-hot rows? pass their argmax)"
                    if y.ndim == 2 and y.shape[1] > 1
                    else " (pass y.ravel())"
                    if y.ndim == 2
                    else ""
                )
                raise ValueError(
                    f"Data {name!r}: {split} labels have shape {y.shape}; a classification "
                    f"task takes one class index an example, shape (N,){hint}."
                )
    elif y_train.shape[1:] != y_test.shape[1:]:
        raise ValueError(
            f"Data {name!r}: train targets are {y_train.shape[1:]} an example but test targets "
            f"{y_test.shape[1:]} (shapes {y_train.shape} and {y_test.shape}); metrics would "
            "compare the predictions with targets of another width."
        )
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if len(x) == 0:
            raise ValueError(f"Data {name!r}: the {split} split is empty.")
        if len(x) != len(y):
            raise ValueError(
                f"Data {name!r}: {len(x)} {split} examples but {len(y)} {split} labels."
            )
        for what, array in (("features", x), ("targets", y)):
            if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                row, *column = np.argwhere(~np.isfinite(array))[0]
                raise ValueError(
                    f"Data {name!r}: {split} {what} are not finite at row {row}"
                    + (f", column {', '.join(str(int(c)) for c in column)}" if column else "")
                    + f" ({array[(row, *column)]}); clean or impute them first."
                )
        if integer_targets and num_classes is not None:
            bad = np.flatnonzero((y < 0) | (y >= num_classes))
            if bad.size:
                raise ValueError(
                    f"Data {name!r}: {split} label {int(y.flat[bad[0]])} at row {bad[0]} is "
                    f"outside [0, {num_classes}) ({bad.size} such labels)."
                )


def from_arrays(
    name,
    task,
    x_train,
    y_train,
    x_test,
    y_test,
    num_classes=None,
    ood=None,
    target_mean=0.0,
    target_scale=1.0,
    corrupted=None,
):
    """A `Data` from NumPy arrays (features float32; labels int32 or targets float32 [n, d]).

    The arrays are checked here, before any training, naming the split, row and column: no
    empty split, one label per example, finite features and targets, and class labels in
    `[0, num_classes)`."""
    x_train, x_test = np.asarray(x_train, np.float32), np.asarray(x_test, np.float32)
    task = tasks_lib.get(task)
    if task.integer_targets:
        for split, y in (("train", y_train), ("test", y_test)):
            y = np.asarray(y)
            if y.size and not np.all(np.equal(np.mod(y, 1), 0)):
                raise ValueError(f"Data {name!r}: {split} labels must be whole class indices.")
        y_train, y_test = np.asarray(y_train, np.int32), np.asarray(y_test, np.int32)
        target_dim = None
    else:
        y_train = np.asarray(y_train, np.float32).reshape(len(y_train), -1)
        y_test = np.asarray(y_test, np.float32).reshape(len(y_test), -1)
        target_dim = y_train.shape[1]
    _check_arrays(name, x_train, y_train, x_test, y_test, num_classes, task.integer_targets)
    shifted = {"ood": ood, **{f"corrupted[{k!r}]": x for k, x in (corrupted or {}).items()}}
    for what, x in shifted.items():
        if x is not None and np.shape(x)[1:] != x_train.shape[1:]:
            raise ValueError(
                f"Data {name!r}: {what} features are {np.shape(x)[1:]} an example, the train "
                f"features {x_train.shape[1:]}."
            )
        if what != "ood" and len(x) != len(x_test):
            raise ValueError(
                f"Data {name!r}: {what} has {len(x)} examples; it shifts the test split's "
                f"{len(x_test)} (same rows, same labels)."
            )
    ood_ds = None
    if ood is not None:
        ood_ds = tf.data.Dataset.from_tensor_slices(np.asarray(ood, np.float32))
    return Data(
        name=name,
        task=task,
        train=tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        test=tf.data.Dataset.from_tensor_slices((x_test, y_test)),
        num_train=len(x_train),
        num_test=len(x_test),
        input_shape=tuple(x_train.shape[1:]),
        num_classes=num_classes,
        target_dim=target_dim,
        ood=ood_ds,
        corrupted=None
        if corrupted is None
        else {
            key: tf.data.Dataset.from_tensor_slices((np.asarray(x, np.float32), y_test))
            for key, x in corrupted.items()
        },
        target_mean=float(np.squeeze(target_mean)),
        target_scale=float(np.squeeze(target_scale)),
    )


def standardized_regression(name, x_train, y_train, x_test, y_test):
    """A regression `Data` with features and targets standardized by the training split's
    statistics (metrics are reported back in the targets' original units)."""
    _, (x_train, x_test) = standardize(x_train, x_test)
    (y_mean, y_scale), (y_train, y_test) = standardize(y_train, y_test)
    return from_arrays(
        name,
        "regression",
        x_train,
        y_train,
        x_test,
        y_test,
        target_mean=y_mean,
        target_scale=y_scale,
    )
