"""XLA's CPU vector width (`blayers.xla_cpu`): the fused kernels and the dense estimators' steps
with 256-bit vectors (XLA's default) against 512-bit ones (what the command lines ask for on an
AVX-512 CPU).

XLA reads `XLA_FLAGS` once a process, so the two widths cannot be interleaved in one process:
this script runs `--pairs` pairs of child processes, alternating the widths, each child timing
the kernels on a million entries (`--repeats` calls, median of `--rounds` rounds) and the
dense estimators' training steps against Keras' `Dense` (interleaved within the child, as
`dense_estimators.py`); each figure is the median over the children of its width. `Dense`
itself runs no XLA and is the same under both widths.

    python benchmarks/xla_vector_width.py --out benchmarks/results/xla_vector_width.json
"""

import argparse
import json
import os
import subprocess
import sys
import time

KERNELS = ("threefry words", "box-muller", "softplus and square", "its gradient", "KL", "KL grads")
ESTIMATORS = ("DenseReparameterization", "DenseFlipout", "DenseLocalReparameterization")


def child(repeats, rounds):
    """Times the kernels and the steps in this process (its `XLA_FLAGS` already set)."""
    import keras
    import numpy as np
    import tensorflow as tf
    from common import interleaved_times, make_train_step

    import blayers
    from blayers import fused

    n = 1 << 20
    x = tf.random.normal([1024, 1024])
    scale = tf.abs(x) + 0.1
    seed = tf.constant([1, 2], tf.int64)
    one, zero = tf.constant(1.0), tf.constant(0.0)
    words = fused.random_words(n, seed)
    kernels = {
        "threefry words": lambda: fused.random_words(n, seed),
        "box-muller": lambda: fused.box_muller(words, None, tf.constant([1024, 1024])),
        "softplus and square": lambda: fused._softplus_and_square_xla(x),
        "its gradient": lambda: fused._softplus_and_square_grad(x, x, x, scale),
        "KL": lambda: fused._normal_kl_terms(x, scale, zero, one),
        "KL grads": lambda: fused._normal_kl_grads(one, x, scale, zero, one),
    }
    times = {name: [] for name in kernels}
    for fn in kernels.values():
        for _ in range(5):
            fn()
    for _ in range(rounds):
        for name, fn in kernels.items():
            start = time.perf_counter()
            for _ in range(repeats):
                out = fn()
            tf.nest.map_structure(lambda t: t.numpy(), out)
            times[name].append((time.perf_counter() - start) / repeats * 1e3)
    result = {"kernels_ms": {k: float(np.median(v)) for k, v in times.items()}}

    blayers.set_seed(0)
    inputs, targets = tf.random.normal([256, 1024]), tf.random.normal([256, 1024])
    steps = {"Dense": make_train_step(keras.layers.Dense(1024), (None, 1024))}
    for name in ESTIMATORS:
        steps[name] = make_train_step(getattr(blayers.layers, name)(1024), (None, 1024))
    step_rounds = interleaved_times(steps, inputs, targets, 50, rounds)
    result["steps_ms"] = {k: float(np.median(v)) for k, v in step_rounds.items()}
    result["ratio_to_dense"] = {
        name: float(np.median(np.array(step_rounds[name]) / np.array(step_rounds["Dense"])))
        for name in ESTIMATORS
    }
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="child processes per width")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/xla_vector_width.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.repeats, args.rounds)))
        return

    import numpy as np
    from common import write_results

    from blayers import xla_cpu

    if not xla_cpu.has_avx512():
        sys.exit("no AVX-512 on this CPU: the command lines keep XLA's 256-bit default here")
    runs = {256: [], 512: []}
    for _ in range(args.pairs):
        for width, children in runs.items():
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
            env["XLA_FLAGS"] = f"{xla_cpu.FLAG}={width}"
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    f"--child={width}",
                    f"--repeats={args.repeats}",
                    f"--rounds={args.rounds}",
                ],
                check=True,
                capture_output=True,
                text=True,
                env=env,
                cwd=os.path.dirname(os.path.abspath(__file__)),
            )
            children.append(json.loads(out.stdout.strip().splitlines()[-1]))

    def median(width, part, name):
        return float(np.median([run[part][name] for run in runs[width]]))

    rows = ["| a million entries | 256-bit ms | 512-bit ms |", "|---|---|---|"]
    results = {"kernels_ms": {}, "ratio_to_dense": {}, "steps_ms": {}}
    for name in KERNELS:
        pair = [round(median(w, "kernels_ms", name), 3) for w in runs]
        results["kernels_ms"][name] = dict(zip(("256", "512"), pair))
        rows.append(f"| {name} | {pair[0]:.2f} | {pair[1]:.2f} |")
    rows += ["", "| step (x Dense, ms) | 256-bit | 512-bit |", "|---|---|---|"]
    for name in ("Dense", *ESTIMATORS):
        ms = [median(w, "steps_ms", name) for w in runs]
        results["steps_ms"][name] = dict(zip(("256", "512"), (round(v, 2) for v in ms)))
        if name == "Dense":
            rows.append(f"| Dense | 1.00 ({ms[0]:.1f}) | 1.00 ({ms[1]:.1f}) |")
            continue
        ratio = [median(w, "ratio_to_dense", name) for w in runs]
        results["ratio_to_dense"][name] = dict(zip(("256", "512"), (round(v, 3) for v in ratio)))
        rows.append(f"| {name} | {ratio[0]:.2f} ({ms[0]:.1f}) | {ratio[1]:.2f} ({ms[1]:.1f}) |")
    payload = {"config": vars(args), "runs": runs, **results}
    write_results(args.out, payload, "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
