"""PNG plots of a run (matplotlib, Agg backend: no display needed)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from blayers import metrics as metrics_lib

__all__ = ["regression_1d", "reliability_diagram", "training_curves"]


def training_curves(history, path):
    """Training NLL / KL / loss and evaluation metrics against the step."""
    train = [h for h in history if h["kind"] == "train"]
    evals = [h for h in history if h["kind"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        steps = [h["step"] for h in train]
        for key in ("loss", "nll", "kl_per_example"):
            axes[0].plot(steps, [h[key] for h in train], label=key)
        axes[0].set_xlabel("step")
        axes[0].set_title("training objective (per example)")
        axes[0].legend()
        axes[0].set_yscale("symlog", linthresh=1e-2)
    if evals:
        steps = [h["step"] for h in evals]
        for key in sorted(k for k in evals[0] if k not in ("kind", "step")):
            axes[1].plot(steps, [h[key] for h in evals], marker="o", label=key)
        axes[1].set_xlabel("step")
        axes[1].set_title("test metrics")
        axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def reliability_diagram(probs, labels, path, num_bins=15):
    """Accuracy against confidence per equal-width bin, with the ECE in the title."""
    counts, _, accuracy = metrics_lib.reliability_bins(probs, labels, num_bins)
    centers = (np.arange(num_bins) + 0.5) / num_bins
    fig, (ax, ax_hist) = plt.subplots(
        2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    ax.bar(
        centers,
        np.nan_to_num(accuracy),
        width=1.0 / num_bins,
        edgecolor="k",
        alpha=0.7,
        label="accuracy",
    )
    ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    ax.set_ylabel("accuracy")
    ax.set_title(f"reliability (ECE = {metrics_lib.ece(probs, labels, num_bins):.3f})")
    ax.legend(loc="upper left")
    ax_hist.bar(centers, counts, width=1.0 / num_bins, edgecolor="k")
    ax_hist.set_xlabel("confidence")
    ax_hist.set_ylabel("count")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def regression_1d(inputs, means, stddevs, targets, path, scale=1.0, shift=0.0):
    """Predictive mean +- 2 sd of a 1-D regression, with the test targets (original units)."""
    order = np.argsort(inputs[:, 0])
    x = inputs[order, 0]
    means, stddevs = np.asarray(means, np.float64), np.asarray(stddevs, np.float64)
    mean = means.mean(0)[order, 0]
    sd = np.sqrt(np.maximum((stddevs**2 + means**2).mean(0) - means.mean(0) ** 2, 0))[order, 0]
    mean, sd, y = shift + scale * mean, scale * sd, shift + scale * targets[order, 0]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter(x, y, s=6, c="k", alpha=0.5, label="test targets")
    ax.plot(x, mean, "C0", label="predictive mean")
    ax.fill_between(x, mean - 2 * sd, mean + 2 * sd, color="C0", alpha=0.25, label="+- 2 sd")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def density_2d(model, samples, path, grid_size=200):
    """The learned 2-D density (from `model(x).distribution.log_prob(x)`) on a grid, beside a
    histogram of the test samples (the true density's draws)."""
    lo, hi = samples.min(0) - 1.0, samples.max(0) + 1.0
    xs = np.linspace(lo[0], hi[0], grid_size, dtype=np.float32)
    ys = np.linspace(lo[1], hi[1], grid_size, dtype=np.float32)
    points = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2)
    log_prob = np.concatenate(
        [
            model(points[i : i + 4096], training=False)
            .distribution.log_prob(points[i : i + 4096])
            .numpy()
            for i in range(0, len(points), 4096)
        ]
    )
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    right.imshow(
        np.exp(log_prob).reshape(grid_size, grid_size),
        origin="lower",
        extent=(lo[0], hi[0], lo[1], hi[1]),
        cmap="viridis",
    )
    right.set_title("learned density")
    left.hist2d(
        samples[:, 0],
        samples[:, 1],
        bins=grid_size // 2,
        range=[[lo[0], hi[0]], [lo[1], hi[1]]],
        cmap="viridis",
    )
    left.set_title("test samples (true density)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def image_grid(model, images, path, count=10):
    """Test images, their reconstructions and prior samples of a VAE-like model (rows)."""
    count = min(count, len(images))  # a small test split has fewer images than the grid
    images = images[:count]
    shape = images.shape[1:3] if images.ndim == 4 else (int(np.sqrt(images.shape[-1])),) * 2
    rows = [
        ("data", images),
        ("reconstruction", np.asarray(model.reconstruct(images))),
        ("sample", np.asarray(model.sample(count, seed=0))),
    ]
    fig, axes = plt.subplots(len(rows), count, figsize=(count, len(rows) + 0.5), squeeze=False)
    for r, (title, row) in enumerate(rows):
        for c in range(count):
            axes[r, c].imshow(row[c].reshape(shape), cmap="gray", vmin=0, vmax=1)
            axes[r, c].axis("off")
        axes[r, 0].set_title(title, fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def flow_samples(model, data, path, count=10):
    """Test images above samples of a density model whose output is a random variable (a flow:
    base draws pushed through the layers)."""
    side = int(np.sqrt(data.shape[-1]))
    if side * side != data.shape[-1]:
        return
    count = min(count, len(data))
    samples = np.asarray(model(data[:count]).distribution.sample(seed=(0, 0)))
    fig, axes = plt.subplots(2, count, figsize=(count, 2.5), squeeze=False)
    for c in range(count):
        for r, row in enumerate((data, samples)):
            axes[r, c].imshow(
                np.clip(row[c].reshape(side, side), 0, 1), cmap="gray", vmin=0, vmax=1
            )
            axes[r, c].axis("off")
    axes[0, 0].set_title("data", fontsize=8, loc="left")
    axes[1, 0].set_title("samples", fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
