"""The work every framework measures, defined once (shapes, data, objective), and the timing
protocol: a worker times each case's training step (`tf.function` or eager PyTorch) as the
median over `repeats` steps after `warmup`, and prints one JSON line `{case: ms or "error: ..."}`.

Dense: 1024 -> 1024, batch 256; conv: 3x3, 64 -> 64 channels, 32x32 images, batch 32; both with
squared error + KL / 50,000 and Adam. SVGP: 8 inputs, N = 10,000, batch 1,000, M inducing points,
float64, whitened full-covariance q(u), the analytic Gaussian expected log-likelihood plus
KL / N, Adam. Each case with a deterministic twin (`*_deterministic`) for the ratios.
"""

import json
import sys
import time

import numpy as np

DENSE = {"batch": 256, "units": 1024, "input_dim": 1024}
CONV = {"batch": 32, "size": 32, "channels": 64, "kernel": 3}
SVGP = {"num_data": 10_000, "batch": 1_000, "input_dim": 8}
KL_SCALE = 1.0 / 50_000
CASES = {
    "dense": ["deterministic", "reparameterization", "flipout", "local_reparameterization"],
    "conv": ["deterministic", "reparameterization", "flipout"],
    "svgp": ["m100", "m500"],
}


def case_names(families):
    return [f"{family}_{variant}" for family in families for variant in CASES[family]]


def dense_data(dtype="float32"):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(DENSE["batch"], DENSE["input_dim"])).astype(dtype)
    return x, rng.normal(size=(DENSE["batch"], DENSE["units"])).astype(dtype)


def conv_data(dtype="float32"):
    rng = np.random.default_rng(0)
    shape = (CONV["batch"], CONV["size"], CONV["size"], CONV["channels"])
    return rng.normal(size=shape).astype(dtype), rng.normal(size=shape).astype(dtype)


def svgp_data():
    """A batch of a smooth 8-D function with noise (float64), and M-point inducing starts."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(SVGP["batch"], SVGP["input_dim"]))
    y = np.sin(x).sum(-1, keepdims=True) + 0.1 * rng.normal(size=(SVGP["batch"], 1))
    return x, y


def time_ms(step, repeats, warmup, sync=lambda out: out):
    for _ in range(warmup):
        sync(step())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(step())
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def run_worker(builders, argv=None):
    """`builders`: {case: () -> (step, sync)}. Prints the JSON line of the requested cases."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    results = {}
    for case in [c for c in args.cases.split(",") if c]:
        if case not in builders:
            results[case] = "error: not supported by this framework"
            continue
        try:
            step, sync = builders[case]()
            results[case] = time_ms(step, args.repeats, args.warmup, sync)
        except Exception as error:  # noqa: BLE001 - reported per case, never fatal
            results[case] = f"error: {type(error).__name__}: {str(error)[:200]}"
    sys.stdout.write("\nRESULT " + json.dumps(results) + "\n")
