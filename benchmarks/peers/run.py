"""Peers in one harness: blayers and each peer on the same work, interleaved rounds.

Each framework runs in its own subprocess (tf-keras and Keras 3 cannot share one; GPflow needs
numpy < 2 and so its own TensorFlow): `blayers` and `tfp_layers` (`TF_USE_LEGACY_KERAS=1`, the
tf-keras TFP installs) in this Python; `gpflow` and `bayesian_torch` in virtual environments the
harness creates once and caches (`--venv_dir`, default `~/.cache/blayers/peers`). A peer that
cannot install or import is reported with the reason, never dropped. Round `r` runs the
frameworks in a rotated order; the table holds medians over rounds of each worker's median step
time (`cases.py`: the shapes, data, objectives), absolute and as a ratio to the framework's own
deterministic twin.

    python benchmarks/peers/run.py --out benchmarks/results/peers.json        # all, 3 rounds
    python benchmarks/peers/run.py --frameworks blayers,tfp_layers --families dense,conv

Writes the JSON and, beside it, the Markdown table (`.md`).
"""

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cases

REPO = os.path.dirname(os.path.dirname(HERE))
FRAMEWORKS = {
    "blayers": {"worker": "blayers_worker.py", "families": ("dense", "conv", "svgp")},
    "tfp_layers": {
        "worker": "tfp_layers_worker.py",
        "families": ("dense", "conv"),
        "env": {"TF_USE_LEGACY_KERAS": "1"},
    },
    "gpflow": {
        "worker": "gpflow_worker.py",
        "families": ("svgp",),
        # GPflow 2.11 needs numpy < 2: TF 2.18 still takes numpy 1.26, and TFP 0.25 needs it.
        "requirements": [
            "gpflow==2.11.2",
            "tensorflow==2.18.1",
            "tensorflow-probability[tf]==0.25.0",
            "numpy<2",
        ],
    },
    "bayesian_torch": {
        "worker": "torch_worker.py",
        "families": ("dense", "conv"),
        "requirements": ["torch", "bayesian-torch==0.5.0"],
    },
}
LABELS = {
    "blayers": "blayers",
    "tfp_layers": "tfp.layers",
    "gpflow": "GPflow",
    "bayesian_torch": "bayesian-torch",
}


def ensure_venv(name, requirements, venv_dir, timeout):
    """`(python, None)` of a cached virtual environment with `requirements`, or
    `(None, reason)` when it cannot be created."""
    path = os.path.join(venv_dir, name)
    python = os.path.join(path, "bin", "python")
    stamp = os.path.join(path, ".ready")
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()
    if os.path.exists(stamp):
        with open(stamp) as f:
            if f.read() == digest:
                return python, None
    print(
        f"[peers] creating the {name} environment in {path} ({' '.join(requirements)})", flush=True
    )
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", path],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        result = subprocess.run(
            [python, "-m", "pip", "install", "--quiet", *requirements],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None, f"pip install did not finish in {timeout} s"
    except (OSError, subprocess.CalledProcessError) as error:
        return None, f"could not create the environment: {error}"
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        return None, "pip install failed: " + " / ".join(lines[-3:])[:400]
    with open(stamp, "w") as f:
        f.write(digest)
    return python, None


