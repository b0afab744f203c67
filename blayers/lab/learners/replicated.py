"""Many small regression models trained as one (`blayers.layers.replicated`).

A UCI table trains one small network per split, grid point and seed: hundreds of models whose
steps cost mostly per-step overhead. `ReplicatedLearner` trains `R` of them in each step of the
ordinary Loop: every weight has a leading replica axis, replica `r` reads its own training rows
in its own order (a permutation of epoch `e` drawn from `(seed_r, e)`), and the loss is the sum
over replicas of each one's objective, `mean NLL_r + c_r ||W_r||^2 / N` (the same per-example
objective as `SupervisedLearner`'s). Since a replica's weights get the gradient of its own loss
only and Adam's update is elementwise, each replica follows the trajectory it follows alone, and
a resumed run continues exactly (the epoch's order is a function of the step).

Evaluation scores each replica on its own test rows with `num_eval_samples` Monte Carlo draws
(the Regression task's metrics: RMSE, NLPD, test log-likelihood, coverage, in original units);
the run's metrics are the means over replicas, and `metrics.json` lists each replica's under
`replicas` (with its name, seed and hyperparameters) for model selection.
"""

import dataclasses
import json

import gin
import numpy as np
import tensorflow as tf

from blayers import metrics as metrics_lib
from blayers import seeds as seeds_lib
from blayers.lab import plots
from blayers.lab.learners.base import KerasLearner, Steps, non_finite, refuse_strategy
from blayers.lab.learners.supervised import make_optimizer
from blayers.lab.tasks.base import features, targets
from blayers.replicas import fold_seed
from blayers.sampling import normal_parameters

__all__ = ["ReplicatedLearner"]

_LOG_2PI = float(np.log(2.0 * np.pi))
_STEP_SCALARS = ("loss", "nll", "kl_per_example", "non_finite", "bad_replica")


def _arrays(dataset):
    return features(dataset).astype(np.float32), targets(dataset).astype(np.float32)


