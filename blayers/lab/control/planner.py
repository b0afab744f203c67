"""The cross-entropy method (CEM) in a learned latent space, as PlaNet plans (Hafner et al.,
2019): from the current latent state, sample `candidates` action sequences of `horizon` steps
from a diagonal Gaussian, score each by the sum of predicted rewards along an imagined rollout,
refit the Gaussian to the `top_k` best, repeat `iterations` times, and act with the mean's first
action. All candidates are rolled out as one batch inside one `tf.function`.
"""

import gin
import tensorflow as tf

__all__ = ["cem"]


@gin.configurable(module="blayers.lab.control", denylist=["state", "rollout_return", "action_dim"])
def cem(
    state,
    rollout_return,
    action_dim,
    horizon=12,
    candidates=1000,
    top_k=100,
    iterations=10,
    seed=None,
):
    """The first action of the CEM plan from `state`.

    Args:
      state: a dict of `[1, ...]` latent tensors (one state).
      rollout_return: `fn(states, actions) -> [candidates]` total predicted reward of
        `[candidates, horizon, action_dim]` actions from `states` (the dict tiled).
      action_dim: action dimensions; actions are clipped to [-1, 1].
      horizon, candidates, top_k, iterations: PlaNet's defaults 12, 1000, 100, 10.
      seed: a `[2]` int tensor: the stateless draws' seed (the caller varies it per action).

    Returns:
      `(action [action_dim], mean [horizon, action_dim])`.
    """
    if not 0 < top_k <= candidates:
        raise ValueError(f"cem: top_k={top_k} must be in 1..candidates={candidates}.")
    seed = tf.zeros([2], tf.int32) if seed is None else tf.cast(seed, tf.int32)
    tiled = {k: tf.repeat(v, candidates, axis=0) for k, v in state.items()}
    mean = tf.zeros([horizon, action_dim])
    stddev = tf.ones([horizon, action_dim])
    for i in range(iterations):
        noise = tf.random.stateless_normal(
            [candidates, horizon, action_dim], seed + tf.constant([0, 1], tf.int32) * i
        )
        actions = tf.clip_by_value(mean + stddev * noise, -1.0, 1.0)
        returns = rollout_return(tiled, actions)
        _, best = tf.math.top_k(returns, top_k)
        elite = tf.gather(actions, best)
        mean, variance = tf.nn.moments(elite, axes=[0])
        stddev = tf.sqrt(variance + 1e-6)
    return mean[0], mean
