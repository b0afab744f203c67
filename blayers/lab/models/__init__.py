"""Registered model builders: gin configurables `fn(input_shape, num_outputs, ...)` returning
a `keras.Model`.

A model is a registered Python function (`mlp`) or written in gin alone as a list of layer specs
(`sequential`). Layers are named by class (`blayers.registry.get_layer`): registered blayers
layers first (`'DenseFlipout'`), then `keras.layers` (`'Dense'`), so an estimator is swapped by one binding
(`mlp.dense_layer = 'DenseReparameterization'`) and the deterministic twin is
`mlp.dense_layer = 'Dense'`.
"""

import functools

import gin
import keras
import numpy as np

from blayers import layers as blayers_layers
from blayers.lab.models.baselines import uncertainty_baseline
from blayers.lab.models.cox import CoxProcess, cox_process
from blayers.lab.models.ensembles import efficient_mlp
from blayers.lab.models.flows import realnvp_flow
from blayers.lab.models.gaussian_process import deep_gp
from blayers.lab.models.resnet import resnet
from blayers.lab.models.sequence import lstm_sequence_model
from blayers.lab.models.transformer import transformer, transformer_lm, transformer_schedule
from blayers.lab.models.vae import VAE, VQVAE, vae, vqvae
from blayers.lab.tasks import Regression
from blayers.layers.base import BayesianLayer
from blayers.registry import get_layer as get_layer_class
from blayers.replicas import ReplicaL2

__all__ = [
    "NUM_OUTPUTS",
    "VAE",
    "VQVAE",
    "CoxProcess",
    "cox_process",
    "deep_gp",
    "efficient_mlp",
    "get_layer_class",
    "lstm_sequence_model",
    "mc_dropout_regressor",
    "mlp",
    "realnvp_flow",
    "resnet",
    "sequential",
    "transformer",
    "transformer_lm",
    "transformer_schedule",
    "uncertainty_baseline",
    "vae",
    "vqvae",
]

NUM_OUTPUTS = "num_outputs"  # a layer-spec value replaced by the model's output size


