"""Documented synthetic data sets with known generating processes.

* `heteroscedastic_1d`: `y = x sin(x) + eps`, `eps ~ N(0, (0.1 + 0.2 |x|)^2)`, `x ~ U(-4, 4)`
  for training and a grid over [-6, 6] (beyond the data) for testing.
* `gaussian_ring_2d`: a mixture of `num_modes` isotropic Gaussians on a circle; its exact
  log-density is `log_density` (for flows: test NLL against the true entropy).
* `markov_sequences`: token sequences from a random first-order Markov chain; the entropy
  rate (the best achievable per-token NLL) is known.
"""

import math

import gin
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.lab.data.base import Data, from_arrays

tfd = tfp.distributions

__all__ = [
    "gaussian_ring_2d",
    "heteroscedastic_1d",
    "markov_entropy_rate",
    "markov_sequences",
    "markov_transitions",
    "ring_distribution",
]


@gin.configurable(module="blayers.lab.data")
def heteroscedastic_1d(num_train=500, num_test=400, seed=0):
    """1-D regression with input-dependent noise: `y = x sin(x) + (0.1 + 0.2 |x|) eps`,
    training inputs uniform on [-4, 4], test inputs a grid on [-6, 6] (extrapolation)."""
    rng = np.random.RandomState(seed)
    x_train = rng.uniform(-4, 4, size=(num_train, 1))
    x_test = np.linspace(-6, 6, num_test)[:, None]

    def target(x):
        return x * np.sin(x) + (0.1 + 0.2 * np.abs(x)) * rng.randn(*x.shape)

    return from_arrays(
        "heteroscedastic_1d", "regression", x_train, target(x_train), x_test, target(x_test)
    )


def ring_distribution(num_modes=8, radius=2.0, stddev=0.2):
    """The exact `tfd` distribution of `gaussian_ring_2d`."""
    angles = np.linspace(0, 2 * math.pi, num_modes, endpoint=False)
    locs = np.stack([radius * np.cos(angles), radius * np.sin(angles)], -1).astype(np.float32)
    return tfd.MixtureSameFamily(
        tfd.Categorical(logits=tf.zeros([num_modes])),
        tfd.MultivariateNormalDiag(loc=locs, scale_diag=tf.fill([num_modes, 2], stddev)),
    )


@gin.configurable(module="blayers.lab.data")
def gaussian_ring_2d(num_train=10_000, num_test=2_000, num_modes=8, radius=2.0, stddev=0.2, seed=0):
    """Density estimation (task 'density': the targets are the points). `reference['entropy']`
    is the true differential entropy in nats (Monte Carlo, 200,000 draws, standard error in
    `reference['entropy_se']`): the best achievable test NLL."""
    dist = ring_distribution(num_modes, radius, stddev)
    x = dist.sample(num_train + num_test, seed=tf.constant([seed, 0])).numpy()
    data = from_arrays(
        "gaussian_ring_2d", "density", x[:num_train], x[:num_train], x[num_train:], x[num_train:]
    )
    log_probs = dist.log_prob(dist.sample(200_000, seed=tf.constant([seed, 1]))).numpy()
    data.reference = {
        "entropy": float(-log_probs.mean()),
        "entropy_se": float(log_probs.std() / np.sqrt(len(log_probs))),
    }
    return data


def markov_transitions(vocab_size=8, concentration=0.3, seed=0):
    """The transition matrix `markov_sequences` uses for these arguments (rows sum to 1)."""
    rng = seed if isinstance(seed, np.random.RandomState) else np.random.RandomState(seed)
    return rng.dirichlet([concentration] * vocab_size, size=vocab_size)


def markov_entropy_rate(vocab_size=8, concentration=0.3, seed=0):
    """`-sum_i pi_i sum_j T_ij log T_ij` (nats per token) with `pi` the stationary
    distribution: the best achievable per-token NLL on long `markov_sequences`."""
    transitions = markov_transitions(vocab_size, concentration, seed)
    values, vectors = np.linalg.eig(transitions.T)
    stationary = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
    stationary = stationary / stationary.sum()
    logs = np.log(np.where(transitions > 0, transitions, 1.0))
    return float(-np.sum(stationary[:, None] * transitions * logs))


@gin.configurable(module="blayers.lab.data")
def markov_sequences(
    num_train=2000, num_test=500, length=20, vocab_size=8, concentration=0.3, seed=0
):
    """Next-token prediction: features are tokens 0..T-2, targets tokens 1..T-1.

    The transition matrix rows are Dirichlet(concentration) draws (`markov_transitions`);
    `markov_entropy_rate` gives the optimum per-token NLL.
    """
    rng = np.random.RandomState(seed)
    transitions = markov_transitions(vocab_size, concentration, rng)
    n = num_train + num_test
    tokens = np.zeros((n, length), np.int32)
    tokens[:, 0] = rng.randint(vocab_size, size=n)
    for t in range(1, length):
        cumulative = transitions[tokens[:, t - 1]].cumsum(-1)
        tokens[:, t] = (rng.uniform(size=(n, 1)) > cumulative).sum(-1).clip(0, vocab_size - 1)
    x = tokens[:, :-1].astype(np.float32)
    y = tokens[:, 1:]
    return Data(
        name="markov_sequences",
        task="classification",
        train=tf.data.Dataset.from_tensor_slices((x[:num_train], y[:num_train])),
        test=tf.data.Dataset.from_tensor_slices((x[num_train:], y[num_train:])),
        num_train=num_train,
        num_test=num_test,
        input_shape=(length - 1,),
        num_classes=vocab_size,
    )
