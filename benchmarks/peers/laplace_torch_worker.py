"""laplace-torch side of the Laplace comparison (its own virtual environment, CPU PyTorch).

Reads a case file written by `laplace_compare.py` (the trained MLP's weights and the data),
builds the same MLP in PyTorch with those weights, and runs laplace-torch's last-layer KFAC
Laplace with the prior precision by the marginal likelihood and the probit (GLM) predictive.
Saves the test set's predictive probabilities (the runner scores both libraries with the same
code) and prints `RESULT {json}`: the prior precision and the fit's seconds."""

import json
import sys
import time

import numpy as np
import torch
from laplace import Laplace

torch.set_num_threads(2)


def torch_mlp(case):
    """The case's Keras MLP (`kernel{i}`, `bias{i}`, ReLU between) as a PyTorch module."""
    layers, i = [], 0
    while f"kernel{i}" in case:
        kernel, bias = case[f"kernel{i}"], case[f"bias{i}"]
        linear = torch.nn.Linear(*kernel.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(kernel.T.copy()))
            linear.bias.copy_(torch.from_numpy(bias))
        layers += [linear, torch.nn.ReLU()]
        i += 1
    return torch.nn.Sequential(*layers[:-1]).eval()


def main(path, probs_path):
    case = np.load(path)
    model = torch_mlp(case)
    x_train, y_train = torch.from_numpy(case["x_train"]), torch.from_numpy(case["y_train"])
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_train, y_train.long()), batch_size=256
    )
    start = time.perf_counter()
    la = Laplace(model, "classification", subset_of_weights="last_layer", hessian_structure="kron")
    la.fit(loader)
    la.optimize_prior_precision(method="marglik")
    seconds = time.perf_counter() - start
    x_test = torch.from_numpy(case["x_test"])
    probs = la(x_test, pred_type="glm", link_approx="probit").detach().numpy().astype(np.float64)
    np.save(probs_path, probs)
    prior = la.prior_precision
    result = {
        "prior_precision": float(prior.item() if prior.numel() == 1 else prior.mean().item()),
        "fit_seconds": seconds,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
