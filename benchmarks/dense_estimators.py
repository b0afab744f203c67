"""Training-step time of each dense estimator against `keras.layers.Dense`, tfp.layers' twin
and the step's own matrix products, and where the time goes.

One step = forward pass, KL, backward pass and an Adam update of a single 1024 -> 1024 layer on
a batch of 256, compiled with `tf.function`; everything is timed in one process, interleaved
(`--rounds` rounds of `--repeats` steps each; times are medians over rounds, ratios medians of
each round's ratio), so that the machine's drift falls on all alike. A run's ratios still move
by 0.1-0.2 with the machine's state, so there are `--processes` runs (3), each in a fresh
process, one after another, and every figure is the median over the runs (the JSON keeps each
run's ratios):

* `Dense` (Keras 3) and the three blayers estimators;
* the same three from tfp.layers on tf-keras (`tfp.layers.Dense*`, tf-keras' Adam, the KL
  divided by 50,000 like blayers'), in the same process;
* the breakdown of each blayers estimator, by removing one part at a time (`common.
  breakdown_steps`): the draw (noise replaced by zeros), the softplus (replaced by a clip), the
  KL (none), Adam (replaced by SGD); what is left is matmuls, bias, loss and the update;
* the *matmul bound*: the same matrix products alone (forward and weight-gradient GEMMs: two
  for Dense and reparameterization, four for Flipout and local reparameterization);
* `Dense` and each estimator with `blayers.optimizers.Adam` (Keras' Adam, one fused kernel a
  variable), and their ratio.

Writes JSON and a Markdown table (`.md` beside it):

    python benchmarks/dense_estimators.py --out benchmarks/results/dense_estimators.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from common import (
    ablation_kwargs,
    breakdown_steps,
    interleaved_times,
    make_train_step,
    parts_ms,
    round_ratio,
    write_results,
)

import blayers

ESTIMATORS = {
    "DenseReparameterization": (blayers.layers.DenseReparameterization, 2),
    "DenseFlipout": (blayers.layers.DenseFlipout, 4),
    "DenseLocalReparameterization": (blayers.layers.DenseLocalReparameterization, 4),
}
GOALS = {  # x Dense (issue #52)
    "DenseReparameterization": 2.0,
    "DenseFlipout": 2.5,
    "DenseLocalReparameterization": 2.2,
}
TFP_SPEEDUP_GOAL = 1.4  # tfp.layers' time / blayers' time
KL_SCALE = 50_000.0  # the KL's divisor in `common.make_train_step`


def tfp_step(name, units, input_dim):
    """tfp.layers' `name` on tf-keras with tf-keras' Adam, the KL divided like blayers'."""
    tfd = tfp.distributions
    layer = getattr(tfp.layers, name)(
        units, kernel_divergence_fn=lambda q, p, _: tfd.kl_divergence(q, p) / KL_SCALE
    )
    layer.build((None, input_dim))
    from tensorflow_probability.python.internal import tf_keras

    optimizer = tf_keras.optimizers.Adam(1e-3)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(layer(x) - y)) + tf.add_n(layer.losses)
        variables = layer.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step


def matmul_step(gemm_pairs, units, input_dim):
    """The step's matrix products alone: `gemm_pairs` times a forward product `x @ W` and a
    weight gradient `x^T @ g` (the FLOP bound of a step that does nothing else)."""
    kernels = [tf.Variable(tf.random.normal([input_dim, units])) for _ in range(gemm_pairs)]
    # One upstream gradient a pair: the same product twice would be computed once.
    upstreams = [tf.Variable(tf.random.normal([1, units])) for _ in range(gemm_pairs)]

    @tf.function
    def step(x, y):
        total = 0.0
        for kernel, upstream in zip(kernels, upstreams):
            total += tf.reduce_sum(tf.matmul(x, kernel)[:1, :1])
            grad = tf.matmul(x, y + upstream, transpose_a=True)
            total += tf.reduce_sum(grad[:1, :1])
        return total

    return step


