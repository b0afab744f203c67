"""Bad input is refused before anything runs, naming the culprit: a gin file that does not
parse, a layout rule that matches no dimension, a non-positive learning rate, a loop that does
not fit the config; a batch larger than the data is said, not silently clamped."""

import os
import pathlib
import subprocess
import sys

import gin
import numpy as np
import pytest

from blayers.lab import config, loop, runs
from blayers.lab import data as data_lib
from blayers.lab.learners import supervised

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_an_unclosed_bracket_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text(
        "include 'digits_mlp_smoke.gin'\ntrain.train_steps = 3\nmlp.hidden_units = (32,\n"
    )
    with pytest.raises(ValueError, match=r"bad.gin, line 3: 'mlp.hidden_units = \(32,'"):
        config.parse([str(bad)])


def test_a_non_positive_learning_rate_is_refused():
    for rate in (-1.0, 0.0, -1):
        with pytest.raises(ValueError, match="learning_rate must be positive"):
            supervised.make_optimizer(learning_rate=rate)
    import keras

    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    assert supervised.make_optimizer(learning_rate=schedule)  # a schedule is not a number


def test_a_layout_rule_matching_no_dimension_is_refused():
    from blayers.lab.mesh import graph as mesh_graph
    from blayers.lab.mesh.random import mtf
    from blayers.lab.mesh.transformer import TransformerHParams

    hparams = TransformerHParams(vocab_size=16, d_model=32, d_ff=64, num_heads=4)
    mesh = mtf.convert_to_shape("model:2")
    mesh_graph.check_layout(hparams, 32, mesh, "heads:model;d_ff:model")
    with pytest.raises(ValueError, match=r"haeds:model names no dimension.*heads"):
        mesh_graph.check_layout(hparams, 32, mesh, "haeds:model")
    # A misspelt mesh dimension would leave the heads unsplit: refused, naming the fix...
    with pytest.raises(ValueError, match=r"heads:modle .*did you mean heads:model"):
        mesh_graph.check_layout(hparams, 32, mesh, "heads:modle")
    # ...while a rule for another mesh's dimension (one layout, several meshes) is not.
    mesh_graph.check_layout(hparams, 32, mtf.convert_to_shape("batch:2"), "heads:model")


def test_a_batch_larger_than_the_data_is_said(caplog):
    digits = data_lib.digits()
    with caplog.at_level("WARNING"):
        run = supervised.SupervisedLearner(digits, model=None, batch_size=100_000)
    assert run.batch_size == digits.num_train
    assert any("batch_size=100000" in r.getMessage() for r in caplog.records)