@gin.configurable(module="blayers.lab.learners")
class ReplicatedLearner(KerasLearner):
    """Trains `R` independent Gaussian regression models as one (module docstring).

    Args:
      replicas: the `blayers.lab.data.Replica`s (or a callable returning them, such as
        `@uci_replicas`); all need the same number of training rows and features.
      model: `model(input_dim, replicas)` -> a Keras model mapping `[R, B, input_dim]` to a
        replicated `GaussianLikelihood`'s random variable `[R, B, 1]` (standardized units);
        where the likelihood's input is a GP's marginals, the loss is the variational
        expectation in closed form.
      optimizer: `optimizer()` -> a Keras optimizer (elementwise ones keep replicas exact).
      batch_size: rows a replica per step (full batches only, like the supervised stream).
      num_eval_samples: Monte Carlo draws of the predictive at evaluation.
      eval_rows: rows (replicas x draws x examples) in one evaluation call.
    """

    resumable_bindings = (
        "ReplicatedLearner.num_eval_samples",
        "ReplicatedLearner.eval_rows",
    )
    progress_scalars = (("loss", "loss"), ("nll", "nll"))

    def __init__(
        self,
        replicas=gin.REQUIRED,
        model=gin.REQUIRED,
        optimizer=make_optimizer,
        batch_size=128,
        num_eval_samples=100,
        eval_rows=1_000_000,
    ):
        self.replicas_source, self.model_fn, self.optimizer_fn = replicas, model, optimizer
        for name, value in (
            ("batch_size", batch_size),
            ("num_eval_samples", num_eval_samples),
            ("eval_rows", eval_rows),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(
                    f"ReplicatedLearner.{name} must be a positive integer, got {value!r}."
                )
        self.batch_size, self.num_eval_samples = int(batch_size), int(num_eval_samples)
        self.eval_rows = int(eval_rows)

    # -- building --------------------------------------------------------------------------------
    def build(self, context):
        if context.strategy_name == "mesh" or context.strategy.num_replicas_in_sync > 1:
            refuse_strategy(self, context, "one device (replicas already batch the work)")
        replicas = (
            self.replicas_source() if callable(self.replicas_source) else self.replicas_source
        )
        # A replica's seed joins the run's (`train.seed`, the `seed` macro a sweep varies):
        # it still depends on no other replica of the group.
        self.seed = context.seed
        self.replica_seeds = [r.seed for r in replicas]
        self.replicas = [
            dataclasses.replace(r, seed=fold_seed(self.seed, r.seed)) for r in replicas
        ]
        if not self.replicas:
            raise ValueError("ReplicatedLearner.replicas is empty.")
        sizes = {(r.data.num_train, tuple(r.data.input_shape)) for r in self.replicas}
        if len(sizes) > 1:
            raise ValueError(
                "ReplicatedLearner: every replica needs the same number of training rows and "
                f"features (one data set, splits of one size); got {sorted(sizes)}."
            )
        ((self.num_train, input_shape),) = sizes
        if len(input_shape) != 1:
            raise ValueError(f"ReplicatedLearner: features must be a vector, got {input_shape}.")
        if self.batch_size > self.num_train:
            raise ValueError(
                f"ReplicatedLearner.batch_size={self.batch_size} exceeds the {self.num_train} "
                "training rows of each replica."
            )
        train = [_arrays(r.data.train) for r in self.replicas]
        self.x_train = np.stack([x for x, _ in train])
        self.y_train = np.stack([y for _, y in train])
        self.tests = [_arrays(r.data.test) for r in self.replicas]
        self.steps_per_epoch = self.num_train // self.batch_size
        seeds_lib.set_seed(self.seed)
        model = self.model_fn(input_shape[0], self.replicas)
        optimizer = self.optimizer_fn()
        optimizer.build(model.trainable_variables)
        self.track(model, optimizer)
        self._train_step_fn = self._make_train_step()
        self._predict_fn = tf.function(
            lambda x: _moments(model(x, training=False)), reduce_retracing=True
        )

    def _make_train_step(self):
        net, opt, step = self.model, self.optimizer, self.step_variable
        x_train, y_train = tf.constant(self.x_train), tf.constant(self.y_train)  # resident
        replicas, batch_size = len(self.replicas), self.batch_size

        def train_step(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                outputs = _moments(net(x, training=True))
                nll = tf.reduce_mean(_gaussian_nll(outputs, y), axis=[1, 2])  # [R]
                penalty = tf.add_n(net.losses) if net.losses else tf.constant(0.0)
                loss = tf.reduce_sum(nll) + penalty
            grads = tape.gradient(loss, net.trainable_variables)
            finite_nll = tf.math.is_finite(nll)
            finite = tf.reduce_all(finite_nll) & tf.math.is_finite(penalty)
            grads = [tf.where(finite, g, tf.zeros_like(g)) for g in grads]
            opt.apply_gradients(zip(grads, net.trainable_variables))
            step.assign_add(1)
            mean_nll = tf.reduce_mean(nll)
            # The weight decay (a Gaussian prior's log density, already divided by N), per
            # replica: the supervised learner's `kl_per_example` for such a model.
            decay = penalty / replicas
            first_bad = tf.argmin(tf.cast(finite_nll, tf.int32), output_type=tf.int32)
            return {
                "loss": mean_nll + decay,
                "nll": mean_nll,
                "kl_per_example": decay,
                "non_finite": 1.0 - tf.cast(finite, tf.float32),
                # The first replica whose NLL is not finite (-1: none), for the diagnosis.
                "bad_replica": tf.where(tf.reduce_all(finite_nll), -1, first_bad),
            }

        def next_batch(i, order, start):
            """The batch `start + i` of the epoch: each replica's rows in its own order,
            gathered from the resident data in the graph."""
            rows = tf.reshape(
                order[:, (start + i) * batch_size : (start + i + 1) * batch_size],
                [replicas, batch_size],
            )
            return tf.constant(True), lambda: (
                tf.gather(x_train, rows, batch_dims=1),
                tf.gather(y_train, rows, batch_dims=1),
            )

        self._train_steps_fn = self.compile_steps(train_step, next_batch, _STEP_SCALARS)
        return tf.function(train_step)

    # -- training --------------------------------------------------------------------------------
    def epoch_order(self, epoch):
        """`[R, N]`: each replica's order of its training rows in `epoch` (from its seed)."""
        return np.stack(
            [
                np.random.default_rng([replica.seed, epoch]).permutation(self.num_train)
                for replica in self.replicas
            ]
        )

    def _batch(self, order, b):
        rows = order[:, b * self.batch_size : (b + 1) * self.batch_size, None]
        return (
            np.take_along_axis(self.x_train, rows, axis=1),
            np.take_along_axis(self.y_train, rows, axis=1),
        )

    def batches(self):
        epoch, skip = divmod(self.step, self.steps_per_epoch)
        order = self.epoch_order(epoch)
        for b in range(skip, self.steps_per_epoch):
            yield self._batch(order, b)

    def begin_phase(self):
        """The rest of an epoch: its orders, resident in the graph's memory."""
        self._epoch = self.step // self.steps_per_epoch
        self._order = self.epoch_order(self._epoch)
        self._order_tensor = tf.constant(self._order, tf.int32)

    def train_steps(self, n):
        """Up to `n` steps of the epoch in one graph call, the batches gathered in the graph."""
        start = self.step - self._epoch * self.steps_per_epoch
        n = min(n, self.steps_per_epoch - start)
        if n <= 0:
            return Steps(0, {}, {})
        count, sums, last = self.read_steps(
            self._train_steps_fn(tf.constant(n), self._order_tensor, tf.constant(start))
        )
        self.bad_replica = int(last.pop("bad_replica"))
        sums.pop("bad_replica")
        bad = self._batch(self._order, start + count - 1) if non_finite(last) else None
        return Steps(count, sums, last, bad)

    def train_step(self, batch):
        scalars = {k: float(v) for k, v in self._train_step_fn(batch).items()}
        self.bad_replica = int(scalars.pop("bad_replica"))
        return scalars

    def diagnose_non_finite(self, batch):
        x = batch[0]
        bad_rows = [r for r in range(len(self.replicas)) if not np.isfinite(x[r]).all()]
        if bad_rows:
            return f"features of replica {self.replicas[bad_rows[0]].name} are not finite"
        if getattr(self, "bad_replica", -1) >= 0:
            name = self.replicas[self.bad_replica].name
            return f"the NLL of replica {name} (the first of {len(self.replicas)}) is not finite"
        return "the weight decay is not finite"

    # -- evaluation and outputs ------------------------------------------------------------------
    def predictive(self, x_tests, num_samples):
        """`(means, stddevs, function_variances)`: per replica, `[S, n_r, 1]` draws of the
        predictive's components in standardized units, for test inputs `x_tests[r] [n_r, D]`
        (padded to one size); `stddevs^2` holds a GP's closed-form function variance
        (`function_variances`; None for networks) besides the noise."""
        n = max(len(x) for x in x_tests)
        padded = np.stack([np.pad(x, ((0, n - len(x)), (0, 0))) for x in x_tests])
        # Draws stack as rows of one call where every row has its own noise (dropout masks);
        # Flipout's rows share a call's perturbation, so each of its draws is a call.
        independent = all(getattr(layer, "independent_rows", True) for layer in self.model.layers)
        chunk = max(1, self.eval_rows // (len(x_tests) * n)) if independent else 1
        # One array in the model's dtype, filled chunk by chunk: a grid stage's draws (60
        # replicas x 1,000 draws x 8,000 rows) are gigabytes, so no copy of them is made.
        outputs = None
        for start in range(0, num_samples, chunk):
            draws = min(chunk, num_samples - start)
            inputs = np.tile(padded, (1, draws, 1))  # [R, draws * n, D]
            part = self._predict_fn(tf.constant(inputs)).numpy()
            part = part.reshape(len(x_tests), draws, n, part.shape[-1])
            if outputs is None:
                outputs = np.empty((len(x_tests), num_samples, *part.shape[2:]), part.dtype)
            outputs[:, start : start + draws] = part
        result = []
        for r, x in enumerate(x_tests):
            own = outputs[r, :, : len(x)]
            function = own[..., 2:3] if own.shape[-1] == 3 else None
            variance = np.exp(own[..., 1:2].astype(np.float64))
            if function is not None:  # a GP's function variance adds to the noise's
                variance += function
            result.append((own[..., :1], np.sqrt(variance).astype(own.dtype), function))
        return result

    def evaluate(self):
        """Each replica's Regression metrics on its own test rows; their means."""
        with self.training_streams_kept():
            draws = self.predictive([x for x, _ in self.tests], self.num_eval_samples)
        per_replica = []
        for replica, (_, y), (means, stddevs, function) in zip(self.replicas, self.tests, draws):
            scores = metrics_lib.regression_metrics(
                means, stddevs, y, replica.data.target_scale, function_variances=function
            )
            per_replica.append({k: float(v) for k, v in scores.items()})
        metrics = {key: float(np.mean([m[key] for m in per_replica])) for key in per_replica[0]}
        return metrics, {"replicas": per_replica}

    def outputs(self, run, records, metrics, arrays):
        """`training_curves.png`; each replica's metrics (with its name, seed, hyperparameters)
        under `replicas` in `metrics.json`."""
        curves = run.file("training_curves.png")
        plots.training_curves(records, curves)
        replicas = [
            {
                "name": replica.name,
                "data": replica.data.name,
                "seed": seed,
                "hparams": json.loads(json.dumps(replica.hparams, default=str)),
                "final": scores,
            }
            for replica, seed, scores in zip(self.replicas, self.replica_seeds, arrays["replicas"])
        ]
        summary = {
            "num_replicas": len(self.replicas),
            "num_train": self.num_train,
            "batch_size": self.batch_size,
            "replicas": replicas,
        }
        return summary, [curves]


def _moments(outputs):
    """A Gaussian likelihood's random variable as `[..., 2]` (mean, log noise variance), or
    `[..., 3]` (mean, log noise variance, the function's variance) where the likelihood's
    input was a GP's marginals (its `function`), integrated in closed form."""
    distribution = outputs.distribution
    function = getattr(outputs, "function", None)
    if function is None:
        return tf.concat([distribution.mean(), tf.math.log(distribution.variance())], -1)
    mean, stddev = normal_parameters(function.distribution)
    log_noise = tf.math.log(distribution.variance())
    return tf.concat([tf.broadcast_to(mean, tf.shape(log_noise)), log_noise, tf.square(stddev)], -1)


def _gaussian_nll(outputs, targets):
    """`-log N(y; mu, sigma^2)` for outputs (mean, log sigma^2); with a third channel, the
    function's variance `s^2` (a GP's marginals), the negative variational expectation
    `-E_q[log N(y; f, sigma^2)]`, which adds `s^2 / (2 sigma^2)`."""
    mean, log_var = outputs[..., :1], outputs[..., 1:2]
    squared = tf.square(targets - mean)
    if outputs.shape[-1] == 3:
        squared += outputs[..., 2:3]
    return 0.5 * (_LOG_2PI + log_var + squared * tf.exp(-log_var))
