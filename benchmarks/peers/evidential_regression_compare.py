"""blayers' deep evidential regression against torch-uncertainty's, trained on the same data with
the same network and schedule.

For each data set (scikit-learn's diabetes, 442 patients; Friedman's first function, 2,000 points
of `make_friedman1` with noise 1, a documented synthetic set) and seed, a seeded 80/20 split,
inputs and targets standardized by the training part; each library trains, from the same
initial weights (Keras' defaults, copied into the torch network: its own default
initialization, smaller on the head, gave 0.2 nats lower NLL on Friedman's set in both
libraries alike), the same MLP (two hidden layers of 64 ReLU units, Adam at 1e-3, batches of 64,
50 epochs on diabetes and 40 on Friedman) with a Normal-Inverse-Gamma output (Amini et al.,
NeurIPS 2020: `nu, beta = softplus`, `alpha = 1 + softplus`, 1e-6 floors) and the paper's loss,
the Student-t NLL plus `lambda |y - gamma| (2 nu + alpha)` at `lambda = 0.01`
(`blayers.layers.NormalInverseGamma` with `NegativeLogLikelihood`; torch-uncertainty's
`NormalInverseGammaLinear` and `DERLoss`). Both libraries' `(gamma, nu, alpha, beta)` on the
test part are scored by the same code, in the targets' units: RMSE of `gamma`, the NLL of the
Student-t predictive `St(gamma, beta (1 + nu) / (nu alpha), 2 alpha)`, and the 90% interval's
coverage; means and standard errors over seeds and the paired NLL difference. Each case also
evaluates both losses on the same 1,000 parameter sets and targets (`nu`, `beta` in [1e-3,
1e2], `alpha` in [1, 1e2]) against the paper's formula in float64 (the largest relative error
of each is reported, relative to the loss or absolute where it is below 1). torch-uncertainty
runs in its own virtual environment (`--venv_dir`).

    python benchmarks/peers/evidential_regression_compare.py --seeds 3 --out benchmarks/results/evidential_regression_peers.json

Writes the JSON and, beside it, the Markdown table (`.md`).
"""

import os
import sys
import tempfile
import time

import numpy as np
from scipy import stats

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import laplace_compare  # the mean and standard error
import metrics_compare  # the torch-uncertainty environment
import run as peers  # the shared venv helper

LIBRARIES = {"blayers": "blayers", "torch_uncertainty": "torch-uncertainty"}
POSSESSIVE = {"blayers": "blayers'", "torch_uncertainty": "torch-uncertainty's"}
METRICS = (("rmse", 3), ("nll", 3), ("coverage_90", 3), ("train_seconds", 1))


def load(name, seed):
    """The standardized split: `(x_train, y_train, x_test, y_test, y_scale)`."""
    from sklearn import datasets

    if name == "diabetes":
        x, y = datasets.load_diabetes(return_X_y=True)
    else:
        x, y = datasets.make_friedman1(2000, noise=1.0, random_state=0)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    train, test = order[:cut], order[cut:]
    x_mean, x_std = x[train].mean(0), x[train].std(0)
    y_mean, y_std = y[train].mean(), y[train].std()
    x = ((x - x_mean) / x_std).astype(np.float32)
    y = ((y - y_mean) / y_std).astype(np.float32)
    return x[train], y[train], x[test], y[test], float(y_std)


def settings(name, seed):
    return {
        "seed": seed,
        "hidden": 64,
        "learning_rate": 1e-3,
        "batch_size": 64,
        "epochs": 50 if name == "diabetes" else 40,
        "evidence_regularizer": 0.01,
    }


def score(params, y, y_scale):
    """RMSE, Student-t NLL and the 90% interval's coverage of NIG parameters `[4, n]`, in the
    targets' units (standardized by `y_scale`)."""
    gamma, nu, alpha, beta = (np.asarray(p, np.float64).reshape(-1) for p in params)
    scale = np.sqrt(beta * (1.0 + nu) / (nu * alpha))
    predictive = stats.t(df=2.0 * alpha, loc=gamma, scale=scale)
    low, high = predictive.ppf(0.05), predictive.ppf(0.95)
    return {
        "rmse": float(np.sqrt(np.mean((gamma - y) ** 2)) * y_scale),
        "nll": float(-np.mean(predictive.logpdf(y)) + np.log(y_scale)),
        "coverage_90": float(np.mean((y >= low) & (y <= high))),
    }


def blayers_fit(x, y, x_test, config):
    import keras

    import blayers

    keras.utils.set_random_seed(config["seed"])
    model = keras.Sequential(
        [keras.Input((x.shape[1],))]
        + [keras.layers.Dense(config["hidden"], "relu") for _ in range(2)]
        + [blayers.layers.NormalInverseGamma(1, config["evidence_regularizer"])]
    )
    model.compile(
        keras.optimizers.Adam(config["learning_rate"]), blayers.objectives.NegativeLogLikelihood()
    )
    initial = {f"initial_{i}": w.numpy() for i, w in enumerate(model.weights)}
    rows = len(x) - len(x) % config["batch_size"]  # full batches, as the torch loop's
    start = time.perf_counter()
    model.fit(
        x[:rows],
        y[:rows, None],
        epochs=config["epochs"],
        batch_size=config["batch_size"],
        verbose=0,
    )
    seconds = time.perf_counter() - start
    predictive = model(x_test).distribution
    params = [predictive.loc, predictive.nu, predictive.alpha, predictive.beta]
    return np.stack([np.asarray(p).reshape(-1) for p in params]), seconds, initial


