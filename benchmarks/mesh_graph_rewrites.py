"""The Mesh TensorFlow learner's session with and without TensorFlow's graph optimizer (grappler):
`MeshLearner(graph_rewrites=...)`, interleaved in one process.

For each case (the smoke config's model on a mesh of two logical CPUs, the same with both mesh
processors on one device, and a wider one with d_model 512 on one) and each setting, in
alternating rounds: the graph's build, the first training step (where grappler rewrites the
step's graph), the median of the next steps, and the first evaluation (teacher-forced scoring
and a few beam decodes, each a fetch grappler rewrites on its first call). `reruns_identical`: whether the two rounds of a setting logged the same
losses bit for bit (a rerun with the same seed).

    python benchmarks/mesh_graph_rewrites.py --out benchmarks/results/mesh_graph_rewrites.json
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_results

# The smoke config's Transformer, heads, d_ff and vocabulary split over two processors.
_SMOKE = {"d_model": 32, "d_ff": 64, "num_heads": 4, "num_layers": 1, "mesh": "model:2"}
CASES = {
    "smoke_model2": _SMOKE,
    # The same with both processors on one device (as the tests run the mesh in one process).
    "smoke_model2_one_device": {**_SMOKE, "devices": ["/cpu:0", "/cpu:0"]},
    "d512_model1": {
        "d_model": 512,
        "d_ff": 2048,
        "num_heads": 8,
        "num_layers": 2,
        "mesh": "model:1",
    },
}


def _one_run(case, graph_rewrites, steps):
    import gin

    from blayers.lab import runs
    from blayers.lab.data import synthetic_translation
    from blayers.lab.learners import MeshLearner
    from blayers.lab.loop import Context
    from blayers.lab.mesh.transformer import TransformerHParams

    spec = dict(CASES[case])
    mesh_shape = spec.pop("mesh")
    gin.bind_parameter("SequenceToSequence.num_decode", 8)
    gin.bind_parameter("SequenceToSequence.beam_size", 2)
    # The smoke config's data: 2,000 noisy copies of 8-token sequences, padded to 10.
    data = synthetic_translation(
        num_train=2000, num_test=64, vocab_size=13, max_length=8, noise=0.1, pad_to=10
    )
    devices = spec.pop("devices", ["/cpu:0", "/cpu:1"] if mesh_shape == "model:2" else None)
    learner = MeshLearner(
        data,
        hparams=TransformerHParams(**spec),
        mesh_shape=mesh_shape,
        devices=devices,
        batch_size=32,
        learning_rate=3e-3,
        num_eval_samples=1,
        graph_rewrites=graph_rewrites,
    )
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        learner.build(Context(runs.RunDir(folder), tf.distribute.get_strategy(), None, 0, steps))
        learner.restored()
        built = time.perf_counter()
        batches = learner.batches()
        losses = [learner.train_step(next(batches))["loss"]]
        first = time.perf_counter()
        times = []
        for _ in range(steps - 1):
            t = time.perf_counter()
            losses.append(learner.train_step(next(batches))["loss"])
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        learner.evaluate()
        evaluated = time.perf_counter() - t
        learner.close()
    gin.clear_config()
    return {
        "build_s": built - began,
        "first_step_s": first - built,
        "step_ms": 1e3 * statistics.median(times),
        "first_evaluation_s": evaluated,
        "losses": losses,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/mesh_graph_rewrites.json")
    args = parser.parse_args(argv)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    table = {}
    for case in args.cases:
        rounds = {False: [], True: []}
        for _ in range(args.rounds):
            for rewrites in (False, True):
                rounds[rewrites].append(_one_run(case, rewrites, args.steps))
        table[case] = {}
        for rewrites, runs in rounds.items():
            row = {
                key: statistics.median(r[key] for r in runs)
                for key in ("build_s", "first_step_s", "step_ms", "first_evaluation_s")
            }
            row["reruns_identical"] = all(r["losses"] == runs[0]["losses"] for r in runs)
            table[case]["on" if rewrites else "off"] = row
    lines = [
        (
            f"Medians of {args.rounds} interleaved rounds, {args.steps} steps at batch 32; "
            "`off` is the learner's default."
        ),
        "",
        (
            "| case | grappler | build (s) | first step (s) | a step (ms) "
            "| first evaluation (s) | reruns identical |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for case, settings in table.items():
        for name, row in settings.items():
            lines.append(
                f"| {case} | {name} | {row['build_s']:.2f} | {row['first_step_s']:.2f} | "
                f"{row['step_ms']:.1f} | {row['first_evaluation_s']:.2f} | "
                f"{'yes' if row['reruns_identical'] else 'no'} |"
            )
    payload = {"config": vars(args), "cases": CASES, "table": table}
    write_results(args.out, payload, "\n".join(lines) + "\n")
    return table


if __name__ == "__main__":
    main()
