"""The `Task` interface, and the name -> task registry."""

import numpy as np
import tensorflow as tf

from blayers import objectives
from blayers.layers.ensemble import EnsembleMixture
from blayers.random_variable import RandomVariable

__all__ = ["Task", "get", "register_task"]

_TASKS = {}


def register_task(cls):
    """Class decorator: makes `cls` gettable by its `name` (`Data(task='regression')`)."""
    _TASKS[cls.name] = cls
    return cls


def get(task):
    """A `Task` from an instance (returned as is) or a registered name."""
    if isinstance(task, Task):
        return task
    if isinstance(task, str) and task in _TASKS:
        return _TASKS[task]()
    raise ValueError(f"Unknown task {task!r}: a Task instance or one of {sorted(_TASKS)}.")


class Task:
    """What a model's outputs mean and how a run is judged.

    Subclasses define:
      name: a short name for logs and `metrics.json`.
      output_size(data): the size of the model's last axis the task expects.
      likelihood(outputs): `p(y | outputs)`, a TFP distribution whose batch shape is the examples.
      evaluate(model, data, num_samples, batch_size): `(metrics, arrays)` on `data.test`.
      plot(model, data, arrays, model_dir): writes PNGs, returns their paths (the trainer also
        sends them to TensorBoard).
    """

    name = None
    integer_targets = False  # labels (int32) rather than float targets of shape [n, d]

    def __eq__(self, other):  # a task equals its name, so `data.task == 'regression'` reads well
        if isinstance(other, str):
            return other == self.name
        return type(other) is type(self)

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return f"{type(self).__name__}()"

    def output_size(self, data):
        raise NotImplementedError(f"{type(self).__name__}.output_size")  # abstract; intentional

    def likelihood(self, outputs):
        """`p(y | outputs)`; a model returning a `RandomVariable` supplies its own."""
        if isinstance(outputs, RandomVariable):
            return outputs.distribution
        return self.likelihood_from_tensor(tf.convert_to_tensor(outputs))

    def likelihood_from_tensor(self, outputs):
        raise ValueError(
            f"A {self.name} model must return a RandomVariable, got a tensor of shape "
            f"{outputs.shape}."
        )

    def negative_log_likelihood(self, outputs, targets, example_axes=1):
        """Per-example `-log p(y | outputs)` (summed over any sequence or event axis); an
        ensemble's members are fitted each on its own (`objectives.training_log_prob`).
        `example_axes`: the leading axes that index examples (2 for a replicated model's
        `[R, B, ...]`)."""
        log_prob = self.log_likelihood(outputs, targets)
        return -sum_event_axes(log_prob, example_axes)

    def log_likelihood(self, outputs, targets):
        """`log p(y | outputs)` elementwise, the training objective's term."""
        return objectives.training_log_prob(self.likelihood(outputs), targets)

    def evaluate(self, model, data, num_samples=10, batch_size=500):
        raise NotImplementedError(f"{type(self).__name__}.evaluate")  # abstract; intentional

    def predictive_moments(self, outputs):
        """`(mean, variance, function_variance)` of the predictive a forward pass gives (the
        function's variance None where it is sampled, not integrated); regression only."""
        raise ValueError(f"A {self.name} model has no Gaussian predictive moments.")

    def plot(self, model, data, arrays, model_dir):
        del model, data, arrays, model_dir
        return []

    # Shared by the tasks' evaluations.
    def predictive_samples(
        self,
        model,
        dataset,
        num_samples,
        batch_size=500,
        draws_per_call=64,
        parameters=None,
        replicas=None,
    ):
        """Arrays `[num_samples, n, ...]` of `predictive_parameters` over an unbatched dataset,
        one fresh posterior draw per pass (memory grows with samples x examples x outputs,
        never with activations). Up to `draws_per_call` passes run in one graph loop, so that
        thousands of draws (MC dropout's 10,000) cost little more than the passes themselves.

        An ensemble's output (`EnsembleMixture`, the uniform mixture of `E` members) gives its
        members' parameters, each pass counting as `E` draws (`[num_samples * E, n, ...]`):
        the predictive is the same mixture, and the mutual information (the members'
        disagreement) is not lost to an average taken before the metrics see it.

        `parameters(distribution)` -> a tuple of tensors replaces `predictive_parameters`
        (the post-hoc methods read float64 probabilities, which do not saturate).

        `replicas=R`: `model` is `R` models as one (`blayers.replicas`); every replica sees the
        same inputs (`[R, batch, ...]`) and counts as a member, as an ensemble's do."""
        parameters = parameters or self.predictive_parameters
        several_draws = self._draws_function(model, parameters, replicas)
        batched = dataset.batch(batch_size)
        # One trace for every batch size and data set of these features (the test set's last
        # batch, the OOD and shifted sets): traced at the dataset's spec, its batch axis unknown.
        spec = batched.element_spec
        several_draws.get_concrete_function(
            spec[0] if isinstance(spec, tuple) else spec, tf.TensorSpec([], tf.int32)
        )
        chunks = []
        done = 0
        while done < num_samples:
            count = min(draws_per_call, num_samples - done)
            parts = [
                several_draws(x[0] if isinstance(x, tuple) else x, tf.constant(count))
                for x in batched
            ]
            # [count, members, n, ...] per parameter: examples concatenate on axis 2
            chunks.append(
                [
                    _merge_first_axes(np.concatenate([p[i].numpy() for p in parts], axis=2))
                    for i in range(len(parts[0]))
                ]
            )
            done += count
        return [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]

    def _draws_function(self, model, parameters, replicas=None):
        """The traced `several_draws(x, count)` of `model` and `parameters`, kept for the last
        pair asked for: an evaluation's several data sets and a method that predicts many times
        with new weights (SWAG's draws) reuse one graph instead of tracing one a call."""
        cached = getattr(self, "_draws_function_cache", None)
        if cached is not None and cached[0] is model and cached[1:3] == (parameters, replicas):
            return cached[3]

        def one_draw(x):
            if replicas is not None:  # the replica axis is the members axis
                shared = tf.broadcast_to(x[None], tf.concat([[replicas], tf.shape(x)], 0))
                return parameters(self.likelihood(model(shared, training=False)))
            distribution = self.likelihood(model(x, training=False))
            if not isinstance(distribution, EnsembleMixture):
                return tuple(t[None] for t in parameters(distribution))
            member_axis = distribution.batch_shape.rank  # members: the last batch axis
            return tuple(_move_axis_first(t, member_axis) for t in parameters(distribution.members))

        # One trace of the model's pass, called for every draw (each call runs its random ops
        # afresh): the first draw, which gives the arrays their shapes, and the loop's.
        draw = tf.function(one_draw, autograph=False)

        def several_draws(x, count):
            first = draw(x)
            arrays = [tf.TensorArray(t.dtype, size=count, element_shape=t.shape) for t in first]
            arrays = [a.write(0, t) for a, t in zip(arrays, first)]

            def body(i, arrays):
                return i + 1, [a.write(i, t) for a, t in zip(arrays, draw(x))]

            _, arrays = tf.while_loop(lambda i, _: i < count, body, (tf.constant(1), arrays))
            return tuple(a.stack() for a in arrays)

        # A `tf.while_loop` as written: autograph would spend seconds converting it a process.
        several_draws = tf.function(several_draws, autograph=False)

        self._draws_function_cache = (model, parameters, replicas, several_draws)
        return several_draws

    def predictive_parameters(self, distribution):
        """The per-example parameters an evaluation keeps from one posterior draw."""
        return distribution.mean(), distribution.stddev()


def _move_axis_first(tensor, axis):
    perm = [axis] + [i for i in range(tensor.shape.rank) if i != axis]
    return tf.transpose(tensor, perm)


def _merge_first_axes(array):
    return array.reshape((-1,) + array.shape[2:])


def sum_event_axes(values, example_axes=1):
    """`values` summed over every axis after the first `example_axes` (the examples')."""
    if values.shape.rank > example_axes:
        values = tf.reduce_sum(values, axis=list(range(example_axes, values.shape.rank)))
    return values


def features(dataset):
    """All features of an unbatched `(features, target)` dataset, as one array."""
    return np.concatenate([x.numpy() for x, _ in dataset.batch(4096)])


def targets(dataset):
    """All targets of an unbatched `(features, target)` dataset, as one array."""
    return np.concatenate([y.numpy() for _, y in dataset.batch(4096)])