def one_case(name, seed, python, timeout):
    x, y, x_test, y_test, y_scale = load(name, seed)
    config = settings(name, seed)
    params, seconds, initial = blayers_fit(x, y, x_test, config)
    row = {"dataset": name, "seed": seed}
    row["blayers"] = {**score(params, y_test, y_scale), "train_seconds": seconds}
    if python is None:
        row["torch_uncertainty"] = "not run"
        return row
    with tempfile.TemporaryDirectory() as tmp:
        case, out = os.path.join(tmp, "case.npz"), os.path.join(tmp, "params.npz")
        check_params, check_targets = _loss_check_inputs(seed)
        np.savez(
            case,
            x_train=x,
            y_train=y,
            x_test=x_test,
            check_params=check_params,
            check_targets=check_targets,
            **initial,
            **config,
        )
        result = peers.call_worker(python, "torch_uncertainty_der_worker.py", [case, out], timeout)
        if not isinstance(result, dict):
            row["torch_uncertainty"] = result
            return row
        outputs = np.load(out)
        theirs, their_loss = outputs["params"], outputs["check_loss"]
    row["torch_uncertainty"] = {
        **score(theirs, y_test, y_scale),
        "train_seconds": result["seconds"],
    }
    lam = config["evidence_regularizer"]
    exact = reference_loss(check_params, check_targets, lam)
    for library, loss in (
        ("blayers", blayers_loss(check_params, check_targets, lam)),
        ("torch_uncertainty", their_loss),
    ):
        # relative to the loss, or absolute where it is below 1 (it crosses 0)
        error = np.abs(loss - exact) / np.maximum(np.abs(exact), 1.0)
        row[library]["loss_max_relative_error"] = float(np.max(error))
    return row


def reference_loss(params, targets, regularizer):
    """The paper's per-example loss (Eq. 10: the Student-t NLL of Eq. 8 plus `lambda |y -
    gamma| (2 nu + alpha)`) in float64."""
    from scipy.special import gammaln

    gamma, nu, alpha, beta = (np.asarray(p, np.float64) for p in params)
    y = np.asarray(targets, np.float64)
    omega = 2.0 * beta * (1.0 + nu)
    nll = (
        0.5 * np.log(np.pi / nu)
        - alpha * np.log(omega)
        + (alpha + 0.5) * np.log(nu * (y - gamma) ** 2 + omega)
        + gammaln(alpha)
        - gammaln(alpha + 0.5)
    )
    return nll + regularizer * np.abs(y - gamma) * (2.0 * nu + alpha)


def _loss_check_inputs(seed, n=1000):
    """Parameters across the range training visits (`nu` and `beta` from 1e-3 to 1e2, `alpha`
    from 1 to 100) and targets around them, float32."""
    rng = np.random.default_rng(seed)
    params = np.stack(
        [
            rng.normal(size=n),
            10 ** rng.uniform(-3, 2, n),
            1.0 + 10 ** rng.uniform(-3, 2, n),
            10 ** rng.uniform(-3, 2, n),
        ]
    ).astype(np.float32)
    return params, (params[0] + rng.normal(size=n) * 2).astype(np.float32)


def blayers_loss(params, targets, regularizer):
    """The per-example loss blayers trains on: `-training_log_prob` (the paper's Eq. 10)."""
    from blayers.layers.evidential import NormalInverseGammaPredictive

    predictive = NormalInverseGammaPredictive(*params, evidence_regularizer=regularizer)
    return -np.asarray(predictive.training_log_prob(targets), np.float64)


def summarize(rows):
    table = {}
    for name, group in peers.groups_by_dataset(rows, "torch_uncertainty"):
        entry = {"seeds": len(group)}
        for library in LIBRARIES:
            for metric, _ in METRICS:
                entry[f"{library}/{metric}"] = laplace_compare._mean_se(
                    [r[library][metric] for r in group]
                )
        for library in LIBRARIES:
            entry[f"{library}/loss_max_relative_error"] = max(
                r[library]["loss_max_relative_error"] for r in group
            )
        entry["difference/nll"] = laplace_compare._mean_se(
            [r["blayers"]["nll"] - r["torch_uncertainty"]["nll"] for r in group]
        )
        table[name] = entry
    return table


def markdown(table):
    lines = [
        "| data | library | RMSE | NLL | 90% coverage | train s |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in table.items():
        for library, text in LIBRARIES.items():
            cells = [
                "{:.{d}f} ± {:.{d}f}".format(*entry[f"{library}/{m}"], d=d) for m, d in METRICS
            ]
            lines.append(f"| {name} | {text} | " + " | ".join(cells) + " |")
        diff = entry["difference/nll"]
        lines.append(
            f"| {name} | blayers - torch-uncertainty (paired) | | "
            f"{diff[0]:+.3f} ± {diff[1]:.3f} | | |"
        )
    lines.append("")
    for library, text in LIBRARIES.items():
        worst = max(entry[f"{library}/loss_max_relative_error"] for entry in table.values())
        lines.append(
            f"{POSSESSIVE[library]} loss against the paper's in float64 on 1,000 parameter "
            f"sets and targets a case: error at most {worst:.1e} (relative; absolute below 1)."
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    return peers.compare_main(
        argv,
        __doc__,
        "torch_uncertainty",
        metrics_compare.REQUIREMENTS,
        "benchmarks/results/evidential_regression_peers.json",
        one_case,
        summarize,
        markdown,
        datasets=("diabetes", "friedman"),
    )


if __name__ == "__main__":
    main()
