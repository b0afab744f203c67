"""Gaussian-process speed: SVGP training steps and exact-GP fit and prediction, as JSON.

SVGP: one Adam step of `SparseGaussianProcess(1)` + `GaussianLikelihood` on a batch of 1,000
points with 8 inputs, for M = 100 and 500 inducing points. Exact GP: `GaussianProcess` conditioned
on N = 2,000 points (the Cholesky of the training covariance) predicting 2,000 test points.
Where GPflow imports beside TF 2.21, its SVGP runs on the same data as a ratio; otherwise the
JSON says it was not available.

    python benchmarks/gaussian_process.py --out benchmarks/results/gaussian_process.json
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from common import time_step, write_json

import blayers
from blayers.layers import GaussianLikelihood, GaussianProcess, SparseGaussianProcess


def svgp_step(num_inducing, x, y):
    model = keras.Sequential(
        [
            keras.Input((x.shape[1],)),
            SparseGaussianProcess(1, num_inducing=num_inducing),
            GaussianLikelihood(),
        ]
    )
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            nll = -tf.reduce_mean(model(x).distribution.log_prob(y))
            loss = nll + tf.add_n(model.losses) / 10_000.0
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step


def gpflow_svgp_ms(num_inducing, x, y, repeats):
    try:
        import gpflow
    except Exception as error:  # noqa: BLE001 - any import failure means "not available"
        return f"not available: {type(error).__name__}: {str(error)[:120]}"
    model = gpflow.models.SVGP(
        gpflow.kernels.SquaredExponential(lengthscales=np.ones(8)),
        gpflow.likelihoods.Gaussian(),
        x[:num_inducing].copy(),
        num_data=10_000,
    )
    optimizer = tf.keras.optimizers.Adam(0.01)
    loss = model.training_loss_closure((x, y))

    @tf.function
    def step(x_, y_):
        optimizer.minimize(loss, model.trainable_variables)
        return loss()

    return time_step(step, x, y, repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/gaussian_process.json")
    args = parser.parse_args()
    blayers.set_seed(0)
    rng = np.random.RandomState(0)
    x = rng.randn(1000, 8).astype("float32")
    y = np.sin(x.sum(1, keepdims=True)).astype("float32")
    results = {"config": vars(args), "svgp": {}}
    for m in (100, 500):
        ms = time_step(svgp_step(m, x, y), tf.constant(x), tf.constant(y), args.repeats)
        results["svgp"][f"M={m}"] = {
            "ms_per_step": round(ms, 2),
            "gpflow_ms_per_step": gpflow_svgp_ms(m, x, y, args.repeats),
        }
        print(f"SVGP M={m}: {ms:.1f} ms/step")
    x_train = rng.randn(2000, 8).astype("float32")
    y_train = np.sin(x_train.sum(1, keepdims=True)).astype("float32")
    x_test = rng.randn(2000, 8).astype("float32")
    start = time.perf_counter()
    layer = GaussianProcess(1, conditional_inputs=x_train, conditional_outputs=y_train)
    prediction = layer(x_test).distribution.mean().numpy()
    seconds = time.perf_counter() - start
    assert np.all(np.isfinite(prediction))
    results["exact_gp"] = {"N": 2000, "fit_and_predict_seconds": round(seconds, 3)}
    print(f"exact GP N=2000 fit + predict: {seconds:.2f} s")
    write_json(results, args.out)


if __name__ == "__main__":
    main()
