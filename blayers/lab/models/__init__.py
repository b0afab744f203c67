"""Registered model builders: gin configurables `fn(input_shape, num_outputs, ...)` returning
a `keras.Model`.

A model is a registered Python function (`mlp`) or written in gin alone as a list of layer specs
(`sequential`). Layers are named by class (`blayers.registry.get_layer`): registered blayers
layers first (`'DenseFlipout'`), then `keras.layers` (`'Dense'`), so an estimator is swapped by one binding
(`mlp.dense_layer = 'DenseReparameterization'`) and the deterministic twin is
`mlp.dense_layer = 'Dense'`.
"""

import gin
import keras

from blayers import layers as blayers_layers
from blayers.lab.models.baselines import uncertainty_baseline
from blayers.lab.models.cox import CoxProcess, cox_process
from blayers.lab.models.flows import realnvp_flow
from blayers.lab.models.gaussian_process import deep_gp, replicated_deep_gp
from blayers.lab.models.resnet import resnet
from blayers.lab.models.sequence import lstm_sequence_model
from blayers.lab.models.transformer import transformer, transformer_lm, transformer_schedule
from blayers.lab.models.vae import VAE, VQVAE, vae, vqvae
from blayers.lab.tasks import Regression
from blayers.registry import get_layer as get_layer_class
from blayers.regularizers import NormalKLDivergence
from blayers.replicas import ReplicaL2

