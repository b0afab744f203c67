"""edward2's `ed.losses`: the uncertainty-aware cross-entropy (UCE) of a Dirichlet over class
probabilities (Biloš et al., 2019; Charpentier et al., NeurIPS 2020), the loss of the
Posterior Network's concentrations (`blayers.layers.PosteriorNetworkLayer`):

    UCE(alpha, y) = E_{p ~ Dir(alpha)}[-log p_y] - lambda H[Dir(alpha)]
                  = sum_c y_c (psi(alpha_0) - psi(alpha_c)) - lambda H[Dir(alpha)],

`alpha_0 = sum_c alpha_c`, averaged over the batch. (`PosteriorNetwork`'s random variable
trains on the same loss through its `training_log_prob`.)
"""

import functools

import tensorflow as tf
import tensorflow_probability as tfp

__all__ = ["uce_loss"]


def uce_loss(entropy_reg=1e-5, sparse=True, return_all_loss_terms=False, num_classes=None):
    """The UCE loss as a function `loss(labels, alpha)` (module docstring).

    Args:
      entropy_reg: `lambda`, the weight of the Dirichlet's entropy.
      sparse: integer labels `[B]` (then `num_classes` is needed); False: one-hot (or soft)
        labels `[B, C]`.
      return_all_loss_terms: return `(loss, cross_entropy, entropy)`, each a batch mean.
      num_classes: `C`, for sparse labels.
    """
    if sparse and num_classes is None:
        raise ValueError("uce_loss: sparse labels need num_classes.")
    return functools.partial(
        _uce,
        entropy_reg=float(entropy_reg),
        return_all_loss_terms=bool(return_all_loss_terms),
        num_classes=int(num_classes) if sparse else None,
    )


def _uce(labels, alpha, entropy_reg, return_all_loss_terms, num_classes):
    alpha = tf.convert_to_tensor(alpha)
    if num_classes is not None:
        labels = tf.one_hot(tf.cast(labels, tf.int32), num_classes, dtype=alpha.dtype)
    labels = tf.cast(labels, alpha.dtype)
    strength = tf.reduce_sum(alpha, axis=-1, keepdims=True)
    cross_entropy = tf.reduce_sum(
        labels * (tf.math.digamma(strength) - tf.math.digamma(alpha)), axis=-1
    )
    entropy = tfp.distributions.Dirichlet(alpha).entropy()
    loss = tf.reduce_mean(cross_entropy - entropy_reg * entropy)
    if return_all_loss_terms:
        return loss, tf.reduce_mean(cross_entropy), tf.reduce_mean(entropy)
    return loss
