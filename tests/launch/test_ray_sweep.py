"""`launch.sweep --backend=ray` (Ray Tune on a local Ray instance) and the random search's
distributions; the Ray runs are slow tests, the parsing and the missing-extra error are not.
Stopping a Ray sweep is tested with the local backend's stop test (`test_cli.py`)."""

import argparse
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from launch import local, ray_backend, sweep

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOKE = [
    "--gin_file=digits_mlp_smoke",
    "--gin_param=train.progress = False",
    "--gin_param=SupervisedLearner.num_eval_samples = 2",
]
RAY = ["--backend=ray", "--ray_num_cpus=2"]
CHILD_ENV = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get(sys.argv[2], 'unset'))"


def _sweep(args, timeout=600):
    return subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [sys.executable, "-m", "launch.sweep", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_parse_distribution_and_random_plans():
    assert sweep.parse_distribution("a.lr=loguniform(1e-4, 1e-2)") == (
        "a.lr",
        "loguniform",
        (1e-4, 1e-2),
    )
    assert sweep.parse_distribution("seed=[0, 1]") == ("seed", "choice", ([0, 1],))
    assert sweep.parse_distribution("u=choice(['Dense', 'DenseFlipout'])")[1] == "choice"
    with pytest.raises(ValueError, match="unknown distribution 'gamma'"):
        sweep.parse_distribution("x=gamma(1, 2)")
    with pytest.raises(ValueError, match="0 < low < high"):
        sweep.parse_distribution("x=loguniform(0, 1)")
    specs = ["a.lr=loguniform(1e-4, 1e-2)", "b.n=randint(1, 4)", "c.layer=['Dense', 'X']"]
    plan = sweep.plan_random(specs, 200, seed=3)
    assert plan == sweep.plan_random(specs, 200, seed=3)  # a re-run draws the same runs
    assert plan != sweep.plan_random(specs, 200, seed=4)
    assert len({name for name, _ in plan}) == 200
    lrs = np.array([float(b["a.lr"]) for _, b in plan])
    assert lrs.min() >= 1e-4 and lrs.max() <= 1e-2
    # log(lr) is uniform on [log 1e-4, log 1e-2]: its mean within 5 standard errors.
    logs = np.log(lrs)
    centre, width = math.log(1e-3), math.log(100.0)
    assert abs(logs.mean() - centre) < 5 * width / math.sqrt(12 * 200)
    assert {b["b.n"] for _, b in plan} == {"1", "2", "3"}  # randint excludes the high end
    assert {b["c.layer"] for _, b in plan} == {"'Dense'", "'X'"}  # gin text of each choice


def test_grid_search_rejects_distributions_and_local_rejects_asha(tmp_path):
    result = _sweep([*SMOKE, "--sweep", "a.lr=loguniform(1e-4, 1e-2)", "--root", str(tmp_path)])
    assert result.returncode == 2 and "needs --search=random" in result.stderr
    result = _sweep([*SMOKE, "--sweep", "seed=[0]", "--scheduler=asha", "--root", str(tmp_path)])
    assert result.returncode == 2 and "--scheduler=asha needs --backend=ray" in result.stderr


def test_ray_backend_without_ray_names_the_extra(monkeypatch):
    from launch import ray_backend

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(SystemExit, match=r"\.\[ray\]"):
        ray_backend.require_ray()


def test_history_records_become_tune_metrics(tmp_path):
    from launch.ray_backend import _records, flatten_record

    path = tmp_path / "history.jsonl"
    path.write_text('{"kind": "eval", "step": 5, "nll": 0.5, "note": "x"}\n{"kind": "tr')
    records, offset = _records(str(path), 0)
    assert [flatten_record(r) for r in records] == [{"step": 5, "eval/nll": 0.5}]
    with open(path, "a") as f:  # the half-written line completes
        f.write('ain", "step": 6, "loss": 1.0}\n')
    records, _ = _records(str(path), offset)
    assert [flatten_record(r) for r in records] == [{"step": 6, "train/loss": 1.0}]


@pytest.mark.parametrize("cpus,threads", [(4, "4"), (0.5, "1")])
def test_ray_trainers_get_tensorflow_threads_for_their_cpus(tmp_path, monkeypatch, cpus, threads):
    """A trial's trainer starts with `--cpus_per_run` TensorFlow threads (packed trials would
    otherwise each size their pools to the node); a variable the user set is kept."""
    args = argparse.Namespace(
        cpus_per_run=cpus, strategy=None, tpu=None, gin_file=["digits_mlp_smoke"], gin_param=[]
    )
    (spec,) = ray_backend.trial_specs([("run0", {"seed": "0"})], args, str(tmp_path), None)
    assert spec["threads"] == max(1, int(cpus)) and "--gin_file=digits_mlp_smoke" in spec["command"]
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "7")
    seen = {}
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        out = tmp_path / name
        child = [sys.executable, "-c", CHILD_ENV, str(out), name]
        with open(tmp_path / "log.txt", "a") as log:
            trainer = ray_backend._Trainer(child, log, None, local.thread_env(spec["threads"]))
        trainer.process.wait(timeout=60)
        seen[name] = out.read_text()
    assert seen == {"TF_NUM_INTRAOP_THREADS": threads, "TF_NUM_INTEROP_THREADS": "7"}


