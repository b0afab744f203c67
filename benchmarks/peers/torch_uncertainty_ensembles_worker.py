"""torch-uncertainty side of the efficient-ensembles comparison (its own virtual environment, CPU
PyTorch).

Reads a case file written by `ensembles_compare.py` (the split, the seed, the architecture and
the schedule), trains with torch-uncertainty 0.13 the same MLP as Packed-Ensembles
(`PackedLinear`), Masksembles (`MaskedLinear` after each hidden layer), a Dirichlet evidential
head (`DECLoss`, softplus evidence, the squared-error Bayes risk, KL annealed over the same
steps), MIMO (`mimo_mlp`, `MIMOBatchFormat`) and SGLD (`SGLD`, `CheckpointCollector`); a
snapshot ensemble (`CosineAnnealingWarmRestarts`, `CheckpointCollector` at each cycle's end) on
the lab's split; and MC-BatchNorm (`MCBatchNorm` over the CNN's `BatchNorm2d`s). Writes each
method's test probabilities to the output file and prints `RESULT {json}` with the training
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
from torch_uncertainty.post_processing import MCBatchNorm
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
        self.net = _mlp(d, hidden, classes)
        self.members = 1

    def forward(self, x):
        return nn.functional.softplus(self.net(x))  # the evidence


def _mlp(d, hidden, classes):
    return nn.Sequential(
        nn.Linear(d, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def _snapshots(case, seed):
    """blayers' configs/digits_snapshots.gin in PyTorch: the MLP, the mean NLL plus the
    `N(0, I / lambda)` prior's `lambda ||theta||^2 / (2N)`, Adam restarting on a cosine every
    cycle, full shuffled batches of each epoch; the model at each cycle's end kept."""
    torch.manual_seed(seed)
    x = torch.tensor(case["snapshot_x_train"])
    y = torch.tensor(case["snapshot_y_train"]).long()
    classes, batch = int(case["classes"]), int(case["batch_size"])
    cycles, cycle = int(case["snapshot_cycles"]), int(case["snapshot_cycle_steps"])
    decay = float(case["snapshot_prior_precision"]) / (2.0 * len(x))
    model = _mlp(x.shape[1], int(case["snapshot_hidden"]), classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(case["snapshot_learning_rate"]))
    schedule = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=cycle)
    # The final model is the last cycle's snapshot; the collector keeps the others.
    collector = CheckpointCollector(model, save_schedule=list(range(cycles - 1)))
    generator = torch.Generator().manual_seed(seed)
    step, start = 0, time.perf_counter()
    while step < cycles * cycle:
        order = torch.randperm(len(x), generator=generator)
        for i in range(0, len(x) - batch + 1, batch):
            rows = order[i : i + batch]
            penalty = sum(p.pow(2).sum() for p in model.parameters())
            loss = nn.functional.cross_entropy(model(x[rows]), y[rows]) + decay * penalty
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            if step % cycle == 0:
                collector.update_wrapper(step // cycle - 1)
            if step == cycles * cycle:
                break
    seconds = time.perf_counter() - start
    collector.eval()
    with torch.no_grad():
        x_test = torch.tensor(case["snapshot_x_test"])
        logits = collector(x_test).reshape(-1, len(x_test), classes)
    assert len(logits) == cycles, len(logits)
    return torch.softmax(logits.double(), -1).mean(0).numpy(), seconds


def _cnn(side, classes):
    """The MC-BatchNorm comparison's CNN (ensembles_compare.cnn's twin)."""

    def block(cin, cout):
        return [
            nn.Conv2d(cin, cout, 3, padding=1),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]

    return nn.Sequential(
        *block(1, 16), *block(16, 32), nn.Flatten(), nn.Linear(32 * (side // 4) ** 2, classes)
    )


def _mc_batchnorm(case, seed):
    torch.manual_seed(seed)
    side, classes = int(case["image_side"]), int(case["classes"])
    x = torch.tensor(case["x_train"]).reshape(-1, 1, side, side)
    y = torch.tensor(case["y_train"]).long()
    model = _cnn(side, classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(case["learning_rate"]))
    batch, generator = int(case["batch_size"]), torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(int(case["epochs"])):
        model.train()
        order = torch.randperm(len(x), generator=generator)
        for i in range(0, len(x) - batch + 1, batch):
            rows = order[i : i + batch]
            loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    model.eval()
    x_test = torch.tensor(case["x_test"]).reshape(-1, 1, side, side)
    with torch.no_grad():
        base = torch.softmax(model(x_test).double(), -1).numpy()
    draws = int(case["mc_draws"])
    mcbn = MCBatchNorm(model, num_estimators=draws, mc_batch_size=batch)
    # Each draw one random training batch (as blayers draws them): more batches than one epoch
    # holds come from successive shuffles.
    sampler = torch.utils.data.RandomSampler(
        range(len(x)), num_samples=draws * batch, generator=torch.Generator().manual_seed(seed)
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch, sampler=sampler
    )
    return _mc_predict(mcbn, loader, x_test, draws, classes), base, seconds


def _mc_predict(mcbn, loader, x_test, draws, classes):
    mcbn.fit(loader)
    mcbn.eval()
    with torch.no_grad():
        logits = mcbn(x_test).reshape(draws, len(x_test), classes)
    return torch.softmax(logits.double(), -1).mean(0).numpy()


def _same_weights(case):
    """torch-uncertainty's MC-BatchNorm on the Keras CNN's weights (kernels HWIO -> OIHW; the
    linear layer's rows from Keras' (h, w, c) flattening to torch's (c, h, w)) with blayers'
    very batches."""
    side, classes = int(case["image_side"]), int(case["classes"])
    weights = [case[f"mcbn_weight_{i}"] for i in range(int(case["mcbn_weights"]))]
    model = _cnn(side, classes)
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    norms = [m for m in model if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for k, (conv, norm) in enumerate(zip(convs, norms)):
            kernel, bias, gamma, beta, mean, variance = weights[6 * k : 6 * k + 6]
            conv.weight.copy_(torch.tensor(kernel.transpose(3, 2, 0, 1)))
            conv.bias.copy_(torch.tensor(bias))
            norm.weight.copy_(torch.tensor(gamma))
            norm.bias.copy_(torch.tensor(beta))
            norm.running_mean.copy_(torch.tensor(mean))
            norm.running_var.copy_(torch.tensor(variance))
        kernel, bias = weights[-2:]
        cells = side // 4
        kernel = kernel.reshape(cells, cells, -1, classes).transpose(2, 0, 1, 3)
        model[-1].weight.copy_(torch.tensor(kernel.reshape(-1, classes).T.copy()))
        model[-1].bias.copy_(torch.tensor(bias))
    model.eval()
    rows = case["mcbn_rows"]  # [draws, batch]
    draws, batch = rows.shape
    x = torch.tensor(case["x_train"]).reshape(-1, 1, side, side)
    y = torch.tensor(case["y_train"]).long()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch, sampler=rows.reshape(-1).tolist()
    )
    mcbn = MCBatchNorm(model, num_estimators=draws, mc_batch_size=batch)
    x_test = torch.tensor(case["x_test"]).reshape(-1, 1, side, side)
    return _mc_predict(mcbn, loader, x_test, draws, classes)


def _train(method, case, seed):
    if method == "snapshots":
        return _snapshots(case, seed)
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
        model = _mlp(d, hidden, classes)
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
    for method in case["methods"]:
        method = str(method)
        if method == "mc_batchnorm":  # also the network's own predictive, and on blayers'
            probs, results["mc_batchnorm_base"], seconds[method] = _mc_batchnorm(case, seed)
            results[method] = probs
            results["mc_batchnorm_same_weights"] = _same_weights(case)
            continue
        results[method], seconds[method] = _train(method, case, seed)
    np.savez(out, **results)
    print("RESULT " + json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
