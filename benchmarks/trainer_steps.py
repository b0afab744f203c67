"""Trainer throughput on the main job's model: deterministic MLP vs Bayesian (Flipout) MLP.

Runs `blayers.lab.loop.train` on `configs/digits_mlp.gin` for each `mlp.dense_layer` and reports
training steps per second (after the first logging interval, which includes tracing) as JSON.

    python benchmarks/trainer_steps.py --out benchmarks/results/trainer_steps.json
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gin
import numpy as np
from common import write_json

from blayers.lab import config, loop, runs


def steps_per_second(dense_layer, steps, log_every):
    gin.clear_config()
    config.parse(
        ["digits_mlp"],
        [
            f"mlp.dense_layer = '{dense_layer}'",
            f"train.train_steps = {steps}",
            "train.eval_every = None",
            f"train.log_every = {log_every}",
            "train.progress = False",
            "SupervisedLearner.num_eval_samples = 1",
        ],
    )
    with tempfile.TemporaryDirectory() as model_dir:
        loop.train(model_dir)
        records = runs.RunDir(model_dir).records("train")
    rates = [r["steps_per_second"] for r in records][1:]
    return float(np.median(rates))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--log_every", type=int, default=100)
    parser.add_argument("--out", default="benchmarks/results/trainer_steps.json")
    args = parser.parse_args()
    results = {"config": vars(args)}
    for layer in ("Dense", "DenseFlipout"):
        results[layer] = {
            "steps_per_second": round(steps_per_second(layer, args.steps, args.log_every), 2)
        }
        print(f"{layer:14s} {results[layer]['steps_per_second']:8.1f} steps/s")
    results["bayesian_over_deterministic_time"] = round(
        results["Dense"]["steps_per_second"] / results["DenseFlipout"]["steps_per_second"], 2
    )
    write_json(results, args.out)


if __name__ == "__main__":
    main()
