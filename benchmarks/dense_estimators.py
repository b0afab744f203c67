"""Training-step time of each dense estimator relative to `keras.layers.Dense`.

One step = forward pass, KL (for Bayesian layers), backward pass and an Adam update, of a single
1024 -> 1024 layer on a batch of 256, compiled with `tf.function` (and, with `--xla`, with XLA).
Writes JSON: milliseconds per step and the ratio to Dense for each estimator.

    python benchmarks/dense_estimators.py --out benchmarks/results/dense_estimators.json
"""

import argparse
import os
import platform

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from common import make_train_step, time_step, write_json

import blayers

LAYERS = {
    "Dense": keras.layers.Dense,
    "DenseReparameterization": blayers.layers.DenseReparameterization,
    "DenseFlipout": blayers.layers.DenseFlipout,
    "DenseLocalReparameterization": blayers.layers.DenseLocalReparameterization,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1024)
    parser.add_argument("--input_dim", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds over all layers; the median per layer is kept",
    )
    parser.add_argument("--xla", action="store_true", help="also time jit_compile=True steps")
    parser.add_argument("--out", default="benchmarks/results/dense_estimators.json")
    args = parser.parse_args()

    blayers.set_seed(0)
    x = tf.random.normal([args.batch, args.input_dim])
    y = tf.random.normal([args.batch, args.units])
    modes = [False, True] if args.xla else [False]
    results = {
        "config": {
            **vars(args),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        }
    }
    for jit in modes:
        steps = {
            name: make_train_step(cls(args.units), (None, args.input_dim), jit)
            for name, cls in LAYERS.items()
        }
        ms = {name: [] for name in LAYERS}
        for _ in range(args.rounds):  # interleave to average out machine noise
            for name, step in steps.items():
                ms[name].append(time_step(step, x, y, args.repeats))
        medians = {name: float(np.median(v)) for name, v in ms.items()}
        key = "xla" if jit else "tf_function"
        results[key] = {
            name: {"ms_per_step": round(m, 3), "ratio_to_dense": round(m / medians["Dense"], 3)}
            for name, m in medians.items()
        }
        print(key)
        for name, r in results[key].items():
            print(f"  {name:30s} {r['ms_per_step']:8.2f} ms   x{r['ratio_to_dense']:.2f}")
    write_json(results, args.out)


if __name__ == "__main__":
    main()
