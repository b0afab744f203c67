"""The supervised learner under the Loop, in-process: outputs, ELBO bookkeeping, the non-finite
guard, resume."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers import objectives
from blayers.lab import data as data_lib
from blayers.lab import loop, models, runs
from blayers.lab.learners import supervised
from blayers.layers import DenseFlipout


def _small_digits():
    return data_lib.digits(ood="uniform_noise")


def _mlp(input_shape, num_outputs):
    return models.mlp(input_shape, num_outputs, hidden_units=(16,), dense_layer="DenseFlipout")


def test_outputs_metrics_and_plots(tmp_path, autograph_conversions):
    """A run's metrics, files and records; its steps, evaluation draws and feature extractor
    are traced as written (autograph's conversion took seconds in every process: a third of a
    smoke run's start)."""
    model_dir = str(tmp_path / "run")
    metrics = loop.fit(
        model_dir,
        data=_small_digits(),
        model=_mlp,
        train_steps=12,
        batch_size=64,
        log_every=4,
        eval_every=6,
        num_eval_samples=2,
        progress=False,
    )
    for key in (
        "accuracy",
        "nll",
        "ece",
        "brier",
        "entropy",
        "mutual_information",
        "ood_auroc_entropy",
    ):
        assert key in metrics and np.isfinite(metrics[key])
    names = set(os.listdir(model_dir))
    assert autograph_conversions == []
    assert {
        "checkpoints",
        "tensorboard",
        "operative_config.gin",
        "metrics.json",
        "history.jsonl",
        "training_curves.png",
        "reliability.png",
    } <= names
    assert os.listdir(os.path.join(model_dir, "tensorboard"))
    summary = json.loads(pathlib.Path(model_dir, "metrics.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 12
    records = [
        json.loads(line)
        for line in pathlib.Path(model_dir, "history.jsonl").read_text().splitlines()
    ]
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train_records] == [4, 8, 12]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [6, 12]
    for r in train_records:  # loss = nll + beta * KL / N, with beta = 1 by default
        assert r["loss"] == pytest.approx(r["nll"] + r["kl_per_example"], rel=1e-5)
        assert r["elbo"] == pytest.approx(-r["loss"], rel=1e-5)


def test_regression_writes_1d_plot_and_metrics(tmp_path):
    toy = data_lib.heteroscedastic_1d(num_train=64, num_test=32)
    metrics = loop.fit(
        str(tmp_path),
        data=toy,
        model=_mlp,
        train_steps=4,
        batch_size=32,
        num_eval_samples=2,
        progress=False,
    )
    assert {"rmse", "nlpd", "test_log_likelihood", "coverage_95"} <= set(metrics)
    assert os.path.exists(tmp_path / "regression_1d.png")


def test_kl_is_divided_by_dataset_size_and_annealed(tmp_path):
    toy = data_lib.heteroscedastic_1d(num_train=64, num_test=8)
    loop.fit(
        str(tmp_path),
        data=toy,
        model=_mlp,
        train_steps=4,
        batch_size=64,
        log_every=1,
        num_eval_samples=1,
        progress=False,
        plots=False,
        kl_schedule=lambda step: tf.cast(step, tf.float32) * 0.25,
    )
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["kl_weight"] for r in train_records] == [0.0, 0.25, 0.5, 0.75]
    for r in train_records:
        assert r["loss"] == pytest.approx(r["nll"] + r["kl_weight"] * r["kl_per_example"], rel=1e-5)


class BlowUpAfter(keras.layers.Layer):
    """Returns +inf from its `after`-th call on (a stand-in for a diverging layer)."""

    def __init__(self, after, **kwargs):
        super().__init__(**kwargs)
        self.after = after

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

    def call(self, x):
        self.calls.assign_add(1.0)
        return tf.where(self.calls >= self.after, np.inf, 1.0) * x


def test_non_finite_loss_names_step_and_layer_and_keeps_checkpoint(tmp_path):
    def model_fn(input_shape, num_outputs):
        return keras.Sequential(
            [
                keras.Input(input_shape),
                DenseFlipout(8, name="hidden"),
                BlowUpAfter(6, name="blow_up"),
                DenseFlipout(num_outputs),
            ]
        )

    with pytest.raises(loop.NonFiniteLossError) as error:
        loop.fit(
            str(tmp_path),
            data=_small_digits(),
            model=model_fn,
            train_steps=20,
            batch_size=32,
            checkpoint_every=2,
            progress=False,
            plots=False,
        )
    message = str(error.value)
    assert "step 6" in message and "'blow_up' (output)" in message and "ckpt-4" in message
    checkpoints = tf.train.get_checkpoint_state(str(tmp_path / "checkpoints"))
    assert checkpoints.model_checkpoint_path.endswith("ckpt-4")
    assert not os.path.exists(tmp_path / "metrics.json")


def test_first_non_finite_layer_checks_kl_too():
    layer = DenseFlipout(3, name="bad_kl")
    model = keras.Sequential([keras.Input((4,)), DenseFlipout(4, name="fine"), layer])
    model(np.ones((2, 4), "float32"))
    # softplus(-200) underflows to 0: a finite parameter, an infinite KL.
    layer.kernel_initializer.stddev.assign(tf.fill([4, 3], -200.0))
    assert supervised.first_non_finite_layer(model, np.ones((2, 4), "float32")) == (
        "bad_kl",
        "KL / regularization loss",
    )


def _jitter(features, target, seed):
    return features + 0.3 * tf.random.stateless_normal(tf.shape(features), seed), target


@pytest.mark.parametrize(
    "augment",
    # `test_resume_is_exact_from_any_checkpoint` checks more, on augmented data, in the fast
    # suite.
    [pytest.param(None, marks=pytest.mark.slow), pytest.param(_jitter, marks=pytest.mark.slow)],
    ids=["plain", "augmented"],
)
def test_resume_continues_from_the_checkpoint(tmp_path, augment):
    digits = _small_digits()
    digits.augment = augment  # per-example noise: a resumed run must replay its draws
    kwargs = {
        "data": digits,
        "model": _mlp,
        "batch_size": 64,
        "log_every": 5,
        "checkpoint_every": 5,
        "num_eval_samples": 1,
        "progress": False,
        "seed": 3,
    }
    loop.fit(str(tmp_path / "a"), train_steps=10, **kwargs)
    loop.fit(str(tmp_path / "a"), train_steps=20, **kwargs)  # resumes at 10
    loop.fit(str(tmp_path / "b"), train_steps=20, **kwargs)  # uninterrupted twin
    summary = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert summary["resumed_from_step"] == 10 and summary["step"] == 20

    def train_losses(run):
        return [
            r["nll"]
            for r in map(json.loads, (tmp_path / run / "history.jsonl").read_text().splitlines())
            if r["kind"] == "train"
        ]

    # Same seed, same data order and optimizer state: the resumed run retraces the twin.
    np.testing.assert_allclose(train_losses("a"), train_losses("b"), rtol=1e-4)


def test_optimizer_errors():
    with pytest.raises(ValueError, match="Unknown optimizer 'adamm'"):
        supervised.make_optimizer("adamm")
    assert isinstance(supervised.make_optimizer("sgd", 0.1), keras.optimizers.SGD)


def test_trains_on_mocked_tfds(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=64):
        mnist = data_lib.tfds_dataset("mnist", flatten=True)
        metrics = loop.fit(
            str(tmp_path),
            data=mnist,
            model=_mlp,
            train_steps=3,
            batch_size=32,
            num_eval_samples=1,
            progress=False,
            plots=False,
        )
    assert 0.0 <= metrics["accuracy"] <= 1.0


# -- nothing lost ------------------------------------------------------------------------------

_QUICK = {
    "batch_size": 64,
    "log_every": 5,
    "num_eval_samples": 1,
    "progress": False,
    "plots": False,  # the tests above draw them
    "seed": 3,
}


def _train_records(model_dir, key="nll"):
    lines = (pathlib.Path(model_dir) / "history.jsonl").read_text().splitlines()
    return [json.loads(line)[key] for line in lines if json.loads(line)["kind"] == "train"]


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory):
    """A finished 10-step run with checkpoints at steps 5 and 10 (each test damages a copy)."""
    run = tmp_path_factory.mktemp("ten_steps") / "run"
    blayers.set_seed(0)
    loop.fit(
        str(run), data=_small_digits(), model=_mlp, train_steps=10, checkpoint_every=5, **_QUICK
    )
    return run


