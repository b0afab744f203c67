"""The full UCI protocol's training time on this machine, projected cell by cell.

Each stage `experiments.uci_regression` would run (replicated form: MC dropout's 12-point
validation grid and its final fits, Flipout's one stage, the GPs' 20,000 full-batch steps) is
trained for a few logging windows at its real shape (the data set's rows and features from
`--uci_dir`, every split as a replica, the published batch and model), through the same
`blayers.train` runs the experiment starts; its median step rate times the stage's planned
steps is the projection. Training steps only: evaluations (MC dropout's 10,000 test draws)
and start-up come on top, as in the experiment's `training` column, which the projection is
checked against where a cell was measured (`--measured`).

    python benchmarks/uci_projection.py --uci_dir=~/data/uci \\
        --out benchmarks/results/uci_projection.json

Writes the JSON and a Markdown table (hours per data set and method, and the total: what the
one command for every set and method would take).
"""

import argparse
import json
import os
import re
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # experiments

import numpy as np
from common import write_json

from blayers.experiments import uci_regression as uci
from blayers.lab import runs
from blayers.lab.config import find_config_file
from blayers.lab.data.uci import uci_num_splits
from blayers.launch import sweep

WINDOWS = 4  # logging windows per measurement; the first (tracing) is dropped


def _gin_steps(gin_file):
    """The gin file's `train.train_steps` (the GPs' steps, which the experiment does not bind)."""
    with open(find_config_file(gin_file)) as f:
        return int(re.search(r"^train\.train_steps\s*=\s*(\d+)", f.read(), re.MULTILINE).group(1))


def stages(method, uci_dir, dataset):
    """`[(name, bindings, planned steps)]`: the stages of `method` on `dataset`, as the
    experiment plans them (the final fits at the grid's first pair: the shape is the same)."""
    spec = uci.METHODS[method]
    planned = uci.plan(method, uci_dir, [dataset])
    if spec.grid_search:
        pair = uci.grid_pairs(method, dataset)[0]
        splits = range(uci_num_splits(dataset, uci_dir))
        planned += uci.plan(
            method, uci_dir, [dataset], selected={(dataset, s): pair for s in splits}
        )
    return [
        (
            name,
            b,
            int(b["train.train_steps"]) if "train.train_steps" in b else _gin_steps(spec.gin_file),
        )
        for name, b in planned
    ]


def step_rate(method, name, bindings, log_every, root):
    """Median steps/s of a stage's run over `WINDOWS - 1` windows after the first."""
    spec = uci.METHODS[method]
    run = f"{method}/{name}".replace("/", "_")
    measured = {
        **bindings,
        "train.train_steps": str(WINDOWS * log_every),
        "train.log_every": str(log_every),
        "train.eval_every": "None",
        "SupervisedLearner.num_eval_samples": "1",
    }
    results, stopped = sweep.run_experiment_grid([(run, measured)], root, spec.gin_file)
    if stopped or not results[0][2].startswith("finished"):
        raise SystemExit(f"{method} {name}: {results[0][2]}")
    records = runs.RunDir(os.path.join(root, run)).records("train")
    return float(np.median([r["steps_per_second"] for r in records][1:]))