@gin.configurable(module="blayers.lab.models")
def mlp(
    input_shape,
    num_outputs,
    hidden_units=(100,),
    activation="relu",
    dense_layer="DenseFlipout",
    output_layer=None,
    dropout_rate=0.0,
    input_dropout=False,
    noise_variance=None,
    learn_noise=True,
    layer_kwargs=None,
    prior_precision=None,
    batch_norm=False,
    name="mlp",
    replicas=None,
):
    """Multilayer perceptron: [Flatten] -> [MCDropout] -> (dense_layer(h), [BatchNormalization,
    activation], [MCDropout]) * L -> output_layer [-> GaussianLikelihood].

    Args:
      dense_layer: class or name of the hidden layers (`'DenseFlipout'`, `'Dense'`, ...).
      output_layer: class or name of the last layer (defaults to `dense_layer`).
      dropout_rate: MC dropout after each hidden layer (0 for none).
      input_dropout: MC dropout on the inputs too (Gal & Ghahramani's regression networks drop
        before every dense layer).
      noise_variance: for regression, a homoscedastic `GaussianLikelihood` with this initial
        variance (standardized units) after an output layer of one unit per target; `None`
        (default) leaves the task's output layout (the heteroscedastic mean and scale).
      learn_noise: whether that likelihood's variance is trained (else it stays fixed).
      layer_kwargs: extra keyword arguments for every dense layer (e.g. initializers).
      prior_precision: for layers with deterministic weights (`'Dense'`), the precision
        `lambda` of a Gaussian prior `N(0, I / lambda)` on their kernels and biases: an L2
        penalty `lambda / 2 ||W||^2`, which the trainer divides by the number of training
        examples `N`, so the trained weights are the MAP of `mean NLL + lambda ||W||^2 / (2N)`
        (weight decay `lambda / N` per example). Laplace and SWAG then approximate the posterior
        of that prior. Layers with random weights ignore it (their prior is in their KL).
      batch_norm: batch normalization between each hidden layer and its activation (Ioffe &
        Szegedy, 2015), e.g. for `--method=mc_batchnorm`; not with replicas (the statistics
        would mix the replicas' batches).
      replicas: None, or the `blayers.lab.data.Replica`s of replicated data: every layer then
        has `replicas=R` (`blayers.replicas`; `'Dense'` is the blayers dense layer with Keras'
        deterministic initializer) and a replica's `hparams` may set its own `dropout_rate`
        and `noise_variance` (a number or, here, one a replica). Inputs `[R, batch, d]`.
    """
    if isinstance(hidden_units, (int, np.integer)):
        hidden_units = (hidden_units,)  # one hidden layer
    if isinstance(hidden_units, (str, bytes)) or not all(
        isinstance(u, (int, np.integer)) and not isinstance(u, bool) and u > 0 for u in hidden_units
    ):
        raise ValueError(
            f"mlp.hidden_units must be the widths of the hidden layers, positive integers "
            f"(e.g. (100,) or [50, 50]), got {hidden_units!r}."
        )
    hidden_cls = get_layer_class(dense_layer)
    output_cls = get_layer_class(output_layer or dense_layer)
    kwargs = dict(layer_kwargs or {})
    hidden_kwargs, output_kwargs = _map_prior(prior_precision, hidden_cls, output_cls, replicas)
    group = {}
    if replicas is not None:
        if batch_norm:
            raise ValueError(
                "mlp.batch_norm: replicated data (SupervisedLearner.data's replicas) would mix "
                "the replicas' batches in one normalization; train the replicas as separate "
                "runs for batch normalization."
            )
        if len(input_shape) > 1:
            raise ValueError(f"mlp: replicas take vector features, got shape {input_shape}.")
        group = {"replicas": len(replicas), "replica_seeds": [r.seed for r in replicas]}
        hidden_cls, output_cls = _replicated_dense(hidden_cls), _replicated_dense(output_cls)
        dropout_rate = _per_replica(replicas, "dropout_rate", dropout_rate)
        if noise_variance is not None:
            noise_variance = _per_replica(replicas, "noise_variance", noise_variance)
        model_layers = [keras.Input((None, *input_shape))]
    else:
        model_layers = [keras.Input(tuple(input_shape))]
        if len(input_shape) > 1:
            model_layers.append(keras.layers.Flatten())
    dropout = bool(np.any(dropout_rate))
    if input_dropout and dropout:
        model_layers.append(blayers_layers.MCDropout(dropout_rate, **group))
    for units in hidden_units:
        if batch_norm:
            model_layers += [
                hidden_cls(units, **kwargs, **hidden_kwargs),
                keras.layers.BatchNormalization(),
                keras.layers.Activation(activation),
            ]
        else:
            model_layers.append(
                hidden_cls(units, activation=activation, **kwargs, **hidden_kwargs, **group)
            )
        if dropout:
            model_layers.append(blayers_layers.MCDropout(dropout_rate, **group))
    if noise_variance is None:
        model_layers.append(output_cls(num_outputs, **kwargs, **output_kwargs, **group))
    else:
        model_layers.append(
            output_cls(Regression.target_dim(num_outputs), **kwargs, **output_kwargs, **group)
        )
        model_layers.append(
            blayers_layers.GaussianLikelihood(
                noise_variance, trainable=learn_noise, name="likelihood", **group
            )
        )
    return keras.Sequential(model_layers, name=name)


def _map_prior(prior_precision, hidden_cls, output_cls, replicas):
    """The L2 regularizers of `mlp.prior_precision` for the hidden and the output layers (none
    for layers with random weights)."""
    if prior_precision is None:
        return {}, {}
    if not float(prior_precision) > 0:
        raise ValueError(f"mlp.prior_precision must be positive, got {prior_precision!r}.")

    def kwargs(cls):
        if isinstance(cls, type) and issubclass(cls, BayesianLayer):
            return {}
        decay = float(prior_precision) / 2.0
        penalty = (
            keras.regularizers.L2(decay)
            if replicas is None
            else ReplicaL2([decay] * len(replicas))  # the same prior for every replica
        )
        return {"kernel_regularizer": penalty, "bias_regularizer": penalty}

    return kwargs(hidden_cls), kwargs(output_cls)


def _per_replica(replicas, key, default):
    """Each replica's `hparams[key]`, else `default` (one value, or one a replica)."""
    defaults = np.broadcast_to(np.asarray(default, np.float64), (len(replicas),))
    return [float(r.hparams.get(key, d)) for r, d in zip(replicas, defaults)]


def _replicated_dense(cls):
    """`keras.layers.Dense` as replicas train it: the blayers dense layer with Keras' kernel
    initializer (deterministic weights); a blayers layer as it is."""
    if cls is keras.layers.Dense:
        return functools.partial(
            blayers_layers.DenseReparameterization, kernel_initializer="glorot_uniform"
        )
    return cls


