"""Cost of the efficient-uncertainty methods on the comparison's network (ResNet-20, 32x32x3).

For `--members` (4) members: parameters of BatchEnsemble, rank-1 and a deep ensemble relative to
one network; the training-step time (forward, loss, backward, SGD update, `tf.function`) of
BatchEnsemble and rank-1 on a tiled batch of `members x batch` rows against the single network
on the same `members x batch` rows (the fast weights' overhead: the members share one
convolution over the tiled batch) and against the single network on `batch` rows (what one
member's data costs alone; a deep ensemble pays that `members` times); spectral normalization's
step against the plain network; SNGP's precision update against the same SNGP without it.
Writes JSON (milliseconds are medians over `--repeats` steps, after warm-up).

    python benchmarks/efficient_ensembles.py --out benchmarks/results/efficient_ensembles.json
"""

import argparse
import os
import platform

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from common import time_step, write_json

import blayers
from blayers.lab.models import uncertainty_baseline
from blayers.layers import gaussian_process
from blayers.objectives import training_log_prob


def train_step(model, num_classes):
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            outputs = model(x, training=True)
            if isinstance(outputs, blayers.RandomVariable):
                nll = -tf.reduce_mean(training_log_prob(outputs.distribution, y))
            else:
                nll = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(y, outputs, from_logits=True)
                )
            loss = nll + (tf.add_n(model.losses) / 50_000.0 if model.losses else 0.0)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step


def trainable(model):
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="examples per member")
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/efficient_ensembles.json")
    args = parser.parse_args()
    blayers.set_seed(0)
    shape, classes, e, b = (32, 32, 3), 10, args.members, args.batch
    rng = np.random.default_rng(0)

    def data(n):
        x = tf.constant(rng.normal(size=(n, *shape)), tf.float32)
        return x, tf.constant(rng.integers(0, classes, n), tf.int32)

    def build(method, **kwargs):
        return uncertainty_baseline(
            shape, classes, method=method, depth=args.depth, ensemble_size=e, **kwargs
        )

    def ms(model, n):
        x, y = data(n)
        return time_step(train_step(model, classes), x, y, args.repeats, warmup=3)

    single = build("deterministic")
    results = {
        "machine": platform.processor() or platform.machine(),
        "tensorflow": tf.__version__,
        "network": f"ResNet-{args.depth}, 32x32x3, 10 classes",
        "members": e,
        "batch_per_member": b,
        "parameters": {"single": trainable(single)},
        "step_ms": {"single_batch": ms(single, b), "single_tiled_batch": ms(single, e * b)},
    }
    for method in ("batch_ensemble", "rank1"):
        model = build(method)
        results["parameters"][method] = trainable(model)
        results["step_ms"][method] = ms(model, b)  # tiled to e * b rows inside the model
    results["parameters"]["deep_ensemble"] = e * results["parameters"]["single"]
    results["step_ms"]["deep_ensemble"] = e * results["step_ms"]["single_batch"]

    # Spectral normalization of every convolution, with a plain dense head.
    sn = build("sngp")
    features = sn.get_layer(index=-2).output
    sn_plain = keras.Model(sn.inputs, keras.layers.Dense(classes)(features))
    results["step_ms"]["spectral_norm"] = ms(sn_plain, e * b)
    results["step_ms"]["sngp"] = ms(sn, e * b)
    update = gaussian_process.RandomFeatureGaussianProcess._update_precision
    try:  # the same SNGP step without the precision update
        gaussian_process.RandomFeatureGaussianProcess._update_precision = lambda *a: None
        results["step_ms"]["sngp_without_covariance"] = ms(build("sngp"), e * b)
    finally:
        gaussian_process.RandomFeatureGaussianProcess._update_precision = update
    p, t = results["parameters"], results["step_ms"]
    results["ratios"] = {
        "batch_ensemble_parameters": p["batch_ensemble"] / p["single"],
        "rank1_parameters": p["rank1"] / p["single"],
        "deep_ensemble_parameters": p["deep_ensemble"] / p["single"],
        "batch_ensemble_step_vs_single_same_rows": t["batch_ensemble"] / t["single_tiled_batch"],
        "rank1_step_vs_single_same_rows": t["rank1"] / t["single_tiled_batch"],
        "batch_ensemble_step_vs_single_member_batch": t["batch_ensemble"] / t["single_batch"],
        "deep_ensemble_step_vs_single_member_batch": t["deep_ensemble"] / t["single_batch"],
        "spectral_norm_step": t["spectral_norm"] / t["single_tiled_batch"],
        "sngp_covariance_update": t["sngp"] / t["sngp_without_covariance"],
    }
    for key, value in results["ratios"].items():
        print(f"{key:48s} {value:.3f}")
    write_json(results, args.out)


if __name__ == "__main__":
    main()
