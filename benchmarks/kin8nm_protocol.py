"""MC dropout's whole published protocol on a kin8nm-sized set, end to end, timed.

kin8nm (8,192 rows x 8 features, the forward kinematics of an 8-link robot arm) is not in every
user's UCI folder, so this writes a synthetic set of its shape in the 20-split format (90/10
splits as Hernandez-Lobato & Adams'): 8 joint angles uniform in [-pi/2, pi/2], the target the
distance of an 8-link planar arm's end from a fixed point plus Gaussian noise (kin8nm's own
construction in spirit, its "fairly linear, moderate noise" variant). Then one command runs what
a user runs:

    python -m blayers.experiments.uci_regression --uci_dir=<folder> --datasets=kin8nm \\
        --methods=mc_dropout

(the 12-point validation grid of all 20 splits as one run of 240 replicas, then the 20 final
fits as one run), and the wall-clock minutes of the whole command, of each stage's training
steps and of everything else (start-up, evaluations, tables) are written:

    python benchmarks/kin8nm_protocol.py --out benchmarks/results/kin8nm_protocol.json

`--epochs` shortens the protocol (for a quick check; the JSON says which was run).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from common import machine, write_json

ROWS, FEATURES, SPLITS = 8192, 8, 20


def write_kin8nm_like(folder, seed=0):
    """A kin8nm-shaped set in the 20-split format under `folder/kin8nm`; returns that path."""
    rng = np.random.default_rng(seed)
    angles = rng.uniform(-np.pi / 2, np.pi / 2, (ROWS, FEATURES))
    lengths = np.linspace(0.25, 0.1, FEATURES)
    cumulative = np.cumsum(angles, 1)
    end = np.stack([(lengths * np.cos(cumulative)).sum(1), (lengths * np.sin(cumulative)).sum(1)])
    target = np.hypot(end[0] - 0.5, end[1] - 0.3) + rng.normal(0, 0.05, ROWS)
    path = os.path.join(folder, "kin8nm")
    os.makedirs(path, exist_ok=True)
    np.savetxt(os.path.join(path, "data.txt"), np.column_stack([angles, target]), fmt="%.6f")
    np.savetxt(os.path.join(path, "index_features.txt"), np.arange(FEATURES), fmt="%d")
    np.savetxt(os.path.join(path, "index_target.txt"), [FEATURES], fmt="%d")
    for split in range(SPLITS):
        order = rng.permutation(ROWS)
        train = ROWS * 9 // 10
        np.savetxt(os.path.join(path, f"index_train_{split}.txt"), order[:train], fmt="%d")
        np.savetxt(os.path.join(path, f"index_test_{split}.txt"), order[train:], fmt="%d")
    with open(os.path.join(path, "n_splits.txt"), "w") as f:
        f.write(f"{SPLITS}\n")
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None, help="default: the published 4,000")
    parser.add_argument("--out", default="benchmarks/results/kin8nm_protocol.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        uci_dir, root = os.path.join(tmp, "uci"), os.path.join(tmp, "runs")
        write_kin8nm_like(uci_dir)
        command = [
            sys.executable,
            "-m",
            "blayers.experiments.uci_regression",
            f"--uci_dir={uci_dir}",
            f"--root={root}",
            "--datasets=kin8nm",
            "--methods=mc_dropout",
        ]
        if args.epochs:
            command.append(f"--epochs={args.epochs}")
        began = time.perf_counter()
        subprocess.run(command, check=True)
        wall = time.perf_counter() - began
        with open(os.path.join(root, "results.json")) as f:
            (row,) = [r for r in json.load(f) if r["dataset"] == "kin8nm"]
    # The published kin8nm numbers are the real set's; this one is synthetic.
    row = {k: v for k, v in row.items() if not k.startswith(("published", "meets_published"))}
    training = row.get("train_hours", 0.0) * 3600 or None
    result = {
        "machine": machine(),
        "command": " ".join(["python", *command[1:3], "--uci_dir=<folder>", *command[5:]]),
        "epochs": args.epochs or 4000,
        "wall_minutes": wall / 60,
        "training_minutes": training / 60 if training else None,
        "row": row,
    }
    print(json.dumps(result, indent=1), flush=True)
    write_json(result, args.out)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(
            f"MC dropout's protocol on a kin8nm-sized synthetic set ({ROWS:,} rows x {FEATURES} "
            f"features, {SPLITS} splits, the 12-point grid, {result['epochs']:,} epochs), one "
            f"command end to end: {result['wall_minutes']:.1f} minutes wall on "
            f"{result['machine'].get('cpus', '?')} cores"
            + (f", {result['training_minutes']:.1f} of them training steps" if training else "")
            + f"; test LL {row['test_ll']:.2f}, RMSE {row['rmse']:.3f}.\n"
        )


if __name__ == "__main__":
    main()
