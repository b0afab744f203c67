"""Replicated training against its bare maths: steps per second of the UCI experiment's learner
(`SupervisedLearner` on replicas under the Loop, as `experiments.uci_regression` runs it) beside a reference
written here as one bare `tf.function` of the same maths on resident tensors (no Keras layers, no
Loop: variables, a per-replica gather, dropout, the Gaussian NLL, the weight decay or KL, and
Adam written out, 50 steps a call). Runs alternate between the two in one process
(`--rounds` times each), and each rate is the median of a run's logging intervals after the
first (which holds the tracing).

Two shapes:

* `mc_dropout`: the MC dropout validation stage on a kin8nm-sized set (8,192 rows x 8 features:
  each split's training rows less a validation fifth, 5,898 rows), 20 splits x the 12-point
  grid = 240 replicas of 8 -> 50 -> 1 with dropout before each dense layer, batches of 128;
* `svgp`: the sparse GP at concrete's final shape (927 rows x 8 features, 20 splits as
  replicas, 100 inducing points, full batches; float64 factorization as the layer's).

It also projects MC dropout's whole published protocol on the kin8nm-sized set from the rates:
the validation stage (240 replicas, 4,000 epochs of 47 batches) and the final fits (20
replicas, 4,000 epochs of 58 batches), and the steps per call (`--steps_per_execution`, the
Loop's setting) by the same alternation.

    python benchmarks/replica_steps.py --out benchmarks/results/replica_steps.json
"""

import argparse
import json
import math
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from common import machine, write_json
from replicated_uci import _data, _rate, grid_replicas, replicated_gp_learner

from blayers.lab import loop
from blayers.lab.learners.supervised import SupervisedLearner
from blayers.lab.models import mc_dropout_decay, mc_dropout_regressor
from blayers.lab.tasks.base import features, targets

FEATURES, HIDDEN, BATCH, EPOCHS = 8, 50, 128, 4000
KIN8NM_ROWS = 8192
GRID_ROWS = int(KIN8NM_ROWS * 0.9 * 0.8)  # a split's training rows less the validation fifth
FINAL_ROWS = int(KIN8NM_ROWS * 0.9)
VALIDATION_ROWS = FINAL_ROWS - GRID_ROWS  # the validation fifth the grid is ranked on
TEST_ROWS = KIN8NM_ROWS - FINAL_ROWS
RATES, TAUS = (0.005, 0.01, 0.05, 0.1), (150.0, 200.0, 250.0)  # kin8nm's grid
GP_ROWS, GP_REPLICAS, INDUCING = 927, 20, 100
LOG_2PI = float(np.log(2 * np.pi))


def mc_dropout_replicas(replicas, rows, test_rows=100):
    """`replicas` replicas of the kin8nm-shaped grid: 20 splits x (rate, tau)."""
    return grid_replicas(replicas, rows, RATES, TAUS, test_rows)


def mc_dropout_learner(replicas, rows, test_rows=100, num_eval_samples=1):
    return SupervisedLearner(
        data=mc_dropout_replicas(replicas, rows, test_rows),
        model=lambda shape, outputs, replicas: mc_dropout_regressor(
            shape, outputs, hidden_units=(HIDDEN,), replicas=replicas
        ),
        optimizer=lambda: keras.optimizers.Adam(1e-3),
        batch_size=BATCH,
        num_eval_samples=num_eval_samples,
    )


def evaluation_seconds(replicas, rows, test_rows, draws):
    """Seconds of the learner's evaluation at a stage's shape: `draws` Monte Carlo passes over
    each replica's `test_rows` (the grid's validation fifth, the final fits' test tenth)."""
    learner = mc_dropout_learner(replicas, rows, test_rows, draws)
    with tempfile.TemporaryDirectory() as model_dir:
        loop.train(model_dir, learner=learner, train_steps=1, progress=False)
    began = time.perf_counter()
    learner.evaluate()
    return time.perf_counter() - began