def measure(args):
    """`{step name: [ms, one a round]}`: every step of the table, interleaved in this process."""
    blayers.set_seed(0)
    units, input_dim = args.units, args.input_dim
    x = tf.random.normal([args.batch, input_dim])
    y = tf.random.normal([args.batch, units])
    shape = (None, input_dim)
    steps = {"Dense": make_train_step(keras.layers.Dense(units), shape)}
    steps["Dense | SGD"] = make_train_step(keras.layers.Dense(units), shape, optimizer="sgd")
    steps["Dense | blayers Adam"] = make_train_step(
        keras.layers.Dense(units), shape, optimizer="blayers_adam"
    )
    steps["matmuls x2"] = matmul_step(1, units, input_dim)
    steps["matmuls x4"] = matmul_step(2, units, input_dim)
    for name, (cls, _) in ESTIMATORS.items():
        parts = breakdown_steps(
            lambda cls=cls, **kw: cls(units, **ablation_kwargs(**kw)), shape, x, y
        )
        steps.update({f"{name} | {part}": step for part, step in parts.items()})
        steps[f"tfp.layers.{name}"] = tfp_step(name, units, input_dim)
    if args.xla:  # XLA's own random kernels inside the step (`blayers.sampling.xla_is_fast`)
        steps["Dense | XLA"] = make_train_step(keras.layers.Dense(units), shape, jit_compile=True)
        for name, (cls, _) in ESTIMATORS.items():
            steps[f"{name} | XLA"] = make_train_step(cls(units), shape, jit_compile=True)
    return interleaved_times(steps, x, y, args.repeats, args.rounds)


def run_figures(rounds, args):
    """One run's figures: step medians, each estimator's ratios and breakdown."""
    ms = {name: float(np.median(v)) for name, v in rounds.items()}
    figures = {"ms": ms, "estimators": {}}
    for name in ESTIMATORS:
        figures["estimators"][name] = {
            "ratio": round_ratio(rounds, f"{name} | full", "Dense"),
            "tfp_ratio": round_ratio(rounds, f"tfp.layers.{name}", f"{name} | full"),
            # both steps with blayers' fused Adam (`blayers.optimizers.Adam`)
            "fused_adam_ratio": round_ratio(
                rounds, f"{name} | blayers Adam", "Dense | blayers Adam"
            ),
            "parts": parts_ms(rounds, name),
        }
    if args.xla:
        figures["xla_ratio_to_dense"] = {
            name: ms[f"{name} | XLA"] / ms["Dense | XLA"] for name in ESTIMATORS
        }
    return figures


