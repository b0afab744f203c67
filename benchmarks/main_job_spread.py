"""The README's main job over seeds: how far its numbers move from run to run.

The main job (`configs/digits_mlp.gin`, `DenseFlipout` and its `Dense` twin) trained with seeds
0..N-1 through `launch.sweep`; each metric's mean and standard deviation over the seeds, and
seed 0's own row (the README's command). The same seed on another machine moves by about the
seeds' spread: TensorFlow's CPU kernels sum in an order that depends on the thread count and
the instruction set, and a few hundred Adam steps amplify the last bit.

    python benchmarks/main_job_spread.py --out benchmarks/results/main_job_spread.json

Runs go to `--work_dir` (finished runs there are reused). Writes the JSON and its Markdown.
"""

import argparse
import os
import subprocess
import sys

import numpy as np
from common import write_results

from blayers.lab import runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ("DenseFlipout", "Dense")
METRICS = (
    ("accuracy", "accuracy"),
    ("nll", "NLL"),
    ("ece", "ECE"),
    ("brier", "Brier"),
    ("ood_auroc_entropy", "OOD AUROC (entropy)"),
    ("ood_auroc_mutual_information", "OOD AUROC (mutual information)"),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--work_dir", default="runs/main_job_spread")
    parser.add_argument("--out", default="benchmarks/results/main_job_spread.json")
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "blayers.launch.sweep",
            "--gin_file=digits_mlp",
            f"--sweep=mlp.dense_layer={list(LAYERS)}",
            f"--sweep=seed={seeds}",
            "--parallel=2",
            f"--root={args.work_dir}",
        ],
        cwd=REPO,
        check=True,
    )
    results = {}
    for layer in LAYERS:
        finals = [
            runs.RunDir(os.path.join(args.work_dir, f"dense_layer-{layer}_seed-{s}")).final()
            for s in seeds
        ]
        results[layer] = {
            key: {
                "seed0": finals[0].get(key),
                "mean": float(np.mean([f[key] for f in finals])) if key in finals[0] else None,
                "sd": float(np.std([f[key] for f in finals], ddof=1)) if key in finals[0] else None,
            }
            for key, _ in METRICS
        }
    header = "| model | " + " | ".join(label for _, label in METRICS) + " |"
    lines = [header, "|---" * (len(METRICS) + 1) + "|"]
    for layer in LAYERS:
        cells = []
        for key, _ in METRICS:
            value = results[layer][key]
            cells.append(
                "n/a"
                if value["mean"] is None
                else f"{value['seed0']:.3f} ({value['mean']:.3f} ± {value['sd']:.3f})"
            )
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    markdown = (
        f"Seed 0, and in brackets the mean ± standard deviation over seeds 0-{len(seeds) - 1}:\n\n"
        + "\n".join(lines)
        + "\n"
    )
    write_results(args.out, {"seeds": seeds, "results": results}, markdown)


if __name__ == "__main__":
    main()
