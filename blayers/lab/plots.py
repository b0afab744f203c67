"""PNG plots of a run (matplotlib, Agg backend: no display needed)."""

import contextlib
import functools
import gc
import os
import textwrap

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from blayers import metrics as metrics_lib

__all__ = [
    "curve",
    "density_2d",
    "episode_returns",
    "flow_samples",
    "history_panels",
    "image_grid",
    "open_loop_strip",
    "png_to_tensorboard",
    "point_process_intensity",
    "regression_1d",
    "regression_calibration",
    "reliability_diagram",
    "sequence_reliability",
    "skipped",
    "training_curves",
]


_skipping = False  # set by `skipped`


@contextlib.contextmanager
def skipped(skip=True):
    """Within it (with `skip`), every figure function of this module returns None at once,
    drawing and computing nothing: the Loop's `train.plots = False`."""
    global _skipping
    before, _skipping = _skipping, bool(skip)
    try:
        yield
    finally:
        _skipping = before


def _drawing(plot):
    """Pauses Python's cyclic garbage collector while `plot` draws: a figure allocates hundreds
    of thousands of small objects, enough to set off several full collections, each of which
    walks the trainer's whole heap (TensorFlow's graphs and Keras' layers: about a second on a
    slow CPU). Its garbage waits for the next collection after it. Under `skipped()` it does
    nothing."""

    @functools.wraps(plot)
    def wrapped(*args, **kwargs):
        if _skipping:
            return None
        if not gc.isenabled():
            return plot(*args, **kwargs)
        gc.disable()
        try:
            return plot(*args, **kwargs)
        finally:
            gc.enable()

    return wrapped


def _save(fig, path, tight=True):
    """Writes `fig` as a PNG at 100 dpi and closes it; `tight` first fits the margins to the
    labels (`tight_layout`), then drops the layout engine that call leaves on the figure:
    left on, `savefig` draws the whole figure once more before the one it writes (a quarter of
    a plot's time) to lay it out again, the same way."""
    if tight:
        fig.tight_layout()
        fig.set_layout_engine("none")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _log_axis(ax, values):
    """Log y-axis whose tick labels can be read: plain numbers (0.1, 2, 50), and at least three
    labelled ticks even when `values` span less than a decade (where matplotlib's default shows
    one label or none)."""
    ax.set_yscale("log")
    values = np.asarray(values, float)
    values = values[np.isfinite(values) & (values > 0)]
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}")
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(plain)
    if not len(values):
        return
    low, high = values.min(), values.max()
    if high / low >= 10:
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        return
    if high / low < 1.05:  # a flat curve: widen so that the ticks differ
        low, high = low / 1.05, high * 1.05
    margin = max((high / low) ** 0.05, 1.02)  # the curve's extremes stay inside the frame
    ax.set_ylim(low / margin, high * margin)
    for digits in (2, 3, 4, 6):  # the fewest significant digits that give 3 distinct ticks
        ticks = sorted({float(f"{t:.{digits}g}") for t in np.geomspace(low, high, 5)})
        ticks = [t for t in ticks if low <= t <= high]
        if len(ticks) >= 3:
            break
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))


def _title(ax, text, width=34):
    """A panel title wrapped to the panel's width instead of cut off. Its height is given
    (`y=1`, just above the frame: no panel has tick labels on top), which spares matplotlib
    measuring the panel's axes to place it."""
    ax.set_title(textwrap.fill(text, width), fontsize=9, y=1.0)


# Evaluation metrics drawn on a shared [0, 1] axis; the others get one axis each, except the
# families below.
_UNIT_METRICS = (
    "accuracy",
    "ece",
    "adaptive_ece",
    "classwise_ece",
    "smooth_ece",
    "brier",
    "coverage_95",
    "corrupted_accuracy",
    "corrupted_ece",
)
# Families of metrics on one scale drawn in one panel, a line a member (the OOD scores are
# compared with one another; a panel each made a classifier's figure two dozen panels, 2-3 s
# of drawing a run): (title, keys or key prefix, whether the axis is [0, 1]).
_FAMILIES = (
    ("selective risk: AURC, AUGRC", ("aurc", "augrc"), False),
    ("OOD AUROC by score", "ood_auroc_", True),
    ("OOD FPR at 95% TPR by score", "ood_fpr95_", True),
)