def svgp_learner():
    """SVGP (`deep_gp(depth=1)`) on 20 splits of concrete's final shape, as the UCI table."""
    return replicated_gp_learner(1, GP_REPLICAS)


class _Adam:
    """Adam written out (Keras' defaults: beta 0.9, 0.999, epsilon 1e-7)."""

    def __init__(self, variables, learning_rate):
        self.variables, self.lr = variables, learning_rate
        self.m = [tf.Variable(tf.zeros_like(v)) for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v)) for v in variables]
        self.t = tf.Variable(0.0)

    def apply(self, grads):
        t = self.t.assign_add(1.0)
        scale = self.lr * tf.sqrt(1.0 - 0.999**t) / (1.0 - 0.9**t)
        for var, g, m, v in zip(self.variables, grads, self.m, self.v):
            m.assign_add((g - m) * 0.1)
            v.assign_add((tf.square(g) - v) * 0.001)
            var.assign_sub(scale * m / (tf.sqrt(v) + 1e-7))


def _resident(datasets):
    """`(x [R, N, D], y [R, N, 1])`: the replicas' training rows as resident tensors."""
    x = np.stack([features(d.train) for d in datasets]).astype("float32")
    y = np.stack([targets(d.train) for d in datasets]).astype("float32")
    return tf.constant(x), tf.constant(y.reshape(len(datasets), -1, 1))


def _steps_function(loss_fn, variables, optimizer, x, y, batch):
    """The bare loop: 50 steps a call of `loss_fn(xb, yb, seed)` on batches gathered from
    resident `x`, `y` in each replica's order."""
    replicas = x.shape[0]

    @tf.function
    def steps(order, start, n):
        loss = tf.constant(0.0)
        for i in tf.range(n):
            rows = tf.reshape(
                order[:, (start + i) * batch : (start + i + 1) * batch], [replicas, batch]
            )
            xb, yb = tf.gather(x, rows, batch_dims=1), tf.gather(y, rows, batch_dims=1)
            with tf.GradientTape() as tape:
                loss = loss_fn(xb, yb, tf.stack([start + i, 7]))
            optimizer.apply(tape.gradient(loss, variables))
        return loss

    steps.replicas = replicas
    return steps


def bare_mc_dropout(replicas, rows):
    """The MC dropout network's step as bare TF: dropout before both dense layers (one uniform
    draw of each layer's inputs), ReLU, the Gaussian NLL at each replica's fixed noise, each
    replica's weight decay, Adam."""
    rng = np.random.default_rng(0)
    members = mc_dropout_replicas(replicas, rows)
    rows = members[0].data.num_train
    x, y = _resident([m.data for m in members])
    rates = tf.constant([[m.hparams["dropout_rate"]] for m in members], tf.float32)[:, :, None]
    variance = tf.constant(
        [1.0 / (m.hparams["tau"] * m.data.target_scale**2) for m in members], tf.float32
    )[:, None, None]
    decay = tf.constant(
        [
            mc_dropout_decay(1e-2, m.hparams["dropout_rate"], m.data.target_scale) / rows
            for m in members
        ],
        tf.float32,
    )

    def glorot(fan_in, fan_out):
        limit = np.sqrt(6 / (fan_in + fan_out))
        return tf.Variable(
            rng.uniform(-limit, limit, (replicas, fan_in, fan_out)).astype("float32")
        )

    w1, w2 = glorot(FEATURES, HIDDEN), glorot(HIDDEN, 1)
    b1, b2 = tf.Variable(tf.zeros([replicas, 1, HIDDEN])), tf.Variable(tf.zeros([replicas, 1, 1]))
    variables = [w1, b1, w2, b2]

    def dropout(h, seed):
        keep = tf.random.stateless_uniform(tf.shape(h), seed) >= rates
        return tf.where(keep, h / (1.0 - rates), 0.0)

    def loss_fn(xb, yb, seed):
        h = tf.nn.relu(tf.matmul(dropout(xb, seed), w1) + b1)
        mean = tf.matmul(dropout(h, seed + [0, 1]), w2) + b2
        nll = 0.5 * (LOG_2PI + tf.math.log(variance) + tf.square(yb - mean) / variance)
        penalty = tf.reduce_sum(
            decay * (tf.reduce_sum(tf.square(w1), [1, 2]) + tf.reduce_sum(tf.square(w2), [1, 2]))
        )
        return tf.reduce_sum(tf.reduce_mean(nll, [1, 2])) + penalty

    return _steps_function(loss_fn, variables, _Adam(variables, 1e-3), x, y, BATCH), rows, BATCH


