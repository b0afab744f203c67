"""Many small models as one: replica-steps per second of the replicated MC dropout network
against one model per run, on the same work.

Both go through the ordinary Loop (`blayers.lab.loop.train`), on data shaped like concrete's
validation stage (741 training rows of 8 features, batches of 128, one hidden layer of 50
units): `SupervisedLearner` on `R` replicas (each its own rows, seed, dropout rate and tau),
and `SupervisedLearner` on `mc_dropout_regressor`, which is what one run per split and grid
point does (process start-up and data loading, which separate runs also pay, are not counted).
Rates are medians over the logging intervals after the first (which includes tracing).

    python benchmarks/replicated_uci.py --out benchmarks/results/replicated_uci.json

With `--gp_depths=1,2,3` it also times the deep GPs (SVGP, DGP-2, DGP-3) at concrete's final
shape (927 rows of 8 features, full batches, 100 inducing points a layer): 20 splits as
replicas of `deep_gp` against one `deep_gp` run, and projects the 20,000 steps of
the published protocol for the 20 splits both ways.

The JSON also projects the full MC dropout protocol on concrete (20 splits x 12 grid points at
4,000 epochs on 741 rows, then 20 final fits at 4,000 epochs on 927 rows) from the measured
rates: with one model per run, and with the grid as 240 replicas and the final fits as 20.
"""

import argparse
import math
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from common import machine, write_json

from blayers.lab import loop, runs
from blayers.lab.data.base import Replica, standardized_regression
from blayers.lab.learners.supervised import SupervisedLearner
from blayers.lab.models import deep_gp, mc_dropout_regressor

ROWS, FEATURES, BATCH, EPOCHS = 741, 8, 128, 4000
FINAL_ROWS = 927
RATES = (0.005, 0.01, 0.05, 0.1)
TAUS = (0.025, 0.05, 0.075)


def _data(seed, rows=ROWS, test_rows=100):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows + test_rows, FEATURES))
    y = x @ rng.normal(size=(FEATURES, 1)) + rng.normal(size=(rows + test_rows, 1))
    return standardized_regression(f"synthetic_{seed}", x[:rows], y[:rows], x[rows:], y[rows:])


def _rate(learner, steps, log_every, steps_per_execution=loop.STEPS_PER_EXECUTION):
    """Median steps/s of `learner` under the Loop, after the first logging interval."""
    with tempfile.TemporaryDirectory() as model_dir:
        loop.train(
            model_dir,
            learner=learner,
            train_steps=steps,
            eval_every=None,
            log_every=log_every,
            checkpoint_every=10 * steps,
            progress=False,
            steps_per_execution=steps_per_execution,
        )
        records = runs.RunDir(model_dir).records("train")
    return float(np.median([r["steps_per_second"] for r in records][1:]))


def grid_replicas(replicas, rows, rates=RATES, taus=TAUS, test_rows=100):
    """`replicas` replicas of a grid search: 20 splits (synthetic) x the (rate, tau) grid."""
    datasets = [_data(i, rows, test_rows) for i in range(min(replicas, 20))]
    grid = [(p, t) for p in rates for t in taus]
    return [
        Replica(
            f"r{i}",
            datasets[i % len(datasets)],
            seed=i,
            hparams={"dropout_rate": grid[i % len(grid)][0], "tau": grid[i % len(grid)][1]},
        )
        for i in range(replicas)
    ]


def replicated_rate(replicas, steps, log_every, rows=ROWS):
    members = grid_replicas(replicas, rows)
    learner = SupervisedLearner(
        data=members,
        model=mc_dropout_regressor,
        optimizer=lambda: keras.optimizers.Adam(1e-3),
        batch_size=BATCH,
        num_eval_samples=1,
    )
    return _rate(learner, steps, log_every)


def single_rate(steps, log_every, rows=ROWS):
    data = _data(0, rows)
    learner = SupervisedLearner(
        data=data,
        model=lambda shape, outputs: mc_dropout_regressor(
            shape, outputs, dropout_rate=0.05, tau=0.05, target_scale=data.target_scale
        ),
        optimizer=lambda: keras.optimizers.Adam(1e-3),
        batch_size=BATCH,
        num_eval_samples=1,
    )
    return _rate(learner, steps, log_every)


GP_STEPS = 20_000


def replicated_gp_learner(depth, replicas):
    """`deep_gp` of `depth` layers on `replicas` synthetic splits of concrete's final shape,
    full batches, float32 Adam 0.01 (as `configs/deep_gp_uci.gin`)."""
    members = [Replica(f"split{i}", _data(i, FINAL_ROWS), seed=0) for i in range(replicas)]
    return SupervisedLearner(
        data=members,
        model=lambda shape, outputs, replicas: deep_gp(
            shape,
            outputs,
            depth=depth,
            inducing_inputs_initializer="kmeans",
            noise_variance=0.05,
            cholesky_dtype="float64",
            replicas=replicas,
        ),
        optimizer=lambda: keras.optimizers.Adam(1e-2),
        batch_size=FINAL_ROWS,
        num_eval_samples=1,
    )