def _family_members(keys):
    """`[(title, members, unit)]` of the families present among `keys`."""
    found = []
    for title, members, unit in _FAMILIES:
        if isinstance(members, str):
            chosen = [k for k in keys if k.startswith(members)]
        else:
            chosen = [k for k in members if k in keys]
        if chosen:
            found.append((title, chosen, unit))
    return found


@_drawing
def training_curves(history, path):
    """The training objective's terms, the KL weight, and each evaluation metric against the
    step, one panel per scale: the NLL and per-example local loss (a VAE's latent KL), the
    weights' KL per example (log axis), the KL weight `beta_t` (annealing is a schedule, not
    divergence), the [0, 1] metrics together, each family of metrics (the OOD scores' AUROCs,
    their FPRs at 95% TPR, the selective risks) in one panel, and every other metric on its
    own axis. A reference value `<metric>_optimum` (the best achievable, from the data) is a
    dashed line in its metric's panel; with a single evaluation the metrics are a table, not
    panels of dots."""
    train = [h for h in history if h["kind"] == "train"]
    evals = [h for h in history if h["kind"] == "eval"]
    metric_keys = sorted({k for h in evals for k in h} - {"kind", "step"})
    optima = {k[: -len("_optimum")]: k for k in metric_keys if k.endswith("_optimum")}
    metric_keys = [k for k in metric_keys if k not in optima.values()]
    single = len(evals) == 1
    unit = [k for k in metric_keys if k in _UNIT_METRICS]
    families = _family_members(metric_keys)
    grouped = {k for _, members, _ in families for k in members}
    other = [k for k in metric_keys if k not in _UNIT_METRICS and k not in grouped]
    # A deterministic run has no weights' KL: no KL panels, and its loss is its NLL's scale.
    has_kl = any(h.get("kl_per_example", 0.0) for h in train)
    panels = (
        (["objective", "loss", "kl", "kl_weight"] if has_kl else ["objective"]) if train else []
    )
    if single:
        panels.append("table")
    else:
        panels += (["unit"] if unit else []) + [("family", *f) for f in families] + other
    panels = panels or ["empty"]
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    fig, axes = _panel_grid(rows, columns)
    axes = axes.ravel()
    for ax in axes[len(panels) :]:
        ax.axis("off")
    steps = [h["step"] for h in train]
    eval_steps = [h["step"] for h in evals]
    for ax, panel in zip(axes, panels):
        ax.set_xlabel("step")
        if panel == "objective":
            ax.plot(steps, [h["nll"] for h in train], label="NLL")
            if any(h.get("local_loss", 0.0) for h in train):
                ax.plot(steps, [h["local_loss"] for h in train], label="local (latent KL)")
            if not has_kl:  # the loss is the NLL (and any penalty): the same scale
                ax.plot(steps, [h["loss"] for h in train], label="loss", alpha=0.6)
            _title(ax, "training NLL per example" if has_kl else "training objective per example")
            ax.set_ylabel("nats per example")
            ax.legend(fontsize=7)
        elif panel == "loss":  # NLL + beta_t KL / N: often 100x the NLL, so its own axis
            ax.plot(steps, [h["loss"] for h in train], "C1")
            _title(ax, "loss: NLL + beta_t KL / N (annealed)")
            ax.set_ylabel("nats per example")
        elif panel == "kl":
            kl = [h["kl_per_example"] for h in train]
            ax.plot(steps, kl, "C3")
            if all(v > 0 for v in kl):
                _log_axis(ax, kl)
            _title(ax, "weights' KL / N")
            ax.set_ylabel("nats per example")
        elif panel == "kl_weight":
            ax.plot(steps, [h.get("kl_weight", 1.0) for h in train], "C2")
            ax.set_ylim(-0.05, 1.05 * max(1.0, *[h.get("kl_weight", 1.0) for h in train]))
            _title(ax, "KL weight beta_t")
        elif panel == "unit":
            for key in unit:
                ax.plot(eval_steps, [h[key] for h in evals], marker="o", label=key)
            ax.set_ylim(-0.02, 1.02)
            _title(ax, "test metrics in [0, 1]")
            ax.legend(fontsize=6)
        elif isinstance(panel, tuple):  # a family: a line a member
            _, title, members, unit_axis = panel
            prefix = os.path.commonprefix(members) if len(members) > 1 else ""
            prefix = prefix if prefix.endswith("_") else ""
            for key in members:
                label = key[len(prefix) :]
                ax.plot(eval_steps, [h[key] for h in evals], marker="o", label=label)
            if unit_axis:
                ax.set_ylim(-0.02, 1.02)
            _title(ax, title)
            ax.legend(fontsize=6)
        elif panel == "table":
            _metrics_table(ax, evals[0], metric_keys, optima)
        elif panel == "empty":
            _title(ax, "no records")
        else:
            ax.plot(eval_steps, [h[panel] for h in evals], marker="o", color="C4")
            if panel in optima:
                value = evals[-1][optima[panel]]
                ax.axhline(value, color="k", ls="--", lw=1, label=f"optimum {value:.4g}")
                ax.legend(fontsize=7)
            _title(ax, panel if panel.startswith("test") else f"test {panel}")
    _save(fig, path, tight=False)


