"""GPflow side of the peer harness (run in the harness's own GPflow virtual environment: GPflow
2.11 needs numpy < 2, which TF 2.21 cannot use). SVGP with a whitened full-covariance q(u), the
analytic Gaussian ELBO, float64 (GPflow's default), Adam; the same data and M as blayers'."""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # GPflow's optimizers are tf-keras ones
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases
import gpflow
import numpy as np
import tensorflow as tf


def svgp_step(num_inducing):
    x, y = cases.svgp_data()
    model = gpflow.models.SVGP(
        gpflow.kernels.SquaredExponential(lengthscales=np.ones(cases.SVGP["input_dim"])),
        gpflow.likelihoods.Gaussian(),
        x[:num_inducing].copy(),
        num_data=cases.SVGP["num_data"],
        whiten=True,
        q_diag=False,
    )
    optimizer = tf.optimizers.Adam(1e-2)
    data = (tf.constant(x), tf.constant(y))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = model.training_loss(data)  # -ELBO, the batch scaled to num_data
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step, lambda out: out.numpy()


BUILDERS = {"svgp_m100": lambda: svgp_step(100), "svgp_m500": lambda: svgp_step(500)}

if __name__ == "__main__":
    tf.random.set_seed(0)
    cases.run_worker(BUILDERS)
