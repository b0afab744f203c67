"""RandomVariable, generated constructors and tracing."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import blayers

tfd = tfp.distributions


def test_holds_distribution_and_lazy_value():
    rv = blayers.Normal(loc=tf.zeros([3]), scale=1.0, seed=tf.constant([1, 2]))
    assert isinstance(rv.distribution, tfd.Normal)
    assert not rv.has_value
    assert rv.shape == (3,) and rv.dtype == tf.float32
    value = rv.value
    assert rv.has_value and rv.value is value  # drawn once, then fixed
    np.testing.assert_allclose(rv.numpy(), value.numpy())
    assert tf.is_tensor(rv)
    np.testing.assert_allclose(tf.convert_to_tensor(rv).numpy(), value.numpy())


def test_sample_shape_and_explicit_value():
    rv = blayers.Normal(loc=[0.0, 1.0], scale=1.0, sample_shape=[4])
    assert rv.sample_shape == (4,) and rv.shape == (4, 2)
    assert rv.value.shape == (4, 2)
    fixed = blayers.Normal(0.0, 1.0, value=2.5)
    assert fixed.has_value and float(fixed) == 2.5
    with pytest.raises(ValueError, match="does not match"):
        blayers.Normal(loc=tf.zeros([3]), scale=1.0, value=tf.zeros([2]))


def test_operators_act_on_value():
    rv = blayers.Normal(0.0, 1.0, value=2.0)
    assert float(rv + 1.0) == 3.0 and float(1.0 + rv) == 3.0
    assert float(rv * 3.0) == 6.0 and float(-rv) == -2.0 and float(rv**2) == 4.0
    assert bool(rv > 1.0) and float(tf.exp(rv)) == pytest.approx(np.exp(2.0))
    m = blayers.Normal(tf.zeros([2, 2]), 1.0, value=tf.eye(2))
    np.testing.assert_allclose((m @ tf.ones([2, 1])).numpy(), np.ones([2, 1]))
    np.testing.assert_allclose(
        (np.ones(2) + blayers.Normal([0.0, 0.0], 1.0, value=[1.0, 2.0])), [2.0, 3.0]
    )


def test_slicing_slices_value_and_distribution():
    rv = blayers.Normal(loc=tf.reshape(tf.range(6.0), [3, 2]), scale=1.0)
    part = rv[1:]
    assert isinstance(part, blayers.RandomVariable)
    np.testing.assert_allclose(part.distribution.mean().numpy(), [[2.0, 3.0], [4.0, 5.0]])
    np.testing.assert_allclose(part.value.numpy(), rv.value.numpy()[1:])
    mvn = blayers.MultivariateNormalDiag(loc=tf.zeros([4, 3]))
    column = mvn[:, 0]  # an event dimension: TFP cannot slice it, so the value comes back
    assert not isinstance(column, blayers.RandomVariable) and column.shape == (4,)


def test_constructors_cover_tfp_distributions():
    for name in (
        "Normal",
        "Bernoulli",
        "Categorical",
        "Independent",
        "MultivariateNormalTriL",
        "Poisson",
        "MixtureSameFamily",
        "LogNormal",
        "HalfCauchy",
        "Deterministic",
    ):
        assert callable(getattr(blayers, name))
    rv = blayers.Categorical(logits=tf.zeros([5, 3]))
    assert rv.dtype == tf.int32 and rv.shape == (5,)
    assert "tfp.distributions.Normal" in blayers.Normal.__doc__


def test_trace_take_mean_condition_and_tape():
    with blayers.trace(blayers.take_mean):
        rv = blayers.Normal(loc=3.0, scale=2.0, sample_shape=[2])
    np.testing.assert_allclose(rv.numpy(), [3.0, 3.0])
    with blayers.trace(blayers.condition(w=-1.0)):
        w = blayers.Normal(0.0, 1.0, name="w")
        z = blayers.Normal(5.0, 1e-6, name="z")
    assert float(w) == -1.0 and abs(float(z) - 5.0) < 1e-3
    with blayers.tape() as recorded:
        blayers.Normal(0.0, 1.0, name="a")
        blayers.Normal(0.0, 1.0, name="a")
    assert list(recorded) == ["a", "a_1"]

    calls = []

    def outer(f, *args, **kwargs):
        calls.append("outer")
        return f(*args, **kwargs)

    def inner(f, *args, **kwargs):
        calls.append("inner")
        return blayers.Normal(*args, **kwargs)  # constructed again: the outer one sees it

    with blayers.trace(outer), blayers.trace(inner):
        blayers.Normal(0.0, 1.0)
    assert calls == ["inner", "outer"]


class _NormalOutput(keras.layers.Layer):
    def call(self, x):
        return blayers.Normal(loc=x[..., :1], scale=tf.nn.softplus(x[..., 1:]) + 1e-3)

    def compute_output_shape(self, shape):
        return shape[:-1] + (1,)


def _nll(y, rv):
    return -rv.distribution.log_prob(y)


def test_flows_through_sequential_functional_tf_function_and_fit():
    x = np.random.RandomState(0).randn(512, 3).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1).astype("float32")
    inputs = keras.Input((3,))
    outputs = _NormalOutput()(keras.layers.Dense(2)(inputs))
    model = keras.Model(inputs, outputs)
    out = model(x[:4])
    assert isinstance(out, blayers.RandomVariable) and out.shape == (4, 1)

    sequential = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(2), _NormalOutput(), keras.layers.Dense(1)]
    )  # an RV feeds an ordinary layer
    assert sequential(x[:4]).shape == (4, 1)

    mean_fn = tf.function(lambda a: model(a).distribution.mean())
    np.testing.assert_allclose(mean_fn(x[:4]).numpy(), out.distribution.mean().numpy(), rtol=1e-5)

    model.compile(keras.optimizers.Adam(0.05), loss=_nll)
    history = model.fit(x, y, epochs=15, batch_size=64, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] - 1.0


def test_fast_standard_normal_is_standard_normal():
    from blayers.sampling import rademacher, standard_normal

    z = standard_normal([1_000_000], tf.constant([3, 4])).numpy().astype(np.float64)
    n = z.size
    assert np.all(np.isfinite(z))
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1.0) < 5 * math.sqrt(2.0 / n)
    assert abs(np.mean(z**4) - 3.0) < 5 * math.sqrt(96.0 / n)  # Var[z^4] = 105 - 9
    for q in (0.01, 0.1, 0.5, 0.9, 0.99):  # quantiles: binomial standard error of the CDF
        p = np.mean(z <= float(tfd.Normal(0.0, 1.0).quantile(q)))
        assert abs(p - q) < 5 * math.sqrt(q * (1 - q) / n)
    signs = rademacher([100_000], tf.constant([1, 2])).numpy()
    assert set(np.unique(signs)) == {-1.0, 1.0} and abs(signs.mean()) < 5 / math.sqrt(1e5)
    # 32 signs come from one random word: neighbours in a word and the same bit of
    # neighbouring words are uncorrelated (each lag's mean product within 5 standard errors).
    for lag in (1, 31, 32, 33):
        assert abs(np.mean(signs[lag:] * signs[:-lag])) < 5 / math.sqrt(1e5)
    odd = tf.function(lambda shape: rademacher(shape, tf.constant([5, 6]), tf.float64))
    block = odd(tf.constant([7, 5])).numpy()  # not a multiple of 32, shape known at run time
    assert block.shape == (7, 5) and block.dtype == np.float64 and set(np.unique(block)) <= {-1, 1}


# -- the paper's figures as written ----------------------------------------------------------


def test_distribution_methods_are_forwarded():
    rv = blayers.Normal(loc=[0.0, 1.0], scale=2.0)
    np.testing.assert_allclose(rv.mean().numpy(), [0.0, 1.0])
    np.testing.assert_allclose(rv.stddev().numpy(), [2.0, 2.0])
    np.testing.assert_allclose(
        rv.log_prob([0.0, 0.0]).numpy(), rv.distribution.log_prob([0.0, 0.0]).numpy()
    )
    np.testing.assert_allclose(rv.entropy().numpy(), rv.distribution.entropy().numpy())
    # The other side of a KL may be a random variable (the paper's Figure 6).
    kl = rv.kl_divergence(blayers.Normal(0.0, 1.0))
    expected = math.log(1 / 2.0) + (4.0 + np.array([0.0, 1.0])) / 2 - 0.5
    np.testing.assert_allclose(kl.numpy(), expected, rtol=1e-6)
    assert rv.cdf(0.0).shape == (2,) and rv.quantile(0.5).shape == (2,)


def test_paper_figure_5_predictions_mean():
    """Deep GP (Figure 5): `predictions = model(features); predictions.mean()`."""
    model = keras.Sequential(
        [
            keras.Input((3,)),
            blayers.layers.SparseGaussianProcess(2, num_inducing=4),
            blayers.layers.SparseGaussianProcess(1, num_inducing=4),
        ]
    )
    predictions = model(np.random.randn(5, 3).astype("float32"))
    assert predictions.mean().shape == (5, 1)
    assert np.all(predictions.stddev().numpy() > 0)


def test_paper_figure_6_vae_as_written():
    """VAE (Figure 6): `encoding = encoder(x)`, `decoder(encoding).log_prob(x)`,
    `encoding.kl_divergence(blayers.Normal(0., 1.))`."""
    x = (np.random.rand(4, 6) > 0.5).astype("float32")
    encoder = keras.Sequential([keras.Input((6,)), blayers.layers.Normal(2)])
    decoder = keras.Sequential([keras.Input((2,)), blayers.layers.Bernoulli(6)])
    encoding = encoder(x)
    nll = -tf.reduce_sum(decoder(encoding).log_prob(x), -1)
    kl = tf.reduce_sum(encoding.kl_divergence(blayers.Normal(0.0, 1.0)), -1)
    loss = tf.reduce_mean(nll + kl)
    assert loss.shape == () and np.isfinite(loss.numpy())


def test_comparison_with_values_is_elementwise_and_with_variables_is_identity():
    x = blayers.Normal(tf.zeros(3), 1.0)
    value = x.value.numpy()
    np.testing.assert_array_equal(x == value, [True, True, True])
    np.testing.assert_array_equal(x != 5.0, [True, True, True])
    np.testing.assert_array_equal(x == tf.constant(value), [True, True, True])
    y = blayers.Normal(tf.zeros(3), 1.0, value=value)
    assert x == x and x != y and not (x == y)  # noqa: PLR0124, SIM201 - identity
    assert {x: 1, y: 2}[x] == 1 and hash(x) == id(x)


def test_truth_value_raises_as_a_graph_tensor():
    x = blayers.Normal(0.0, 1.0)
    with pytest.raises(TypeError, match="bool"):
        not x  # noqa: B018 - the expression under test


def test_random_variables_pass_through_tf_function_signatures():
    x = blayers.Normal(0.0, 1.0)
    double = tf.function(lambda rv: rv * 2.0 + rv.distribution.stddev())
    np.testing.assert_allclose(double(x), 2.0 * x.value + 1.0)
    np.testing.assert_allclose(double(x), 2.0 * x.value + 1.0)
    other = blayers.Normal(3.0, 2.0)
    np.testing.assert_allclose(double(other), 2.0 * other.value + 2.0)
    first, second = x.__tf_tracing_type__(None), other.__tf_tracing_type__(None)
    assert first == x.__tf_tracing_type__(None) and first.is_subtype_of(first)
    assert first != second and not first.is_subtype_of(second)
    assert first.most_specific_common_supertype([second]) is None


def test_predict_stays_callable_after_its_module_is_imported():
    """`import blayers.predict` (mkdocstrings, a user) binds the package's `predict` to the
    module; the module then calls the function."""
    import importlib

    importlib.import_module("blayers.predict")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    prediction = blayers.predict(model, np.ones((3, 2), "float32"), num_samples=2)
    assert prediction.mean.shape == (3, 1)