# A panel's cell in inches: the axes and, around them, room for its title (two lines), tick
# labels and axis labels.
_CELL = (4.2, 3.2)
_MARGINS = {"left": 0.85, "right": 0.15, "top": 0.5, "bottom": 0.55}


def _panel_grid(rows, columns):
    """`rows x columns` panels with fixed margins (`tight_layout` finds about the same ones by
    drawing the whole figure an extra time: with two dozen panels that doubled the seconds
    every run spent on its plot)."""
    width, height = columns * _CELL[0], rows * _CELL[1]
    m = _MARGINS
    axes_width = _CELL[0] - m["left"] - m["right"]
    axes_height = _CELL[1] - m["top"] - m["bottom"]
    return plt.subplots(
        rows,
        columns,
        figsize=(width, height),
        squeeze=False,
        gridspec_kw={
            "left": m["left"] / width,
            "right": 1 - m["right"] / width,
            "bottom": m["bottom"] / height,
            "top": 1 - m["top"] / height,
            "wspace": (m["left"] + m["right"]) / axes_width,
            "hspace": (m["top"] + m["bottom"]) / axes_height,
        },
    )


def _metrics_table(ax, record, keys, optima):
    """One evaluation's metrics as text (a panel of single dots says less), in a font small
    enough for every line to fit between the panel's top and the figure's bottom edge, and the
    longest across the cell (the panel is the last: nothing below it)."""
    ax.axis("off")
    lines = []
    for key in keys:
        value = record[key]
        line = f"{key:<28s} {value:>10.4g}" if isinstance(value, (int, float)) else key
        if key in optima:
            line += f"   (optimum {record[optima[key]]:.4g})"
        lines.append(line)
    # Measured (one text laid out, not the figure drawn) and shrunk until it fits; a few
    # rounds, as small sizes round their line heights up.
    text = ax.text(0.0, 1.0, "\n".join(lines), va="top", family="monospace", fontsize=7.0)
    renderer, frame = ax.figure.canvas.get_renderer(), ax.figure.bbox
    for _ in range(4):
        box = text.get_window_extent(renderer)
        scale = min((box.y1 - frame.y0) / box.height, (frame.x1 - box.x0) / box.width)
        if scale >= 1.0:
            break
        text.set_fontsize(text.get_fontsize() * scale * 0.98)
    _title(ax, f"test metrics at step {record['step']}")


def png_to_tensorboard(path, name=None):
    """Writes the PNG at `path` as a TensorBoard image (under the default summary writer)."""
    import tensorflow as tf  # plots are drawn without TF; only this writer needs it

    with open(path, "rb") as f:
        image = tf.image.decode_png(f.read(), channels=4)
    name = name or os.path.splitext(os.path.basename(path))[0]
    tf.summary.image(f"plots/{name}", image[None])