def write_markdown(result, path):
    """The table of `result` (this script's JSON): a row per data set, a column per method."""
    cells = result["cells"]
    methods = list(dict.fromkeys(c["method"] for c in cells))
    datasets = list(dict.fromkeys(c["dataset"] for c in cells))
    labels = [uci.METHODS[m].label for m in methods]
    lines = ["| data set | " + " | ".join(labels) + " |", "|---" * (len(methods) + 1) + "|"]
    for dataset in datasets:
        row = []
        for method in methods:
            cell = next(c for c in cells if (c["dataset"], c["method"]) == (dataset, method))
            text = uci.duration_text(cell["projected_hours"])
            if "measured_hours" in cell:
                text += f" ({uci.duration_text(cell['measured_hours'])})"
            row.append(text)
        lines.append(f"| {dataset} | " + " | ".join(row) + " |")
    cpus = result["machine"]["cpus"]
    lines.append(
        f"\nAll {len(cells)} cells: {uci.duration_text(result['total_hours'])} of training steps on "
        f"{cpus} cores"
        + (
            " (in brackets: measured by the experiment)."
            if any("measured_hours" in c for c in cells)
            else "."
        )
    )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def _measured(path):
    """`{(dataset, method): hours}` from an experiment's `results.json` (its training column)."""
    with open(path) as f:
        return {
            (r["dataset"], r["method"]): r["train_hours"]
            for r in json.load(f)
            if r.get("train_hours") is not None
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uci_dir", default="", help="folder of the 20-split UCI sets")
    parser.add_argument("--methods", default=",".join(uci.METHODS))
    parser.add_argument("--datasets", default=",".join(uci.DATASETS))
    parser.add_argument("--network_log_every", type=int, default=100)
    parser.add_argument("--gp_log_every", type=int, default=5)
    parser.add_argument(
        "--measured", default="", help="an experiment's results.json whose training times to show"
    )
    parser.add_argument(
        "--render", action="store_true", help="only rewrite the table from the JSON at --out"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="measure only --methods x --datasets and replace those cells in --out's JSON",
    )
    parser.add_argument("--out", default="benchmarks/results/uci_projection.json")
    args = parser.parse_args()
    args.uci_dir = os.path.expanduser(args.uci_dir)
    if not args.uci_dir and not args.render:
        parser.error("--uci_dir is needed to measure (or --render to rewrite the table)")
    methods, datasets = args.methods.split(","), args.datasets.split(",")
    if args.render:  # the table again, from the JSON
        with open(args.out) as f:
            result = json.load(f)
    else:
        result = measure(args, methods, datasets)
        if args.update:
            with open(args.out) as f:
                earlier = json.load(f)
            fresh = {(c["dataset"], c["method"]) for c in result["cells"]}
            kept = [c for c in earlier["cells"] if (c["dataset"], c["method"]) not in fresh]
            order = {(c["dataset"], c["method"]): i for i, c in enumerate(earlier["cells"])}
            cells = sorted(
                kept + result["cells"],
                key=lambda c: order.get((c["dataset"], c["method"]), len(order)),
            )
            total = sum(c["projected_hours"] for c in cells)
            result = {**earlier, "cells": cells, "total_hours": total}
    if args.measured:
        measured = _measured(args.measured)
        for cell in result["cells"]:
            if (cell["dataset"], cell["method"]) in measured:
                cell["measured_hours"] = measured[(cell["dataset"], cell["method"])]
    write_json(result, args.out)
    print(write_markdown(result, os.path.splitext(args.out)[0] + ".md"))


def measure(args, methods, datasets):
    """This script's JSON: every cell's stages, their step rates and the projected hours."""
    cells = []
    with tempfile.TemporaryDirectory() as root:
        for dataset in datasets:
            for method in methods:
                spec = uci.METHODS[method]
                log_every = args.network_log_every if spec.epochs else args.gp_log_every
                cell = {"dataset": dataset, "method": method, "stages": []}
                for name, bindings, steps in stages(method, args.uci_dir, dataset):
                    rate = step_rate(method, name, bindings, log_every, root)
                    cell["stages"].append(
                        {"stage": name, "planned_steps": steps, "steps_per_second": rate}
                    )
                cell["projected_hours"] = (
                    sum(s["planned_steps"] / s["steps_per_second"] for s in cell["stages"]) / 3600
                )
                cells.append(cell)
                print(cell, flush=True)
    total = sum(c["projected_hours"] for c in cells)
    return {"machine": {"cpus": os.cpu_count()}, "cells": cells, "total_hours": total}


if __name__ == "__main__":
    main()