def test_the_loop_must_fit_the_config(tmp_path):
    """`--strategy=mesh` with a Keras config, or a mesh config with a tf.distribute strategy,
    fails at once, naming the strategy and the config's learner (the first through the command
    line, which also removes the temporary folder a killed blayers process left; the second
    in-process, the same refusal of the Loop)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / "system_tmp" / f"blayers-{gone.pid}"
    stale.mkdir(parents=True)
    (stale / "__autograph_generated_file1234.py").write_text("x = 1\n")
    env = dict(os.environ, TMPDIR=str(tmp_path / "system_tmp"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "blayers.train",
            "--strategy=mesh",
            "--gin_file=digits_mlp_smoke",
            f"--model_dir={tmp_path / 'mesh'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--strategy=mesh cannot run SupervisedLearner" in done.stderr
    assert not (tmp_path / "mesh" / "command.json").exists()
    assert os.listdir(tmp_path / "system_tmp") == []  # the stale folder and its own: gone
    config.parse(["bayesian_transformer_mesh_smoke"])
    with pytest.raises(ValueError, match=r"--strategy=cpu cannot run MeshLearner"):
        loop.train(str(tmp_path / "cpu"), strategy="cpu")
    assert not list((tmp_path / "cpu").glob("checkpoints/*"))
    gin.clear_config()


def test_gin_imports_are_listed_refused_on_request_and_recorded(tmp_path):
    """Gin files are code: `--refuse_gin_imports` refuses every import (and dynamic
    registration) with its file and line, also in an included file; the operative config of
    a run lists the imports it used."""
    fragment = tmp_path / "fragment.gin"
    fragment.write_text("from __gin__ import dynamic_registration\n")
    outside = tmp_path / "outside.gin"
    outside.write_text(
        "include 'digits_mlp_smoke.gin'\ninclude 'fragment.gin'\nimport colorsys\n"
        "train.train_steps = 3\n"
    )
    with pytest.raises(ValueError, match="gin files are code") as info:
        config.parse([str(outside)], refuse_imports=True)
    assert f"{outside}:3: import colorsys" in str(info.value)
    assert f"{fragment}:1: from __gin__ import dynamic_registration" in str(info.value)
    gin.clear_config()
    with pytest.raises(ValueError, match=r"--gin_param #1: import colorsys"):
        config.parse(["digits_mlp_smoke"], ["import colorsys"], refuse_imports=True)
    gin.clear_config()
    plain = tmp_path / "plain.gin"
    plain.write_text("include 'digits_mlp_smoke.gin'\nimport colorsys\n")
    config.parse([str(plain)])  # trusted: parsed
    assert "import colorsys" in gin.config_str()
    gin.clear_config()


def test_refuse_gin_imports_refuses_what_it_cannot_scan_on_every_command(tmp_path):
    """gin runs an import as it parses, before a later syntax error: a file the scan cannot
    parse is refused, and the flag exists on the sweep, the experiments and post-hoc."""
    (tmp_path / "marker_mod.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('x')\n"
    )
    bad = tmp_path / "bad.gin"
    bad.write_text("import marker_mod\ntrain.train_steps = (\n")
    with pytest.raises(ValueError, match=r"bad.gin: does not parse"):
        config.parse([str(bad)], refuse_imports=True)
    with pytest.raises(ValueError, match=r"--gin_param #1 .*does not parse"):
        config.parse(["digits_mlp_smoke"], ["import marker_mod\nx = ("], refuse_imports=True)
    gin.clear_config()
    from launch import sweep

    with pytest.raises(SystemExit) as exited:  # refused before a trainer starts
        sweep.main([f"--gin_file={bad}", f"--root={tmp_path / 'sweep'}", "--refuse_gin_imports"])
    assert exited.value.code == 2 and not (tmp_path / "sweep").exists()
    with pytest.raises(SystemExit) as exited:
        sweep.main(
            [
                "--gin_file=digits_mlp_smoke",
                f"--root={tmp_path / 'sweep'}",
                "--refuse_gin_imports",
                "--sweep=seed=[1, 2]",
                "--gin_param=import marker_mod",
            ]
        )
    assert exited.value.code == 2
    run = tmp_path / "run"
    run.mkdir()
    (run / "operative_config.gin").write_text("import marker_mod\ntrain.train_steps = 3\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    # Each command refuses before it loads TensorFlow (a fraction of a second).
    commands = {
        "trainer": [
            "-m",
            "blayers.train",
            f"--model_dir={tmp_path / 'trained'}",
            f"--gin_file={bad}",
        ],
        "posthoc": ["-m", "blayers.posthoc", f"--model_dir={run}", "--method=temperature"],
        "experiment": [
            "-m",
            "experiments.cox_process",
            f"--root={tmp_path / 'cox'}",
            f"--gin_file={bad}",
        ],
    }
    for name, command in commands.items():
        done = subprocess.run(
            [sys.executable, *command, "--refuse_gin_imports"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode in (1, 2), (name, done.stderr[-2000:])
        assert "--refuse_gin_imports" in done.stderr, (name, done.stderr[-2000:])
    assert not (tmp_path / "ran").exists()  # the module never ran
    assert not (tmp_path / "cox").exists() and not (tmp_path / "trained").exists()


def test_bad_arrays_are_named_before_training():
    x, y = np.ones((10, 3), np.float32), np.arange(10) % 3
    make = lambda *a, **k: data_lib.from_arrays("toy", "classification", *a, **k)
    make(x, y, x, y, num_classes=3)
    with pytest.raises(ValueError, match=r"test label 5 at row 2 is outside \[0, 3\)"):
        make(x, y, x, np.where(y == 2, 5, y), num_classes=3)
    with pytest.raises(ValueError, match=r"train features are not finite at row 4, column 1"):
        bad = x.copy()
        bad[4, 1] = np.inf
        make(bad, y, x, y, num_classes=3)
    with pytest.raises(ValueError, match="the test split is empty"):
        make(x, y, x[:0], y[:0], num_classes=3)
    with pytest.raises(ValueError, match="10 train examples but 9 train labels"):
        make(x, y[:9], x, y, num_classes=3)
    with pytest.raises(ValueError, match=r"targets are not finite at row 3"):
        t = np.zeros(10, np.float32)
        t[3] = np.nan
        data_lib.from_arrays("toy", "regression", x, t, x, np.zeros(10))


def test_mismatched_shapes_are_refused_naming_both(tmp_path):
    """Targets [100, 1] against [20, 2] would be scored against the wrong width; labels (N, 1)
    or one-hot (N, 3) would fail inside TFP. Each fails in `from_arrays`, and a run refused
    for its data leaves no model_dir behind."""
    rng = np.random.default_rng(0)
    x_train, x_test = rng.normal(size=(100, 4)), rng.normal(size=(20, 4))
    regression = lambda *a, **k: data_lib.from_arrays("toy", "regression", *a, **k)
    with pytest.raises(ValueError, match=r"train targets are \(1,\) .* test targets \(2,\)"):
        regression(x_train, np.zeros((100, 1)), x_test, np.zeros((20, 2)))
    with pytest.raises(ValueError, match=r"train features are \(4,\) .* test features \(5,\)"):
        regression(x_train, np.zeros(100), rng.normal(size=(20, 5)), np.zeros(20))
    labels = np.arange(100) % 3
    classify = lambda *a, **k: data_lib.from_arrays("toy", "classification", *a, **k)
    with pytest.raises(ValueError, match=r"train labels have shape \(100, 1\).*y.ravel"):
        classify(x_train, labels[:, None], x_test, labels[:20], num_classes=3)
    with pytest.raises(ValueError, match=r"test labels have shape \(20, 3\).*one-hot"):
        classify(x_train, labels, x_test, np.eye(3)[labels[:20]], num_classes=3)
    with pytest.raises(ValueError, match=r"ood features are \(2,\)"):
        classify(x_train, labels, x_test, labels[:20], num_classes=3, ood=np.zeros((5, 2)))
    from blayers.lab import models

    model_dir = tmp_path / "run"  # a model that fails to build: no empty folder left
    data = classify(x_train, labels, x_test, labels[:20], num_classes=3)
    with pytest.raises((ValueError, TypeError)):
        loop.fit(
            str(model_dir),
            data=data,
            model=lambda shape, n: models.mlp(shape, n, hidden_units="abc"),
            train_steps=2,
            progress=False,
        )
    assert not model_dir.exists()


def test_a_non_finite_input_is_blamed_on_the_data_not_a_layer(tmp_path):
    """Data streamed from elsewhere (TFDS) is not checked up front; a NaN cell that reaches the
    loss is named as the data's, with its rows in the batch."""
    import tensorflow as tf

    from blayers.lab import models

    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    x[5, 2] = np.nan
    y = (np.arange(16) % 2).astype("int32")
    data = data_lib.Data(
        name="streamed",
        task="classification",
        train=tf.data.Dataset.from_tensor_slices((x, y)),
        test=tf.data.Dataset.from_tensor_slices((x[:4] * 0, y[:4])),
        num_train=16,
        num_test=4,
        input_shape=(4,),
        num_classes=2,
    )
    with pytest.raises(
        loop.NonFiniteLossError,
        match=r"features are not finite in rows \[\d+\] of data 'streamed'",
    ):
        loop.fit(
            str(tmp_path),
            data=data,
            model=lambda shape, n: models.mlp(shape, n, hidden_units=(4,)),
            batch_size=16,
            train_steps=2,
            shuffle_buffer=1,
            progress=False,
        )


