"""Trainers sharing a machine: steps per second of two training runs at a time, each with
TensorFlow's default thread pools (every core: what `--parallel=2` gave before) or with its
share of the cores (`launch.local.trainer_env`, what it gives now), against one run at a time.

Each run is a child process timing the ordinary Loop (`benchmarks/replicated_uci.py`'s
learners): the deep GPs' replicated DGP-2 at concrete's final shape (20 splits, 927 rows,
full batches), whose steps are a few large products, and the replicated MC dropout network
(20 replicas, batches of 128), whose steps are many small ops. Throughput is the summed
median rate of the runs that share the machine.

    python benchmarks/sweep_threads.py --out benchmarks/results/sweep_threads.json
"""

import argparse
import json
import os
import subprocess
import sys

from common import machine, write_json

WORKLOADS = {"dgp2": (40, 10), "mc_dropout": (1200, 200)}  # (steps, log_every)


def child(workload):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import replicated_uci as bench

    steps, log_every = WORKLOADS[workload]
    if workload == "dgp2":
        rate = bench._rate(bench.replicated_gp_learner(2, 20), steps, log_every)
    else:
        rate = bench.replicated_rate(20, steps, log_every, rows=bench.FINAL_ROWS)
    print(json.dumps({"steps_per_second": rate}))


def rates(workload, runs, env):
    """Steps/s of each of `runs` concurrent children with environment `env`."""
    command = [sys.executable, os.path.abspath(__file__), "--child", workload]
    here = os.path.dirname(os.path.abspath(__file__))
    children = [
        subprocess.Popen(command, stdout=subprocess.PIPE, env=env, cwd=here, text=True)
        for _ in range(runs)
    ]
    out = []
    for process in children:
        stdout, _ = process.communicate()
        if process.returncode:
            raise SystemExit(f"{workload} child failed ({process.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1])["steps_per_second"])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workloads", default="dgp2,mc_dropout")
    parser.add_argument("--out", default="benchmarks/results/sweep_threads.json")
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from blayers.launch.local import THREAD_VARIABLES, trainer_env

    default = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    shared = trainer_env(2, environ=default)
    rows = []
    for workload in args.workloads.split(","):
        alone = rates(workload, 1, default)
        both_default = rates(workload, 2, default)
        both_shared = rates(workload, 2, shared)
        row = {
            "workload": workload,
            "one_run_steps_per_second": alone[0],
            "two_runs_default_threads": both_default,
            "two_runs_shared_threads": both_shared,
            "threads_each_shared": int(shared[THREAD_VARIABLES[0]]),
            "x_one_at_a_time_default": sum(both_default) / alone[0],
            "x_one_at_a_time_shared": sum(both_shared) / alone[0],
            "x_shared_over_default": sum(both_shared) / sum(both_default),
        }
        rows.append(row)
        print(row, flush=True)
    write_json({"machine": machine(), "rows": rows}, args.out)
    write_table(rows, os.path.splitext(args.out)[0] + ".md")


def write_table(rows, path):
    """The docs' table: steps/s of one run, and of two runs together both ways."""
    names = {"dgp2": "DGP-2, 20 replicas", "mc_dropout": "MC dropout, 20 replicas"}
    lines = [
        (
            "| workload | one run at a time | two at a time, default threads "
            "| two at a time, a share each |"
        ),
        "|---|---|---|---|",
    ]
    for row in rows:
        alone = row["one_run_steps_per_second"]
        default, shared = row["two_runs_default_threads"], row["two_runs_shared_threads"]
        lines.append(
            f"| {names.get(row['workload'], row['workload'])} | {alone:.3g} steps/s "
            f"| {sum(default):.3g} ({row['x_one_at_a_time_default']:.2f}x) "
            f"| {sum(shared):.3g} ({row['x_one_at_a_time_shared']:.2f}x) |"
        )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