def compare_main(
    argv,
    doc,
    venv,
    requirements,
    default_out,
    one_case,
    summarize,
    markdown,
    datasets=("digits", "mnist5k"),
):
    """The command line of a same-data comparison with one peer library (`laplace_compare`,
    `calibration_compare`): `one_case(dataset, seed, python, timeout)` per data set (default
    `datasets`) and seed (python: the peer's environment's interpreter, or None when it cannot
    be created), then `summarize(rows)` written as JSON and `markdown(table)` beside it.
    Returns the table."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(datasets))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default=default_out)
    parser.add_argument(
        "--venv_dir", default=os.path.expanduser(os.path.join("~", ".cache", "blayers", "peers"))
    )
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args(argv)
    # The shared output helper (benchmarks/), imported before anything here compiles with XLA:
    # it sets the command lines' XLA vector width, which the JSON's `machine` records.
    sys.path.insert(0, os.path.dirname(HERE))
    from common import write_results

    python, reason = ensure_venv(venv, requirements, args.venv_dir, args.timeout)
    if python is None:
        print(f"[{venv}] the peer is not available: {reason}", flush=True)
    rows = []
    for name in args.datasets.split(","):
        for seed in range(args.seeds):
            rows.append(one_case(name, seed, python, args.timeout))
            print(f"[{venv}] {name} seed {seed}: {json.dumps(rows[-1])}", flush=True)
    table = summarize(rows)
    write_results(
        args.out,
        {"requirements": requirements, "unavailable": reason, "rows": rows, "table": table},
        markdown(table),
    )
    return table


def groups_by_dataset(rows, peer):
    """`(dataset, rows)` in the rows' order, each with the rows where `peer` ran (its entry is
    a dict, not the reason it did not)."""
    for name in dict.fromkeys(r["dataset"] for r in rows):
        yield name, [r for r in rows if r["dataset"] == name and isinstance(r[peer], dict)]


def call_worker(python, worker, args, timeout):
    """Runs `worker` (a script beside this one) with the peer's `python`: its last
    `RESULT {json}` line as a dict, or an `error: ...` string naming its exit and stderr."""
    result = subprocess.run(  # noqa: PLW1510 - the output is read below
        [python, os.path.join(HERE, worker), *args], capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = " / ".join(result.stderr.strip().splitlines()[-2:])[:400]
        return f"error: the worker failed (exit {result.returncode}): {tail}"
    return json.loads(lines[-1][len("RESULT ") :])


def run_worker(python, framework, names, repeats, timeout):
    spec = FRAMEWORKS[framework]
    env = {**os.environ, **spec.get("env", {}), "PYTHONPATH": REPO}
    command = [
        python,
        os.path.join(HERE, spec["worker"]),
        "--cases",
        ",".join(names),
        "--repeats",
        str(repeats),
    ]
    try:
        result = subprocess.run(  # noqa: PLW1510 - the exit code is read below
            command, capture_output=True, text=True, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {n: f"error: the worker did not finish in {timeout} s" for n in names}
    for line in reversed(result.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = " / ".join(result.stderr.strip().splitlines()[-2:])[:400]
    return {n: f"error: the worker failed (exit {result.returncode}): {tail}" for n in names}


def summarize(rounds, frameworks, names):
    """Medians over rounds; errors kept (the last one) where a case never ran."""
    table = {}
    for framework in frameworks:
        table[framework] = {}
        for name in names:
            values = [r[framework].get(name) for r in rounds if framework in r]
            numbers = [v for v in values if isinstance(v, (int, float))]
            table[framework][name] = (
                float(np.median(numbers))
                if numbers
                else (next((v for v in reversed(values) if v is not None), None))
            )
    return table


def markdown(table, frameworks, names):
    header = ["case"]
    for framework in frameworks:
        header += [f"{LABELS[framework]} ms", "x twin"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        family = name.split("_", 1)[0]
        cells = [name]
        for framework in frameworks:
            value = table[framework].get(name)
            twin = table[framework].get(f"{family}_deterministic")
            if isinstance(value, float):
                cells.append(f"{value:.1f}")
                ratio = value / twin if isinstance(twin, float) and family != "svgp" else None
                cells.append("-" if ratio is None else f"{ratio:.2f}")
            else:
                cells += ["n/a", "-"]
        rows.append("| " + " | ".join(cells) + " |")
    notes = []
    for framework in frameworks:
        errors = {v for v in table[framework].values() if isinstance(v, str)}
        errors.discard("error: not supported by this framework")
        for error in sorted(errors):
            notes.append(f"* {LABELS[framework]}: {error}")
    return "\n".join(rows + ([""] + notes if notes else [])) + "\n"


def comparisons(table):
    """blayers' absolute speed-up over tfp.layers per dense/conv estimator, and SVGP's ratio to
    GPflow (the README's goals)."""
    out = {}
    b, t, g = (table.get(k, {}) for k in ("blayers", "tfp_layers", "gpflow"))
    for name, value in b.items():
        bayesian = name.startswith(("dense_", "conv_")) and not name.endswith("deterministic")
        if bayesian and isinstance(value, float) and isinstance(t.get(name), float):
            out[f"{name}_faster_than_tfp_layers"] = 1.0 - value / t[name]
        if name.startswith("svgp_") and isinstance(value, float) and isinstance(g.get(name), float):
            out[f"{name}_time_vs_gpflow"] = value / g[name]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--families", default="dense,conv,svgp")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--venv_dir", default=os.path.expanduser("~/.cache/blayers/peers"))
    parser.add_argument("--install_timeout", type=int, default=3600)
    parser.add_argument("--worker_timeout", type=int, default=1800)
    parser.add_argument("--out", default="benchmarks/results/peers.json")
    args = parser.parse_args()
    frameworks = [f for f in args.frameworks.split(",") if f]
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown:
        parser.error(f"unknown framework(s) {unknown}; choose among {list(FRAMEWORKS)}")
    families = [f for f in args.families.split(",") if f]
    names = cases.case_names(families)

    pythons, unavailable = {}, {}
    for framework in frameworks:
        spec = FRAMEWORKS[framework]
        if "requirements" in spec:
            python, reason = ensure_venv(
                framework, spec["requirements"], args.venv_dir, args.install_timeout
            )
        else:
            python, reason = sys.executable, None
        if reason:
            unavailable[framework] = reason
            print(f"[peers] {framework} not available: {reason}", flush=True)
        else:
            pythons[framework] = python

    rounds = []
    for r in range(args.rounds):
        order = frameworks[r % len(frameworks) :] + frameworks[: r % len(frameworks)]
        results = {}
        for framework in order:
            own = [n for n in names if n.split("_", 1)[0] in FRAMEWORKS[framework]["families"]]
            if framework in unavailable:
                results[framework] = {n: f"not available: {unavailable[framework]}" for n in own}
                continue
            if own:
                results[framework] = run_worker(
                    pythons[framework], framework, own, args.repeats, args.worker_timeout
                )
                print(f"[peers] round {r + 1} {framework}: {results[framework]}", flush=True)
        rounds.append(results)

    table = summarize(rounds, frameworks, names)
    report = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "repeats": args.repeats,
        "cases": {"dense": cases.DENSE, "conv": cases.CONV, "svgp": cases.SVGP},
        "median_ms": table,
        "per_round": rounds,
        "unavailable": unavailable,
        "comparisons": comparisons(table),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    text = markdown(table, frameworks, names)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(text)
    print(text)
    for key, value in report["comparisons"].items():
        print(f"{key:48s} {value:+.3f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
