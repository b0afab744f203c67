"""Bayesian PlaNet against deterministic PlaNet (paper Figures 10 and 11).

Trains the agent of `--gin_file` (default `bayesian_planet_cheetah`) for each seed with a
`DenseReparameterization` transition and with a `Dense` one, through `launch.sweep`'s grid
runner, then writes in `--root`:

* `score.png`: return against episode, median over seeds with the 5th-95th percentile band,
  Bayesian beside deterministic (Figure 10);
* `weight_kl.png`: the Bayesian transition's weight KL / N over training (Figure 10);
* `open_loop.png`: the first Bayesian seed's open-loop prediction, true above predicted;
* `results.md`, `results.csv`, `results.json`: per model, the final evaluation return, the
  mean return of the last 10 collected episodes, the open-loop error and the velocity probe's
  R^2 (Figure 11), mean over seeds.

    python -m experiments.bayesian_planet --root=runs/planet_seeds --seeds=0,1,2,3,4
    python -m experiments.bayesian_planet --gin_file=bayesian_planet_smoke --seeds=0,1 \
        --root=runs/planet_smoke_seeds --parallel=2

Finished runs are skipped, interrupted ones resume (the sweep's behaviour).
"""

import json
import os
import shutil

import numpy as np
from absl import app, flags

from blayers.lab import plots
from blayers.lab.runs import RunDir
from launch import sweep

MODELS = {"Bayesian": "'DenseReparameterization'", "deterministic": "'Dense'"}

FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags (defined only when run as a script, so that importing
    several experiment modules in one process defines no flag twice)."""
    flags.DEFINE_string("root", "runs/bayesian_planet", "Folder of the runs and figures.")
    flags.DEFINE_string("gin_file", "bayesian_planet_cheetah", "Gin file of every run.")
    flags.DEFINE_multi_string("gin_param", [], "Gin bindings of every run.")
    flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of each model.")
    flags.DEFINE_integer("parallel", 1, "Runs at a time.")


def plan(seeds):
    """`[(run_name, bindings)]` for every (model, seed) and `{run_name: model}`."""
    runs, models = [], {}
    for model, layer in MODELS.items():
        for seed in seeds:
            name = f"{model}_seed{seed}"
            runs.append((name, {"transition": layer, "train.seed": str(seed)}))
            models[name] = model
    return runs, models


def summarize(root, results, models):
    """The figures and the table from the finished runs."""
    finished = [n for n, _, status, _ in results if status.startswith(("finished", "skipped"))]
    summaries = {}
    for name in finished:
        summaries[name] = RunDir(os.path.join(root, name)).metrics()
    curves = {}
    for name, summary in summaries.items():
        curves.setdefault(models[name], []).append(summary["episode_returns"])
    if curves:
        plots.episode_returns(curves, os.path.join(root, "score.png"))
    bayesian = sorted(n for n in summaries if models[n] == "Bayesian")
    if bayesian:
        train = RunDir(os.path.join(root, bayesian[0])).records("train")
        plots.curve(
            [h["step"] for h in train],
            [h["weight_kl_per_sequence"] for h in train],
            "training step",
            "transition weight KL / N",
            os.path.join(root, "weight_kl.png"),
        )
        shutil.copy(
            os.path.join(root, bayesian[0], "open_loop.png"), os.path.join(root, "open_loop.png")
        )
    rows = []
    for model in MODELS:
        names = [n for n in summaries if models[n] == model]
        if not names:
            continue
        finals = [summaries[n]["final"] for n in names]
        last10 = [np.mean(summaries[n]["episode_returns"][-10:]) for n in names]
        mean = lambda key, finals=finals: float(np.mean([f[key] for f in finals]))
        rows.append(
            {
                "model": model,
                "seeds": len(names),
                "eval_return": mean("eval_return"),
                "last10_return": float(np.mean(last10)),
                "open_loop_mse": mean("open_loop_mse"),
                "velocity_probe_r2": mean("velocity_probe_r2"),
            }
        )
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    header = ["model", "seeds", "eval return", "last 10 episodes", "open-loop MSE", "velocity R^2"]
    table = [
        [
            r["model"],
            r["seeds"],
            f"{r['eval_return']:.1f}",
            f"{r['last10_return']:.1f}",
            f"{r['open_loop_mse']:.3f}",
            f"{r['velocity_probe_r2']:.2f}",
        ]
        for r in rows
    ]
    markdown = sweep.write_table(header, table, root)
    print("\n" + markdown)
    return rows


def run_experiment(root, gin_file, gin_params, seeds, parallel):
    """Trains every (model, seed) run (skipping finished ones); writes figures and tables."""
    runs, models = plan(seeds)
    results, stopped = sweep.run_experiment_grid(
        runs,
        root,
        gin_file,
        gin_params,
        parallel,
        quiet=False,  # PlaNet's own progress=False
    )
    rows = summarize(root, results, models)
    if stopped:
        sweep.exit_stopped(root)
    return rows


def main(argv):
    del argv
    run_experiment(FLAGS.root, FLAGS.gin_file, FLAGS.gin_param, FLAGS.seeds, FLAGS.parallel)


if __name__ == "__main__":
    define_flags()
    app.run(main)
