"""The training objective: the ELBO with an annealed, dataset-size-scaled KL.

Per example, `-ELBO / N = E_q[-log p(y | f_theta(x))] + beta_t * KL[q || p] / N`
(Tran et al., 2019, Sec. 2.1; Blundell et al., 2015). The trainer estimates the first term with
the minibatch mean of the negative log-likelihood and takes the KL from `model.losses` (every
term there is treated as part of the KL, i.e. of the negative log prior), divided by the number
of training examples `N` and weighted by an annealing schedule `beta_t`.

The likelihood comes from the model's output: a `RandomVariable` gives its own distribution;
logits give a Categorical (classification); for regression, the output's last axis holds a mean
and a raw scale per target dimension, giving `Normal(mean, softplus(raw) + 1e-3)`.
"""

import gin
import keras
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.random_variable import RandomVariable

tfd = tfp.distributions

__all__ = [
    "MIN_SCALE",
    "NegativeLogLikelihood",
    "constant_kl_weight",
    "linear_kl_annealing",
    "negative_log_likelihood",
    "predictive_distribution",
    "sigmoid_kl_annealing",
]

MIN_SCALE = 1e-3


def predictive_distribution(outputs, task):
    """The likelihood `p(y | outputs)` as a TFP distribution (batch shape = examples)."""
    if isinstance(outputs, RandomVariable):
        return outputs.distribution
    outputs = tf.convert_to_tensor(outputs)
    if task == "classification":
        return tfd.Categorical(logits=outputs)
    if task == "density":
        raise ValueError(
            "A density model must return a RandomVariable (e.g. a flow applied to "
            f"a base distribution), got a {type(outputs).__name__}."
        )
    if task == "regression":
        loc, raw_scale = tf.split(outputs, 2, axis=-1)
        return tfd.Independent(tfd.Normal(loc, tf.nn.softplus(raw_scale) + MIN_SCALE), 1)
    raise ValueError(f"Unknown task {task!r}.")


def negative_log_likelihood(outputs, targets, task):
    """Per-example `-log p(y | outputs)` (summed over any sequence axis)."""
    log_prob = predictive_distribution(outputs, task).log_prob(targets)
    if log_prob.shape.rank > 1:
        log_prob = tf.reduce_sum(log_prob, axis=list(range(1, log_prob.shape.rank)))
    return -log_prob


@gin.configurable(module="blayers.objectives")
def constant_kl_weight(step, weight=1.0):
    """`beta_t = weight`."""
    del step
    return tf.constant(weight, tf.float32)


@gin.configurable(module="blayers.objectives")
def linear_kl_annealing(step, warmup_steps=1000, start=0.0):
    """`beta_t` rises linearly from `start` to 1 over `warmup_steps` (Bowman et al., 2016)."""
    fraction = tf.cast(step, tf.float32) / float(max(warmup_steps, 1))
    return start + (1.0 - start) * tf.minimum(fraction, 1.0)


@gin.configurable(module="blayers.objectives")
def sigmoid_kl_annealing(step, midpoint=1000, rate=0.01):
    """`beta_t = sigmoid(rate * (t - midpoint))`."""
    return tf.sigmoid(rate * (tf.cast(step, tf.float32) - midpoint))


@keras.saving.register_keras_serializable("blayers.objectives")
class NegativeLogLikelihood(keras.losses.Loss):
    """Keras loss `-mean log p(y_true | y_pred)` for models whose output is a `RandomVariable`.

    Keras' own losses cast `y_pred` to float, which turns an integer-valued random variable
    (a `Categorical` output) into its value; this loss reads `y_pred.distribution` first.
    Event dimensions beyond the batch are summed (a sequence's or an image's log-likelihood).
    """

    def __init__(self, name="negative_log_likelihood", **kwargs):
        super().__init__(name=name, **kwargs)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if not isinstance(y_pred, RandomVariable):
            raise TypeError(
                "NegativeLogLikelihood needs a model whose output is a "
                f"RandomVariable, got {type(y_pred).__name__}."
            )
        log_prob = y_pred.distribution.log_prob(tf.cast(y_true, y_pred.dtype))
        if log_prob.shape.rank and log_prob.shape.rank > 1:
            log_prob = tf.reduce_sum(log_prob, axis=list(range(1, log_prob.shape.rank)))
        losses = -log_prob
        if sample_weight is not None:
            losses = losses * tf.cast(tf.reshape(sample_weight, tf.shape(losses)), losses.dtype)
        return tf.reduce_mean(losses)

    def call(self, y_true, y_pred):  # Loss' abstract method; __call__ does the work
        return self(y_true, y_pred)


def _leaf_layers(layer):
    children = getattr(layer, "layers", None) or []
    if not children:
        return [layer]
    return [leaf for child in children for leaf in _leaf_layers(child)]


def split_losses(model):
    """`(local, global_)` sums of `model.losses`.

    Global terms (weights' KL, regularizers) are per data set and the ELBO divides them by the
    number of training examples. Local terms are per-example averages already (a VAE's latent
    KL, a VQ-VAE's codebook and commitment losses): layers mark them with `local_losses = True`
    and they join the likelihood term unscaled.
    """
    local = [
        loss
        for layer in _leaf_layers(model)
        if getattr(layer, "local_losses", False)
        for loss in layer.losses
    ]
    local_ids = {id(loss) for loss in local}
    global_ = [loss for loss in model.losses if id(loss) not in local_ids]
    zero = tf.constant(0.0)
    return (tf.add_n(local) if local else zero), (tf.add_n(global_) if global_ else zero)
