"""Replicas: many independent models as one, an argument of the library's layers.

`R` independent copies of a small network (the splits, grid points and seeds of a UCI table, the
members of a deep ensemble) train in one step when every weight carries a leading replica axis
and every layer maps `[R, B, ...]` to `[R, B, ...]` replica by replica: one batched matmul does the
work of `R` for about the per-step overhead of one. A layer takes `replicas=R` (and optionally
`replica_seeds`, one int a replica, default `0..R-1`); `replicas=None` is the ordinary layer.

Nothing mixes replicas, and a replica does not depend on its group: replica `r`'s initial
weights are drawn by the weight's initializer for one replica's shape with a seed folded from the
initializer's own and `replica_seeds[r]` (`ReplicaInitializer`), and its noise (weight draws,
Flipout's signs, dropout masks) from the layer's per-call seed and its own key
(`blayers.sampling.replica_keys`). So a replica trained in a group follows the trajectory it
follows alone in a layer built the same way with `replicas=1, replica_seeds=[its seed]`: the
gradient of a sum of per-replica losses with respect to replica `r`'s weights is the gradient of
its own loss, and Adam's update is elementwise.

Unlike the efficient ensembles (`blayers.layers.BatchEnsemble`, rank-1 layers), replicas share
nothing: not the weights, not the batch (each has its own examples), not the hyperparameters
(a per-replica dropout rate, weight decay or noise variance).
"""

import keras
import numpy as np
import tensorflow as tf

__all__ = [
    "ReplicaInitializer",
    "ReplicaL2",
    "check_replica_inputs",
    "check_replicas",
    "fold_seed",
    "per_replica",
]


def fold_seed(seed, replica_seed):
    """A non-negative int seed from `seed` and a replica's seed: the same pair, the same seed."""
    state = np.random.SeedSequence([int(seed) % 2**63, int(replica_seed) % 2**63])
    return int(state.generate_state(1, np.uint32)[0] >> 1)


def check_replicas(layer, replicas, replica_seeds, supported):
    """`(replicas, replica_seeds)` checked for `layer`: `(None, None)` for an ordinary layer,
    else a positive count and one int seed a replica (default `0..R-1`)."""
    name = f"{type(layer).__name__} ({layer.name})"
    if replicas is None:
        if replica_seeds is not None:
            raise ValueError(f"{name}: replica_seeds needs replicas (the number of replicas).")
        return None, None
    if not supported:
        raise ValueError(
            f"{name} has no replica axis; replicas is an argument of the dense layers, MCDropout, "
            "the sparse GP and GaussianLikelihood."
        )
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise ValueError(f"{name}: replicas must be a positive integer, got {replicas!r}.")
    if replica_seeds is None:
        replica_seeds = list(range(int(replicas)))
    if (
        not isinstance(replica_seeds, (list, tuple, np.ndarray))
        or len(replica_seeds) != replicas
        or not all(isinstance(s, (int, np.integer)) for s in replica_seeds)
    ):
        raise ValueError(
            f"{name}: replica_seeds must be {replicas} ints (one a replica), got {replica_seeds!r}."
        )
    return int(replicas), [int(s) for s in replica_seeds]


def per_replica(layer, argument, values, replicas):
    """One value, or `replicas` of them, as a list of `replicas` floats (or the float itself
    for an ordinary layer); a `ValueError` naming the layer and the argument otherwise."""
    name = f"{type(layer).__name__} ({layer.name})"
    array = np.asarray(values, np.float64)
    if replicas is None:
        if array.ndim:
            raise ValueError(f"{name}: {argument} is one number without replicas, got {values!r}.")
        return float(array)
    if array.ndim > 1 or array.size not in (1, replicas):
        raise ValueError(
            f"{name}: {argument} needs one value or {replicas} (one a replica), got {values!r}."
        )
    return [float(v) for v in np.broadcast_to(array, (replicas,))]


def check_replica_inputs(layer, input_shape, min_rank=3):
    """Inputs of a replicated layer: `[replicas, batch, ...]` of at least `min_rank` axes."""
    shape = tuple(input_shape)
    if len(shape) < min_rank or shape[0] not in (None, layer.replicas):
        raise ValueError(
            f"{type(layer).__name__} ({layer.name}) has replicas={layer.replicas}: its inputs are "
            f"[replicas, batch, ...] of at least {min_rank} axes, got shape {shape}."
        )


def replica_shape(rank, replicas):
    """`[R, 1, ..., 1]` of `rank` axes: a per-replica value broadcast against a layer's inputs."""
    return [replicas] + [1] * (rank - 1)


@keras.saving.register_keras_serializable("blayers.replicas")
class ReplicaInitializer(keras.initializers.Initializer):
    """`[R, *shape]`: replica `r`'s slice drawn by `initializer` for one replica's `shape`
    (so fan-based scales, Glorot's and He's, see a replica's fans) with the seed
    `fold_seed(initializer's seed, replica_seeds[r])`: the same slice in any group. A
    deterministic initializer (zeros, a constant) fills the whole shape: a `Constant` may hold
    one value a replica.

    Args:
      initializer: a Keras initializer (identifier or instance).
      replica_seeds: one int a replica.
    """

    def __init__(self, initializer, replica_seeds):
        self.initializer = keras.initializers.get(initializer)
        self.replica_seeds = [int(s) for s in replica_seeds]

    def _base_seed(self):
        seed = getattr(self.initializer, "seed", None)
        if isinstance(seed, keras.random.SeedGenerator):
            seed = int(keras.ops.convert_to_numpy(seed.next())[0])
            self.initializer.seed = seed  # one draw, reused by every weight it initializes
        return seed

    def __call__(self, shape, dtype=None):
        shape = tuple(int(d) for d in shape)
        if not shape or shape[0] != len(self.replica_seeds):
            raise ValueError(
                f"ReplicaInitializer for {len(self.replica_seeds)} replicas got shape {shape}."
            )
        seed = self._base_seed()
        config = self.initializer.get_config()
        with tf.init_scope():  # eager values, even when first built inside a tf.function
            if seed is None or "seed" not in config:  # deterministic: zeros, a constant (one
                return self.initializer(shape, dtype=dtype)  # for all, or one a replica)
            slices = [
                type(self.initializer).from_config({**config, "seed": fold_seed(seed, s)})(
                    shape[1:], dtype=dtype
                )
                for s in self.replica_seeds
            ]
            return tf.stack(slices)

    def get_config(self):
        return {
            "initializer": keras.initializers.serialize(self.initializer),
            "replica_seeds": self.replica_seeds,
        }


@keras.saving.register_keras_serializable("blayers.replicas")
class ReplicaL2(keras.regularizers.Regularizer):
    """`sum_r l2[r] ||W_r||^2`: an L2 penalty (a Gaussian prior) of its own per replica, for
    weights with a leading replica axis (Gal & Ghahramani's weight decay `l^2 (1 - p) / (2 N
    tau)` differs across a grid of rates and precisions).

    Args:
      l2: one coefficient a replica.
    """

    def __init__(self, l2):
        self.l2 = [float(v) for v in np.ravel(l2)]

    def __call__(self, x):
        coefficients = tf.constant(self.l2, x.dtype)
        squares = tf.reduce_sum(tf.reshape(tf.square(x), [len(self.l2), -1]), axis=1)
        return tf.reduce_sum(coefficients * squares)

    def get_config(self):
        return {"l2": self.l2}