@_drawing
def reliability_diagram(probs, labels, path, num_bins=15, name=None):
    """Accuracy against confidence per equal-width bin, with the ECE (and `name`: the run and
    model, or the post-hoc method) in the title."""
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
    ece = metrics_lib.ece(probs, labels, num_bins)
    _title(
        ax,
        f"{name}: reliability (ECE = {ece:.3f})" if name else f"reliability (ECE = {ece:.3f})",
        48,
    )
    ax.legend(loc="upper left")
    ax_hist.bar(centers, counts, width=1.0 / num_bins, edgecolor="k")
    ax_hist.set_xlabel("confidence")
    ax_hist.set_ylabel("count")
    _save(fig, path)


@_drawing
def corruption_curves(table, path):
    """Accuracy, NLL and ECE against the corruption's severity, one line per corruption;
    `table` maps `'<corruption>_<severity>'` to that set's metrics (severity 0: the clean test
    set, key `'clean'`)."""
    names = sorted({key.rsplit("_", 1)[0] for key in table if key != "clean"})
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, metric in zip(axes, ("accuracy", "nll", "ece")):
        for name in names:
            severities = sorted(int(k.rsplit("_", 1)[1]) for k in table if k.startswith(name + "_"))
            xs = ([0] if "clean" in table else []) + severities
            ys = ([table["clean"][metric]] if "clean" in table else []) + [
                table[f"{name}_{s}"][metric] for s in severities
            ]
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xlabel("severity (0: clean)")
        _title(ax, metric)
    axes[0].legend(fontsize=8)
    _save(fig, path)


@_drawing
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
    _save(fig, path)


