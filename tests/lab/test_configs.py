"""Every gin file in configs/ parses with the search path, and every smoke config trains."""

import math
import pathlib
import re

import gin
import pytest

import blayers
from blayers.lab import config, loop

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs"
CONFIGS = sorted(CONFIG_DIR.rglob("*.gin"))
SMOKES = [p for p in CONFIGS if p.name.endswith("_smoke.gin")]
# Mesh TensorFlow configs: the mesh learner (tests below and tests/lab/test_mesh.py).
MESH = [p for p in CONFIGS if "MeshLearner." in p.read_text()]
# PlaNet configs: the PlaNet learner (tests/lab/test_planet.py).
PLANET = [p for p in CONFIGS if "PlanetLearner." in p.read_text()]


def _text_with_includes(path):
    text = path.read_text()
    included = re.findall(r"^include '([^']+)'", text, flags=re.MULTILINE)
    return text + "".join(_text_with_includes(CONFIG_DIR / name) for name in included)


# Full-scale configs whose data comes through TFDS: run end to end on mocked TFDS data.
TFDS_CONFIGS = [p for p in CONFIGS if p not in SMOKES + MESH and "tfds_" in _text_with_includes(p)]
# ResNet-50, the baselines' Wide ResNet, Transformer-base and the binarized-MNIST VQ-VAE (its
# digits smoke config trains the same model in the fast suite): about 25 s each.
SLOW_TFDS = {
    "realnvp_mnist.gin",  # realnvp_digits_smoke trains the same flow in the fast suite
    "vae_mnist_subset.gin",  # vae_digits_smoke trains the same VAE in the fast suite
    "vqvae_binarized_mnist.gin",
    "uncertainty_baselines_cifar10.gin",
    "resnet50_imagenet.gin",
    "resnet50_cifar10.gin",
    "bayesian_transformer_wmt14.gin",
    "bayesian_transformer_wmt14_mesh.gin",
}


def _tfds_bindings(path, tmp_path):
    """Mocked TFDS text must not leave a vocabulary in the user's cache."""
    if "tfds_translation" in _text_with_includes(path):
        return [f"tfds_translation.vocab_dir = '{tmp_path / 'vocab'}'"]
    return []


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_gin_file_parses(path):
    config.parse([str(path.relative_to(CONFIG_DIR))], refuse_imports=True)  # no gin imports
    assert gin.config_str() or path.stat().st_size == 0
    # The schedule a config binds is one the Loop accepts (the smoke runs below override it).
    names = ("train_steps", "eval_every", "checkpoint_every", "log_every", "keep_checkpoints")
    bound = {}
    for name in names:
        try:
            bound[name] = gin.query_parameter(f"train.{name}")
        except ValueError:  # not bound: the default
            pass
    loop.Loop("unused", learner=None, **bound)


_FEW_DECODES = (
    "SequenceToSequence.num_decode = 4",
    "SequenceToSequence.beam_size = 2",
    "SequenceToSequence.max_decode_length = 4",
)


def _train_briefly(path, model_dir, steps, *bindings):
    """Trains the config at `path` for `steps` steps, one evaluation sample, no progress bar."""
    config.parse(
        [str(path.relative_to(CONFIG_DIR))],
        [
            f"train.train_steps = {steps}",
            "train.eval_every = None",
            "train.progress = False",
            "SupervisedLearner.num_eval_samples = 1",
            # a few decodes: the full evaluation is the smoke run's own (slow tests, README)
            *(_FEW_DECODES if "SequenceToSequence" in _text_with_includes(path) else []),
            *bindings,
        ],
    )
    metrics = loop.fit(str(model_dir))
    assert metrics and all(math.isfinite(v) for v in metrics.values())


# Short runs the fast suite checks elsewhere, faster (each still runs here with the slow suite,
# and in full in tests/experiments/): the Transformer trains and decodes in
# tests/lab/test_transformer.py (its language-model and WMT14 smoke runs differ in data only);
# ResNet-50 is built from its smoke config in tests/library/test_layer_families.py, and its
# Bayesian convolutions fit and save there. Two smoke configs train in full in the fast suite
# (the Cox process's in tests/library/test_point_process.py, the replicated UCI one in
# tests/lab/test_replicated_training.py).
SLOW_SMOKES = {
    "bayesian_transformer_smoke.gin",
    "bayesian_transformer_lm_smoke.gin",
    "bayesian_transformer_wmt14_smoke.gin",
    "resnet50_smoke.gin",
    "cox_process_smoke.gin",
    "uci_mc_dropout_smoke.gin",
}


