"""Peak memory of a gradient step through a stack of reversible blocks vs plain residual
blocks (same f, g), against depth, on CPU (`tf.config.experimental.get_memory_info`).

RevNet's custom gradient rebuilds each block's input from its output, so the backward pass keeps
no per-block activations: its peak should stay flat with depth where the plain stack's grows. The
parameter gradients themselves (`grad_mb`, 4 bytes a weight) must grow with depth whatever the
backward pass does, so `activation_mb = peak_mb - grad_mb` is the figure that should stay flat.
The slope (MB per block, least squares over depths) summarizes each. Each point is the least
peak of `--repeats` steps (3).

    python benchmarks/revnet_memory.py --out benchmarks/results/revnet_memory.json

It runs in a process of its own (the allocator is chosen when TensorFlow starts);
`tests/library/test_reversible.py` runs it at a small size.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TF counts CPU memory (get_memory_info, reset_memory_stats) only with its BFC allocator, which
# it reads once at start-up: set here, before TensorFlow loads, so no one sets it by hand.
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script from anywhere
from common import write_json

import blayers
from blayers.layers import RevNetBlock, RevNetStack


def _halves(width):
    return (
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
    )


def peak_megabytes(depth, reversible, batch, width, repeats=3):
    """`(peak MB, parameter-gradient MB)` of one gradient step: the least peak over `repeats`
    steps, as the executor's two threads sometimes run a later op early and hold its buffers
    longer (up to about 0.7 MB more on a loaded machine)."""
    blocks = [RevNetBlock(*_halves(width)) if reversible else _halves(width) for _ in range(depth)]
    x = tf.random.normal([batch, 2 * width])
    stack = RevNetStack(blocks) if reversible == "stack" else None
    if stack is not None:
        stack(x)
    for block in blocks:  # build
        if reversible:
            block(x)
        else:
            block[0].build((None, width))
            block[1].build((None, width))
    variables = [
        v
        for b in blocks
        for v in (
            b.trainable_variables
            if reversible
            else b[0].trainable_variables + b[1].trainable_variables
        )
    ]

    @tf.function  # as in training: the custom gradient's savings show in graph execution
    def gradient_step(x):
        with tf.GradientTape() as tape:
            h = x
            if stack is not None:
                h = stack(h)
            for block in blocks if stack is None else []:
                if reversible:
                    h = block(h)
                else:
                    x1, x2 = tf.split(h, 2, axis=-1)
                    y1 = x1 + block[0](x2)
                    h = tf.concat([y1, x2 + block[1](y1)], -1)
            loss = tf.reduce_sum(tf.square(h))
        return tape.gradient(loss, variables)

    grad_mb = sum(v.shape.num_elements() for v in variables) * 4 / 2**20
    gradient_step.get_concrete_function(x)  # trace outside the measurement
    peaks = []
    for _ in range(repeats):
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        grads = gradient_step(x)
        del grads
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - base)
    return min(peaks) / 2**20, grad_mb


def slope(points):
    """Least-squares MB per block of `{depth: mb}`."""
    depths, mbs = np.array(list(points), float), np.array(list(points.values()))
    return float(np.polyfit(depths, mbs, 1)[0])


# Each stack's `reversible` argument of `peak_megabytes`.
KINDS = {"revnet_stack": "stack", "revnet_blocks": True, "plain": False}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument(
        "--repeats", type=int, default=3, help="steps a point; the least peak is kept"
    )
    parser.add_argument("--out", default="benchmarks/results/revnet_memory.json")
    parser.add_argument(
        "--kinds", nargs="+", default=list(KINDS), choices=list(KINDS), help="stacks to measure"
    )
    args = parser.parse_args(argv)
    blayers.set_seed(0)
    kinds = {kind: KINDS[kind] for kind in args.kinds}
    results = {
        "config": vars(args),
        "peak_mb": {kind: {} for kind in kinds},
        "activation_mb": {kind: {} for kind in kinds},
        "grad_mb": {},
    }
    for depth in args.depths:
        for kind, reversible in kinds.items():
            mb, grad_mb = peak_megabytes(depth, reversible, args.batch, args.width, args.repeats)
            results["peak_mb"][kind][depth] = round(mb, 2)
            results["activation_mb"][kind][depth] = round(mb - grad_mb, 2)
            results["grad_mb"][depth] = round(grad_mb, 2)
        sizes = "   ".join(
            f"{kind} {results['peak_mb'][kind][depth]:6.1f}"
            f" ({results['activation_mb'][kind][depth]:5.1f})"
            for kind in kinds
        )
        print(f"depth {depth:3d}: peak (activations) MB: {sizes}")
    results["mb_per_block"] = {
        measure: {kind: round(slope(results[measure][kind]), 3) for kind in kinds}
        for measure in ("peak_mb", "activation_mb")
    }
    print("MB per block:", results["mb_per_block"])
    write_json(results, args.out)


if __name__ == "__main__":
    main()
