"""The training objective: the ELBO with an annealed, dataset-size-scaled KL.

Per example, `-ELBO / N = E_q[-log p(y | f_theta(x))] + beta_t * KL[q || p] / N`
(Tran et al., 2019, Sec. 2.1; Blundell et al., 2015). The trainer estimates the first term with
the minibatch mean of the negative log-likelihood and takes the KL from `model.losses` (every
term there is treated as part of the KL, i.e. of the negative log prior), divided by the number
of training examples `N` and weighted by an annealing schedule `beta_t`.

The likelihood `p(y | f_theta(x))` belongs to the task (`blayers.lab.tasks`): a `RandomVariable`
output gives its own distribution; otherwise the task reads the output's layout (logits, or a
mean and raw scale per target).

In `keras.Model.fit`, Keras adds `model.losses` to the loss unscaled. `set_kl_scale(model,
num_train)` sets every KL that blayers layers add (weights' regularizers, a sparse GP's) to
`KL / num_train`, so `fit` with a per-example NLL loss optimizes the per-example negative ELBO.
"""

import keras
import tensorflow as tf

from blayers.layers.base import AddsKL, BayesianLayer, LocalLosses
from blayers.random_variable import RandomVariable, align_value
from blayers.registry import configurable_function
from blayers.regularizers import DistributionRegularizer, ScaledRegularizer

__all__ = [
    "NegativeLogLikelihood",
    "constant_kl_weight",
    "linear_kl_annealing",
    "set_kl_scale",
    "sigmoid_kl_annealing",
    "split_losses",
    "training_log_prob",
]


@configurable_function(None, "blayers.objectives")
def constant_kl_weight(step, weight=1.0):
    """`beta_t = weight`."""
    del step
    return tf.constant(weight, tf.float32)


@configurable_function(None, "blayers.objectives")
def linear_kl_annealing(step, warmup_steps=1000, start=0.0):
    """`beta_t` rises linearly from `start` to 1 over `warmup_steps` (Bowman et al., 2016)."""
    fraction = tf.cast(step, tf.float32) / float(max(warmup_steps, 1))
    return start + (1.0 - start) * tf.minimum(fraction, 1.0)


@configurable_function(None, "blayers.objectives")
def sigmoid_kl_annealing(step, midpoint=1000, rate=0.01):
    """`beta_t = sigmoid(rate * (t - midpoint))`."""
    return tf.sigmoid(rate * (tf.cast(step, tf.float32) - midpoint))


def training_log_prob(distribution, targets):
    """The log-likelihood a training loss maximizes: `distribution.log_prob(targets)`, except for
    an ensemble's mixture (`blayers.layers.EnsembleOutput`), whose members are fitted
    independently: the mean of the members' `member_log_prob` (Lakshminarayanan et al., 2017;
    Wen et al., 2020), a lower bound on the mixture's log-likelihood (Jensen); and a
    distribution with a `training_log_prob` of its own (the evidential outputs,
    `blayers.layers.evidential`), whose papers train on an objective other than the
    predictive's log-likelihood. Targets of shape
    `(N,)` for a likelihood of shape `(N, 1)` are expanded; other shapes that would broadcast
    into an `(N, N)` matrix are refused (`blayers.random_variable.align_value`)."""
    shape = distribution.batch_shape.concatenate(distribution.event_shape)
    targets = align_value(targets, shape, f"{distribution.name} likelihood", distribution.dtype)
    own = getattr(distribution, "training_log_prob", None)
    if own is not None:
        return own(targets)
    member_log_prob = getattr(distribution, "member_log_prob", None)
    if member_log_prob is not None:
        return tf.reduce_mean(member_log_prob(targets), axis=-1)
    return distribution.log_prob(targets)


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
        log_prob = training_log_prob(y_pred.distribution, tf.cast(y_true, y_pred.dtype))
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
    KL, a VQ-VAE's codebook and commitment losses): layers say so by mixing in
    `blayers.layers.base.LocalLosses`, and their losses join the likelihood term unscaled.
    """
    local = [
        loss
        for layer in _leaf_layers(model)
        if isinstance(layer, LocalLosses)
        for loss in layer.losses
    ]
    local_ids = {id(loss) for loss in local}
    global_ = [loss for loss in model.losses if id(loss) not in local_ids]
    zero = tf.constant(0.0)
    return (tf.add_n(local) if local else zero), (tf.add_n(global_) if global_ else zero)


def _distribution_regularizers(model):
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for name, value in vars(layer).items():
            if name.endswith("regularizer") and isinstance(value, DistributionRegularizer):
                yield value


def set_kl_scale(model, num_train):
    """Scales every KL term that blayers layers put in `model.losses` by `1 / num_train`, for
    `model.fit`.

    Keras' `fit` minimizes `mean_batch loss(y, y_pred) + sum(model.losses)`; with each KL
    divided by the training-set size, that is the per-example negative ELBO
    `E_q[-log p(y | x, w)] + KL[q(w) || p(w)] / N` (Tran et al., 2019, Sec. 2.1):

        blayers.set_kl_scale(model, len(x_train))
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x_train, y_train)

    Scaled: every random weight's regularizer (a named one's `scale_factor`; a plain callable
    `fn(rv)` is wrapped in `blayers.regularizers.ScaledRegularizer`), and the KL of layers that
    add their own (`SparseGaussianProcess` and the other `AddsKL` layers). Per-example losses
    (`LocalLosses`: a VAE's latent KL) and Keras regularizers of deterministic weights (`l2`)
    keep their meaning and are left as they are.

    Build the model first (its weights' regularizers exist once it is built). Returns the
    number of KL terms scaled. The scale is saved with the model. Do not use it with the
    blayers trainer, which divides the KL by `N` itself.
    """
    if not model.built:
        raise ValueError("set_kl_scale: build the model first (call it once on a batch).")
    if not num_train or num_train <= 0:
        raise ValueError(f"set_kl_scale needs a positive num_train, got {num_train!r}.")
    scale = 1.0 / float(num_train)
    scaled = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, AddsKL):
            layer.scale_factor = scale
            scaled[id(layer)] = layer
        if isinstance(layer, BayesianLayer):
            for name in layer.random_weight_names():
                attribute = f"{name}_regularizer"
                regularizer = getattr(layer, attribute)
                if regularizer is None:
                    continue
                if not isinstance(regularizer, DistributionRegularizer):
                    if not callable(regularizer):
                        raise TypeError(
                            f"set_kl_scale: layer '{layer.name}' has a {attribute} that is not "
                            f"callable ({regularizer!r}), so its KL cannot be scaled."
                        )
                    regularizer = ScaledRegularizer(regularizer)
                    setattr(layer, attribute, regularizer)
                regularizer.scale_factor = scale
                scaled[id(regularizer)] = regularizer
    for regularizer in _distribution_regularizers(model):  # any other layer holding one
        regularizer.scale_factor = scale
        scaled[id(regularizer)] = regularizer
    return len(scaled)


def _distribution_regularizers(model):
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for name, value in vars(layer).items():
            if name.endswith("regularizer") and isinstance(value, DistributionRegularizer):
                yield value
