"""Many models' data as one: the data adapter of replicated training (`blayers.replicas`).

`Replicas` holds `R` `Replica`s (a split, a grid point, a seed, an ensemble member: each its own
data, seed and hyperparameters) as one data set for `SupervisedLearner`: every replica's
training rows resident once a data set (replicas of one split share them), and each epoch's
batches gathered replica by replica from its own permutation, `[R, B, d]`, so replica `r`
reads its rows in the order it reads them alone. The model builder receives the replicas (`replicas=`) and returns a model of
`replicas=R` layers; the task scores each replica on its own test rows.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from blayers import metrics as metrics_lib
from blayers.lab.data.base import Replica
from blayers.lab.tasks.base import features, targets
from blayers.layers.base import BayesianLayer
from blayers.layers.estimators import LocalReparameterizationEstimator

__all__ = ["Replicas", "as_replicas", "independent_rows"]


def _targets(y):
    """Float targets as `[n, t]` float32 (a regression's), class labels as they are."""
    if y.dtype.kind in "iub":
        return y
    return y.astype(np.float32).reshape(len(y), -1)


def as_replicas(data):
    """`data` as `Replicas` when it is replicas (a list of `Replica`), else as it is."""
    if isinstance(data, Replicas):
        return data
    if isinstance(data, (list, tuple)) and data and all(isinstance(r, Replica) for r in data):
        return Replicas(list(data))
    if isinstance(data, (list, tuple)):
        raise ValueError(  # noqa: TRY004 - a configuration error (the CLI exits 2)
            f"SupervisedLearner.data: a list must hold blayers.lab.data.Replica records (many "
            f"models as one), got {[type(r).__name__ for r in data][:3]} (empty: {not data})."
        )
    return data


class Replicas:
    """`R` replicas' data as one (module docstring). Every replica needs the same number of
    training rows and features (the splits of one data set).

    Args:
      members: the `Replica`s.
    """

    def __init__(self, members):
        self.members = list(members)
        if not self.members:
            raise ValueError("SupervisedLearner.data: no replicas.")
        sizes = {(r.data.num_train, tuple(r.data.input_shape)) for r in self.members}
        if len(sizes) > 1:
            raise ValueError(
                "Replicas: every replica needs the same number of training rows and features "
                f"(one data set, splits of one size); got {sorted(sizes)}."
            )
        ((self.num_train, self.input_shape),) = sizes
        if len(self.input_shape) != 1:
            raise ValueError(f"Replicas: features must be a vector, got {self.input_shape}.")
        first = self.members[0].data
        self.task, self.target_dim = first.task, first.target_dim
        if any(r.data.task != self.task for r in self.members):
            raise ValueError("Replicas: every replica's data needs the same task.")
        self.name = first.name if len(self.members) == 1 else f"{first.name} (+{len(self) - 1})"
        self.tests = self.table = self.source = self._table = None
        self._target_dtype = self._target_shape = None
        self._moments = None  # (model, its traced predictive moments), made once

    def _moments_fn(self, model):
        """The traced `task.predictive_moments` of `model`, reused by every evaluation."""
        if self._moments is None or self._moments[0] is not model:
            self._moments = (model, _traced_moments(self.task, model))
        return self._moments[1]

    def __len__(self):
        return len(self.members)

    @property
    def num_outputs(self):
        return self.task.output_size(self.members[0].data)

    def with_run_seed(self, seed, fold):
        """A copy whose replicas' seeds are `fold(seed, replica seed)`: a sweep's run seed joins
        each replica's, which still depends on no other replica of the group."""
        folded = [dataclasses.replace(r, seed=fold(seed, r.seed)) for r in self.members]
        copy = Replicas(folded)
        copy.tests, copy.table, copy.source = self.tests, self.table, self.source
        copy._target_dtype, copy._target_shape = self._target_dtype, self._target_shape
        return copy

    def load(self):
        """Reads every replica's rows once: `table` `[U N, d + t]`, the training rows of the `U`
        distinct data sets once (grid points of a split share theirs; class labels as exact
        floats, given back as the task reads them by `gather`), `source` `[R]`, each replica's
        data set, and each replica's test `(x, y)`."""
        if self.table is None:
            arrays = {}
            for replica in self.members:  # a split shared by grid points is read once
                key = id(replica.data)
                if key not in arrays:
                    train, test = replica.data.train, replica.data.test
                    arrays[key] = (
                        features(train).astype(np.float32),
                        _targets(targets(train)),
                        (features(test).astype(np.float32), _targets(targets(test))),
                    )
            rows = [arrays[id(r.data)] for r in self.members]
            sources = list(arrays)
            self.source = np.array([sources.index(id(r.data)) for r in self.members], np.int32)
            labels = rows[0][1]
            self._target_dtype, self._target_shape = labels.dtype, labels.shape[1:]
            if labels.dtype.kind in "iu" and labels.size and np.abs(labels).max() >= 2**24:
                raise ValueError("Replicas: class labels of 2^24 or more are not exact floats.")
            # Each data set once, features and targets side by side: `[U N, d + t]`.
            self.table = np.concatenate(
                [
                    np.concatenate([x, y.reshape(len(x), -1).astype(np.float32)], -1)
                    for x, y, _ in arrays.values()
                ]
            )
            self.tests = [test for _, _, test in rows]
        return self

    def gather(self, table, order_rows):
        """`([R, B, d], [R, B, ...] targets)` in the graph: the rows `order_rows` (`[R, B]`,
        positions in each replica's training rows) of `table` (`self.table` as a tensor). A
        gather of scattered rows is bound by memory latency, not size: one gather of features
        and targets side by side from each data set's single copy (MC dropout's kin8nm grid
        reads 20 splits, not 240 replicas' copies, and fits the cache) took 0.7 ms a step where
        two gathers from `[R, N, d]` and `[R, N, t]` took 2.6."""
        offsets = tf.constant(self.source * self.num_train, tf.int32)[:, None]
        rows = tf.gather(table, tf.cast(order_rows, tf.int32) + offsets)
        x, y = tf.split(rows, [self.input_shape[0], -1], -1)
        y = tf.reshape(y, tf.concat([tf.shape(order_rows), list(self._target_shape)], 0))
        return x, tf.cast(y, self._target_dtype)

    def epoch_order(self, epoch):
        """`[R, N]`: each replica's order of its training rows in `epoch` (from its seed)."""
        return np.stack(
            [
                np.random.default_rng([replica.seed, epoch]).permutation(self.num_train)
                for replica in self.members
            ]
        )

    def batch(self, order, index, batch_size):
        """Batch `index` of an epoch's `order`, as NumPy arrays: each replica's own rows,
        `([R, B, d], [R, B, ...] targets)` (`gather` on the host: a step's batch replayed)."""
        if self._table is None:
            self._table = tf.constant(self.table)
        rows = order[:, index * batch_size : (index + 1) * batch_size]
        return tuple(t.numpy() for t in self.gather(self._table, rows))

    # -- evaluation ------------------------------------------------------------------------------
    def units(self):
        """What the evaluation scores: each replica, or each ensemble (the replicas naming it,
        `Replica.ensemble`), as `[(name, [member indices])]` in order of appearance."""
        units = {}
        for r, replica in enumerate(self.members):
            units.setdefault(replica.ensemble or replica.name, []).append(r)
        for name, members in units.items():
            if len({id(self.members[r].data) for r in members}) > 1:
                raise ValueError(f"Replicas: the members of ensemble {name!r} hold other data.")
        return list(units.items())

    def evaluate(self, model, num_samples, eval_rows):
        """Each replica's (or ensemble's: its members' draws pooled, a uniform mixture) metrics
        on its own test rows (`task.predictive_moments` of `num_samples` forward passes: RMSE,
        NLPD, test log-likelihood, coverage, the noise's and the function's spread, in original
        units) and their means: `(means, {'replicas': [each unit's]})` (`units`)."""
        self.load()
        draws = self.predictive(model, num_samples, eval_rows)
        per_unit = []
        for _, members in self.units():
            replica, (_, y) = self.members[members[0]], self.tests[members[0]]
            means, stddevs, functions = (
                np.concatenate([draws[r][part] for r in members])
                if draws[members[0]][part] is not None
                else None
                for part in range(3)
            )
            scores = metrics_lib.regression_metrics(
                means, stddevs, y, replica.data.target_scale, function_variances=functions
            )
            per_unit.append({k: float(v) for k, v in scores.items()})
        metrics = {key: float(np.mean([m[key] for m in per_unit])) for key in per_unit[0]}
        return metrics, {"replicas": per_unit}

    def predictive(self, model, num_samples, eval_rows):
        """Per replica, `(means, stddevs, function_variances)`: `[S, n_r, t]` draws of the
        predictive's parts in standardized units on its test rows (padded to one size in the
        calls); `stddevs^2` holds a GP's closed-form function variance besides the noise."""
        moments = self._moments_fn(model)
        x_tests = [x for x, _ in self.tests]
        n = max(len(x) for x in x_tests)
        padded = np.stack([np.pad(x, ((0, n - len(x)), (0, 0))) for x in x_tests])
        # Draws stack as rows of one call where every row has its own noise (dropout masks, a
        # GP's draws, local reparameterization); rows of a call share a weight draw otherwise,
        # so each such draw is a call.
        chunk = max(1, eval_rows // (len(self) * n)) if independent_rows(model) else 1
        # One array a part, filled chunk by chunk: a grid stage's draws (240 replicas x 1,000
        # draws x 1,500 rows) are gigabytes, so no copy of them is made.
        parts = None
        for start in range(0, num_samples, chunk):
            draws = min(chunk, num_samples - start)
            inputs = tf.constant(np.tile(padded, (1, draws, 1)))  # [R, draws * n, d]
            outputs = moments(inputs)
            if parts is None:
                parts = [
                    None
                    if o is None
                    else np.empty((len(self), num_samples, n, o.shape[-1]), o.dtype.as_numpy_dtype)
                    for o in outputs
                ]
            for part, value in zip(parts, outputs):
                if part is not None:
                    value = value.numpy().reshape(len(self), draws, n, -1)
                    part[:, start : start + draws] = value
        mean, variance, function = parts
        result = []
        for r, x in enumerate(x_tests):
            own_function = None if function is None else function[r, :, : len(x)].astype(np.float64)
            total = variance[r, :, : len(x)].astype(np.float64)
            if own_function is not None:  # a GP's function variance adds to the noise's
                total = total + own_function
            result.append((mean[r, :, : len(x)], np.sqrt(total).astype(mean.dtype), own_function))
        return result


def _traced_moments(task, model):
    return tf.function(
        lambda x: task.predictive_moments(model(x, training=False)),
        reduce_retracing=True,
        autograph=False,
    )


def independent_rows(model):
    """Whether every row of a forward pass draws its own noise: no layer draws random weights
    once for the whole call (Flipout's and reparameterization's kernels are shared by rows)."""
    for layer in model._flatten_layers(include_self=False, recursive=True):
        shared = isinstance(layer, BayesianLayer) and layer.random_weight_names()
        if shared and not isinstance(layer, LocalReparameterizationEstimator):
            return False
    return True
