"""Every layer of the later families as a Keras citizen: `.keras` round trip, float64, masks,
gin. (Their maths lives in test_ensembles, test_weight_priors, test_sngp_ncp and
test_discrete_flows.)"""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers import layers as L
from blayers.lab import configurables  # noqa: F401 - gin names of the library

RNG = np.random.RandomState(0)


def _dense_input(dim=4):
    return RNG.randn(4, dim)


def _image_input():
    return RNG.randn(2, 6, 6, 3)


CASES = {
    "DenseBatchEnsemble": (
        lambda: [L.EnsembleTile(2), L.DenseBatchEnsemble(3, ensemble_size=2)],
        _dense_input,
    ),
    "DenseRank1": (lambda: [L.EnsembleTile(2), L.DenseRank1(3, ensemble_size=2)], _dense_input),
    "Conv2DBatchEnsemble": (
        lambda: [L.EnsembleTile(2), L.Conv2DBatchEnsemble(3, 3, ensemble_size=2)],
        _image_input,
    ),
    "Conv2DRank1": (
        lambda: [L.EnsembleTile(2), L.Conv2DRank1(3, 3, ensemble_size=2)],
        _image_input,
    ),
    "DenseVariationalDropout": (lambda: [L.DenseVariationalDropout(3)], _dense_input),
    "Conv2DVariationalDropout": (lambda: [L.Conv2DVariationalDropout(3, 3)], _image_input),
    "DenseHierarchical": (lambda: [L.DenseHierarchical(3)], _dense_input),
    "Conv2DHierarchical": (lambda: [L.Conv2DHierarchical(3, 3)], _image_input),
    "SpectralNormalization": (
        lambda: [L.SpectralNormalization(keras.layers.Dense(3))],
        _dense_input,
    ),
    "SpectralNormalizationConv2D": (
        lambda: [L.SpectralNormalizationConv2D(keras.layers.Conv2D(3, 3))],
        _image_input,
    ),
    "RandomFeatureGaussianProcess": (
        lambda: [L.RandomFeatureGaussianProcess(3, num_inducing=16)],
        _dense_input,
    ),
    "MCSoftmaxDenseFA": (lambda: [L.MCSoftmaxDenseFA(3, num_factors=2, seed=1)], _dense_input),
    "NCPNormalPerturb": (lambda: [L.NCPNormalPerturb(), keras.layers.Dense(2)], _dense_input),
    "EnsembleOutput": (
        lambda: [L.EnsembleTile(2), keras.layers.Dense(3), L.EnsembleOutput(2)],
        _dense_input,
    ),
    "PackedDense": (
        lambda: [
            L.EnsembleTile(2),
            L.PackedDense(4, 2, 2, first=True, activation="relu"),
            L.PackedDense(4, 2, 2, gamma=2),
            L.PackedDense(3, 2, 2, last=True),
            L.EnsembleOutput(2),
        ],
        _dense_input,
    ),
    "PackedConv2D": (
        lambda: [L.EnsembleTile(2), L.PackedConv2D(4, 3, 2, 2, first=True)],
        _image_input,
    ),
    "Masksembles1D": (
        lambda: [L.EnsembleTile(2), keras.layers.Dense(12), L.Masksembles1D(2, 2.0, seed=0)],
        _dense_input,
    ),
    "Masksembles2D": (
        lambda: [L.EnsembleTile(2), keras.layers.Conv2D(12, 1), L.Masksembles2D(2, 2.0)],
        _image_input,
    ),
    "MIMO": (
        lambda: [L.MIMO(keras.Sequential([keras.Input((8,)), keras.layers.Dense(6)]), 2, seed=0)],
        _dense_input,
    ),
    "NormalInverseGamma": (
        lambda: [keras.layers.Dense(8), L.NormalInverseGamma(2)],
        _dense_input,
    ),
    "Dirichlet": (lambda: [keras.layers.Dense(5), L.Dirichlet(annealing_steps=3)], _dense_input),
    "ExactSigmoidDense": (lambda: [L.ExactSigmoidDense(2, logit_noise="logistic")], _dense_input),
    "MCSigmoidDenseFA": (lambda: [L.MCSigmoidDenseFA(1, num_factors=2, seed=1)], _dense_input),
    "HeteroscedasticSNGPLayer": (
        lambda: [L.HeteroscedasticSNGPLayer(3, 2, num_mc_samples=20, num_inducing=16, seed=1)],
        _dense_input,
    ),
    "MultiHeadMCSoftmaxDenseFA": (
        lambda: [L.MultiHeadMCSoftmaxDenseFA(3, 2, ensemble_size=2, seed=1)],
        _dense_input,
    ),
    "BayesianLinearModel": (lambda: [L.BayesianLinearModel(0.5)], _dense_input),
    "MCSoftmaxDense": (lambda: [L.MCSoftmaxDense(3, logit_noise="gumbel", seed=1)], _dense_input),
    "MCSoftmaxDenseFA_tuned_efficient": (
        lambda: [
            L.MCSoftmaxDenseFA(
                3, 2, parameter_efficient=True, tune_temperature=True, num_mc_samples=20, seed=1
            )
        ],
        _dense_input,
    ),
    "MCSoftmaxDenseFASegmentation": (
        lambda: [L.MCSoftmaxDenseFASegmentation(3, 2, num_mc_samples=20, seed=1)],
        _image_input,
    ),
    "MCSoftmaxDenseFACustomLayers": (
        lambda: [
            L.MCSoftmaxDenseFACustomLayers(
                3,
                2,
                keras.layers.Dense(6),
                keras.layers.Dense(3),
                keras.layers.Dense(3, activation="softplus"),
                num_mc_samples=20,
                seed=1,
            )
        ],
        _dense_input,
    ),
    "PosteriorNetwork": (
        lambda: [keras.layers.Dense(3), L.PosteriorNetwork(3, flow_depth=2, seed=0)],
        _dense_input,
    ),
    "EnsembleSyncBatchNorm": (
        lambda: [L.EnsembleTile(2), keras.layers.Conv2D(4, 1), L.EnsembleSyncBatchNorm(2)],
        _image_input,
    ),
}


