"""torch-uncertainty side of the efficient-ensembles comparison (its own virtual environment, CPU
PyTorch).

Reads a case file written by `ensembles_compare.py` (the split, the seed, the architecture and
the schedule), trains with torch-uncertainty 0.13 the same MLP as Packed-Ensembles
(`PackedLinear`), Masksembles (`MaskedLinear` after each hidden layer), a Dirichlet evidential
head (`DECLoss`, softplus evidence, the squared-error Bayes risk, KL annealed over the same
steps), MIMO (`mimo_mlp`, `MIMOBatchFormat`) and SGLD (`SGLD`, `CheckpointCollector`), writes
each method's test probabilities to the output file and prints `RESULT {json}` with the training
seconds."""

import json
import sys
import time

import numpy as np
import torch
from torch import nn
from torch_uncertainty.layers import MaskedLinear, PackedLinear
from torch_uncertainty.losses import DECLoss
from torch_uncertainty.methods import CheckpointCollector
from torch_uncertainty.models.mlp import mimo_mlp
from torch_uncertainty.optim import SGLD
from torch_uncertainty.transforms import MIMOBatchFormat

torch.set_num_threads(2)


class Packed(nn.Module):
    def __init__(self, d, hidden, classes, alpha, members, gamma):
        super().__init__()
        self.members = members
        self.layers = nn.ModuleList(
            [
                PackedLinear(d, hidden, alpha, members, first=True),
                PackedLinear(hidden, hidden, alpha, members, gamma=gamma),
                PackedLinear(hidden, classes, alpha, members, last=True),
            ]
        )

    def forward(self, x):  # -> [(M B), classes], member-major
        x = torch.relu(self.layers[0](x))
        x = torch.relu(self.layers[1](x))
        return self.layers[2](x)


class Masked(nn.Module):
    def __init__(self, d, hidden, classes, members, scale):
        super().__init__()
        self.members = members
        self.first = nn.Linear(d, hidden)
        self.second = MaskedLinear(hidden, hidden, members, scale)
        self.head = MaskedLinear(hidden, classes, members, scale)

    def forward(self, x):  # member-major: the batch repeated M times
        x = x.repeat(self.members, 1)
        x = torch.relu(self.first(x))
        x = torch.relu(self.second(x))
        return self.head(x)


class Evidential(nn.Module):
    def __init__(self, d, hidden, classes):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )
        self.members = 1

    def forward(self, x):
        return nn.functional.softplus(self.net(x))  # the evidence


def _train(method, case, seed):
    torch.manual_seed(seed)
    np.random.seed(seed)  # Masksembles' mask generation
    x = torch.tensor(case["x_train"])
    y = torch.tensor(case["y_train"]).long()
    d, classes = x.shape[1], int(case["classes"])
    hidden, members = int(case["hidden"]), int(case["members"])
    fmt = None
    if method == "packed":
        model = Packed(d, hidden, classes, float(case["alpha"]), members, int(case["gamma"]))
    elif method == "masksembles":
        model = Masked(d, hidden, classes, members, float(case["scale"]))
    elif method == "mimo":
        model = mimo_mlp(d, classes, [hidden, hidden], num_estimators=members)
        fmt = MIMOBatchFormat(members, rho=0.0, batch_repeat=int(case["batch_repetitions"]))
    elif method == "sgld":
        model = nn.Sequential(
            nn.Linear(d, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )
        model.members = 1
        kept = [int(e) for e in case["kept_epochs"]]
        collector = CheckpointCollector(model, save_schedule=kept, use_final_model=False)
    else:
        model = Evidential(d, hidden, classes)
    if method == "sgld":
        n = float(case["num_train"])
        optimizer = SGLD(
            model.parameters(),
            lr=float(case["sgld_learning_rate"]),
            noise_factor=(float(case["temperature"]) / n) ** 0.5,  # sqrt(2 lr T / N) noise
            weight_decay=1.0 / (n * float(case["prior_stddev"]) ** 2),  # the N(0, s^2) prior
        )
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=float(case["learning_rate"]))
    dec = DECLoss(annealing_step=int(case["annealing_steps"]), loss_type="mse")
    batch, epochs, step = int(case["batch_size"]), int(case["epochs"]), 0
    if method == "sgld":
        epochs = int(case["sgld_epochs"])
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(x), generator=generator)
        for i in range(0, len(x) - batch + 1, batch):
            rows = order[i : i + batch]
            if fmt is not None:  # MIMO: each member its own permutation of the batch
                inputs, targets = fmt((x[rows], y[rows]))
                loss = nn.functional.cross_entropy(model(inputs), targets)
            else:
                out = model(x[rows])
                if method == "evidential":
                    loss = dec(out, y[rows], current_epoch=step)
                else:  # every member fitted on the batch
                    loss = nn.functional.cross_entropy(out, y[rows].repeat(model.members))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
        if method == "sgld":
            collector.update_wrapper(epoch)
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        x_test = torch.tensor(case["x_test"])
        if method == "sgld":
            collector.eval()
            logits = collector(x_test).reshape(-1, len(x_test), classes)
            return torch.softmax(logits, -1).mean(0).double().numpy(), seconds
        if method == "mimo":
            probs = torch.softmax(model(x_test), -1).reshape(members, -1, classes).mean(0)
            return probs.double().numpy(), seconds
        out = model(x_test)
        if method == "evidential":
            alpha = out + 1.0
            probs = alpha / alpha.sum(-1, keepdim=True)
        else:
            probs = torch.softmax(out, -1).reshape(model.members, -1, classes).mean(0)
    return probs.double().numpy(), seconds


def main(path, out):
    case = np.load(path)
    seed = int(case["seed"])
    results, seconds = {}, {}
    for method in ("packed", "masksembles", "evidential", "mimo", "sgld"):
        results[method], seconds[method] = _train(method, case, seed)
    np.savez(out, **results)
    print("RESULT " + json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