def test_a_learner_refuses_a_model_it_cannot_train(tmp_path):
    """`VariationalProgramLearner` on a Keras classifier names what it built and the learner
    that trains it, before anything is written."""
    config.parse(
        ["digits_mlp_smoke"],
        [
            "train.learner = @VariationalProgramLearner()",
            "VariationalProgramLearner.data = @digits()",
            "VariationalProgramLearner.model = @mlp",
        ],
    )
    with pytest.raises(ValueError, match=r"built a Sequential, not a blayers.programs.Variational"):
        loop.train(str(tmp_path / "run"))
    assert not (tmp_path / "run" / "bindings.json").exists()


def test_the_mesh_and_planet_learners_name_the_layer_of_a_non_finite_step(tmp_path):
    """A non-finite step of the mesh learner names the first mesh variable with a non-finite
    entry; the PlaNet learner's (a subclassed world model) the first layer with a non-finite
    weight."""
    import keras
    import tensorflow as tf

    from blayers.lab.data import synthetic_translation
    from blayers.lab.learners import MeshLearner
    from blayers.lab.loop import Context
    from blayers.lab.mesh.transformer import TransformerHParams

    data = synthetic_translation(num_train=32, num_test=4, vocab_size=13, max_length=4, pad_to=6)
    hparams = TransformerHParams(d_model=8, d_ff=16, num_heads=2, num_layers=1)
    learner = MeshLearner(data, hparams=hparams, batch_size=8)
    learner.build(Context(runs.RunDir(tmp_path), tf.distribute.get_strategy(), None, 0, 1))
    try:
        # Its session: the process's settings (the test workers' thread counts), no grappler.
        config = learner.session._config
        assert config.graph_options.rewrite_options.disable_meta_optimizer
        threading = tf.config.threading
        assert config.intra_op_parallelism_threads == threading.get_intra_op_parallelism_threads()
        assert config.inter_op_parallelism_threads == threading.get_inter_op_parallelism_threads()
        rewriting = MeshLearner(data, hparams=hparams, batch_size=8, graph_rewrites=True)
        assert not rewriting.session_config().graph_options.rewrite_options.disable_meta_optimizer
        learner.restored()
        assert "every weight is finite" in learner.diagnose_non_finite(None)
        variable = learner.run.graph.trainable_variables[-1]
        (slice_,) = learner.run.lowering.variables[variable].laid_out_tensor.all_slices
        with learner.graph.as_default():
            learner.session.run(slice_.assign(tf.fill(slice_.shape, float("nan"))))
        assert f"mesh variable '{variable.name}'" in learner.diagnose_non_finite(None)
    finally:
        learner.close()

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.first, self.second = keras.layers.Dense(3), keras.layers.Dense(2, name="bad")

        def call(self, x):
            return self.second(self.first(x))

    model = Subclassed()
    model(np.ones((1, 4), "float32"))
    assert supervised.first_non_finite_layer(model) is None
    model.second.kernel.assign(np.full((3, 2), np.inf, "float32"))
    assert supervised.first_non_finite_layer(model) == ("bad", "weight 'subclassed/bad/kernel'")


