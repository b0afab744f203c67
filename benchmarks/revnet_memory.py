"""Peak memory of a gradient step through a stack of reversible blocks vs plain residual
blocks (same f, g), against depth, on CPU (`tf.config.experimental.get_memory_info`).

RevNet's custom gradient rebuilds each block's input from its output, so the backward pass keeps
no per-block activations: its peak should stay flat with depth where the plain stack's grows.

    python benchmarks/revnet_memory.py --out benchmarks/results/revnet_memory.json
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import tensorflow as tf
from common import write_json

import blayers
from blayers.layers import RevNetBlock, RevNetStack


def _halves(width):
    return (
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
    )


def peak_megabytes(depth, reversible, batch, width):
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

    gradient_step.get_concrete_function(x)  # trace outside the measurement
    tf.config.experimental.reset_memory_stats("CPU:0")
    base = tf.config.experimental.get_memory_info("CPU:0")["current"]
    grads = gradient_step(x)
    del grads
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return (peak - base) / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--out", default="benchmarks/results/revnet_memory.json")
    args = parser.parse_args()
    blayers.set_seed(0)
    results = {
        "config": vars(args),
        "peak_mb": {"revnet_stack": {}, "revnet_blocks": {}, "plain": {}},
    }
    for depth in args.depths:
        for kind, reversible in (
            ("revnet_stack", "stack"),
            ("revnet_blocks", True),
            ("plain", False),
        ):
            mb = peak_megabytes(depth, reversible, args.batch, args.width)
            results["peak_mb"][kind][depth] = round(mb, 2)
        sizes = "   ".join(
            f"{kind} {results['peak_mb'][kind][depth]:7.1f} MB" for kind in results["peak_mb"]
        )
        print(f"depth {depth:3d}: {sizes}")
    write_json(results, args.out)


if __name__ == "__main__":
    main()
