"""Subnetwork Laplace: over exactly the last layer's weights it is the full last-layer Laplace;
its "largest variance" selection is the diagonal Laplace's; the evidence and predictive work."""

import keras
import numpy as np
import pytest

from blayers.posthoc import AllWeightsLaplace, Laplace, SubnetworkLaplace


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=10, verbose=0)
    return model, x, y


def test_the_last_layer_as_subnetwork_is_the_full_last_layer_laplace(trained):
    model, x, y = trained
    first = (4 + 1) * 8  # the hidden layer's [W; b]
    last = np.arange(first, first + (8 + 1) * 3)
    sub = SubnetworkLaplace(model, indices=last[::-1], prior_precision=0.5).fit((x, y))
    full = Laplace(model, hessian_structure="full", prior_precision=0.5).fit((x, y))
    np.testing.assert_allclose(sub._map_vector(), full._map_vector())
    _, ours = sub.functional_variance(x[:20])
    _, reference = full.functional_variance(x[:20])
    np.testing.assert_allclose(ours, reference, rtol=1e-7, atol=1e-10)
    for delta in (0.1, 1.0, 10.0):
        # To the float32 forward passes' rounding of the log-likelihood.
        assert sub.log_marginal_likelihood(delta) == pytest.approx(
            full.log_marginal_likelihood(delta), abs=1e-5
        )
    np.testing.assert_allclose(sub.predict(x[:20]), full.predict(x[:20]), rtol=1e-7)


def test_the_subnetwork_is_the_weights_of_largest_diagonal_variance(trained):
    model, x, y = trained
    sub = SubnetworkLaplace(model, num_weights=12, prior_precision=2.0).fit((x, y))
    diagonal = AllWeightsLaplace(model, hessian_structure="diag", prior_precision=2.0)
    variance = 1.0 / diagonal.fit((x, y))._precision_eigenvalues(2.0, 1.0)
    assert sub.indices.size == 12
    assert set(sub.indices) == set(np.argsort(-variance)[:12])
    # More weights under the posterior: the predictive variance grows (the GGN's Schur
    # complement argument: adding weights never shrinks the linearized output variance).
    larger = SubnetworkLaplace(model, num_weights=40, prior_precision=2.0).fit((x, y))
    _, small = sub.functional_variance(x[:50])
    _, big = larger.functional_variance(x[:50])
    assert np.trace(big, axis1=1, axis2=2).mean() > np.trace(small, axis1=1, axis2=2).mean()
    delta = sub.optimize_prior_precision()
    assert delta > 0 and np.isfinite(sub.log_marginal_likelihood())
    probs = sub.predict(x[:30])
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-9)
    with pytest.raises(ValueError, match="flat weight indices"):
        SubnetworkLaplace(model, indices=[10**6]).fit((x, y))
