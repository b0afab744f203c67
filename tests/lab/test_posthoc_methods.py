"""The post-hoc methods' registry and the calibration maps' guard, without a trainer run."""

import numpy as np
import pytest
from scipy.special import softmax

from blayers.lab import posthoc_methods


class _Fit:
    """What a `Calibrator` reads of `posthoc_methods.Fit`."""

    log_mean_probs = staticmethod(posthoc_methods.Fit.log_mean_probs)

    def __init__(self, logits, labels, calibration):
        self.base = [softmax(logits, -1)[None]]
        self.y, self.calibration = labels, calibration
        self.evaluation = np.setdiff1d(np.arange(len(labels)), calibration)


def _data(n, k, bias, scale, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k))
    logits[np.arange(n), labels] += 3.0
    logits[:, 0] += bias
    return scale * logits, labels


def _nll(probs, labels):
    return float(-np.mean(np.log(probs[np.arange(len(labels)), labels])))


def test_the_registry_holds_every_shipped_method_with_its_contract():
    methods = posthoc_methods.methods()
    expected = {"temperature", "vector", "matrix", "dirichlet", "histogram", "isotonic"}
    assert expected | {"conformal", "laplace", "swag", "ensemble"} <= set(methods)
    for name, cls in methods.items():
        assert cls.name == name and issubclass(cls, posthoc_methods.Method)
        assert set(cls.tasks) <= {"classification", "regression"}
    assert all(issubclass(methods[n], posthoc_methods.Calibrator) for n in expected)
    with pytest.raises(ValueError, match="defined twice"):

        class Again(posthoc_methods.Method):
            name = "temperature"


@pytest.mark.parametrize(
    "name",
    [
        "vector",
        # ODIR's cross-validation inside the fallback's: seconds each, in the slow suite.
        pytest.param("matrix", marks=pytest.mark.slow),
        pytest.param("dirichlet", marks=pytest.mark.slow),
        "histogram",
        "isotonic",
    ],
)
def test_a_map_that_overfits_a_small_calibration_part_falls_back_to_temperature(name):
    """A network that classifies 60 calibration examples almost perfectly: the richer maps'
    cross-validated NLL loses to one temperature, which is used instead (and said)."""
    logits, labels = _data(2000, 10, 0.0, 2.0, 0)
    fit = _Fit(logits, labels, np.arange(60))
    method = posthoc_methods.get(name)()
    method.fit(fit)
    assert method.metrics(fit)["fell_back"] == 1.0
    assert "temperature scaling used instead" in method.notes[0]
    temperature = posthoc_methods.get("temperature")()
    temperature.fit(fit)
    np.testing.assert_allclose(method.predictive(fit)[0], temperature.predictive(fit)[0])


def test_a_map_that_beats_temperature_scaling_is_kept():
    """A class bias one temperature cannot remove, and 3,000 calibration examples: vector
    scaling wins the cross-validation and is kept, lowering the held-out NLL further."""
    logits, labels = _data(6000, 5, 2.0, 1.0, 1)
    fit = _Fit(logits, labels, np.arange(3000))
    vector, temperature = posthoc_methods.get("vector")(), posthoc_methods.get("temperature")()
    for method in (vector, temperature):
        method.fit(fit)
    assert vector.metrics(fit)["fell_back"] == 0.0 and not vector.notes
    held_out = fit.evaluation
    assert _nll(vector.predictive(fit)[0][0][held_out], labels[held_out]) < _nll(
        temperature.predictive(fit)[0][0][held_out], labels[held_out]
    )
    unchecked = posthoc_methods.get("vector")(fallback=False)
    unchecked.fit(_Fit(*_data(2000, 10, 0.0, 2.0, 0), np.arange(60)))
    assert "fell_back" not in unchecked.metrics(None)
