"""Bayesian PlaNet's costs (paper Section 3.2: 22 h against 20 h for the deterministic agent,
1.1x): one world-model training step with a DenseReparameterization transition against a Dense
one, and the planner's time per action.

    python benchmarks/planet_steps.py                      # PlaNet's shape: 64x64 pixels,
                                                           # 50 chunks of 50 steps
    python benchmarks/planet_steps.py --batch 16 --chunk 16 --candidates 100

One step: the RSSM filtering the chunks, PlaNet's loss plus the weight KL / N, backward, Adam.
Median of `--repeats` steps after three warm-up steps, interleaved. Planning: CEM (horizon 12,
1000 candidates, top 100, 10 iterations) from one latent state. JSON out.
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
from blayers.lab.control.planner import cem
from blayers.lab.models.rssm import WorldModel


def make_model(transition, args):
    keras.utils.set_random_seed(0)
    shape = (args.size, args.size, 3) if args.pixels else (args.state_size,)
    return WorldModel(
        shape,
        args.action_dim,
        deterministic_size=200,
        stochastic_size=30,
        hidden_units=200,
        transition_layer=transition,
    )


def make_step(model):
    optimizer = keras.optimizers.Adam(1e-3, epsilon=1e-4, clipnorm=1000.0)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(observations, actions, rewards):
        with tf.GradientTape() as tape:
            terms = model((observations, actions, rewards))
            _, kl = objectives.split_losses(model)
            loss, _ = model.objective(terms, kl, num_sequences=1e4)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def make_plan(model, args):
    @tf.function
    def plan(state):
        def rollout_return(states, actions):
            return tf.reduce_sum(model.reward(model.imagine(states, actions)), axis=1)

        return cem(
            state,
            rollout_return,
            args.action_dim,
            horizon=12,
            candidates=args.candidates,
            top_k=max(args.candidates // 10, 1),
            iterations=10,
        )[0]

    return plan


def median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1000 * float(np.median(times)), 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--pixels", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--state_size", type=int, default=17)
    parser.add_argument("--action_dim", type=int, default=6, help="cheetah-run's")
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/planet_steps.json")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    shape = (args.size, args.size, 3) if args.pixels else (args.state_size,)
    batch = (
        tf.constant(rng.uniform(-0.5, 0.5, (args.batch, args.chunk, *shape)), tf.float32),
        tf.constant(rng.uniform(-1, 1, (args.batch, args.chunk, args.action_dim)), tf.float32),
        tf.constant(rng.normal(size=(args.batch, args.chunk)), tf.float32),
    )
    results = {"config": vars(args)}
    steps, plans = {}, {}
    for label, transition in (("deterministic", "Dense"), ("bayesian", "DenseReparameterization")):
        model = make_model(transition, args)
        steps[label], plans[label] = make_step(model), make_plan(model, args)
        state = model.initial_state(1)
        for _ in range(3):
            steps[label](*batch).numpy()
            plans[label](state).numpy()
        results[label] = {
            "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables))
        }
        plans[label] = (plans[label], state)
    times = {label: [] for label in steps}
    for _ in range(args.repeats):
        for label, step in steps.items():
            times[label].append(median_ms(lambda step=step: step(*batch).numpy(), 1))
    for label in steps:
        plan, state = plans[label]
        results[label]["ms_per_train_step"] = round(float(np.median(times[label])), 1)
        results[label]["ms_per_action"] = median_ms(
            lambda plan=plan, state=state: plan(state).numpy(), args.repeats
        )
        print(
            f"{label:14s} {results[label]['ms_per_train_step']:9.1f} ms/step  "
            f"{results[label]['ms_per_action']:8.1f} ms/action  {results[label]['parameters']:,} parameters"
        )
    results["train_step_ratio"] = round(
        results["bayesian"]["ms_per_train_step"] / results["deterministic"]["ms_per_train_step"], 2
    )
    results["action_ratio"] = round(
        results["bayesian"]["ms_per_action"] / results["deterministic"]["ms_per_action"], 2
    )
    print(
        f"Bayesian / deterministic: {results['train_step_ratio']}x per training step, "
        f"{results['action_ratio']}x per action"
    )
    write_json(results, args.out)


if __name__ == "__main__":
    main()
