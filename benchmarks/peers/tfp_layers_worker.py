"""tfp.layers (on the legacy tf-keras, `TF_USE_LEGACY_KERAS=1`) side of the peer harness.

KL terms are scaled like blayers' (`KL / 50,000` through `kernel_divergence_fn`); the posteriors
are tfp.layers' defaults (mean-field Normal kernel, point-estimate bias), as blayers'.
"""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tfp.layers needs tf-keras (Keras 2)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases
import tensorflow as tf
import tensorflow_probability as tfp

tfd = tfp.distributions
keras = tf.keras


def _kl(q, p, _):
    return tfd.kl_divergence(q, p) * cases.KL_SCALE


UNITS = cases.DENSE["units"]
DENSE = {
    "deterministic": lambda: keras.layers.Dense(UNITS),
    "reparameterization": lambda: tfp.layers.DenseReparameterization(
        UNITS, kernel_divergence_fn=_kl
    ),
    "flipout": lambda: tfp.layers.DenseFlipout(UNITS, kernel_divergence_fn=_kl),
    "local_reparameterization": lambda: tfp.layers.DenseLocalReparameterization(
        UNITS, kernel_divergence_fn=_kl
    ),
}
CONV_ARGS = (cases.CONV["channels"], cases.CONV["kernel"])
CONV = {
    "deterministic": lambda: keras.layers.Conv2D(*CONV_ARGS, padding="same"),
    "reparameterization": lambda: tfp.layers.Convolution2DReparameterization(
        *CONV_ARGS, padding="same", kernel_divergence_fn=_kl
    ),
    "flipout": lambda: tfp.layers.Convolution2DFlipout(
        *CONV_ARGS, padding="same", kernel_divergence_fn=_kl
    ),
}


def layer_step(make, data):
    x, y = (tf.constant(a) for a in data)
    layer = make()
    layer.build(x.shape)
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(layer(x) - y))
            if layer.losses:
                loss += tf.add_n(layer.losses)
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(grads, layer.trainable_variables))
        return loss

    return step, lambda out: out.numpy()


BUILDERS = {f"dense_{k}": (lambda m=m: layer_step(m, cases.dense_data())) for k, m in DENSE.items()}
BUILDERS.update(
    {f"conv_{k}": (lambda m=m: layer_step(m, cases.conv_data())) for k, m in CONV.items()}
)

if __name__ == "__main__":
    tf.random.set_seed(0)
    cases.run_worker(BUILDERS)
