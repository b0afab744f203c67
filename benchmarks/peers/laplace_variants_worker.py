"""laplace-torch side of the Laplace-variants comparison (its own virtual environment, CPU
PyTorch).

Reads a case file written by `laplace_variants_compare.py` (the trained MLP's weights, the
training data, a few test inputs, a prior precision, one precision a layer and a subnetwork's
indices in PyTorch's parameter order) and saves, at those fixed precisions:

* the last-layer Laplace's joint covariance of the test outputs (`joint=True`), KFAC and
  full;
* the full-covariance subnetwork Laplace's output covariances (`subset_of_weights=
  'subnetwork'` with the indices);
* the evidence of the diagonal all-weights Laplace with the per-layer prior precisions.
"""

import sys

import numpy as np
import torch
from laplace import Laplace
from laplace_torch_worker import torch_mlp  # the same MLP as the Laplace comparison's

torch.set_num_threads(2)


def main(path, out_path):
    case = np.load(path)
    torch.set_default_dtype(torch.float64)
    model = torch_mlp(case).double()
    x_train = torch.from_numpy(case["x_train"]).double()
    y_train = torch.from_numpy(case["y_train"]).long()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_train, y_train), batch_size=256
    )
    x_test = torch.from_numpy(case["x_test"]).double()
    delta = float(case["delta"])
    results = {}
    for structure in ("kron", "full"):
        last = Laplace(model, "classification", "last_layer", structure, prior_precision=delta)
        last.fit(loader)
        _, joint = last._glm_predictive_distribution(x_test, joint=True)
        results[f"joint_{structure}"] = joint.detach().numpy()
    subnet = Laplace(
        model,
        "classification",
        "subnetwork",
        "full",
        subnetwork_indices=torch.from_numpy(case["subnet_indices"]).long(),
        prior_precision=delta,
    )
    subnet.fit(loader)
    _, variance = subnet._glm_predictive_distribution(x_test)
    results["subnet"] = variance.detach().numpy()
    layered = Laplace(
        model,
        "classification",
        "all",
        "diag",
        prior_precision=torch.from_numpy(case["per_tensor_deltas"]).double(),
    )
    layered.fit(loader)
    results["evidence"] = np.array(float(layered.log_marginal_likelihood()))
    np.savez(out_path, **results)
    print("RESULT {}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
