"""Bayesian PlaNet against deterministic PlaNet (paper Figures 10 and 11).

Trains the agent of `--gin_file` (default `bayesian_planet_cheetah`) for each seed with a
`DenseReparameterization` transition and with a `Dense` one, through `blayers.launch.sweep`'s grid
runner, then writes in `--root`:

* `score.png`: return against episode, median over seeds with the 5th-95th percentile band,
  Bayesian beside deterministic (Figure 10);
* `weight_kl.png`: the Bayesian transition's weight KL / N over training (Figure 10);
* `open_loop.png`: the first Bayesian seed's open-loop prediction, true above predicted;
* `results.md`, `results.csv`, `results.json`: per model, the final evaluation return, the
  mean return of the last 10 collected episodes, the open-loop error and the velocity probe's
  R^2 (Figure 11), mean over seeds.

    python -m blayers.experiments.bayesian_planet --root=runs/planet_seeds --seeds=0,1,2,3,4
    python -m blayers.experiments.bayesian_planet --gin_file=bayesian_planet_smoke --seeds=0,1 \
        --root=runs/planet_smoke_seeds --parallel=2

Finished runs are skipped, interrupted ones resume (the sweep's behaviour).
"""

import json
import os
import shutil

import numpy as np
from absl import flags

from blayers.experiments.base import Experiment, ReportEntry
from blayers.lab.runs import RunDir
from blayers.launch import sweep

MODELS = {"Bayesian": "'DenseReparameterization'", "deterministic": "'Dense'"}


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
    from blayers.lab import plots  # matplotlib: not for `--help`

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


class BayesianPlanet(Experiment):
    name = "bayesian_planet"
    gin_file = "bayesian_planet_cheetah"
    quiet = False  # the runs' output is the agent's episode log
    report = ReportEntry(
        "fig10",
        "Figures 10-11: Bayesian PlaNet",
        "Cheetah-run score 614 (median over 5 seeds x 10 episodes), as the original agent.",
        order=10,
        gin_prefixes=("bayesian_planet",),
        experiments=("bayesian_planet",),
        compare=(("eval_return", 614.0, "bayesian_planet_cheetah", "cheetah-run return"),),
        command="python -m blayers.experiments.bayesian_planet --gin_file=bayesian_planet_smoke "
        "--seeds=0,1 --root=runs/planet --parallel=2",
    )

    def define_options(self):
        flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of each model.")

    def plan(self, seeds):
        self.models = plan(seeds)[1]
        return plan(seeds)[0]

    def summarize(self, root, results):
        return summarize(root, results, self.models)


EXPERIMENT = BayesianPlanet()


def run_experiment(root, gin_file, gin_params, seeds, parallel):
    """Trains every (model, seed) run (skipping finished ones); writes figures and tables."""
    return EXPERIMENT.run(root, gin_file, gin_params, parallel, seeds=seeds)


if __name__ == "__main__":
    EXPERIMENT.main()