@pytest.mark.slow
def test_ray_grid_matches_the_local_table_and_skips_finished_runs(tmp_path):
    """A 2-point grid as Tune trials on a local Ray instance: one finishes, one fails (an
    unknown layer) without stopping it; the table is the local backend's; a re-run skips."""
    args = [
        *SMOKE,
        *RAY,
        "--gin_param=train.train_steps = 30",
        "--sweep",
        "mlp.dense_layer=['DenseFlipout', 'NoSuchLayer']",
        "--parallel=2",
        "--root",
        str(tmp_path),
    ]
    result = _sweep(args)
    assert result.returncode == 1, result.stderr[-3000:]
    # The local Ray instance's session folder and processes are gone with the sweep.
    session = re.search(r"Local Ray instance in (\S+) ", result.stdout).group(1)
    assert not os.path.exists(session)
    assert not ray_backend._processes_under(session)
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert rows[0].startswith("run,mlp.dense_layer,status,accuracy,nll,ece")
    assert "finished" in rows[1] and "failed" in rows[2]
    assert (
        "Unknown layer 'NoSuchLayer'"
        in (tmp_path / "dense_layer-NoSuchLayer" / "log.txt").read_text()
    )
    metrics = json.loads((tmp_path / "dense_layer-DenseFlipout" / "metrics.json").read_text())
    assert metrics["status"] == "finished" and metrics["step"] == 30
    again = _sweep(args)
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert "skipped (finished)" in rows[1] and again.returncode == 1


def test_sweep_exit_code_counts_early_stops_as_success():
    def row(status):
        return ("run", {}, status, {})

    finished, skipped = row("finished"), row("skipped (finished)")
    early = row("stopped early (asha, last report at step 50; checkpointed)")
    assert sweep.exit_code([finished, skipped, early]) == 0
    assert sweep.exit_code([finished, early, row("failed (exit 1, see run/log.txt)")]) == 1
    assert sweep.exit_code([row("not started (sweep stopped)")]) == 1


@pytest.mark.slow
def test_ray_random_search_with_asha_stops_poor_trials(tmp_path):
    """4 trials of a log-uniform learning rate; ASHA on the trainer's `eval/nll` reports stops
    the poor ones early (checkpointed, so a re-run could resume them)."""
    args = [
        *SMOKE,
        *RAY,
        "--gin_param=train.train_steps = 200",
        "--gin_param=train.eval_every = 25",
        "--search=random",
        "--num_samples=4",
        "--sweep",
        "make_optimizer.learning_rate=loguniform(1e-6, 1e-1)",
        "--scheduler=asha",
        "--metric=eval/nll",
        "--mode=min",
        "--parallel=0",
        "--root",
        str(tmp_path),
    ]
    result = _sweep(args)
    # Stopped early is the scheduler's verdict, not a failure.
    assert result.returncode == 0, result.stderr[-3000:]
    rows = (tmp_path / "results.csv").read_text().splitlines()[1:]
    assert len(rows) == 4 and all(r.startswith("trial00") for r in rows)
    finished = [r for r in rows if ",finished," in r]
    stopped = [r for r in rows if "stopped early (asha" in r]
    assert finished and stopped and len(finished) + len(stopped) == 4
    for row in stopped:
        run_dir = tmp_path / row.split(",")[0]
        assert list((run_dir / "checkpoints").glob("ckpt-*.index"))
        assert not (run_dir / "metrics.json").exists()