@_drawing
def density_2d(model, samples, path, grid_size=200):
    """The learned 2-D density (from `model(x).distribution.log_prob(x)`) on a grid, beside a
    histogram of the test samples (the true density's draws)."""
    lo, hi = samples.min(0) - 1.0, samples.max(0) + 1.0
    xs = np.linspace(lo[0], hi[0], grid_size, dtype=np.float32)
    ys = np.linspace(lo[1], hi[1], grid_size, dtype=np.float32)
    points = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2)
    # Eager calls in chunks of 2^16 points (the default grid in one): the flow's per-op Python
    # work, not its arithmetic, is most of an eager call's time.
    chunk = 65536
    log_prob = np.concatenate(
        [
            model(points[i : i + chunk], training=False)
            .distribution.log_prob(points[i : i + chunk])
            .numpy()
            for i in range(0, len(points), chunk)
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
    _save(fig, path)


@_drawing
def image_grid(model, images, path, count=10, sample_label="sample"):
    """Test images, their reconstructions and `model.sample` draws of a VAE-like model (rows);
    `sample_label` names the last row for what it is (a VQ-VAE decodes uniform codes)."""
    count = min(count, len(images))  # a small test split has fewer images than the grid
    images = images[:count]
    shape = images.shape[1:3] if images.ndim == 4 else (int(np.sqrt(images.shape[-1])),) * 2
    rows = [
        ("data", images),
        ("reconstruction", np.asarray(model.reconstruct(images))),
        (sample_label, np.asarray(model.sample(count, seed=0))),
    ]
    fig, axes = plt.subplots(len(rows), count, figsize=(count, len(rows) + 0.5), squeeze=False)
    for r, (title, row) in enumerate(rows):
        for c in range(count):
            axes[r, c].imshow(row[c].reshape(shape), cmap="gray", vmin=0, vmax=1)
            axes[r, c].axis("off")
        axes[r, 0].set_title(title, fontsize=8, loc="left")
    _save(fig, path)


@_drawing
def flow_samples(model, data, path, count=10):
    """Test images above samples of a density model whose output is a random variable (a flow:
    base draws pushed through the layers)."""
    side = int(np.sqrt(data.shape[-1]))
    if data.ndim != 2 or side * side != data.shape[-1]:
        return False
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
    _save(fig, path)
    return True


@_drawing
def regression_calibration(means, stddevs, targets, path, scale=1.0):
    """Calibration of a regression's Monte Carlo predictive (any number of inputs): predicted
    against observed quantiles (the PIT of the mixture-of-Normals predictive; the diagonal is
    perfect calibration), and coverage of central intervals by their width (original units),
    with the nominal levels marked."""
    levels = np.linspace(0.05, 0.95, 19)
    observed = metrics_lib.quantile_calibration(means, stddevs, targets, levels)
    nominal, coverage, width = metrics_lib.interval_coverage(means, stddevs, targets, levels, scale)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    left.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    left.plot(levels, observed, "o-", label="model")
    left.set_xlabel("predicted quantile")
    left.set_ylabel("observed fraction of targets below it")
    left.set_title("quantile calibration")
    left.legend(loc="upper left")
    right.plot(width, nominal, "k--", label="nominal")
    right.plot(width, coverage, "o-", label="observed")
    right.set_xlabel("mean central-interval width (target units)")
    right.set_ylabel("coverage")
    right.set_title("coverage by interval width")
    right.legend(loc="lower right")
    _save(fig, path)


@_drawing
def sequence_reliability(token_confidence, token_correct, sequence_confidence, sequence_bleu, path):
    """Reliability at token level (teacher forced: accuracy against confidence) and, when
    decodes were scored, at sequence level (sentence BLEU / 100 against the decode's predicted
    probability), with their calibration errors in the titles."""
    panels = [("token", token_confidence, token_correct, "accuracy")]
    if sequence_confidence is not None and len(sequence_confidence):
        panels.append(("sequence", sequence_confidence, sequence_bleu, "sentence BLEU / 100"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    num_bins = 15
    centers = (np.arange(num_bins) + 0.5) / num_bins
    for ax, (level, confidence, correctness, label) in zip(axes[0], panels):
        counts, _, mean_correct = metrics_lib.confidence_bins(confidence, correctness, num_bins)
        error = metrics_lib.calibration_error(confidence, correctness, num_bins)
        ax.bar(centers, np.nan_to_num(mean_correct), width=1.0 / num_bins, edgecolor="k", alpha=0.7)
        ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
        ax.set_xlabel(f"{level} confidence")
        ax.set_ylabel(label)
        ax.set_title(f"{level}-level calibration error {error:.3f} (n = {int(counts.sum())})")
        ax.legend(loc="upper left")
    _save(fig, path)


@_drawing
def episode_returns(runs, path):
    """Return against episode (paper Figure 10): for each label, the median over its seeds'
    curves with the 5th-95th percentile band. `runs`: `{label: [returns of seed 1, ...]}`."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curves in runs.items():
        length = min(len(c) for c in curves)
        values = np.asarray([c[:length] for c in curves], float)
        episodes = np.arange(1, length + 1)
        ax.plot(episodes, np.median(values, 0), label=f"{label} ({len(curves)} seeds)")
        if len(curves) > 1:
            low, high = np.percentile(values, [5, 95], axis=0)
            ax.fill_between(episodes, low, high, alpha=0.25)
    ax.set_xlabel("episode")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # whole episodes
    ax.set_ylabel("return")
    ax.legend()
    _save(fig, path)


@_drawing
def curve(x, y, xlabel, ylabel, path, title=None, label=None):
    """One quantity against another (log y-axis when all values are positive), with `title`
    (default: the y label against the x label) and, given `label`, a legend."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, y, label=label)
    if len(y) and np.all(np.asarray(y) > 0):
        _log_axis(ax, y)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _title(ax, title or f"{ylabel} against {xlabel}", 60)
    if label:
        ax.legend(fontsize=8)
    _save(fig, path)


@_drawing
def open_loop_strip(true, predicted, path, columns=10, title=None):
    """An open-loop prediction (paper Figure 10): true frames above predicted ones, every
    `len / columns`-th step, for `[T, H, W, 3]` images in [-0.5, 0.5]; for `[T, d]` states,
    each of the first 6 observation dimensions over time, true against predicted. `title`
    names the run and model above the figure."""
    true, predicted = np.asarray(true), np.asarray(predicted)
    if true.ndim == 4:
        picks = np.linspace(0, len(true) - 1, min(columns, len(true))).astype(int)
        fig, axes = plt.subplots(2, len(picks), figsize=(1.2 * len(picks), 2.6), squeeze=False)
        for column, t in enumerate(picks):
            for row, frames in enumerate((true, predicted)):
                ax = axes[row, column]
                ax.imshow(np.clip(frames[t] + 0.5, 0.0, 1.0))
                ax.set_xticks([])
                ax.set_yticks([])
            axes[0, column].set_title(f"t+{t + 1}", fontsize=8)
        axes[0, 0].set_ylabel("true")
        axes[1, 0].set_ylabel("predicted")
    else:
        dims = min(6, true.shape[-1])
        fig, axes = plt.subplots(dims, 1, figsize=(6, 1.4 * dims), sharex=True, squeeze=False)
        for d in range(dims):
            axes[d, 0].plot(true[:, d], label="true")
            axes[d, 0].plot(predicted[:, d], "--", label="predicted")
            axes[d, 0].set_ylabel(f"observation\ndim {d}", fontsize=8)
        axes[0, 0].legend(fontsize=8)
        axes[-1, 0].set_xlabel("open-loop step")
        axes[-1, 0].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    if title:
        fig.suptitle(textwrap.fill(title, 70), fontsize=9)
    _save(fig, path)


@_drawing
def history_panels(history, keys, path):
    """Each of `keys` of the history's training records against the step, a panel each, with
    any evaluation metrics in the last panels (an agent's curves; the supervised trainer's
    are `training_curves`)."""
    train = [h for h in history if h["kind"] == "train"]
    evals = [h for h in history if h["kind"] == "eval"]
    eval_keys = sorted({k for h in evals for k in h if k not in ("kind", "step")})
    panels = [(k, train) for k in keys] + [(k, evals) for k in eval_keys]
    columns = 3
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    for ax, (key, records) in zip(axes.ravel(), panels):
        points = [(h["step"], h[key]) for h in records if key in h and np.isfinite(h[key])]
        if points:
            ax.plot(*zip(*points), "o-" if records is evals else "-")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    _save(fig, path)


@_drawing
def point_process_intensity(grid, draws, kde, train, test, window, path, unit=""):
    """Posterior intensity of a point process in original units: 1-D, the mean with the 5-95%
    band, the kernel estimate and the events as rugs; 2-D, images of the mean and of the band's
    width with the events, and the kernel estimate."""
    window = np.asarray(window, "float64")
    low, width = window[:, 0], window[:, 1] - window[:, 0]
    scale = 1.0 / np.prod(width)  # unit-window intensity -> per original unit volume
    draws, kde = np.asarray(draws) * scale, np.asarray(kde) * scale
    mean, lo, hi = draws.mean(0), *np.percentile(draws, [5, 95], axis=0)
    dims = window.shape[0]
    per = (f" per {unit}" if dims == 1 else f" per ({unit})^{dims}") if unit else ""
    if dims == 1:
        x = low[0] + width[0] * grid[:, 0]
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.fill_between(x, lo, hi, color="C0", alpha=0.25, label="posterior 5-95%")
        ax.plot(x, mean, "C0", label="posterior mean")
        ax.plot(x, kde, "C1--", label="kernel estimate")
        top = max(hi.max(), kde.max())
        ax.plot(
            low[0] + width[0] * train[:, 0],
            np.full(len(train), -0.03 * top),
            "|k",
            label="train events",
        )
        ax.plot(
            low[0] + width[0] * test[:, 0],
            np.full(len(test), -0.07 * top),
            "|",
            color="C3",
            label="held-out events",
        )
        ax.set_ylabel(f"intensity{per} (training pattern)")
        ax.legend(fontsize=8)
    else:
        size = round(np.sqrt(len(grid)))
        extent = [low[0], low[0] + width[0], low[1], low[1] + width[1]]
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        # The posterior mean and the kernel estimate share one colour scale, so that their
        # colours compare; the band width (a spread, not an intensity) has its own.
        shared = (min(mean.min(), kde.min()), max(mean.max(), kde.max()))
        for ax, image, title, limits in zip(
            axes,
            (mean, hi - lo, kde),
            ("posterior mean", "5-95% band width (own scale)", "kernel estimate"),
            (shared, (None, None), shared),
        ):
            shown = ax.imshow(
                image.reshape(size, size).T,
                origin="lower",
                extent=extent,
                cmap="viridis",
                vmin=limits[0],
                vmax=limits[1],
            )
            fig.colorbar(shown, ax=ax, label=f"intensity{per}")
            ax.scatter(low[0] + width[0] * train[:, 0], low[1] + width[1] * train[:, 1], s=2, c="w")
            ax.set_title(title)
    _save(fig, path)
