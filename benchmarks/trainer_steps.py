"""The training loop against Keras' own `fit`, on the main job's model.

For `mlp.dense_layer` in (`Dense`, `DenseFlipout`), `configs/digits_mlp.gin` (scikit-learn's
digits, 11 batches of 128 an epoch) is trained two ways in one process, interleaved over rounds:

* **Loop**: `blayers.lab.loop.train`, the supervised learner, evaluation and figures off;
  steps per second from the run's training records after the first (which holds the tracing).
* **Keras fit**: the same learner's model builder and optimizer (`SupervisedLearner.model`,
  `make_optimizer`), `model.compile(..., steps_per_execution=50)` (the Loop's default) and
  `model.fit` on the same training set, shuffled, batched and repeated; steps per second
  between its first and last `steps_per_execution` calls after the first two. Keras adds the
  layers' losses (the KL, the weight decay) unscaled where the Loop divides the KL by the
  training set's size: the same work.

Each round runs both for each layer; the ratio is the median over rounds of each round's Loop
time per step over Keras', which cancels the machine's drift between rounds.

    python benchmarks/trainer_steps.py --out benchmarks/results/trainer_steps.json
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gin
import keras
import numpy as np
import tensorflow as tf
from common import write_results

from blayers.lab import config, loop, runs
from blayers.lab.learners import supervised

STEPS_PER_EXECUTION = 50


def _parse(dense_layer, steps, log_every):
    gin.clear_config()
    config.parse(
        ["digits_mlp"],
        [
            f"mlp.dense_layer = '{dense_layer}'",
            f"train.train_steps = {steps}",
            "train.eval_every = None",
            f"train.log_every = {log_every}",
            "train.progress = False",
            "train.plots = False",
            f"train.steps_per_execution = {STEPS_PER_EXECUTION}",
            "SupervisedLearner.num_eval_samples = 1",
        ],
    )


def loop_rate(dense_layer, steps, log_every):
    """Steps per second of `loop.train` (its records after the first)."""
    _parse(dense_layer, steps, log_every)
    with tempfile.TemporaryDirectory() as model_dir:
        loop.train(model_dir)
        records = runs.RunDir(model_dir).records("train")
    return float(np.median([r["steps_per_second"] for r in records][1:]))


class _Clock(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times = []

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())


def keras_rate(dense_layer, steps, log_every):
    """Steps per second of `model.fit` on the learner's model, optimizer and data."""
    _parse(dense_layer, steps, log_every)
    learner = supervised.SupervisedLearner()
    data = learner.data
    keras.utils.set_random_seed(0)
    model = learner.model_fn(data.input_shape, data.num_outputs)
    model.compile(
        optimizer=learner.optimizer_fn(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=STEPS_PER_EXECUTION,
    )
    batches = (
        data.train.shuffle(data.num_train, seed=0)
        .batch(learner.batch_size, drop_remainder=True)
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )
    clock = _Clock()
    model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
    times = clock.times[2:]  # after the call that traced and the one after it
    return (len(times) - 1) * STEPS_PER_EXECUTION / (times[-1] - times[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--log_every", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/trainer_steps.json")
    args = parser.parse_args()
    layers = ("Dense", "DenseFlipout")
    rates = {layer: {"loop": [], "keras_fit": []} for layer in layers}
    for round_ in range(args.rounds):
        for layer in layers:
            rates[layer]["loop"].append(loop_rate(layer, args.steps, args.log_every))
            rates[layer]["keras_fit"].append(keras_rate(layer, args.steps, args.log_every))
            print(
                f"round {round_} {layer:13s} loop {rates[layer]['loop'][-1]:7.1f} steps/s, "
                f"keras fit {rates[layer]['keras_fit'][-1]:7.1f}",
                flush=True,
            )
    results = {"config": vars(args)}
    rows = [
        "| layer | Loop steps/s | Keras fit steps/s | Loop time / Keras time |",
        "|---|---|---|---|",
    ]
    for layer in layers:
        loop_rates, fit_rates = np.array(rates[layer]["loop"]), np.array(rates[layer]["keras_fit"])
        ratios = fit_rates / loop_rates  # time per step: the Loop's over Keras'
        results[layer] = {
            "loop_steps_per_second": round(float(np.median(loop_rates)), 1),
            "keras_fit_steps_per_second": round(float(np.median(fit_rates)), 1),
            "loop_over_keras_time": round(float(np.median(ratios)), 3),
            "rounds": {k: [round(float(v), 1) for v in vs] for k, vs in rates[layer].items()},
        }
        r = results[layer]
        rows.append(
            f"| {layer} | {r['loop_steps_per_second']:.0f} | "
            f"{r['keras_fit_steps_per_second']:.0f} | {r['loop_over_keras_time']:.2f} |"
        )
    results["bayesian_over_deterministic_time"] = round(
        results["Dense"]["loop_steps_per_second"]
        / results["DenseFlipout"]["loop_steps_per_second"],
        2,
    )
    write_results(args.out, results, "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
