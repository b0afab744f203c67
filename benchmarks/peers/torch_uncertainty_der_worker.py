"""torch-uncertainty side of the deep evidential regression comparison (its own virtual
environment, CPU PyTorch).

Reads a case file written by `evidential_regression_compare.py` (the standardized split, the
seed, the architecture, the schedule and blayers' initial weights), trains with
torch-uncertainty 0.13 the same MLP from those weights with a `NormalInverseGammaLinear` head
under `DERLoss`, writes the test part's `(gamma, nu, alpha,
beta)` to the output file and prints `RESULT {json}` with the training seconds."""

import json
import sys
import time

import numpy as np
import torch
from torch import nn
from torch_uncertainty.layers.distributions import NormalInverseGammaLinear
from torch_uncertainty.losses import DERLoss
from torch_uncertainty.utils.distributions import NormalInverseGamma

torch.set_num_threads(2)


class Net(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.head = NormalInverseGammaLinear(nn.Linear, event_dim=1, in_features=hidden)

    def forward(self, x):
        return self.head(self.body(x))


def main(path, out):
    case = np.load(path)
    seed = int(case["seed"])
    torch.manual_seed(seed)
    x = torch.tensor(case["x_train"])
    y = torch.tensor(case["y_train"])[:, None]
    model = Net(x.shape[1], int(case["hidden"]))
    # blayers' initial weights (Keras kernels are [in, out], torch's [out, in]).
    linears = [model.body[0], model.body[2], model.head.base_layer]
    with torch.no_grad():
        for k, layer in enumerate(linears):
            layer.weight.copy_(torch.tensor(case[f"initial_{2 * k}"].T.copy()))
            layer.bias.copy_(torch.tensor(case[f"initial_{2 * k + 1}"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(case["learning_rate"]))
    loss_fn = DERLoss(reg_weight=float(case["evidence_regularizer"]))
    batch, generator = int(case["batch_size"]), torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(int(case["epochs"])):
        order = torch.randperm(len(x), generator=generator)
        for i in range(0, len(x) - batch + 1, batch):
            rows = order[i : i + batch]
            params = model(x[rows])
            loss = loss_fn(NormalInverseGamma(**params), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        params = model(torch.tensor(case["x_test"]))
    order = ("loc", "lmbda", "alpha", "beta")
    # The loss itself on given parameters and targets (per example), for an exact comparison.
    given = [torch.tensor(p)[:, None] for p in case["check_params"]]
    per_example = DERLoss(float(case["evidence_regularizer"]), reduction="none")(
        NormalInverseGamma(*given), torch.tensor(case["check_targets"])[:, None]
    )
    np.savez(
        out,
        params=np.stack([params[k].double().numpy().reshape(-1) for k in order]),
        check_loss=per_example.double().numpy().reshape(-1),
    )
    print("RESULT " + json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
