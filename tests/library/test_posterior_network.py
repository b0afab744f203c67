"""The Posterior Network: each class's flow is a normalized density with the log-determinant
autodiff gives, the concentration is `1 + N_c p(z | c)`, the loss is the paper's, and a
trained network classifies and has less evidence far from the data."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from conftest import epochs_of
from scipy import special

import blayers
from blayers import layers as L


def _layer(flow_type, d=2, classes=3, seed=0):
    layer = L.PosteriorNetwork(classes, flow_type=flow_type, flow_depth=3, class_counts=[5, 1, 2])
    layer.build((None, d))
    rng = np.random.RandomState(seed)
    scale = 0.25 if flow_type == "maf" else 0.6  # a MADE's log-scales add up over its layers
    for w in layer.trainable_weights:
        if "batch_norm" not in w.path:
            w.assign(rng.normal(0, scale, w.shape).astype("float32"))
    return layer


@pytest.mark.parametrize("flow_type", ["radial", "affine", "maf"])
def test_each_class_density_integrates_to_one(flow_type):
    layer = _layer(flow_type)
    grid = np.linspace(-10, 10, 401, dtype="float32")
    xx, yy = np.meshgrid(grid, grid)
    points = np.stack([xx.ravel(), yy.ravel()], -1)
    density = np.exp(layer.class_log_density(tf.constant(points)).numpy())
    mass = density.sum(0) * (grid[1] - grid[0]) ** 2
    np.testing.assert_allclose(mass, 1.0, atol=2e-3)


def test_maf_log_determinant_matches_autodiff():
    """A class's masked autoregressive flow: `u = (z - mu(z)) exp(-s(z))` has a triangular
    Jacobian whose log-determinant (autodiff) is the layer's `-sum s(z)`."""
    layer = L.PosteriorNetwork(2, flow_type="maf", flow_depth=2, flow_width=8, dtype="float64")
    layer.build((None, 3))
    z = tf.constant(np.random.RandomState(2).randn(5, 3))
    made = layer.mafs[1]
    with tf.GradientTape() as tape:
        tape.watch(z)
        shift, log_scale = tf.unstack(made(z), axis=-1)
        u = (z - shift) * tf.exp(-log_scale)
    jac = tape.batch_jacobian(u, z).numpy()
    np.testing.assert_allclose(np.triu(jac, 1), 0.0, atol=1e-12)  # autoregressive
    expected = (
        -0.5 * np.sum(u.numpy() ** 2, -1)
        - 1.5 * np.log(2 * np.pi)
        + np.log(np.abs(np.linalg.det(jac)))
    )
    np.testing.assert_allclose(layer.class_log_density(z)[:, 1], expected, rtol=1e-8)


def test_radial_log_determinant_matches_autodiff():
    """log p(z | c) = log N(g_c(z)) + log |det dg_c / dz|, the determinant from autodiff."""
    layer = _layer("radial", d=3)
    z = tf.constant(np.random.RandomState(1).randn(6, 3).astype("float64"))
    layer64 = L.PosteriorNetwork(3, flow_type="radial", flow_depth=3, dtype="float64")
    layer64.build((None, 3))
    for a, b in zip(layer64.weights, layer.weights):
        a.assign(tf.cast(b, tf.float64))

    def forward(x):  # g_c of one class (c = 1): the flow's map to the base space
        y = x
        for k in range(3):
            alpha = tf.nn.softplus(layer64.raw_alpha[k, 1])
            beta = -alpha + tf.nn.softplus(layer64.raw_beta[k, 1])
            diff = y - layer64.centers[k, 1]
            r = tf.norm(diff, axis=-1, keepdims=True)
            y = y + beta / (alpha + r) * diff
        return y

    with tf.GradientTape() as tape:
        tape.watch(z)
        g = forward(z)
    jac = tape.batch_jacobian(g, z)
    expected = (
        -0.5 * tf.reduce_sum(g**2, -1)
        - 1.5 * np.log(2 * np.pi)
        + tf.math.log(tf.abs(tf.linalg.det(jac)))
    )
    np.testing.assert_allclose(layer64.class_log_density(z)[:, 1], expected, rtol=1e-8)


