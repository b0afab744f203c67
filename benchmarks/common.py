"""Shared by the benchmark scripts: a timed training step of one layer, and JSON (and
Markdown) output.

Importing it gives the process the command lines' XLA vector width (`blayers.xla_cpu`: 512-bit
on an AVX-512 CPU unless `XLA_FLAGS` names one), before anything compiles: a benchmark times the
layers as `python -m blayers.train` runs them, and its JSON records the `XLA_FLAGS` it ran with
(`XLA_FLAGS=--xla_cpu_prefer_vector_width=256` times XLA's default instead)."""

import contextlib
import json
import os
import time

from blayers import xla_cpu

xla_cpu.prefer_wide_vectors()  # XLA reads its flags at its first compilation

import keras
import numpy as np
import tensorflow as tf


def make_train_step(layer, input_shape, jit_compile=False, optimizer="adam"):
    """`step(x, y)`: forward, squared error + KL / 50,000, backward and an update (`'adam'`,
    Keras' Adam; `'blayers_adam'`, `blayers.optimizers.Adam`, one fused kernel a variable; or
    `'sgd'`: one multiply-subtract a parameter, the cheapest update)."""
    import blayers

    layer.build(input_shape)
    optimizer = {
        "adam": keras.optimizers.Adam,
        "blayers_adam": blayers.optimizers.Adam,
        "sgd": keras.optimizers.SGD,
    }[optimizer](1e-3)
    optimizer.build(layer.trainable_variables)

    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.convert_to_tensor(layer(x)) - y))
            if layer.losses:
                loss += tf.add_n(layer.losses) / 50_000.0
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply(grads, layer.trainable_variables)
        return loss

    return step


def time_step(step, x, y, repeats, warmup=5):
    """Median milliseconds of `step(x, y)` over `repeats` calls after `warmup`."""
    for _ in range(warmup):
        step(x, y)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(x, y).numpy()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def write_json(results, path):
    """Writes `results` to `path` (creating its folder) and says where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {path}")


def machine():
    """The machine a benchmark ran on: cores, Python, and the processor's model and widest
    vector unit where Linux says (the same code ran 3x slower on a 2 GHz AVX2 EPYC than on the
    machine of the earlier tables)."""
    import platform

    info = {"cpus": os.cpu_count(), "python": platform.python_version()}
    info["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return info
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = fields.get("flags", "").split()
    info["processor"] = fields.get("model name", platform.processor())
    if "cpu MHz" in fields:
        info["mhz"] = round(float(fields["cpu MHz"]))
    info["vector"] = next((v for v in ("avx512f", "avx2", "avx") if v in flags), "none")
    return info


def write_results(path, payload, markdown):
    """Writes `payload` (with the machine added) as JSON to `path`, `markdown` beside it
    (`.md`), and prints the Markdown."""
    payload = {"machine": machine(), **payload}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(markdown)
    print(markdown)


@contextlib.contextmanager
def without_noise():
    """Inside, blayers' estimators draw no noise: Normal draws are zeros and Flipout's sign
    flips are the identity. Steps traced inside keep this (the breakdown's "draw" is a step's
    time minus that of the same step traced here)."""
    from blayers import sampling
    from blayers.layers import estimators

    def zeros(shape, seed, dtype=tf.float32, keys=None):
        # A fill that depends on the seed: a constant zero would let Grappler fold away the
        # products with the noise (and their gradients), which are not the draw's cost.
        del keys
        return tf.fill(shape, tf.cast(tf.convert_to_tensor(seed)[0] * 0, dtype))

    def identity(x, seed, example_axes=1, keys=None):
        del seed, example_axes, keys
        return x

    patches = [
        (sampling, "standard_normal", zeros),
        (estimators, "standard_normal", zeros),
        (estimators, "flip_signs", identity),
        (
            estimators,
            "rademacher",
            lambda shape, seed, dtype=tf.float32, keys=None: tf.ones(shape, dtype),
        ),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def ablation_kwargs(no_softplus=False, no_kl=False, weights=("kernel",)):
    """blayers keyword arguments removing one part of a step for each weight (argument prefix
    in `weights`, e.g. `("kernel", "recurrent")` for an LSTM cell): the softplus replaced by
    `max(rho, 1e-7)` (`stddev_constraint='positive'`, one cheap pass), the KL by none."""
    import blayers

    kwargs = {}
    for weight in weights:
        if no_softplus:
            kwargs[f"{weight}_initializer"] = blayers.initializers.TrainableNormal(
                stddev_constraint="positive"
            )
        if no_kl:
            kwargs[f"{weight}_regularizer"] = None
    return kwargs


def breakdown_steps(make_layer, input_shape, x, y):
    """The steps of one estimator's breakdown, each removing one part of the full step:
    `{'full', 'no draw', 'no softplus', 'no KL', 'SGD'}` -> `step(x, y)` (traced), and the full
    step with blayers' fused Adam (`'blayers Adam'`).

    `make_layer(no_softplus=False, no_kl=False)` builds the layer (see `ablation_kwargs`); Adam
    is replaced by SGD, and the draw by a fill of zeros (`without_noise`)."""
    steps = {
        "full": make_train_step(make_layer(), input_shape),
        "no softplus": make_train_step(make_layer(no_softplus=True), input_shape),
        "no KL": make_train_step(make_layer(no_kl=True), input_shape),
        "SGD": make_train_step(make_layer(), input_shape, optimizer="sgd"),
        "blayers Adam": make_train_step(make_layer(), input_shape, optimizer="blayers_adam"),
    }
    with without_noise():
        steps["no draw"] = make_train_step(make_layer(), input_shape)
        steps["no draw"](x, y)  # traced here, with the noise patched out
    return steps


PARTS = (
    ("draw", "no draw"),
    ("softplus", "no softplus"),
    ("KL", "no KL"),
    ("Adam over SGD", "SGD"),
)


def parts_ms(rounds, name):
    """`{part: ms}`: the full step's time minus the step's without each part, the median over
    rounds of the difference within a round (`interleaved_times`), which cancels the machine's
    slow drifts."""
    full = np.asarray(rounds[f"{name} | full"])
    return {
        part: round(float(np.median(full - np.asarray(rounds[f"{name} | {key}"]))), 2)
        for part, key in PARTS
    }


def round_ratio(rounds, name, baseline):
    """The median over rounds of `name`'s time over `baseline`'s in the same round
    (`interleaved_times`): the machine's drifts between rounds (`Dense` alone moved 4.4-5.9 ms
    between runs here) cancel in each round's ratio."""
    return float(np.median(np.asarray(rounds[name]) / np.asarray(rounds[baseline])))


def interleaved_times(steps, x, y, repeats, rounds):
    """`{name: [ms, one a round]}`: each `step(x, y)`'s median of `repeats` calls, the steps
    timed in turn `rounds` times, so that the machine's drifts fall on all alike."""
    ms = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            ms[name].append(time_step(step, x, y, repeats))
    return ms