def median_figures(runs):
    """The median over runs of every figure (a nested dict of numbers)."""
    first = runs[0]
    if isinstance(first, dict):
        return {key: median_figures([run[key] for run in runs]) for key in first}
    return float(np.median(runs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1024)
    parser.add_argument("--input_dim", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument(
        "--rounds",
        type=int,
        default=9,
        help="interleaved rounds over all steps; the median per step is kept",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=3,
        help="independent runs, each in a fresh process, one after another; every figure is "
        "the median over the runs (a run's ratios move by 0.1-0.2 with the machine's state)",
    )
    parser.add_argument(
        "--xla",
        action="store_true",
        help="also time whole steps compiled with XLA (jit_compile=True), random kernels included",
    )
    parser.add_argument("--out", default="benchmarks/results/dense_estimators.json")
    parser.add_argument("--rounds_json", help=argparse.SUPPRESS)  # a run's output (a child)
    args = parser.parse_args()
    if args.rounds_json:
        with open(args.rounds_json, "w") as f:
            json.dump(measure(args), f)
        return
    if args.processes == 1:
        runs = [measure(args)]
    else:
        runs = []
        with tempfile.TemporaryDirectory() as folder:
            for i in range(args.processes):
                path = os.path.join(folder, f"run{i}.json")
                subprocess.run(
                    [sys.executable, __file__, *sys.argv[1:], f"--rounds_json={path}"], check=True
                )
                with open(path) as f:
                    runs.append(json.load(f))
    per_run = [run_figures(rounds, args) for rounds in runs]
    figures = median_figures(per_run)
    ms = figures["ms"]

    dense = ms["Dense"]
    gflop = 2.0 * args.batch * args.input_dim * args.units / 1e9  # one GEMM
    rows, results = [], {}
    for name, (_, gemms) in ESTIMATORS.items():
        full = ms[f"{name} | full"]
        bound = ms[f"matmuls x{gemms}"]
        tfp_ms = ms[f"tfp.layers.{name}"]
        ratio = figures["estimators"][name]["ratio"]
        tfp_ratio = figures["estimators"][name]["tfp_ratio"]
        parts = {k: round(v, 2) for k, v in figures["estimators"][name]["parts"].items()}
        results[name] = {
            "ms_per_step": round(full, 2),
            "ratio_to_dense": round(ratio, 3),
            "ratio_to_dense_per_run": [round(r["estimators"][name]["ratio"], 3) for r in per_run],
            "ms_per_step_blayers_adam": round(ms[f"{name} | blayers Adam"], 2),
            "ratio_to_dense_both_blayers_adam": round(
                figures["estimators"][name]["fused_adam_ratio"], 3
            ),
            "goal_ratio_to_dense": GOALS[name],
            "tfp_layers_ms": round(tfp_ms, 2),
            "tfp_layers_over_blayers": round(tfp_ratio, 3),
            "matmul_bound_ms": round(bound, 2),
            "matmul_gflops": round(gemms * gflop / bound * 1e3, 1),
            "ratio_to_matmul_bound": round(full / bound, 3),
            "parts_ms": parts,
        }
        rows.append(
            f"| {name} | {full:.1f} | **{ratio:.2f}** (<= {GOALS[name]}) | "
            f"{tfp_ms:.1f} | **{tfp_ratio:.2f}** (>= {TFP_SPEEDUP_GOAL}) | "
            + " | ".join(f"{v:.1f}" for v in parts.values())
            + f" | {bound:.1f} ({gemms}) | {full / bound:.2f} | "
            f"{ms[f'{name} | blayers Adam']:.1f} ({figures['estimators'][name]['fused_adam_ratio']:.2f}) |"
        )
    results["Dense"] = {
        "ms_per_step": round(dense, 2),
        "ms_per_step_per_run": [round(r["ms"]["Dense"], 2) for r in per_run],
        "Adam over SGD": round(dense - ms["Dense | SGD"], 2),
        "matmul_bound_ms": round(ms["matmuls x2"], 2),
        "ratio_to_matmul_bound": round(dense / ms["matmuls x2"], 3),
    }
    markdown = (
        "| layer | ms / step | x Dense (goal) | tfp.layers ms | tfp.layers / blayers (goal) "
        "| draw | softplus | KL | Adam over SGD | matmuls ms (GEMMs) | x matmuls "
        "| ms, blayers Adam (x Dense) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"| Dense | {dense:.1f} | 1.00 | | | | | | {dense - ms['Dense | SGD']:.1f} "
        f"| {ms['matmuls x2']:.1f} (2) | {dense / ms['matmuls x2']:.2f} "
        f"| {ms['Dense | blayers Adam']:.1f} (1.00) |\n" + "\n".join(rows) + "\n"
    )
    if args.xla:
        results["xla_ratio_to_dense"] = {
            name: round(v, 2) for name, v in figures["xla_ratio_to_dense"].items()
        }
    config = {k: v for k, v in vars(args).items() if k != "rounds_json"}
    payload = {
        "config": config | {"tensorflow": tf.__version__, "keras": keras.__version__},
        "medians_ms": {k: round(v, 3) for k, v in ms.items()},
        "estimators": results,
    }
    write_results(args.out, payload, markdown)


if __name__ == "__main__":
    main()
