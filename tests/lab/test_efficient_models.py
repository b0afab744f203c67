"""The field's single-pass ensembles and evidential heads in the lab: each trains under the
Loop, is scored by the classification task (members' disagreement included), and resumes
exactly from a checkpoint (MIMO's permutations, the masks and the Dirichlet's annealing step
travel with it)."""

import functools
import json
import pathlib

import numpy as np
import pytest

from blayers.lab import data as data_lib
from blayers.lab import loop, models

_COMMON = {
    "batch_size": 64,
    "log_every": 1,
    "eval_every": 4,
    "num_eval_samples": 1,
    "progress": False,
    "plots": False,
}


def _records(model_dir, kind="train"):
    lines = (pathlib.Path(model_dir) / "history.jsonl").read_text().splitlines()
    return [json.loads(line)["nll"] for line in lines if json.loads(line)["kind"] == kind]


def _model(method):
    return functools.partial(
        models.efficient_mlp, method=method, hidden_units=(32,), annealing_steps=6, seed=0
    )


@pytest.mark.parametrize("method", ["mimo", pytest.param("evidential", marks=pytest.mark.slow)])
def test_resumes_exactly(tmp_path, method):
    """MIMO's permutations and the Dirichlet head's annealing step are state: a run cut at a
    checkpoint resumes to the uninterrupted run's losses and metrics."""
    digits, model = data_lib.digits(), _model(method)
    common = dict(_COMMON, checkpoint_every=4)
    twin = loop.fit(str(tmp_path / "twin"), data=digits, model=model, train_steps=8, **common)
    loop.fit(str(tmp_path / "cut"), data=digits, model=model, train_steps=4, **common)
    resumed = loop.fit(str(tmp_path / "cut"), data=digits, model=model, train_steps=8, **common)
    np.testing.assert_allclose(_records(tmp_path / "cut"), _records(tmp_path / "twin"), rtol=1e-5)
    assert resumed["nll"] == pytest.approx(twin["nll"], rel=1e-5)
    first, last = _records(tmp_path / "twin", "eval")  # held-out NLL at steps 4 and 8
    assert last < first


@pytest.mark.parametrize("method", ["packed", "masksembles"])
def test_trains_and_members_disagree(tmp_path, method):
    digits = data_lib.digits()
    metrics = loop.fit(str(tmp_path), data=digits, model=_model(method), train_steps=8, **_COMMON)
    first, last = _records(tmp_path, "eval")
    assert last < first
    assert metrics["mutual_information"] > 0  # one network's members disagree


def test_mlp_batch_norm_normalizes_each_hidden_layer_before_its_activation():
    """`mlp.batch_norm`: Dense -> BatchNormalization -> activation per hidden layer (what
    `--method=mc_batchnorm` samples); refused with replicas, whose batches it would mix."""
    import keras

    from blayers.lab.data.base import Replica

    model = models.mlp((4,), 3, hidden_units=(8, 8), dense_layer="Dense", batch_norm=True)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == ["Dense", "BatchNormalization", "Activation"] * 2 + ["Dense"]
    assert model.layers[0].activation is keras.activations.linear
    x = np.random.RandomState(0).randn(64, 4).astype("float32") * 5 + 3
    hidden = keras.Sequential(model.layers[:2])(x, training=True).numpy()
    np.testing.assert_allclose(hidden.mean(0), 0.0, atol=1e-4)  # normalized over the batch
    with pytest.raises(ValueError, match="mlp.batch_norm"):
        replicas = [Replica(f"r{i}", None, seed=i) for i in range(2)]
        models.mlp((4,), 3, dense_layer="Dense", batch_norm=True, replicas=replicas)
