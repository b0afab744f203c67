"""bayesian-torch (PyTorch, CPU) side of the peer harness: dense and conv layers with the same
shapes (PyTorch's channels-first images), squared error + KL / 50,000, Adam, eager PyTorch."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases
import torch
from bayesian_torch.layers import (
    Conv2dFlipout,
    Conv2dReparameterization,
    LinearFlipout,
    LinearReparameterization,
)

torch.set_num_threads(os.cpu_count() or 1)
UNITS, IN = cases.DENSE["units"], cases.DENSE["input_dim"]
CH, K = cases.CONV["channels"], cases.CONV["kernel"]
DENSE = {
    "deterministic": lambda: torch.nn.Linear(IN, UNITS),
    "reparameterization": lambda: LinearReparameterization(IN, UNITS),
    "flipout": lambda: LinearFlipout(IN, UNITS),
}
CONV = {
    "deterministic": lambda: torch.nn.Conv2d(CH, CH, K, padding=1),
    "reparameterization": lambda: Conv2dReparameterization(CH, CH, K, padding=1),
    "flipout": lambda: Conv2dFlipout(CH, CH, K, padding=1),
}


def layer_step(make, data, channels_first=False):
    x, y = (torch.from_numpy(a) for a in data)
    if channels_first:
        x, y = x.permute(0, 3, 1, 2).contiguous(), y.permute(0, 3, 1, 2).contiguous()
    layer = make()
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
        out = layer(x)
        kl = 0.0
        if isinstance(out, tuple):  # bayesian-torch layers return (outputs, kl)
            out, kl = out
        loss = torch.mean((out - y) ** 2) + kl * cases.KL_SCALE
        loss.backward()
        optimizer.step()
        return loss

    return step, lambda out: out.item()


BUILDERS = {f"dense_{k}": (lambda m=m: layer_step(m, cases.dense_data())) for k, m in DENSE.items()}
BUILDERS.update(
    {f"conv_{k}": (lambda m=m: layer_step(m, cases.conv_data(), True)) for k, m in CONV.items()}
)

if __name__ == "__main__":
    torch.manual_seed(0)
    cases.run_worker(BUILDERS)