__all__ = [
    "NUM_OUTPUTS",
    "VAE",
    "VQVAE",
    "CoxProcess",
    "cox_process",
    "deep_gp",
    "get_layer_class",
    "lstm_sequence_model",
    "mc_dropout_regressor",
    "mlp",
    "realnvp_flow",
    "replicated_deep_gp",
    "replicated_flipout_regressor",
    "replicated_mc_dropout_regressor",
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
    name="mlp",
):
    """Multilayer perceptron: [Flatten] -> [MCDropout] -> (dense_layer(h), [MCDropout]) * L ->
    output_layer [-> GaussianLikelihood].

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
    """
    hidden_cls = get_layer_class(dense_layer)
    output_cls = get_layer_class(output_layer or dense_layer)
    kwargs = dict(layer_kwargs or {})
    model_layers = [keras.Input(tuple(input_shape))]
    if len(input_shape) > 1:
        model_layers.append(keras.layers.Flatten())
    if input_dropout and dropout_rate:
        model_layers.append(blayers_layers.MCDropout(dropout_rate))
    for units in hidden_units:
        model_layers.append(hidden_cls(units, activation=activation, **kwargs))
        if dropout_rate:
            model_layers.append(blayers_layers.MCDropout(dropout_rate))
    if noise_variance is None:
        model_layers.append(output_cls(num_outputs, **kwargs))
    else:
        model_layers.append(output_cls(Regression.target_dim(num_outputs), **kwargs))
        model_layers.append(
            blayers_layers.GaussianLikelihood(
                noise_variance, trainable=learn_noise, name="likelihood"
            )
        )
    return keras.Sequential(model_layers, name=name)


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
    """
    if tau <= 0 or target_scale <= 0:
        raise ValueError(
            f"mc_dropout_regressor needs tau > 0 and target_scale > 0, got {tau}, {target_scale}."
        )
    decay = mc_dropout_decay(lengthscale, dropout_rate, target_scale)
    return mlp(
        input_shape,
        num_outputs,
        hidden_units=hidden_units,
        activation="relu",
        dense_layer="Dense",
        dropout_rate=dropout_rate,
        input_dropout=True,
        noise_variance=1.0 / (tau * target_scale**2),
        learn_noise=False,
        layer_kwargs={"kernel_regularizer": keras.regularizers.L2(decay)},
        name=name,
    )


@gin.configurable(module="blayers.lab.models")
def replicated_mc_dropout_regressor(
    input_dim, replicas, hidden_units=(50,), lengthscale=1e-2, name="replicated_mc_dropout"
):
    """`mc_dropout_regressor` for `R` replicas at once (`blayers.replicas`: the same layers
    with `replicas=R`): replica `r` drops units at its `hparams['dropout_rate']`, has the noise
    precision `hparams['tau']` (original units) and the weight decay of its rate, its data's
    target scale and training size (`blayers.replicas.ReplicaL2`). Inputs `[R, B, input_dim]`;
    outputs a `GaussianLikelihood`'s random variable `[R, B, 1]`.

    Args:
      input_dim: features per example.
      replicas: the `blayers.lab.data.Replica`s (their seeds seed every layer's replica).
      hidden_units, lengthscale: as `mc_dropout_regressor`.
    """
    rates, variances, decays = [], [], []
    for replica in replicas:
        rate, tau = replica.hparams.get("dropout_rate", 0.05), replica.hparams.get("tau", 1.0)
        scale = replica.data.target_scale
        if tau <= 0 or scale <= 0:
            raise ValueError(
                f"replicated_mc_dropout_regressor: replica {replica.name} needs tau > 0 and a "
                f"positive target scale, got {tau}, {scale}."
            )
        rates.append(rate)
        variances.append(1.0 / (tau * scale**2))
        decays.append(mc_dropout_decay(lengthscale, rate, scale) / replica.data.num_train)
    group = {"replicas": len(replicas), "replica_seeds": [replica.seed for replica in replicas]}
    model_layers = [keras.Input((None, input_dim))]
    widths = (*hidden_units, 1)
    for i, units in enumerate(widths):  # dropout before every dense layer, as theirs
        model_layers.append(blayers_layers.MCDropout(rates, **group))
        model_layers.append(  # a Keras initializer: the deterministic dense layer
            blayers_layers.DenseReparameterization(
                units,
                activation="relu" if i < len(hidden_units) else None,
                kernel_initializer="glorot_uniform",
                kernel_regularizer=ReplicaL2(decays),
                **group,
            )
        )
    model_layers.append(
        blayers_layers.GaussianLikelihood(variances, trainable=False, name="likelihood", **group)
    )
    return keras.Sequential(model_layers, name=name)


@gin.configurable(module="blayers.lab.models")
def replicated_flipout_regressor(
    input_dim,
    replicas,
    hidden_units=(50,),
    activation="relu",
    prior_stddev=1.0,
    noise_variance=0.1,
    learn_noise=True,
    name="replicated_flipout",
):
    """`mlp(dense_layer='DenseFlipout', noise_variance=..., learn_noise=True)`, the mean-field
    Flipout regressor, for `R` replicas at once (`blayers.replicas`: `DenseFlipout` and
    `GaussianLikelihood` with `replicas=R`): each replica has its own posterior, KL weight
    `1 / N` (its negative ELBO per example) and learned noise variance (standardized units,
    `hparams['noise_variance']` where a replica sets it). Inputs `[R, B, input_dim]`; outputs
    the likelihood's random variable `[R, B, 1]`.

    Args:
      input_dim: features per example.
      replicas: the `blayers.lab.data.Replica`s (their seeds seed every layer's replica).
      hidden_units, activation: the hidden layers, as `mlp`'s.
      prior_stddev: the weights' prior stddev (Hernandez-Lobato & Adams' VI baseline: 1).
      noise_variance: the initial noise variance; learn_noise: whether it is trained.
    """
    variances = [r.hparams.get("noise_variance", noise_variance) for r in replicas]
    sizes = {r.data.num_train for r in replicas}
    if len(sizes) > 1 or any("prior_stddev" in r.hparams for r in replicas):
        raise ValueError(
            "replicated_flipout_regressor: replicas share one prior and one training size (the "
            f"KL's 1 / N); got sizes {sorted(sizes)} and per-replica prior_stddev hparams."
        )
    group = {"replicas": len(replicas), "replica_seeds": [replica.seed for replica in replicas]}
    kl = {"stddev": prior_stddev, "scale_factor": 1.0 / sizes.pop()}
    model_layers = [keras.Input((None, input_dim))]
    widths = (*hidden_units, 1)
    for i, units in enumerate(widths):
        model_layers.append(
            blayers_layers.DenseFlipout(
                units,
                activation=activation if i < len(hidden_units) else None,
                kernel_regularizer=NormalKLDivergence(**kl),
                **group,
            )
        )
    model_layers.append(
        blayers_layers.GaussianLikelihood(
            variances, trainable=learn_noise, name="likelihood", **group
        )
    )
    return keras.Sequential(model_layers, name=name)


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