def _value(rv):
    """A random variable's distribution as an array: class probabilities, else the mean."""
    d = rv.distribution
    return d.probs_parameter() if hasattr(d, "probs_parameter") else d.mean()


def _model(name):
    make, inputs = CASES[name]
    x = inputs()
    return keras.Sequential([keras.Input(x.shape[1:]), *make()]), x


def _outputs(model, x):
    out = model(x, training=False)
    if isinstance(out, blayers.RandomVariable):
        return _value(out).numpy()
    return np.asarray(out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_keras_round_trip(name, tmp_path):
    model, x = _model(name)
    x = x.astype("float32")
    model(x, training=True)  # statistics (SNGP's precision, power iteration) move once
    with blayers.posterior_mean():
        before = _outputs(model, x)
    path = tmp_path / f"{name}.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    with blayers.posterior_mean():
        if "MCS" in name or "SNGPLayer" in name:  # Monte Carlo: same seed state, same draws
            state = model.layers[-1].seed_generator.state.numpy()
            before = _outputs(model, x)
            loaded.layers[-1].seed_generator.state.assign(state)
        np.testing.assert_allclose(_outputs(loaded, x), before, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_float64(name):
    make, inputs = CASES[name]
    keras.config.set_dtype_policy("float64")
    try:
        built = make()
    finally:
        keras.config.set_dtype_policy("float32")
    x = tf.constant(inputs(), tf.float64)
    for layer in built:
        x = layer(x, training=True)
    value = _value(x) if isinstance(x, blayers.RandomVariable) else x
    assert value.dtype == tf.float64


@pytest.mark.parametrize(
    "layer",
    [
        lambda: L.DenseVariationalDropout(3),
        lambda: L.DenseHierarchical(3),
        lambda: L.DenseBatchEnsemble(3, ensemble_size=1),
        lambda: L.DenseRank1(3, ensemble_size=1),
    ],
)
def test_masks_pass_through_sequence_layers(layer):
    tokens = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(7, 4, mask_zero=True)(tokens)
    h = layer()(h)
    out = keras.layers.GlobalAveragePooling1D()(h)
    model = keras.Model(tokens, out)
    with blayers.posterior_mean():
        padded = model(np.array([[1, 2, 0, 0, 0]])).numpy()
        short = model(np.array([[1, 2]])).numpy()
    # The mask reached the pooling: padding does not enter the average.
    np.testing.assert_allclose(padded, short, rtol=1e-5, atol=1e-6)
    assert model.layers[2].supports_masking


def test_gin_configures_the_new_families():
    gin.parse_config(
        """
        DenseVariationalDropout.threshold = 2.0
        RandomFeatureGaussianProcess.num_inducing = 8
        SpectralNormalization.norm_multiplier = 0.5
        rank1_prior.regularizer = @normal_kl_divergence()
        normal_kl_divergence.mean = 1.0
        normal_kl_divergence.stddev = 0.1
        PackedDense.gamma = 2
        Masksembles1D.scale = 3.0
        MIMO.batch_repetitions = 4
        Dirichlet.loss = 'digamma'
        NormalInverseGamma.evidence_regularizer = 0.1
        """
    )
    assert L.PackedDense(8, alpha=2, num_estimators=2).gamma == 2
    assert L.Masksembles1D(2).scale == 3.0
    assert L.MIMO(keras.layers.Dense(4), 2).batch_repetitions == 4
    assert L.Dirichlet().loss == "digamma"
    assert L.NormalInverseGamma().evidence_regularizer == 0.1
    assert L.DenseVariationalDropout(2).threshold == 2.0
    assert L.RandomFeatureGaussianProcess(2).num_inducing == 8
    assert L.SpectralNormalization(keras.layers.Dense(2)).norm_multiplier == 0.5
    prior = L.DenseRank1(2).alpha_regularizer
    assert (prior.mean, prior.stddev) == (1.0, 0.1)


def test_multi_input_layers_round_trip(tmp_path):
    """CondDense, DenseHyperBatchEnsemble and NCPNormalOutput take a second input; the
    bipartite flow and the rank-1 LSTM cell nest layers: all save and load."""
    x_in, r_in, y_in = keras.Input((4,)), keras.Input((3,)), keras.Input((2,))
    tiled = L.EnsembleTile(2)(x_in)
    hyper = L.DenseHyperBatchEnsemble(2, ensemble_size=2, l2_index=0)(
        [tiled, L.EnsembleTile(2)(r_in)]
    )
    cond = L.CondDense(2, num_experts=3)(x_in, keras.layers.Softmax()(r_in))
    ncp = L.NCPNormalOutput(stddev=2.0)(cond, y_in)
    model = keras.Model([x_in, r_in, y_in], [hyper, ncp])
    inputs = [RNG.randn(3, 4), RNG.randn(3, 3), RNG.randn(3, 2)]
    inputs = [a.astype("float32") for a in inputs]
    before = [np.asarray(o) for o in model(inputs)]
    model.save(tmp_path / "multi.keras")
    after = [np.asarray(o) for o in keras.models.load_model(tmp_path / "multi.keras")(inputs)]
    for a, b in zip(before, after):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    flow = keras.Sequential(
        [keras.Input((4, 3)), L.DiscreteBipartiteFlow(keras.layers.Dense(6), mask=[1, 0, 0, 1])]
    )
    tokens = tf.one_hot(RNG.randint(0, 3, (5, 4)), 3)
    flow.save(tmp_path / "flow.keras")
    np.testing.assert_array_equal(
        keras.models.load_model(tmp_path / "flow.keras")(tokens), flow(tokens)
    )


def test_lstm_cell_rank1_float64():
    keras.config.set_dtype_policy("float64")
    try:
        rnn = keras.layers.RNN(L.LSTMCellRank1(3, ensemble_size=2))
    finally:
        keras.config.set_dtype_policy("float32")
    out = rnn(tf.constant(RNG.randn(4, 5, 2), tf.float64))
    assert out.dtype == tf.float64 and all(w.dtype == "float64" for w in rnn.weights)
