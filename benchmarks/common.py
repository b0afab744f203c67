"""Shared by the benchmark scripts: a timed training step of one layer, and JSON (and
Markdown) output."""

import json
import os
import time

import keras
import numpy as np
import tensorflow as tf


def make_train_step(layer, input_shape, jit_compile=False):
    """`step(x, y)`: forward, squared error + KL / 50,000, backward and an Adam update."""
    layer.build(input_shape)
    optimizer = keras.optimizers.Adam(1e-3)
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
