"""blayers (Keras 3) side of the peer harness: the cases of `cases.py`."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases
import keras
import numpy as np
import tensorflow as tf

import blayers
from blayers.layers import GaussianLikelihood, SparseGaussianProcess

L = blayers.layers
DENSE = {
    "deterministic": lambda: keras.layers.Dense(cases.DENSE["units"]),
    "reparameterization": lambda: L.DenseReparameterization(cases.DENSE["units"]),
    "flipout": lambda: L.DenseFlipout(cases.DENSE["units"]),
    "local_reparameterization": lambda: L.DenseLocalReparameterization(cases.DENSE["units"]),
}
CONV_ARGS = (cases.CONV["channels"], cases.CONV["kernel"])
CONV = {
    "deterministic": lambda: keras.layers.Conv2D(*CONV_ARGS, padding="same"),
    "reparameterization": lambda: L.Conv2DReparameterization(*CONV_ARGS, padding="same"),
    "flipout": lambda: L.Conv2DFlipout(*CONV_ARGS, padding="same"),
}


def layer_step(make, data):
    x, y = (tf.constant(a) for a in data)
    layer = make()
    layer.build(x.shape)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(layer.trainable_variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.convert_to_tensor(layer(x)) - y))
            if layer.losses:
                loss += tf.add_n(layer.losses) * cases.KL_SCALE
        optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
        return loss

    return step, lambda out: out.numpy()


def svgp_step(num_inducing):
    x, y = (tf.constant(a) for a in cases.svgp_data())
    gp = SparseGaussianProcess(
        1,
        num_inducing=num_inducing,
        whiten=True,
        variational="full",
        dtype="float64",
        inducing_inputs_initializer=keras.initializers.Constant(x.numpy()[:num_inducing]),
    )
    likelihood = GaussianLikelihood(dtype="float64")
    gp.build(x.shape)
    likelihood.build((None, 1))
    variables = gp.trainable_variables + likelihood.trainable_variables
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(variables)
    n = float(cases.SVGP["num_data"])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            f = gp(x)
            expected = tf.reduce_sum(likelihood.variational_expectation(f, y))
            # The negative ELBO of the full data set, estimated from the batch.
            loss = -(n / float(cases.SVGP["batch"])) * expected + tf.add_n(gp.losses)
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    return step, lambda out: out.numpy()


BUILDERS = {f"dense_{k}": (lambda m=m: layer_step(m, cases.dense_data())) for k, m in DENSE.items()}
BUILDERS.update(
    {f"conv_{k}": (lambda m=m: layer_step(m, cases.conv_data())) for k, m in CONV.items()}
)
BUILDERS.update({"svgp_m100": lambda: svgp_step(100), "svgp_m500": lambda: svgp_step(500)})

if __name__ == "__main__":
    blayers.set_seed(0)
    np.random.seed(0)
    cases.run_worker(BUILDERS)
