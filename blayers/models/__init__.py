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
from blayers.models.baselines import uncertainty_baseline
from blayers.models.cox import CoxProcess, cox_process
from blayers.models.flows import realnvp_flow
from blayers.models.gaussian_process import deep_gp
from blayers.models.resnet import resnet
from blayers.models.sequence import lstm_sequence_model
from blayers.models.transformer import transformer, transformer_lm, transformer_schedule
from blayers.models.vae import VAE, VQVAE, vae, vqvae
from blayers.registry import get_layer as get_layer_class

__all__ = [
    "NUM_OUTPUTS",
    "VAE",
    "VQVAE",
    "CoxProcess",
    "cox_process",
    "deep_gp",
    "get_layer_class",
    "lstm_sequence_model",
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


@gin.configurable(module="blayers.models")
def mlp(
    input_shape,
    num_outputs,
    hidden_units=(100,),
    activation="relu",
    dense_layer="DenseFlipout",
    output_layer=None,
    dropout_rate=0.0,
    layer_kwargs=None,
    name="mlp",
):
    """Multilayer perceptron: [Flatten] -> (dense_layer(h), [MCDropout]) * L -> output_layer.

    Args:
      dense_layer: class or name of the hidden layers (`'DenseFlipout'`, `'Dense'`, ...).
      output_layer: class or name of the last layer (defaults to `dense_layer`).
      dropout_rate: MC dropout after each hidden layer (0 for none).
      layer_kwargs: extra keyword arguments for every dense layer (e.g. initializers).
    """
    hidden_cls = get_layer_class(dense_layer)
    output_cls = get_layer_class(output_layer or dense_layer)
    kwargs = dict(layer_kwargs or {})
    model_layers = [keras.Input(tuple(input_shape))]
    if len(input_shape) > 1:
        model_layers.append(keras.layers.Flatten())
    for units in hidden_units:
        model_layers.append(hidden_cls(units, activation=activation, **kwargs))
        if dropout_rate:
            model_layers.append(blayers_layers.MCDropout(dropout_rate))
    model_layers.append(output_cls(num_outputs, **kwargs))
    return keras.Sequential(model_layers, name=name)


@gin.configurable(module="blayers.models")
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
