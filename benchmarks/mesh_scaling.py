"""Mesh TensorFlow Bayesian Transformer against mesh size (paper Figure 9's shape): training-step
time and per-device parameter + optimizer memory for meshes of 1, 2, 4 and 8 processors along
`model` (heads, d_ff and vocabulary split), Bayesian (Flipout attention, local-reparameterization
feed-forward) and deterministic.

    python benchmarks/mesh_scaling.py --out benchmarks/results/mesh_scaling.json

Here the processors are logical CPU devices carved out of one CPU, so time cannot fall with
mesh size (they share the cores); the memory column is what model parallelism buys. On GPUs
(`--devices gpu`) the time column is the real measure. Writes JSON and a PNG beside it.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_json


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--d_ff", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--devices", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--out", default="benchmarks/results/mesh_scaling.json")
    args = parser.parse_args(argv)
    if args.devices == "cpu":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * max(args.sizes)
        )
    from blayers.lab.mesh import graph as mesh_graph
    from blayers.lab.mesh.transformer import TransformerHParams

    rng = np.random.RandomState(0)
    ids = lambda: rng.randint(3, args.vocab, (args.batch, args.length)).astype(np.int32)
    batch = (ids(), ids(), ids())  # source, target_in, target_out: one fixed batch, fed
    kind = "GPU" if args.devices == "gpu" else "CPU"
    results = {"config": vars(args), "runs": []}
    for bayesian in (False, True):
        estimators = ("flipout", "local_reparameterization") if bayesian else (None, None)
        hparams = TransformerHParams(
            vocab_size=args.vocab,
            d_model=args.d_model,
            d_ff=args.d_ff,
            num_heads=args.heads,
            num_layers=args.layers,
            attention_estimator=estimators[0],
            ffn_estimator=estimators[1],
        )
        for size in args.sizes:
            devices = [f"/{kind.lower()}:{i}" for i in range(size)]
            graph = tf.Graph()
            with graph.as_default():
                run = mesh_graph.MeshRun(
                    args.length,
                    args.length,
                    hparams,
                    f"model:{size}",
                    "heads:model;d_ff:model;vocab:model",
                    devices,
                    args.batch,
                    1e-4,
                    1.0,
                    1_000_000,
                    0,
                )
                # The learner's session: the graph as lowered (`MeshLearner.graph_rewrites`).
                with tf.compat.v1.Session(config=mesh_graph.session_config()) as session:
                    session.run(run.initializer)
                    session.run(run.to_slices)
                    feed = run.feed(*batch)
                    for _ in range(2):
                        session.run(run.train_op, feed)
                    times = []
                    for _ in range(args.repeats):
                        start = time.perf_counter()
                        session.run(run.train_op, feed)
                        times.append(time.perf_counter() - start)
                memory = mesh_graph.parameter_bytes_per_device(run, include_optimizer=True)
                params = mesh_graph.parameter_bytes_per_device(run)
            row = {
                "bayesian": bayesian,
                "mesh_size": size,
                "ms_per_step": round(1000 * float(np.median(times)), 1),
                "max_device_param_mb": round(max(params.values()) / 2**20, 2),
                "max_device_param_and_optimizer_mb": round(max(memory.values()) / 2**20, 2),
            }
            results["runs"].append(row)
            print(row, flush=True)
    by = {(r["bayesian"], r["mesh_size"]): r for r in results["runs"]}
    results["bayesian_over_deterministic_time"] = {
        str(n): round(by[True, n]["ms_per_step"] / by[False, n]["ms_per_step"], 2)
        for n in args.sizes
    }
    results["bayesian_over_deterministic_params"] = round(
        by[True, args.sizes[0]]["max_device_param_mb"]
        / by[False, args.sizes[0]]["max_device_param_mb"],
        2,
    )
    print("Bayesian / deterministic time:", results["bayesian_over_deterministic_time"])
    write_json(results, args.out)
    _plot(results, os.path.splitext(args.out)[0] + ".png")


def _plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for bayesian, style in ((True, "o-"), (False, "s--")):
        rows = [r for r in results["runs"] if r["bayesian"] == bayesian]
        label = "Bayesian" if bayesian else "deterministic"
        sizes = [r["mesh_size"] for r in rows]
        left.plot(sizes, [r["ms_per_step"] for r in rows], style, label=label)
        right.plot(
            sizes, [r["max_device_param_and_optimizer_mb"] for r in rows], style, label=label
        )
    for ax, title in ((left, "step time (ms)"), (right, "per-device parameters + Adam (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("mesh size (model dimension)")
        ax.set_title(title)
        ax.legend()
    right.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