def gp_rates(depth, replicas, steps, log_every):
    """`(replicated steps/s with `replicas` splits, one deep_gp run's steps/s)` at concrete's
    final shape, full batches, float32 Adam 0.01 (as `configs/deep_gp_uci*.gin`)."""
    single = SupervisedLearner(
        data=_data(0, FINAL_ROWS),
        model=lambda shape, outputs: deep_gp(
            shape, outputs, depth=depth, inducing_inputs_initializer="kmeans", noise_variance=0.05
        ),
        optimizer=lambda: keras.optimizers.Adam(1e-2),
        batch_size=FINAL_ROWS,
        num_eval_samples=1,
    )
    together = _rate(replicated_gp_learner(depth, replicas), steps, log_every)
    return together, _rate(single, steps, log_every)


def mc_dropout_part(args):
    """The MC dropout rows and the concrete protocol's projection."""
    single = single_rate(args.steps, args.log_every)
    rows = [{"replicas": 1, "steps_per_second": single, "learner": "SupervisedLearner"}]
    print(f"one model per run: {single:.0f} steps/s", flush=True)
    for r in [int(v) for v in args.replicas.split(",")]:
        rate = replicated_rate(r, args.steps, args.log_every)
        rows.append(
            {
                "replicas": r,
                "steps_per_second": rate,
                "replica_steps_per_second": r * rate,
                "x_one_model_per_run": r * rate / single,
                "learner": "SupervisedLearner (replicas)",
            }
        )
        print(f"{r} replicas: {rate:.0f} steps/s, x{r * rate / single:.1f}", flush=True)
    projection = None
    grid = [row for row in rows if row["replicas"] == 240 and row["learner"] != "SupervisedLearner"]
    if grid:  # the protocol's grid is 240 replicas
        final_rate = replicated_rate(20, args.steps, args.log_every, rows=FINAL_ROWS)
        # As experiments.uci_regression counts them: the last partial batch of an epoch counts.
        grid_steps = EPOCHS * math.ceil(ROWS / BATCH)
        final_steps = EPOCHS * math.ceil(FINAL_ROWS / BATCH)
        projection = {
            "grid_steps_per_model": grid_steps,
            "final_steps_per_model": final_steps,
            "one_model_per_run_hours": (240 * grid_steps + 20 * final_steps) / single / 3600,
            "replicated_minutes": (
                grid_steps / grid[0]["steps_per_second"] + final_steps / final_rate
            )
            / 60,
            "replicated_final_20_steps_per_second": final_rate,
            "note": "training steps only; evaluation (10,000 test draws) and start-up not included",
        }
        print(projection, flush=True)
    return rows, projection


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="1,12,60,240")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--log_every", type=int, default=100)
    parser.add_argument("--gp_depths", default="", help="e.g. 1,2,3 (default: none)")
    parser.add_argument("--gp_steps", type=int, default=60)
    parser.add_argument("--out", default="benchmarks/results/replicated_uci.json")
    args = parser.parse_args()
    gp_rows = []
    for depth in [int(d) for d in args.gp_depths.split(",") if d]:
        together, alone = gp_rates(depth, 20, args.gp_steps, args.gp_steps // 4)
        gp_rows.append(
            {
                "depth": depth,
                "replicas": 20,
                "replicated_steps_per_second": together,
                "one_run_steps_per_second": alone,
                "x_one_model_per_run": 20 * together / alone,
                "protocol_20_splits_replicated_hours": GP_STEPS / together / 3600,
                "protocol_20_splits_one_run_each_hours": 20 * GP_STEPS / alone / 3600,
            }
        )
        print(gp_rows[-1], flush=True)
    rows, projection = [], None
    if args.replicas:  # '' times the deep GPs only
        rows, projection = mc_dropout_part(args)
    previous = {}
    if os.path.exists(args.out):  # a run of one part keeps the other part's numbers
        import json

        with open(args.out) as f:
            previous = json.load(f)
    result = {"machine": machine(), "rows": rows, "concrete_protocol": projection}
    if not args.replicas:  # the MC dropout part, and the machine it ran on, as they were
        result = {**previous}
    # Each part keeps the machine it was measured on.
    if gp_rows:
        result.update(deep_gps=gp_rows, deep_gps_machine=machine())
    else:
        result.update(
            deep_gps=previous.get("deep_gps", []),
            deep_gps_machine=previous.get("deep_gps_machine", previous.get("machine")),
        )
    write_json(result, args.out)
    if gp_rows:  # the docs' table
        lines = [
            (
                "| model | steps/s, 20 replicas | steps/s, one run | x one run per split "
                "| 20,000 steps x 20 splits, replicated | one run per split |"
            ),
            "|---|---|---|---|---|---|",
        ]
        for row in gp_rows:
            name = {1: "SVGP"}.get(row["depth"], f"DGP-{row['depth']}")
            lines.append(
                f"| {name} | {row['replicated_steps_per_second']:.1f} "
                f"| {row['one_run_steps_per_second']:.1f} | {row['x_one_model_per_run']:.1f} "
                f"| {row['protocol_20_splits_replicated_hours']:.1f} h "
                f"| {row['protocol_20_splits_one_run_each_hours']:.1f} h |"
            )
        with open(os.path.splitext(args.out)[0] + "_deep_gps.md", "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
