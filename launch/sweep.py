"""Run a grid of gin bindings as trainer subprocesses, then tabulate their final metrics.

    python -m launch.sweep --gin_file=digits_mlp \
        --sweep "mlp.dense_layer=['DenseFlipout','Dense']" --sweep 'seed=[0,1,2]' \
        --parallel 2 --root runs/digits

Each point of the Cartesian product runs `python -m blayers.train` with its bindings in its own
`model_dir` under `--root` (output in `log.txt` there). A failing run does not stop the others.
The sweep writes `results.csv` and `results.md` (one row per run: its bindings, status and final
metrics) and prints the Markdown table. Re-running the same sweep skips finished runs.
"""

import argparse
import ast
import concurrent.futures
import csv
import itertools
import json
import os
import re
import subprocess
import sys

__all__ = ["main", "parse_sweep", "plan_runs", "run", "run_sweep"]

DEFAULT_COLUMNS = (
    "accuracy",
    "nll",
    "ece",
    "brier",
    "ood_auroc_entropy",
    "rmse",
    "test_log_likelihood",
    "coverage_95",
)


def _split_top_level(text):
    """Splits `a, [b, c], 'd,e'` at top-level commas."""
    parts, depth, quote, current = [], 0, None, ""
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def parse_sweep(spec):
    """`'name=[v1, v2]'` -> `(name, ['v1', 'v2'])` with each value as gin text."""
    if "=" not in spec:
        raise ValueError(f"--sweep {spec!r}: expected NAME=[VALUE, ...].")
    name, values = (s.strip() for s in spec.split("=", 1))
    if not (values.startswith("[") and values.endswith("]")):
        raise ValueError(f"--sweep {spec!r}: the values must be a [list].")
    try:
        texts = [repr(v) for v in ast.literal_eval(values)]
    except (ValueError, SyntaxError):  # gin references such as @DenseFlipout
        texts = _split_top_level(values[1:-1])
    if not texts:
        raise ValueError(f"--sweep {spec!r}: no values.")
    return name, texts


def _slug(text):
    return re.sub(r"[^A-Za-z0-9_.-]+", "", text.replace(" ", ""))[:40] or "v"


def plan_runs(sweeps):
    """`[(run_name, {name: value_text})]` for the Cartesian product of the sweeps."""
    names = [name for name, _ in sweeps]
    runs, seen = [], set()
    for values in itertools.product(*[texts for _, texts in sweeps]):
        bindings = dict(zip(names, values))
        run_name = "_".join(f"{_slug(n.split('.')[-1])}-{_slug(v)}" for n, v in bindings.items())
        run_name = run_name or "run"
        base, i = run_name, 1
        while run_name in seen:
            run_name, i = f"{base}-{i}", i + 1
        seen.add(run_name)
        runs.append((run_name, bindings))
    return runs


def _finished(model_dir):
    path = os.path.join(model_dir, "metrics.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    return summary if summary.get("status") == "finished" else None


def _run_one(run_name, bindings, args):
    model_dir = os.path.join(args.root, run_name)
    done = _finished(model_dir)
    if done:
        return run_name, bindings, "skipped (finished)", done["final"]
    os.makedirs(model_dir, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "blayers.train",
        f"--model_dir={model_dir}",
        f"--strategy={args.strategy}",
    ]
    if args.tpu:
        command.append(f"--tpu={args.tpu}")
    command += [f"--gin_file={f}" for f in args.gin_file]
    command += [f"--gin_param={p}" for p in args.gin_param]
    command += [f"--gin_param={name} = {value}" for name, value in bindings.items()]
    with open(os.path.join(model_dir, "log.txt"), "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        code = subprocess.run(command, check=False, stdout=log, stderr=subprocess.STDOUT).returncode
    done = _finished(model_dir)
    if code == 0 and done:
        return run_name, bindings, "finished", done["final"]
    return run_name, bindings, f"failed (exit {code}, see {model_dir}/log.txt)", {}


def _write_tables(rows, names, root, columns):
    metric_names = [c for c in columns if any(c in r[3] for r in rows)]
    metric_names += sorted({k for r in rows for k in r[3]} - set(metric_names))
    header = ["run", *names, "status", *metric_names]
    table = []
    for run_name, bindings, status, metrics in rows:
        table.append(
            [
                run_name,
                *[bindings[n] for n in names],
                status,
                *[f"{metrics[m]:.4f}" if m in metrics else "" for m in metric_names],
            ]
        )
    with open(os.path.join(root, "results.csv"), "w", newline="") as f:
        csv.writer(f).writerows([header, *table])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    markdown = "\n".join(lines) + "\n"
    with open(os.path.join(root, "results.md"), "w") as f:
        f.write(markdown)
    return markdown


def run_sweep(args):
    sweeps = [parse_sweep(s) for s in args.sweep]
    runs = plan_runs(sweeps)
    os.makedirs(args.root, exist_ok=True)
    print(f"Sweep of {len(runs)} run(s) under {args.root}, {args.parallel} at a time.")
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = [pool.submit(_run_one, name, bindings, args) for name, bindings in runs]
        for future in concurrent.futures.as_completed(futures):
            name, _, status, _ = future.result()
            print(f"  {name}: {status}", flush=True)
    rows = [f.result() for f in futures]
    markdown = _write_tables(rows, [n for n, _ in sweeps], args.root, DEFAULT_COLUMNS)
    print("\n" + markdown)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument(
        "--gin_param", action="append", default=[], help="binding for every run (repeatable)"
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        help="NAME=[V1, V2, ...] (repeatable; the grid is their product)",
    )
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--root", required=True, help="folder of the runs and tables")
    parser.add_argument("--strategy", default="cpu", help="passed to the trainer")
    parser.add_argument("--tpu", default=None, help="passed to the trainer (--strategy=tpu)")
    args = parser.parse_args(argv)
    rows = run_sweep(args)
    return 0 if all(not r[2].startswith("failed") for r in rows) else 1


def run():
    sys.exit(main())


if __name__ == "__main__":
    run()