def bare_svgp():
    """The sparse GP's full-batch step as bare TF: ARD exponentiated quadratic kernel, the
    float64 Cholesky of K_ZZ, whitened q(u) with a full Cholesky factor, the closed-form
    variational expectation under a learned noise, the KL, Adam."""
    rng = np.random.default_rng(0)
    data = [_data(i, GP_ROWS) for i in range(GP_REPLICAS)]
    x, y = _resident(data)
    r, m, d = GP_REPLICAS, INDUCING, FEATURES
    z = tf.Variable(rng.normal(size=(r, m, d)).astype("float32"))
    raw_amp = tf.Variable(tf.fill([r], 0.5413))
    raw_ls = tf.Variable(tf.fill([r, d], 0.5413))
    q_mean = tf.Variable(tf.zeros([r, 1, m]))
    init = np.zeros((r, 1, m, m), "float32")
    init[..., np.arange(m), np.arange(m)] = 0.5413
    q_scale = tf.Variable(init)
    raw_noise = tf.Variable(tf.fill([r], -2.944))
    variables = [z, raw_amp, raw_ls, q_mean, q_scale, raw_noise]
    eye = tf.eye(m)
    lower = tf.linalg.band_part(tf.ones([m, m]), -1, 0) - eye

    def covariance(a, b, amplitude, length_scale):
        a, b = a / length_scale[:, None, :], b / length_scale[:, None, :]
        squared = (
            tf.reduce_sum(tf.square(a), -1)[:, :, None]
            + tf.reduce_sum(tf.square(b), -1)[:, None, :]
            - 2.0 * tf.matmul(a, b, transpose_b=True)
        )
        return tf.square(amplitude)[:, None, None] * tf.exp(-0.5 * tf.maximum(squared, 0.0))

    def loss_fn(xb, yb, seed):
        del seed
        amplitude = tf.nn.softplus(tf.cast(raw_amp, tf.float64))
        length_scale = tf.nn.softplus(tf.cast(raw_ls, tf.float64))
        z64, x64 = tf.cast(z, tf.float64), tf.cast(xb, tf.float64)
        k_zz = covariance(z64, z64, amplitude, length_scale) + 1e-6 * tf.eye(m, dtype=tf.float64)
        chol = tf.linalg.cholesky(k_zz)
        a = tf.linalg.triangular_solve(chol, covariance(z64, x64, amplitude, length_scale))
        prior = tf.square(amplitude)[:, None] - tf.reduce_sum(tf.square(a), 1)
        a = tf.cast(a, tf.float32)
        scale = q_scale * lower + tf.nn.softplus(q_scale * eye) * eye
        mean = tf.transpose(tf.matmul(q_mean, a), [0, 2, 1])
        la = tf.matmul(scale[:, 0], a, transpose_a=True)
        variance = (
            tf.cast(prior, tf.float32)[..., None] + tf.reduce_sum(tf.square(la), 1)[..., None]
        )
        noise = tf.nn.softplus(raw_noise)[:, None, None]
        expected = 0.5 * (LOG_2PI + tf.math.log(noise) + (tf.square(yb - mean) + variance) / noise)
        diag = tf.linalg.diag_part(scale)
        kl = 0.5 * (
            tf.reduce_sum(tf.square(scale), [1, 2, 3])
            + tf.reduce_sum(tf.square(q_mean), [1, 2])
            - m
        ) - tf.reduce_sum(tf.math.log(diag), [1, 2])
        return tf.reduce_sum(tf.reduce_mean(expected, [1, 2])) + tf.reduce_sum(kl) / GP_ROWS

    return (
        _steps_function(loss_fn, variables, _Adam(variables, 1e-2), x, y, GP_ROWS),
        GP_ROWS,
        GP_ROWS,
    )