def mc_dropout_decay(lengthscale, dropout_rate, target_scale):
    """The weight decay `c = l^2 (1 - p) s^2 / 4` of Gal & Ghahramani's objective, in the
    trainer's `mean NLL + c ||W||^2 / N` (see `mc_dropout_regressor`)."""
    return lengthscale**2 * (1.0 - dropout_rate) * target_scale**2 / 4.0


@gin.configurable(module="blayers.lab.models")
def mc_dropout_regressor(
    input_shape,
    num_outputs,
    hidden_units=(50,),
    dropout_rate=0.05,
    tau=1.0,
    target_scale=1.0,
    lengthscale=1e-2,
    name="mc_dropout_regressor",
    replicas=None,
):
    """Gal & Ghahramani's (2016) MC dropout regression network, as in their UCI experiments.

    Dropout (rate `p`) before every `Dense` layer, ReLU hidden layers, weight decay on the
    kernels from the prior lengthscale `l`, and a Gaussian likelihood of fixed precision `tau`
    in the targets' original units (`noise_variance = 1 / (tau s^2)` on targets standardized by
    `s = target_scale`, the training split's standard deviation). Their code minimizes
    `MSE + l^2 (1 - p) / (2 N tau) ||W||^2` on standardized targets; the trainer minimizes
    `mean NLL + c ||W||^2 / N`, whose terms stand in the same ratio (Adam is invariant to the
    loss's overall scale) for `c = l^2 (1 - p) s^2 / 4`.

    Args:
      hidden_units: hidden layer widths (50, or 100 for protein, in their experiments).
      dropout_rate: `p`, the probability of dropping a unit (their grid: 0.005-0.1).
      tau: the observation noise precision in original units (their grid is per data set).
      target_scale: `s`, the standard deviation the targets were divided by.
      lengthscale: `l`, the prior lengthscale (1e-2 in their code).
      replicas: None, or the `Replica`s of replicated data: replica `r` drops units at its
        `hparams['dropout_rate']`, has the precision `hparams['tau']` and the weight decay of
        its rate and its own data's target scale (`blayers.replicas.ReplicaL2`).
    """
    if replicas is None:
        rates, taus, scales = [dropout_rate], [tau], [target_scale]
    else:
        rates = _per_replica(replicas, "dropout_rate", dropout_rate)
        taus = _per_replica(replicas, "tau", tau)
        scales = [replica.data.target_scale for replica in replicas]
    for t, scale in zip(taus, scales):
        if t <= 0 or scale <= 0:
            raise ValueError(
                f"mc_dropout_regressor needs tau > 0 and target_scale > 0, got {t}, {scale}."
            )
    decays = [mc_dropout_decay(lengthscale, p, s) for p, s in zip(rates, scales)]
    variances = [1.0 / (t * s**2) for t, s in zip(taus, scales)]
    regularizer = keras.regularizers.L2(decays[0]) if replicas is None else ReplicaL2(decays)
    return mlp(
        input_shape,
        num_outputs,
        hidden_units=hidden_units,
        activation="relu",
        dense_layer="Dense",
        dropout_rate=rates[0] if replicas is None else rates,
        input_dropout=True,
        noise_variance=variances[0] if replicas is None else variances,
        learn_noise=False,
        layer_kwargs={"kernel_regularizer": regularizer},
        name=name,
        replicas=replicas,
    )


@gin.configurable(module="blayers.lab.models")
def sequential(input_shape, num_outputs, layers=gin.REQUIRED, name="sequential"):
    """A model written in gin: `layers` is a list of `(class_name, kwargs)` specs.

    A kwarg whose value is the string `'num_outputs'` takes the model's output size:

        sequential.layers = [
            ('DenseFlipout', {'units': 64, 'activation': 'relu'}),
            ('DenseFlipout', {'units': 'num_outputs'}),
        ]
    """
    model_layers = [keras.Input(tuple(input_shape))]
    for i, spec in enumerate(layers):
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[1], dict)):
            raise ValueError(f"sequential.layers[{i}] must be (class_name, kwargs), got {spec!r}.")
        cls = get_layer_class(spec[0])
        kwargs = {k: (num_outputs if v == NUM_OUTPUTS else v) for k, v in spec[1].items()}
        try:
            model_layers.append(cls(**kwargs))
        except TypeError as error:
            raise ValueError(f"sequential.layers[{i}] ({spec[0]}): {error}") from None
    return keras.Sequential(model_layers, name=name)
