"""The figures a researcher reads: every axis can be read (log axes carry several labelled
ticks), reference values are lines rather than metrics, panels say what they show."""

import matplotlib.pyplot as plt
import numpy as np
import pytest

from blayers.lab import plots


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions close, kept open for inspection."""
    kept, close = [], plt.close
    monkeypatch.setattr(plots.plt, "close", kept.append)
    yield kept
    for figure in kept:
        close(figure)


def _tick_labels(ax):
    ax.figure.canvas.draw()
    low, high = ax.get_ylim()
    return [
        t.get_text()
        for t, v in zip(ax.get_yticklabels(), ax.get_yticks())
        if t.get_text() and low <= v <= high
    ]


@pytest.mark.parametrize("values", [[0.012, 0.019], [3.1, 3.3, 3.6], [2.0, 2.0], [1e-3, 5.0]])
def test_log_axes_show_several_readable_tick_labels(values):
    """A KL curve within one decade (the usual case) gets at least three labels, plain
    numbers, inside the visible range."""
    fig, ax = plt.subplots()
    ax.plot(range(len(values)), values)
    plots._log_axis(ax, values)
    labels = _tick_labels(ax)
    plt.close(fig)
    assert len(labels) >= 3, labels
    assert all("$" not in label and "^" not in label for label in labels)


def _history(evals):
    train = [
        {
            "kind": "train",
            "step": s,
            "loss": 1.0 / s,
            "nll": 0.9 / s,
            "local_loss": 0.0,
            "kl_per_example": 0.02 + 0.001 * s,
            "kl_weight": 1.0,
        }
        for s in range(1, 40)
    ]
    return train + evals


def test_one_evaluation_is_a_table_and_optima_are_not_metrics(figures, tmp_path):
    record = {
        "kind": "eval",
        "step": 39,
        "token_nll": 0.6,
        "token_nll_optimum": 0.49,
        "accuracy": 0.9,
        "bleu_beam": 75.9,
        "test_elbo": -90.0,
    }
    plots.training_curves(_history([record]), str(tmp_path / "curves.png"))
    axes = [ax for ax in figures[0].axes if ax.axison]  # the table's panel has no axes
    titles = [ax.get_title() for ax in figures[0].axes]
    assert len(axes) == 4 and any("test metrics at step 39" in t for t in titles), titles
    text = " ".join(t.get_text() for ax in figures[0].axes for t in ax.texts)
    assert "token_nll" in text and "optimum 0.49" in text and "bleu_beam" in text
    assert not any("optimum" in t for t in titles)
    kl_axis = next(ax for ax in axes if "KL / N" in ax.get_title())
    assert len(_tick_labels(kl_axis)) >= 3 and kl_axis.get_ylabel() == "nats per example"


@pytest.mark.parametrize("num_metrics", [5, 25, 40])
def test_every_line_of_the_table_is_inside_the_figure(figures, tmp_path, num_metrics):
    """A classification run scores a few dozen metrics; each line of the one-evaluation table
    is drawn inside the figure (a fixed font ran the last lines off its bottom edge)."""
    record = {"kind": "eval", "step": 39}
    record.update({f"ood_auroc_metric_number_{i:02d}": 0.5 + i / 1000 for i in range(num_metrics)})
    record["loglik_optimum"], record["loglik"] = -1.0, -1.2  # the longest line: an optimum
    plots.training_curves(_history([record]), str(tmp_path / "curves.png"))
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    (table,) = [t for ax in fig.axes for t in ax.texts]
    box, frame = table.get_window_extent(renderer), fig.bbox
    assert table.get_text().count("\n") == num_metrics  # one line a metric
    assert box.y0 >= frame.y0 and box.y1 <= frame.y1, (box, frame)
    assert box.x0 >= frame.x0 and box.x1 <= frame.x1, (box, frame)
    assert table.get_fontsize() >= 2.0


def test_several_evaluations_draw_optima_as_reference_lines(figures, tmp_path):
    evals = [
        {
            "kind": "eval",
            "step": s,
            "token_nll": 1.0 / s,
            "token_nll_optimum": 0.49,
            "test_elbo": -100.0 + s,
        }
        for s in (10, 20, 30)
    ]
    plots.training_curves(_history(evals), str(tmp_path / "curves.png"))
    axes = [ax for ax in figures[0].axes if ax.axison]
    titles = [ax.get_title() for ax in axes]
    assert "test test_elbo" not in titles and "test_elbo" in titles
    nll = next(ax for ax in axes if ax.get_title() == "test token_nll")
    assert any(np.allclose(line.get_ydata(), 0.49) for line in nll.lines)
    assert not any("optimum" in t for t in titles)


def test_intensity_images_share_one_colour_scale(figures, tmp_path):
    grid = np.stack(np.meshgrid(np.linspace(0, 1, 10), np.linspace(0, 1, 10)), -1).reshape(-1, 2)
    rng = np.random.RandomState(0)
    draws = rng.uniform(500, 900, (20, 100))
    kde = rng.uniform(1000, 2500, 100)
    events = rng.uniform(0, 1, (30, 2))
    plots.point_process_intensity(
        grid, draws, kde, events, events, [[0, 1], [0, 1]], str(tmp_path / "i.png")
    )
    mean_image, band_image, kde_image = (ax.images[0] for ax in figures[0].axes[:3])
    assert mean_image.get_clim() == kde_image.get_clim()
    assert band_image.get_clim() != mean_image.get_clim()


def test_episode_axes_count_whole_episodes_and_open_loop_names_its_run(figures, tmp_path):
    plots.episode_returns({"Bayesian": [[1.0, 5.0, 3.0]]}, str(tmp_path / "score.png"))
    ax = figures[0].axes[0]
    ax.figure.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())
    true = np.random.RandomState(0).randn(12, 5)
    plots.open_loop_strip(true, true + 0.1, str(tmp_path / "ol.png"), title="planet/seed0: cheetah")
    figure = figures[1]
    assert figure._suptitle is not None and "planet/seed0" in figure._suptitle.get_text()
    assert all("x[" not in ax.get_ylabel() for ax in figure.axes)


def test_the_loss_has_its_own_axis_and_a_deterministic_run_draws_no_kl(figures, tmp_path):
    """NLL (~0.5) and an annealed loss with the weights' KL (~130) on one axis would flatten
    the NLL: the loss gets its own panel; a run without KL draws no KL panels."""
    history = _history([{"kind": "eval", "step": 39, "accuracy": 0.9}])
    for record in history[:-1]:
        record["loss"] = record["nll"] + 130.0
    plots.training_curves(history, str(tmp_path / "bayesian.png"))
    axes = [ax for ax in figures[0].axes if ax.axison]
    objective = next(ax for ax in axes if "NLL per example" in ax.get_title())
    assert max(max(line.get_ydata()) for line in objective.lines) < 1.0  # no loss line there
    assert any("NLL + beta_t KL" in ax.get_title() for ax in axes)
    for record in history[:-1]:
        record.update(kl_per_example=0.0, loss=record["nll"])
    plots.training_curves(history, str(tmp_path / "deterministic.png"))
    titles = [ax.get_title() for ax in figures[1].axes if ax.axison]
    assert not any("KL" in t for t in titles), titles
    assert any("training objective" in t for t in titles)


def test_plots_name_what_they_show_and_keep_the_curve_in_frame(figures, tmp_path):
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=(1, 50))
    plots.reliability_diagram(
        probs, rng.integers(0, 3, 50), str(tmp_path / "r.png"), name="run + swag"
    )
    assert figures[0].axes[0].get_title().startswith("run + swag: reliability")
    values = [5.0, 3.0, 2.0, 1.5]
    plots.curve(
        range(4), values, "training step", "KL", str(tmp_path / "c.png"), title="T", label="rssm"
    )
    ax = figures[1].axes[0]
    low, high = ax.get_ylim()
    assert low < min(values) and high > max(values)  # not clipped at the frame
    assert ax.get_title() == "T" and ax.get_legend() is not None


def test_a_family_of_metrics_shares_one_panel_a_line_a_member(figures, tmp_path):
    """The OOD scores' AUROCs (and their FPRs) are compared with one another: one panel each,
    a labelled line a score, on the [0, 1] axis; the selective risks share one too."""
    names = ("entropy", "max_logit", "feature_density")
    evals = [
        {
            "kind": "eval",
            "step": s,
            "accuracy": 0.8,
            "nll": 0.5,
            "aurc": 0.1,
            "augrc": 0.05,
            **{f"ood_auroc_{n}": 0.5 + 0.1 * i for i, n in enumerate(names)},
            **{f"ood_fpr95_{n}": 0.9 - 0.1 * i for i, n in enumerate(names)},
        }
        for s in (10, 20)
    ]
    plots.training_curves(_history(evals), str(tmp_path / "curves.png"))
    axes = {ax.get_title(): ax for ax in figures[0].axes if ax.axison}
    auroc = axes["OOD AUROC by score"]
    drawn = {line.get_label(): line.get_ydata()[0] for line in auroc.lines}
    assert drawn == pytest.approx({"entropy": 0.5, "max_logit": 0.6, "feature_density": 0.7})
    assert auroc.get_ylim() == (-0.02, 1.02)
    fpr = axes["OOD FPR at 95% TPR by score"]
    assert sorted(line.get_label() for line in fpr.lines) == sorted(names)
    assert len(axes["selective risk: AURC, AUGRC"].lines) == 2
    assert not any("ood_" in title or title == "test aurc" for title in axes)
    assert "test nll" in axes


def test_a_plot_draws_with_the_cyclic_collector_paused_and_restores_it(tmp_path, monkeypatch):
    """Drawing allocates enough to set off full collections of the trainer's whole heap: the
    collector is paused while a plot draws, and on again after it, also when the plot fails."""
    import gc

    seen, subplots = [], plt.subplots

    def recording(*args, **kwargs):
        seen.append(gc.isenabled())
        return subplots(*args, **kwargs)

    monkeypatch.setattr(plots.plt, "subplots", recording)
    assert gc.isenabled()
    plots.curve([0, 1, 2], [1.0, 0.5, 0.2], "step", "loss", str(tmp_path / "curve.png"))
    assert seen == [False] and gc.isenabled() and (tmp_path / "curve.png").exists()
    with pytest.raises(ValueError):
        plots.curve([0, 1], [1.0], "step", "loss", str(tmp_path / "bad.png"))  # unequal lengths
    assert gc.isenabled()
    gc.disable()  # a caller that paused it keeps it paused
    try:
        plots.curve([0, 1], [1.0, 0.5], "step", "loss", str(tmp_path / "again.png"))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_skipped_plots_draw_and_compute_nothing_until_the_block_ends(tmp_path):
    """`train.plots = False`: under `skipped()` a figure function returns None before any of
    its work (here a model the density plot would call), also nested, and draws again after."""
    calls = []
    with plots.skipped():
        assert plots.density_2d(calls.append, np.zeros((4, 2)), str(tmp_path / "d.png")) is None
        with plots.skipped(False):
            plots.curve([0, 1], [1.0, 0.5], "step", "loss", str(tmp_path / "inner.png"))
        plots.curve([0, 1], [1.0, 0.5], "step", "loss", str(tmp_path / "skipped.png"))
    assert calls == [] and not (tmp_path / "skipped.png").exists()
    assert (tmp_path / "inner.png").exists()
    plots.curve([0, 1], [1.0, 0.5], "step", "loss", str(tmp_path / "after.png"))
    assert (tmp_path / "after.png").exists()