@pytest.mark.parametrize(
    "damage",
    # A truncated newest checkpoint: test_loop_promises checks it for every learner (fast).
    [pytest.param("truncated_data", marks=pytest.mark.slow), "empty_index", "empty_state_file"],
)
def test_damaged_latest_checkpoint_falls_back_to_an_intact_one(tmp_path, damage, caplog, ten_steps):
    import shutil

    digits = _small_digits()
    run = tmp_path / "run"
    shutil.copytree(ten_steps, run)  # a moved run folder restores its own checkpoints
    ckpts = run / "checkpoints"
    if damage == "truncated_data":
        data_file = next(ckpts.glob("ckpt-10.data-*"))
        data_file.write_bytes(data_file.read_bytes()[:100])
        damaged = "ckpt-10"
    elif damage == "empty_index":
        (ckpts / "ckpt-10.index").write_bytes(b"")
        damaged = "ckpt-10"
    else:
        (ckpts / "checkpoint").write_text("")
        damaged = None
    with caplog.at_level("WARNING"):
        loop.fit(str(run), data=digits, model=_mlp, train_steps=15, checkpoint_every=5, **_QUICK)
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["step"] == 15
    if damaged:
        assert summary["resumed_from_step"] == 5  # the newest intact checkpoint
        assert any(
            damaged in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records
        )
        assert list(ckpts.glob(f"{damaged}.*.damaged"))  # kept, not deleted
    else:
        assert summary["resumed_from_step"] == 10  # the files themselves are intact


