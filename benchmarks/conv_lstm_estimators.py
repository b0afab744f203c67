"""Training-step time of Bayesian convolutions and LSTM cells against their Keras twins, and
where the time goes.

Conv: 3x3, 64 -> 64 channels, 32x32 inputs, batch 32 (`Conv2DReparameterization`,
`Conv2DFlipout`, `Conv2DLocalReparameterization` against `keras.layers.Conv2D`). LSTM: 256 units,
32 steps, batch 64, in `keras.layers.RNN` (`LSTMCellReparameterization`, `LSTMCellFlipout`
against `keras.layers.LSTMCell`). One step = forward, KL, backward, Adam; `tf.function`; all
steps of a group interleaved in one process (ratios: medians of each round's ratio). Each
Bayesian layer's breakdown removes one part at a time (`common.breakdown_steps`: draw, softplus,
KL, Adam over SGD); the conv *matmul bound* is the convolutions alone (forward and filter
gradient: one pair for Conv2D and reparameterization, two for Flipout and local
reparameterization).

    python benchmarks/conv_lstm_estimators.py --out benchmarks/results/conv_lstm_estimators.json
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
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

GOALS = {  # x the Keras twin (issue #52)
    "Conv2DReparameterization": 1.3,
    "Conv2DFlipout": 2.3,
    "Conv2DLocalReparameterization": 2.3,
    "LSTMCellFlipout": 2.5,
}
CONV_PAIRS = {
    "Conv2DReparameterization": 1,
    "Conv2DFlipout": 2,
    "Conv2DLocalReparameterization": 2,
}


def conv_step(pairs, x_shape, filters):
    """The convolutions alone: `pairs` times a forward convolution and a filter gradient."""
    kernels = [tf.Variable(tf.random.normal([3, 3, x_shape[-1], filters])) for _ in range(pairs)]
    # One upstream gradient a pair: the same filter gradient twice would be computed once.
    upstreams = [tf.Variable(tf.random.normal([1, 1, 1, filters])) for _ in range(pairs)]

    @tf.function
    def step(x, y):
        total = 0.0
        for kernel, upstream in zip(kernels, upstreams):
            total += tf.reduce_sum(tf.nn.conv2d(x, kernel, 1, "SAME")[:1, :1, :1, :1])
            grad = tf.compat.v1.nn.conv2d_backprop_filter(
                x, tf.shape(kernel), y + upstream, [1, 1, 1, 1], "SAME"
            )
            total += tf.reduce_sum(grad[:1, :1, :1, :1])
        return total

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/conv_lstm_estimators.json")
    args = parser.parse_args()
    blayers.set_seed(0)
    layers = blayers.layers

    def conv(cls):
        return lambda **kw: cls(64, 3, padding="same", **ablation_kwargs(**kw))

    def lstm(cls):
        return lambda **kw: keras.layers.RNN(
            cls(256, **ablation_kwargs(**kw, weights=("kernel", "recurrent"))),
            return_sequences=True,
        )

    groups = {
        "conv": (
            (32, 32, 32, 64),
            lambda: keras.layers.Conv2D(64, 3, padding="same"),
            {
                "Conv2DReparameterization": conv(layers.Conv2DReparameterization),
                "Conv2DFlipout": conv(layers.Conv2DFlipout),
                "Conv2DLocalReparameterization": conv(layers.Conv2DLocalReparameterization),
            },
        ),
        "lstm": (
            (64, 32, 256),
            lambda: keras.layers.RNN(keras.layers.LSTMCell(256), return_sequences=True),
            {
                "LSTMCellReparameterization": lstm(layers.LSTMCellReparameterization),
                "LSTMCellFlipout": lstm(layers.LSTMCellFlipout),
            },
        ),
    }
    payload = {"config": vars(args), "groups": {}}
    rows = []
    for group, (shape, make_twin, builders) in groups.items():
        x, y = tf.random.normal(shape), tf.random.normal(shape)
        twin = "Conv2D" if group == "conv" else "LSTMCell"
        steps = {twin: make_train_step(make_twin(), shape)}
        for name, build in builders.items():
            parts = breakdown_steps(build, shape, x, y)
            steps.update({f"{name} | {part}": step for part, step in parts.items()})
        if group == "conv":
            for pairs in (1, 2):
                steps[f"convolutions x{pairs}"] = conv_step(pairs, shape, 64)
        rounds = interleaved_times(steps, x, y, args.repeats, args.rounds)
        ms = {name: float(np.median(v)) for name, v in rounds.items()}
        base = ms[twin]
        results = {twin: {"ms_per_step": round(base, 2)}}
        rows.append(f"| {twin} | {base:.1f} | 1.00 | | | | | | |")
        for name in builders:
            full = ms[f"{name} | full"]
            ratio = round_ratio(rounds, f"{name} | full", twin)
            parts = parts_ms(rounds, name)
            bound = ms[f"convolutions x{CONV_PAIRS[name]}"] if name in CONV_PAIRS else None
            results[name] = {
                "ms_per_step": round(full, 2),
                "ratio_to_twin": round(ratio, 3),
                "goal": GOALS.get(name),
                "parts_ms": parts,
                "matmul_bound_ms": None if bound is None else round(bound, 2),
            }
            goal = f" (<= {GOALS[name]})" if name in GOALS else ""
            bound_cells = "| | |" if bound is None else f"| {bound:.1f} | {full / bound:.2f} |"
            rows.append(
                f"| {name} | {full:.1f} | **{ratio:.2f}**{goal} | "
                + " | ".join(f"{v:.1f}" for v in parts.values())
                + f" {bound_cells}"
            )
        payload["groups"][group] = {"medians_ms": {k: round(v, 3) for k, v in ms.items()}}
        payload["groups"][group]["layers"] = results
    markdown = (
        "| layer | ms / step | x Keras twin (goal) | draw | softplus | KL | Adam over SGD "
        "| convolutions ms | x convolutions |\n|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )
    write_results(args.out, payload, markdown)


if __name__ == "__main__":
    main()
