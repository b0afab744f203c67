"""Training-step time of Bayesian convolutions and LSTM cells relative to their Keras twins.

Conv: 3x3, 64 -> 64 channels, 32x32 inputs, batch 32 (`Conv2DReparameterization`,
`Conv2DFlipout`, `Conv2DLocalReparameterization` against `keras.layers.Conv2D`). LSTM: 256 units,
32 steps, batch 64, in `keras.layers.RNN` (`LSTMCellReparameterization`, `LSTMCellFlipout`
against `keras.layers.LSTMCell`). One step = forward, KL, backward, Adam; `tf.function`.

    python benchmarks/conv_lstm_estimators.py --out benchmarks/results/conv_lstm_estimators.json
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from common import make_train_step, time_step, write_json

import blayers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/conv_lstm_estimators.json")
    args = parser.parse_args()
    blayers.set_seed(0)
    layers = blayers.layers
    groups = {
        "conv": (
            (32, 32, 32, 64),
            (32, 32, 32, 64),
            {
                "Conv2D": lambda: keras.layers.Conv2D(64, 3, padding="same"),
                "Conv2DReparameterization": lambda: layers.Conv2DReparameterization(
                    64, 3, padding="same"
                ),
                "Conv2DFlipout": lambda: layers.Conv2DFlipout(64, 3, padding="same"),
                "Conv2DLocalReparameterization": lambda: layers.Conv2DLocalReparameterization(
                    64, 3, padding="same"
                ),
            },
        ),
        "lstm": (
            (64, 32, 256),
            (64, 32, 256),
            {
                "LSTMCell": lambda: keras.layers.RNN(
                    keras.layers.LSTMCell(256), return_sequences=True
                ),
                "LSTMCellReparameterization": lambda: keras.layers.RNN(
                    layers.LSTMCellReparameterization(256), return_sequences=True
                ),
                "LSTMCellFlipout": lambda: keras.layers.RNN(
                    layers.LSTMCellFlipout(256), return_sequences=True
                ),
            },
        ),
    }
    results = {"config": vars(args)}
    for group, (x_shape, y_shape, builders) in groups.items():
        x, y = tf.random.normal(x_shape), tf.random.normal(y_shape)
        steps = {name: make_train_step(build(), x_shape) for name, build in builders.items()}
        ms = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                ms[name].append(time_step(step, x, y, args.repeats))
        base = float(np.median(ms[next(iter(steps))]))
        results[group] = {
            name: {
                "ms_per_step": round(float(np.median(v)), 3),
                "ratio": round(float(np.median(v)) / base, 3),
            }
            for name, v in ms.items()
        }
        for name, r in results[group].items():
            print(f"  {name:32s} {r['ms_per_step']:8.2f} ms   x{r['ratio']:.2f}")
    write_json(results, args.out)


if __name__ == "__main__":
    main()