@pytest.mark.slow  # test_loop_promises checks the torn line for every learner (fast)
def test_torn_history_line_is_dropped_with_a_warning(tmp_path, caplog):
    digits = _small_digits()
    loop.fit(str(tmp_path), data=digits, model=_mlp, train_steps=5, checkpoint_every=5, **_QUICK)
    with open(tmp_path / "history.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 6, "nl')  # killed mid-write
    with caplog.at_level("WARNING"):
        loop.fit(
            str(tmp_path), data=digits, model=_mlp, train_steps=10, checkpoint_every=5, **_QUICK
        )
    assert any("torn line" in r.getMessage() for r in caplog.records)
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)


def test_second_trainer_on_a_model_dir_refuses(tmp_path):
    from blayers.lab.runs import RunLock, RunLockedError

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = tmp_path / "LOCK"
        lock.write_text(
            json.dumps({"pid": holder.pid, "host": socket.gethostname(), "started": time.time()})
        )
        with pytest.raises(RunLockedError, match=f"PID {holder.pid} on host"):
            loop.fit(str(tmp_path), data=_small_digits(), model=_mlp, train_steps=2, **_QUICK)
        assert not (tmp_path / "history.jsonl").exists()  # nothing was touched
    finally:
        holder.kill()
        holder.wait()
    # The holder is dead now: its lock is taken over, and released at the end.
    loop.fit(str(tmp_path), data=_small_digits(), model=_mlp, train_steps=2, **_QUICK)
    assert not (tmp_path / "LOCK").exists()
    with RunLock(str(tmp_path)), pytest.raises(RunLockedError, match="this process"):
        RunLock(str(tmp_path)).acquire()


