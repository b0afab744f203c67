"""Normalizing flows: the paper's Figure 7 RealNVP, applied to a base `blayers.Normal`.

    flow = Sequential([RealNVP(MADE([512, 512])),
                       RealNVP(MADE([512, 512], order='right-to-left')),
                       RealNVP(MADE([512, 512]))])
    outputs = flow(blayers.Normal(loc=tf.zeros([batch, d]), scale=1.))
    loss = -outputs.distribution.log_prob(features)

`realnvp_flow` builds that as a model of the features (the input only sets the batch size), so
the trainer minimizes `-log_prob(features)` (task 'density').
"""

import gin
import keras

from blayers.layers.reversible import MADE, ActNorm, RealNVP, StandardNormalBase

__all__ = ["realnvp_flow"]


@gin.configurable(module="blayers.lab.models")
def realnvp_flow(
    input_shape, num_outputs, num_layers=3, hidden_dims=(512, 512), actnorm=False, name="realnvp"
):
    """`num_layers` RealNVP couplings with MADE networks of alternating order and mask."""
    del num_outputs
    model_layers = [keras.Input(tuple(input_shape)), StandardNormalBase()]
    for i in range(num_layers):
        order = "left-to-right" if i % 2 == 0 else "right-to-left"
        model_layers.append(RealNVP(MADE(list(hidden_dims), order=order), parity=i % 2))
        if actnorm and i < num_layers - 1:
            model_layers.append(ActNorm())
    return keras.Sequential(model_layers, name=name)