def bare_rate(bare, steps, seed=0):
    """Median steps/s of the bare function `(steps_fn, rows, batch)`, 50 steps a call (fewer
    at an epoch's end), over the calls after the first."""
    steps_fn, rows, batch = bare
    replicas, per_epoch = steps_fn.replicas, rows // batch
    rng = np.random.default_rng(seed)
    rates, done = [], 0
    while done < steps:
        position = done % per_epoch
        if position == 0:
            order = np.stack([rng.permutation(rows) for _ in range(replicas)])
            order = tf.constant(order, tf.int32)
        n = min(50, per_epoch - position, steps - done)
        began = time.perf_counter()
        steps_fn(order, tf.constant(position), tf.constant(n)).numpy()
        rates.append(n / (time.perf_counter() - began))
        done += n
    return float(np.median(rates[1:]))


def compare(name, make_learner, make_bare, steps, rounds, log_every, spe):
    """`rounds` alternations of the learner and the bare reference."""
    ours, bare = [], []
    reference = make_bare()
    for _ in range(rounds):
        ours.append(_rate(make_learner(), steps, log_every, spe))
        bare.append(bare_rate(reference, steps))
        print(f"{name}: learner {ours[-1]:.1f} steps/s, bare {bare[-1]:.1f}", flush=True)
    return {
        "learner_steps_per_second": float(np.median(ours)),
        "bare_steps_per_second": float(np.median(bare)),
        "bare_over_learner": float(np.median(bare) / np.median(ours)),
        "rounds": {"learner": ours, "bare": bare},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--gp_steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps_per_execution", default="1,10,50")
    parser.add_argument("--out", default="benchmarks/results/replica_steps.json")
    parser.add_argument(
        "--evaluation_only",
        action="store_true",
        help="time the protocol's evaluations and add them to --out's existing JSON",
    )
    args = parser.parse_args()
    if args.evaluation_only:
        with open(args.out) as f:
            result = json.load(f)
        protocol = result["kin8nm_protocol"]
        protocol["grid_evaluation_seconds"] = evaluation_seconds(
            240, GRID_ROWS, VALIDATION_ROWS, 1000
        )
        protocol["final_evaluation_seconds"] = evaluation_seconds(20, FINAL_ROWS, TEST_ROWS, 10000)
        protocol["total_minutes"] = (
            protocol["training_minutes"]
            + (protocol["grid_evaluation_seconds"] + protocol["final_evaluation_seconds"]) / 60
        )
        write_json(result, args.out)
        write_markdown(result, os.path.splitext(args.out)[0] + ".md")
        return
    result = {"machine": machine()}
    # The Loop's steps a call: the validation-stage learner at each setting, alternated.
    settings = [int(v) for v in args.steps_per_execution.split(",") if v]
    by_setting = {s: [] for s in settings}
    for _ in range(args.rounds if len(settings) > 1 else 0):
        for s in settings:
            by_setting[s].append(_rate(mc_dropout_learner(240, GRID_ROWS), args.steps, 50, s))
            print(f"steps_per_execution={s}: {by_setting[s][-1]:.1f} steps/s", flush=True)
    result["steps_per_execution"] = {
        str(s): float(np.median(v)) for s, v in by_setting.items() if v
    }
    spe = loop.STEPS_PER_EXECUTION
    result["mc_dropout"] = compare(
        "mc_dropout 240 replicas",
        lambda: mc_dropout_learner(240, GRID_ROWS),
        lambda: bare_mc_dropout(240, GRID_ROWS),
        args.steps,
        args.rounds,
        50,
        spe,
    )
    final = compare(
        "mc_dropout 20 replicas (final fits)",
        lambda: mc_dropout_learner(20, FINAL_ROWS),
        lambda: bare_mc_dropout(20, FINAL_ROWS),
        args.steps,
        args.rounds,
        50,
        spe,
    )
    result["mc_dropout_final"] = final
    grid_steps = EPOCHS * math.ceil(GRID_ROWS / BATCH)
    final_steps = EPOCHS * math.ceil(FINAL_ROWS / BATCH)
    result["kin8nm_protocol"] = {
        "grid_steps": grid_steps,
        "final_steps": final_steps,
        "training_minutes": (
            grid_steps / result["mc_dropout"]["learner_steps_per_second"]
            + final_steps / final["learner_steps_per_second"]
        )
        / 60,
        # The experiment's evaluations: 1,000 draws on each grid replica's validation fifth,
        # 10,000 on each final fit's test tenth.
        "grid_evaluation_seconds": evaluation_seconds(240, GRID_ROWS, VALIDATION_ROWS, 1000),
        "final_evaluation_seconds": evaluation_seconds(20, FINAL_ROWS, TEST_ROWS, 10000),
        "note": "training steps of both stages, and each stage's evaluation; start-up not included",
    }
    protocol = result["kin8nm_protocol"]
    protocol["total_minutes"] = (
        protocol["training_minutes"]
        + (protocol["grid_evaluation_seconds"] + protocol["final_evaluation_seconds"]) / 60
    )
    result["svgp"] = compare(
        "svgp 20 replicas",
        svgp_learner,
        bare_svgp,
        args.gp_steps,
        args.rounds,
        10,
        spe,
    )
    print(result, flush=True)
    write_json(result, args.out)
    write_markdown(result, os.path.splitext(args.out)[0] + ".md")


def write_markdown(result, path):
    """The docs' table of `result` (this script's JSON)."""
    rows = [
        ("MC dropout, kin8nm shape, 240 replicas (grid stage)", result["mc_dropout"]),
        ("MC dropout, kin8nm shape, 20 replicas (final fits)", result["mc_dropout_final"]),
        ("SVGP, concrete shape, 20 replicas", result["svgp"]),
    ]
    lines = [
        "| shape | learner steps/s | bare `tf.function` steps/s | bare / learner |",
        "|---|---|---|---|",
    ]
    for name, row in rows:
        lines.append(
            f"| {name} | {row['learner_steps_per_second']:.1f} "
            f"| {row['bare_steps_per_second']:.1f} | {row['bare_over_learner']:.2f} |"
        )
    protocol = result["kin8nm_protocol"]
    lines.append("")
    lines.append(
        f"MC dropout's published protocol on a kin8nm-sized set: {protocol['grid_steps']:,} "
        f"steps of the grid stage and {protocol['final_steps']:,} of the final fits, "
        f"{protocol['training_minutes']:.1f} minutes of training steps at these rates"
        + (
            f", and {protocol['grid_evaluation_seconds'] / 60:.1f} + "
            f"{protocol['final_evaluation_seconds'] / 60:.1f} minutes of evaluation (1,000 draws "
            f"on the grid's validation rows, 10,000 on the final fits' test rows): "
            f"{protocol['total_minutes']:.1f} minutes in all."
            if "total_minutes" in protocol
            else "."
        )
    )
    if result.get("steps_per_execution"):
        settings = ", ".join(
            f"{k}: {v:.0f}"
            for k, v in sorted(result["steps_per_execution"].items(), key=lambda kv: int(kv[0]))
        )
        lines.append("")
        lines.append(f"The grid stage's steps/s by `train.steps_per_execution`: {settings}.")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