def test_concentration_and_loss_are_the_papers():
    layer = _layer("affine")
    x = np.random.RandomState(2).randn(4, 2).astype("float32")
    rv = layer(x, training=False)
    latents = layer.batch_norm(x, training=False)
    density = np.exp(layer.class_log_density(latents).numpy())
    alpha = 1.0 + np.array([5.0, 1.0, 2.0]) * density
    np.testing.assert_allclose(rv.distribution.concentration, alpha, rtol=1e-5)
    labels = np.array([0, 1, 2, 0])
    s = alpha.sum(-1)
    uce = special.digamma(s) - special.digamma(alpha[np.arange(4), labels])
    entropy = (
        special.gammaln(alpha).sum(-1)
        - special.gammaln(s)
        + (s - 3) * special.digamma(s)
        - ((alpha - 1) * special.digamma(alpha)).sum(-1)
    )
    np.testing.assert_allclose(
        -rv.distribution.training_log_prob(labels).numpy(), uce - 1e-5 * entropy, rtol=1e-4
    )


def test_learns_and_loses_evidence_away_from_the_data(tmp_path):
    rng = np.random.RandomState(0)
    centers = np.array([[0.0, 4.0], [4.0, -2.0], [-4.0, -2.0]], "float32")
    y = rng.randint(0, 3, 900)
    x = (centers[y] + rng.randn(900, 2)).astype("float32")
    blayers.set_seed(0)
    model = keras.Sequential(
        [
            keras.Input((2,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(4),
            L.PosteriorNetwork(3, flow_depth=4, class_counts=np.bincount(y).tolist(), seed=0),
        ]
    )
    model.compile(keras.optimizers.Adam(5e-3), loss=blayers.objectives.NegativeLogLikelihood())
    model.fit(epochs_of(x, y, 30, batch_size=64), verbose=0)
    d = model(x, training=False).distribution
    assert np.mean(np.argmax(d.probs_parameter(), -1) == y) > 0.95
    far = model(np.array([[30.0, 30.0], [-30.0, 25.0]], "float32"), training=False).distribution
    inside = float(np.median(d.strength.numpy()))
    assert float(far.strength.numpy().max()) < inside
    model.save(tmp_path / "postnet.keras")
    again = keras.models.load_model(tmp_path / "postnet.keras")
    np.testing.assert_allclose(
        again(x[:5], training=False).distribution.concentration, d.concentration[:5], rtol=1e-5
    )


def test_uce_loss_is_the_expected_cross_entropy_minus_the_entropy():
    """`blayers.losses.uce_loss`: `E_Dir[-log p_y]` (Monte Carlo, 5 standard errors) minus
    `lambda H[Dir]`; sparse and one-hot labels agree, and it is `PosteriorNetwork`'s loss."""
    rng = np.random.RandomState(3)
    alpha = rng.uniform(0.5, 4.0, size=(4, 3)).astype("float32")
    labels = np.array([0, 2, 1, 2])
    draws = rng.dirichlet(alpha[0], size=200_000)
    nll = -np.log(draws[:, 0])
    loss = blayers.losses.uce_loss(entropy_reg=0.0, num_classes=3)(labels[:1], alpha[:1])
    np.testing.assert_allclose(loss, nll.mean(), atol=5 * nll.std() / np.sqrt(200_000))
    sparse = blayers.losses.uce_loss(entropy_reg=0.1, num_classes=3)(labels, alpha)
    dense = blayers.losses.uce_loss(entropy_reg=0.1, sparse=False)(np.eye(3)[labels], alpha)
    np.testing.assert_allclose(sparse, dense, rtol=1e-6)
    digamma = special.digamma(alpha.sum(-1)) - special.digamma(alpha[np.arange(4), labels])
    entropy = tf.reduce_mean(tfp.distributions.Dirichlet(alpha).entropy()).numpy()
    np.testing.assert_allclose(sparse, digamma.mean() - 0.1 * entropy, rtol=1e-5)
    rv = blayers.layers.evidential.make_dirichlet_rv(
        alpha, loss="digamma", kl_weight=0.0, entropy_regularizer=0.1
    )
    np.testing.assert_allclose(
        sparse, -np.mean(rv.distribution.training_log_prob(labels)), rtol=1e-5
    )
    with pytest.raises(ValueError, match="num_classes"):
        blayers.losses.uce_loss()
