"""Training-step time and parameter count of the Keras Bayesian Transformer against its
deterministic twin (Flipout attention + local-reparameterization feed-forward vs Keras' own
layers): the shape of the paper's Figure 9 comparison (1.23x time on TPU), data parallel.

    python benchmarks/transformer_steps.py                         # scaled to a 2-core CPU
    python benchmarks/transformer_steps.py --layers 6 --d_model 512 --d_ff 2048 --tokens 4096

One step: forward, the sequence task's NLL plus KL / N, backward, Adam. Median of `--repeats`
timed steps after two warm-up steps, Bayesian and deterministic interleaved. JSON out, with
`flop_ratio`: the Bayesian / deterministic ratio of the step's matrix-multiply FLOPs
(`matmul_flops`), the time ratio a FLOP-bound machine would show.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_json

from blayers import objectives
from blayers.lab import models
from blayers.lab.tasks import SequenceToSequence


def matmul_flops(args, bayesian):
    """Matrix-multiply FLOPs of one training step (forward and backward: 3 products per
    weight product, 6 for a Flipout or local-reparameterization one, which multiplies twice:
    mean and perturbation, or mean and variance). Attention scores and the output layer are
    deterministic in both models; source and target have `args.length` tokens."""
    d, f, v, n = args.d_model, args.d_ff, args.vocab, args.length
    tokens = max(args.tokens // n, 1) * n
    encoder = 4 * d * d + 2 * d * f  # per token: q, k, v, output projections; two FFN layers
    decoder = 8 * d * d + 2 * d * f  # self and cross attention
    weights = args.layers * (encoder + decoder)
    scores = args.layers * (2 * n * d + 4 * n * d)  # q k^T and weights @ v per attention
    macs = (2 if bayesian else 1) * weights + scores + d * v
    return 2 * 3 * macs * tokens


def make_step(bayesian, args):
    model = models.transformer(
        {"source": (None,), "target_in": (None,)},
        args.vocab,
        num_layers=args.layers,
        d_model=args.d_model,
        d_ff=args.d_ff,
        num_heads=args.heads,
        dropout=0.1,
        bayesian_attention=bayesian,
        bayesian_ffn=bayesian,
    )
    task = SequenceToSequence(label_smoothing=0.1)
    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(features, targets):
        with tf.GradientTape() as tape:
            nll = tf.reduce_mean(
                task.negative_log_likelihood(model(features, training=True), targets)
            )
            _, kl = objectives.split_losses(model)
            loss = nll + kl / 1e6
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    parameters = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    return step, parameters


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--d_ff", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--length", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--tokens", type=int, default=1024, help="target tokens per batch")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/transformer_steps.json")
    args = parser.parse_args(argv)
    batch = max(args.tokens // args.length, 1)
    rng = np.random.RandomState(0)
    ids = lambda: rng.randint(3, args.vocab, (batch, args.length)).astype("int32")
    features, targets = {"source": ids(), "target_in": ids()}, ids()
    steps, results = {}, {"config": vars(args)}
    for bayesian in (False, True):
        step, parameters = make_step(bayesian, args)
        for _ in range(2):
            step(features, targets)  # trace and warm up
        steps[bayesian] = step
        results["bayesian" if bayesian else "deterministic"] = {"parameters": parameters}
    times = {False: [], True: []}
    for _ in range(args.repeats):
        for bayesian in (False, True):
            start = time.perf_counter()
            steps[bayesian](features, targets).numpy()
            times[bayesian].append(time.perf_counter() - start)
    for bayesian in (False, True):
        key = "bayesian" if bayesian else "deterministic"
        results[key]["ms_per_step"] = round(1000 * float(np.median(times[bayesian])), 1)
        results[key]["matmul_gflop_per_s"] = round(
            matmul_flops(args, bayesian) / 1e6 / results[key]["ms_per_step"], 1
        )
        print(
            f"{key:14s} {results[key]['ms_per_step']:9.1f} ms/step  "
            f"{results[key]['parameters']:,} parameters"
        )
    results["time_ratio"] = round(
        results["bayesian"]["ms_per_step"] / results["deterministic"]["ms_per_step"], 2
    )
    results["flop_ratio"] = round(matmul_flops(args, True) / matmul_flops(args, False), 2)
    results["parameter_ratio"] = round(
        results["bayesian"]["parameters"] / results["deterministic"]["parameters"], 2
    )
    print(
        f"Bayesian / deterministic: {results['time_ratio']}x time, "
        f"{results['parameter_ratio']}x parameters (matmul FLOPs: {results['flop_ratio']}x)"
    )
    write_json(results, args.out)


if __name__ == "__main__":
    main()