@pytest.mark.parametrize(
    "stop_at",
    # Between evaluations: the same restore with the evaluation schedule's offset (slow suite).
    [10, pytest.param(7, marks=pytest.mark.slow)],
    ids=["checkpoint_on_eval_step", "between_evals"],
)
def test_resume_is_exact_from_any_checkpoint(tmp_path, stop_at):
    """Evaluation must not advance the training random streams: a run stopped at step 10 (a
    checkpoint that is also an evaluation step) or 7 resumes with the uninterrupted run's
    weight noise and per-example augmentation noise, so both finish with the same losses and
    metrics. A log window cut by a resume (steps 4 and 5 after a stop at 3) is the mean of its
    own steps' losses."""
    digits = _small_digits()
    digits.augment = _jitter  # per-example noise: a resumed run must replay its draws
    common = dict(_QUICK, log_every=1, eval_every=10, checkpoint_every=stop_at)
    twin = loop.fit(str(tmp_path / "twin"), data=digits, model=_mlp, train_steps=20, **common)
    loop.fit(str(tmp_path / "cut"), data=digits, model=_mlp, train_steps=stop_at, **common)
    resumed = loop.fit(str(tmp_path / "cut"), data=digits, model=_mlp, train_steps=20, **common)
    per_step = _train_records(tmp_path / "twin")  # steps 1..20
    np.testing.assert_allclose(_train_records(tmp_path / "cut"), per_step, rtol=1e-5)
    assert resumed["accuracy"] == twin["accuracy"] and resumed["nll"] == pytest.approx(
        twin["nll"], rel=1e-5
    )
    if stop_at != 10:
        return
    windows = dict(_QUICK, log_every=5, checkpoint_every=3)
    loop.fit(str(tmp_path / "a"), data=digits, model=_mlp, train_steps=3, **windows)
    # `train.plots = False` drew nothing, and may change on resume: the rerun draws.
    assert not list((tmp_path / "a").glob("*.png"))
    assert not list((tmp_path / "twin").glob("*.png"))
    loop.fit(
        str(tmp_path / "a"), data=digits, model=_mlp, train_steps=5, **dict(windows, plots=True)
    )
    assert {p.name for p in (tmp_path / "a").glob("*.png")} == {
        "training_curves.png",
        "reliability.png",
    }
    records = [
        json.loads(line)
        for line in (tmp_path / "a" / "history.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    window = next(r for r in records if r["step"] == 5)  # steps 4 and 5 after the resume
    assert window["nll"] == pytest.approx(np.mean(per_step[3:5]), rel=1e-4)


def _parse(*params):
    from blayers.lab import config

    config.parse(["digits_mlp_smoke"], ["train.progress = False", *params])


# test_run_folder's damaged-bindings tests refuse the same change, the folder untouched (fast).
@pytest.mark.slow
def test_a_binding_changed_on_resume_refuses_and_the_config_is_not_rewritten(tmp_path):
    from blayers.lab import config  # noqa: F401 - registers the configurables

    _parse("train.train_steps = 4", "train.checkpoint_every = 2")
    loop.fit(str(tmp_path))
    before = (tmp_path / "operative_config.gin").read_text()
    gin.clear_config()
    _parse(
        "train.train_steps = 6",  # may change: the loop's length
        "train.checkpoint_every = 2",
        "make_optimizer.learning_rate = 0.5",  # cannot apply: restored with the optimizer
    )
    with pytest.raises(runs.ChangedBindingsError, match="make_optimizer.learning_rate"):
        loop.fit(str(tmp_path))
    assert (tmp_path / "operative_config.gin").read_text() == before
    gin.clear_config()
    _parse("train.train_steps = 6", "train.checkpoint_every = 2")
    assert loop.fit(str(tmp_path))  # the original bindings (and a longer run) resume


def test_a_binding_the_model_builder_overrides_fails_loudly(tmp_path):
    _parse("DenseFlipout.units = 'ten'")
    with pytest.raises(ValueError, match="DenseFlipout.units = 'ten'"):
        loop.fit(str(tmp_path))


def test_outputs_a_researcher_reads(tmp_path):
    """Calibration plot for multi-input regression, the KL weight and local loss in the
    history, and the plots as TensorBoard images."""
    regression = data_lib.diabetes()
    loop.fit(
        str(tmp_path / "reg"),
        data=regression,
        model=_mlp,
        train_steps=6,
        log_every=3,
        num_eval_samples=2,
        progress=False,
        kl_schedule=objectives.linear_kl_annealing,
    )
    assert (tmp_path / "reg" / "calibration.png").exists()
    records = [json.loads(line) for line in (tmp_path / "reg" / "history.jsonl").open()]
    assert all("kl_weight" in r and "local_loss" in r for r in records if r["kind"] == "train")
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(
        str(tmp_path / "reg" / "tensorboard"), size_guidance={"tensors": 0}
    )
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {"plots/calibration", "plots/training_curves", "train/kl_weight"} <= tags


def test_vae_latent_kl_is_logged_where_it_lives(tmp_path, capsys):
    """The latent KL is the local loss (history, progress bar `latent_kl`); the progress bar's
    weights' KL is labelled as such (a VAE's deterministic weights have none)."""
    from blayers.lab.models import vae

    data = data_lib.binarized_digits()
    loop.fit(
        str(tmp_path),
        data=data,
        model=lambda s, n: vae(s, n, latent_dim=2, filters=(4,), hidden_units=16),
        train_steps=4,
        log_every=2,
        batch_size=32,
        num_eval_samples=2,
        progress=True,
        plots=False,
    )
    shown = capsys.readouterr().out
    assert "latent_kl:" in shown and "weights_kl/N:" in shown and " kl:" not in shown
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").open()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert all(r["local_loss"] > 0 for r in train_records)  # the latent KL, not a flat 0
    for r in train_records:
        assert r["loss"] == pytest.approx(
            r["nll"] + r["local_loss"] + r["kl_weight"] * r["kl_per_example"], rel=1e-5
        )


def test_set_kl_scale_gives_fit_the_per_example_elbo():
    """`model.fit` adds `model.losses` unscaled (a loss near 1e5 on digits); after
    `set_kl_scale(model, N)` the KL joins as KL / N."""
    digits = _small_digits()
    x = np.concatenate([f.numpy()[None] for f, _ in digits.train.take(256)])
    y = np.concatenate([t.numpy()[None] for _, t in digits.train.take(256)])
    model = _mlp(digits.input_shape, digits.num_outputs)
    model(x[:2])
    kl = float(sum(model.losses))
    assert blayers.set_kl_scale(model, digits.num_train) == 2
    model(x[:2])
    assert float(sum(model.losses)) == pytest.approx(kl / digits.num_train, rel=0.05)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    assert history.history["loss"][0] < 10.0  # NLL (about log 10) + KL / N, not 1e5
    with pytest.raises(ValueError, match="build the model first"):
        blayers.set_kl_scale(keras.Sequential([DenseFlipout(3)]), 100)


@pytest.mark.parametrize(
    "make",
    [
        lambda: blayers.layers.SparseGaussianProcess(1, num_inducing=5),
        lambda: blayers.layers.RandomFourierFeatures(1, num_features=16),
        lambda: DenseFlipout(
            3, kernel_regularizer=lambda rv: tf.reduce_sum(rv.distribution.stddev())
        ),
        lambda: keras.layers.RNN(blayers.layers.LSTMCellFlipout(3)),
    ],
    ids=["svgp", "random_features", "callable_regularizer", "lstm"],
)
def test_set_kl_scale_scales_every_kl_blayers_adds(make):
    """GP KLs, random-feature output layers, callable regularizers and recurrent cells: every
    term of `model.losses` is divided by N, none is left at full size."""
    x = np.random.RandomState(0).randn(8, 4, 2).astype("float32")
    layer = make()
    inputs = x if isinstance(layer, keras.layers.RNN) else x[:, 0]
    model = keras.Sequential([keras.Input(inputs.shape[1:]), layer])
    model(inputs)
    before = [float(loss) for loss in model.losses]
    assert before and all(b != 0 for b in before)
    assert blayers.set_kl_scale(model, 100) == len(before)
    model(inputs)
    # Every KL here is analytic in the variational parameters: exactly KL / N.
    np.testing.assert_allclose(
        [float(loss) for loss in model.losses], np.array(before) / 100, rtol=1e-5
    )
    if isinstance(layer, blayers.layers.SparseGaussianProcess):
        assert layer.get_config()["scale_factor"] == 0.01


def test_a_learner_collects_between_phases(tmp_path):
    """A reinforcement-learning learner collects between training phases: the Loop calls
    `collect` before each phase that `batches` yields, whatever the phase's length."""
    calls = []

    class Collecting(supervised.SupervisedLearner):
        def collect(self):
            calls.append(self.step)

        def batches(self):  # phases of 4 steps
            for i, batch in enumerate(super().batches()):
                if i == 4:
                    return
                yield batch

    mine = ("batch_size", "num_eval_samples")
    learner = Collecting(_small_digits(), _mlp, **{k: _QUICK[k] for k in mine})
    quick = {k: v for k, v in _QUICK.items() if k not in mine}
    loop.train(str(tmp_path), learner=learner, train_steps=10, **dict(quick, log_every=2))
    assert calls == [0, 4, 8]
    assert json.loads((tmp_path / "metrics.json").read_text())["step"] == 10


def test_density_bits_are_named_by_what_they_measure():
    """Dequantized pixels: the discrete bits per pixel (the figure papers report) beside the
    continuous density's bits on the unit scale, each named; other data: bits per dimension."""
    import tensorflow_probability as tfp

    from blayers.lab.tasks.density import Density

    x = np.random.RandomState(0).uniform(0, 1, (20, 4)).astype("float32")

    def model(inputs, training=False):
        del training
        return blayers.Independent(tfp.distributions.Uniform(tf.zeros_like(inputs), 1.0), 1)

    dataset = tf.data.Dataset.from_tensor_slices((x, x))
    pixels = data_lib.Data(
        "px", "density", dataset, dataset, 20, 20, (4,), reference={"levels": 17}
    )
    result = Density._flow_metrics(model, pixels, 2, 8)
    assert set(result) == {
        "test_nll",
        "bits_per_dim_continuous_unit_scale",
        "bits_per_pixel_discrete",
    }
    assert result["bits_per_dim_continuous_unit_scale"] == pytest.approx(0.0, abs=1e-6)
    assert result["bits_per_pixel_discrete"] == pytest.approx(np.log2(17), rel=1e-6)
    points = data_lib.Data("pts", "density", dataset, dataset, 20, 20, (4,))
    assert set(Density._flow_metrics(model, points, 2, 8)) == {"test_nll", "bits_per_dim"}


@pytest.mark.parametrize("autograph", [True, False])
def test_compiled_steps_sum_until_the_data_ends_or_a_step_is_not_finite(autograph):
    """`compile_steps`: up to `n` steps a call, stopping early at the end of the data or after
    a non-finite step; with autograph (a learner's own step function may branch on tensors)
    and without (blayers' learners)."""
    from blayers.lab.learners.base import KerasLearner

    total = tf.Variable(0.0)

    def step_fn(value):
        total.assign_add(value)
        if autograph:  # converted: a tensor-valued `if`
            non_finite = 0.0
            if not tf.math.is_finite(value):
                non_finite = 1.0
        else:
            non_finite = tf.cast(tf.logical_not(tf.math.is_finite(value)), tf.float32)
        return {"value": value, "non_finite": non_finite}

    def next_batch(i, values):
        return i < tf.shape(values)[0], lambda: values[i]

    steps = KerasLearner.compile_steps(step_fn, next_batch, ("value", "non_finite"), autograph)
    read = lambda values, n: KerasLearner.read_steps(steps(tf.constant(n), tf.constant(values)))
    assert read([1.0, 2.0, 3.0], 2) == (
        2,
        {"value": 3.0, "non_finite": 0.0},
        {"value": 2.0, "non_finite": 0.0},
    )
    assert read([1.0, 2.0], 5)[:2] == (2, {"value": 3.0, "non_finite": 0.0})  # the data ends
    count, sums, last = read([1.0, np.inf, 5.0], 3)  # stops after the non-finite step
    assert count == 2 and last["non_finite"] == 1.0 and sums["value"] == np.inf
    assert float(total.numpy()) == np.inf


def test_several_runs_in_a_process_do_not_warn_of_retracing():
    """Each run compiles its own steps; TensorFlow counts traces per code object, so every
    run's counted together and the sixth run in a process (a notebook's, a benchmark's) warned
    "triggered tf.function retracing" though no run traced more than its own two shapes."""
    from blayers.lab import cli_env
    from blayers.lab.learners.base import KerasLearner

    def step_fn(value):
        return {"value": value, "non_finite": tf.constant(0.0)}

    def next_batch(i, values):
        return i < tf.shape(values)[0], lambda: values[i]

    warned = []
    keep = lambda record: warned.append(record.getMessage()) or True
    with cli_env.dropped_records(tf.get_logger(), keep):
        for _ in range(8):  # eight runs, each a full call and a shorter last one
            steps = KerasLearner.compile_steps(step_fn, next_batch, ("value", "non_finite"), False)
            for n in (3, 1):
                KerasLearner.read_steps(steps(tf.constant(n), tf.ones([n])))
    assert not [m for m in warned if "retracing" in m], warned
    name = steps.get_concrete_function(tf.constant(1), tf.ones([1])).name.decode()
    assert name.startswith("__inference_steps_"), name  # its name in profiles and TensorBoard


@pytest.mark.parametrize("hook", [False, True], ids=["chained", "begin_epoch_layer"])
def test_a_phase_chains_short_epochs_batch_for_batch(tmp_path, hook):
    """An epoch of a few batches: a phase's pipeline holds the rest of its epoch and the next
    epochs' to the run's end, batch for batch the per-epoch stream's (one iterator, not one an
    epoch); a model with a layer that restarts statistics at each epoch (`begin_epoch`) keeps
    to one epoch a phase."""
    from blayers.lab.data.stream import epoch_batches
    from blayers.lab.loop import Context

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 3)), rng.normal(size=(20, 1))
    data = data_lib.from_arrays("toy", "regression", x, y, x[:4], y[:4])

    class EpochCounter(keras.layers.Layer):
        def begin_epoch(self):
            pass

    def model(input_shape, num_outputs):
        extra = [EpochCounter()] if hook else []
        return keras.Sequential([keras.Input(input_shape), *extra, keras.layers.Dense(num_outputs)])

    learner = supervised.SupervisedLearner(data, model=model, batch_size=6)  # 3 batches an epoch
    learner.build(Context(runs.RunDir(str(tmp_path)), tf.distribute.get_strategy(), None, 4, 200))
    learner.step_variable.assign(7)  # epoch 2, its second batch
    got = [b[0].numpy() for b in learner.batches()]
    expected = [
        b[0].numpy()
        for epoch in range(2, 67)  # epochs 2-66 hold the run's steps 7-200
        for b in epoch_batches(data, 6, 4, epoch, 1 if epoch == 2 else 0)
    ]
    assert len(expected) == 194
    assert len(got) == (2 if hook else 194)  # hook: the rest of epoch 2
    for a, b in zip(got, expected, strict=False):
        np.testing.assert_array_equal(a, b)
    learner.step_variable.assign(195)  # five steps left: two epochs
    assert len(list(learner.batches())) == (3 if hook else 6)