def test_an_unknown_control_task_is_one_line_naming_the_known_ones():
    pytest.importorskip("dm_control")
    from blayers.lab.control.env import ControlEnv

    with pytest.raises(ValueError, match=r"no task cheetha-run; its domains are .*cheetah"):
        ControlEnv(domain="cheetha", task="run", observation="state")
    with pytest.raises(ValueError, match=r"no task cheetah-rn; cheetah's tasks are run"):
        ControlEnv(domain="cheetah", task="rn", observation="state")


def test_a_bad_binding_is_named_with_its_file_and_line(tmp_path):
    """An unclosed bracket is blamed on the line that opened it (gin fails on the next line),
    and a value that fails deep in a layer is traced back to the binding that set it."""
    from blayers.lab import models

    bad = tmp_path / "unclosed.gin"
    bad.write_text(
        "include 'digits_mlp_smoke.gin'\nmlp.hidden_units = (32,\ntrain.train_steps = 3\n"
    )
    with pytest.raises(ValueError, match=r"unclosed bracket on line 2 .*hidden_units = \(32,"):
        config.parse([str(bad)])
    gin.clear_config()
    config.parse(["digits_mlp_smoke"], ["mlp.hidden_units = 'abc'"])
    with pytest.raises(ValueError, match=r"mlp.hidden_units must be the widths") as info:
        gin.get_configurable(models.mlp)((8,), 3)
    named = "\n".join(config.bindings_in_error(info.value))
    assert "mlp.hidden_units = 'abc'  (In --gin_param #1" in named
    assert 'digits_mlp.gin", line' in named  # the chain's other bindings, from the file