# Smoke configs whose figures other fast tests draw (a digits classifier's, replicas' training
# curves: tests/lab/test_supervised_learner.py, test_corruptions.py): they train here without
# figures (`train.plots = False`); the others draw theirs.
DRAWN_ELSEWHERE = {
    "digits_mlp_smoke.gin",
    "digits_sgmcmc_smoke.gin",
    "digits_snapshots_smoke.gin",
    "mnist5k_mlp_smoke.gin",
    "uncertainty_baselines_smoke.gin",
    "uci_deep_ensemble_smoke.gin",
    "uci_flipout_smoke.gin",
}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_SMOKES else p
        for p in SMOKES
        if p not in MESH + PLANET
    ],
    ids=lambda p: p.name,
)
def test_smoke_config_trains(path, tmp_path):
    figures = ["train.plots = False"] if path.name in DRAWN_ELSEWHERE else []
    if "uci_replicas" in _text_with_includes(path):  # the user's UCI folder: a toy one here
        from tests.conftest import write_uci_folder

        write_uci_folder(tmp_path / "uci", rows=80, splits=2)
        root = f"uci_replicas.root = '{tmp_path / 'uci'}'"
        _train_briefly(path, tmp_path / "run", 3, "uci_replicas.name = 'toy'", root, *figures)
        return
    if "tfds_" not in _text_with_includes(path):
        _train_briefly(path, tmp_path, 3, *figures)
    else:
        import tensorflow_datasets as tfds

        with tfds.testing.mock_data(num_examples=64):
            _train_briefly(path, tmp_path, 3, *_tfds_bindings(path, tmp_path), *figures)
    assert bool(list(tmp_path.glob("*.png"))) == (not figures)  # all or nothing


def test_the_lists_of_configs_name_configs_that_exist():
    names = {p.name for p in CONFIGS}
    assert DRAWN_ELSEWHERE | SLOW_SMOKES | SLOW_TFDS | FAST_MESH <= names


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_TFDS else p for p in TFDS_CONFIGS],
    ids=lambda p: p.name,
)
def test_full_scale_tfds_config_trains_on_mock_data(path, tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=8):  # fewer test images than a plot's grid
        _train_briefly(
            path, tmp_path, 2, "SupervisedLearner.batch_size = 4", *_tfds_bindings(path, tmp_path)
        )
    assert list(tmp_path.glob("*.png"))


def _train_mesh_briefly(path, model_dir, steps, *bindings):
    """The mesh learner on the config at `path` for `steps` steps, its heads, d_ff and vocabulary
    split over two mesh processors (both on this process's one CPU device)."""
    config.parse(
        [str(path.relative_to(CONFIG_DIR))],
        [
            f"train.train_steps = {steps}",
            "MeshLearner.num_eval_samples = 1",
            "MeshLearner.mesh_shape = 'model:2'",
            "MeshLearner.devices = ['/cpu:0', '/cpu:0']",
            "SequenceToSequence.num_decode = 2",
            "SequenceToSequence.beam_size = 2",
            *bindings,
        ],
    )
    metrics = loop.train(str(model_dir))
    assert metrics and all(math.isfinite(v) for v in metrics.values())
    assert (model_dir / "sequence_reliability.png").exists()


# The mesh learner trains in the fast suite on the translation smoke config; its LM and WMT14
# smoke variants differ in data only and run with the full configs in the slow suite.
FAST_MESH = {"bayesian_transformer_mesh_smoke.gin"}


@pytest.mark.parametrize(
    "path",
    [p for p in MESH if p.name in FAST_MESH]
    + [pytest.param(p, marks=pytest.mark.slow) for p in MESH if p.name not in FAST_MESH],
    ids=lambda p: p.name,
)
def test_mesh_config_trains(path, tmp_path):
    """Mesh configs train in-process: the loop builds its own graph and the process stays
    eager. Full-scale ones run two steps (TFDS mocked, small batches)."""
    full = path not in SMOKES
    bindings = ["MeshLearner.batch_size = 4"] if full else []
    if full and "tfds_translation" in _text_with_includes(path):
        bindings.append("tfds_translation.max_length = 16")  # decoding steps, not the model
    if "tfds_" not in _text_with_includes(path):
        _train_mesh_briefly(path, tmp_path, 2 if full else 3, *bindings)
        return
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=16 if full else 64):
        _train_mesh_briefly(
            path, tmp_path, 2 if full else 3, *bindings, *_tfds_bindings(path, tmp_path)
        )


def test_prior_fragment_swaps_the_prior():
    config.parse(["priors/scale_mixture"], ["scale_mixture_kl_divergence.pi = 0.25"])
    reg = blayers.layers.DenseReparameterization(3).kernel_regularizer
    assert isinstance(reg, blayers.regularizers.ScaleMixtureKLDivergence) and reg.pi == 0.25


def test_gin_only_model_and_estimator_swap():
    config.parse(
        [],
        [
            (
                "sequential.layers = [('DenseFlipout', {'units': 8, 'activation': 'relu'}), "
                "('Dense', {'units': 'num_outputs'})]"
            ),
            "DenseFlipout.kernel_initializer = 'trainable_he_normal'",
        ],
    )
    from blayers.lab import models

    model = models.sequential((4,), 3)
    assert [type(layer).__name__ for layer in model.layers] == ["DenseFlipout", "Dense"]
    assert model.output_shape == (None, 3)
    gin.clear_config()
    config.parse([], ["mlp.dense_layer = 'DenseReparameterization'"])
    assert {type(layer).__name__ for layer in models.mlp((4,), 3).layers} == {
        "DenseReparameterization"
    }
    with pytest.raises(ValueError, match="Unknown layer 'Dnse'"):
        models.get_layer_class("Dnse")


def test_unknown_config_file():
    with pytest.raises(ValueError, match="No gin file 'nonexistent'"):
        config.parse(["nonexistent"])
