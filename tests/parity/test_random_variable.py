"""edward2's `edward2/tensorflow/random_variable_test.py`, translated (`ed.RandomVariable` is
`blayers.RandomVariable`; a repr names `blayers.RandomVariable`). edward2's commented-out
`testOperatorsEq` is left out."""

import operator
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import blayers as ed


class FakeDistribution(tfp.distributions.Distribution):
    """Fake distribution class for testing."""

    def __init__(self):
        super().__init__(
            dtype=tf.float32,
            reparameterization_type=tfp.distributions.FULLY_REPARAMETERIZED,
            validate_args=False,
            allow_nan_stats=True,
        )

    def _sample_n(self, *args, **kwargs):
        return tf.ones(shape=(4, 4))

    def sample(self, *args, **kwargs):
        return tf.ones(shape=(4, 4))


class FakeDistributionNoSample(tfp.distributions.Distribution):
    """Fake distribution class for testing."""

    def __init__(self):
        super().__init__(
            dtype=None,
            reparameterization_type=tfp.distributions.FULLY_REPARAMETERIZED,
            validate_args=False,
            allow_nan_stats=True,
        )


def test_constructor():
    x = ed.RandomVariable(tfp.distributions.Poisson(rate=np.ones([2, 5])), value=np.ones([2, 5]))
    np.testing.assert_array_equal(tf.convert_to_tensor(x), x.value)
    with pytest.raises(ValueError):
        _ = ed.RandomVariable(
            tfp.distributions.Bernoulli(probs=0.5), value=tf.zeros([2, 5], dtype=tf.int32)
        )
    x = ed.RandomVariable(FakeDistribution())
    with pytest.raises(NotImplementedError):
        _ = ed.RandomVariable(FakeDistributionNoSample())


def test_trace_type():
    x_1 = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    x_2 = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    trace_type_1 = x_1.__tf_tracing_type__(None)
    trace_type_2 = x_2.__tf_tracing_type__(None)
    assert trace_type_1 == trace_type_1  # noqa: PLR0124 - edward2's check
    assert trace_type_1.is_subtype_of(trace_type_1)
    assert trace_type_1 != trace_type_2
    assert not trace_type_1.is_subtype_of(trace_type_2)


def test_gradients_first_order():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))

    def f(x):
        return 2.0 * x

    with tf.GradientTape() as tape:
        tape.watch(x.value)
        y = f(x)
    z = tape.gradient(y, [x.value])[0]
    assert float(z) == 2.0


def test_gradients_second_order():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))

    def f(x):
        return 2 * (x**2)

    with tf.GradientTape() as tape2:
        tape2.watch(x.value)
        with tf.GradientTape() as tape:
            tape.watch(x.value)
            y = f(x)
        z = tape.gradient(y, [x.value])[0]
    z = tape2.gradient(z, [x.value])[0]
    assert float(z) == 4.0


def test_str():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0), value=1.234)
    pattern = 'RandomVariable("1.234", shape=(), dtype=float32'
    assert re.search(re.escape(pattern), str(x))


def test_repr():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0), value=1.234)
    string = (
        f"<blayers.RandomVariable '{x.distribution.name}' shape=() "
        "dtype=float32 numpy=np.float32(1.234)>"
    )
    assert repr(x) == string


def test_numpy():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0), value=1.23)
    assert x == tf.constant(1.23)


BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "pow": operator.pow,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_operators(name):
    """edward2's testOperators{Add, Sub, Mul, Div, Floordiv, Mod, Lt, Le, Gt, Ge, Pow}."""
    op = BINARY[name]
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    y = 5.0
    np.testing.assert_array_equal(op(x, y), op(x.value, y))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "floordiv", "mod", "pow"])
def test_operators_reflected(name):
    """edward2's testOperators{Radd, Rsub, Rmul, Rdiv, Rfloordiv, Rmod, Rpow}."""
    op = BINARY[name]
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    y = 5.0
    np.testing.assert_array_equal(op(y, x), op(y, x.value))


def test_operators_getitem():
    x = ed.RandomVariable(tfp.distributions.Normal(tf.random.normal([3, 4]), 1.0))
    z = x[0:2, 2:3]
    z_value = x.value[0:2, 2:3]
    assert isinstance(z, ed.RandomVariable)
    np.testing.assert_array_equal(z.distribution.mean(), x.distribution.mean()[0:2, 2:3])
    np.testing.assert_array_equal(tf.convert_to_tensor(z), z_value)


def test_operators_neg():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    np.testing.assert_array_equal(-x, -x.value)


def test_operators_abs():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    np.testing.assert_array_equal(abs(x), abs(x.value))


def test_operators_hash():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    y = 5.0
    assert hash(x) != hash(y)
    assert hash(x) == id(x)


def test_operators_ne():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    y = 5.0
    assert x != y


def test_operators_bool_nonzero():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    with pytest.raises(TypeError):
        _ = not x


def test_array_priority():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 1.0))
    y = np.array(5.0, dtype=np.float32)
    z = y / x
    z_value = y / x.value
    np.testing.assert_array_equal(z, z_value)


def test_convert_to_tensor():
    x = ed.RandomVariable(tfp.distributions.Normal(0.0, 0.1))
    with pytest.raises(ValueError):
        _ = tf.convert_to_tensor(x, dtype=tf.int32)


@pytest.mark.parametrize(
    "probs, sample_shape, batch_shape, event_shape",
    [
        (0.5, [], [], []),
        (np.zeros([2, 3]) + 0.5, [], [2, 3], []),
        (0.5, [2], [], []),
        (0.5, [2], [], []),  # noqa: PT014 - edward2's list, as it is
        (0.5, [2, 4], [], []),
    ],
)
def test_shape(probs, sample_shape, batch_shape, event_shape):
    rv = ed.RandomVariable(tfp.distributions.Bernoulli(probs=probs), sample_shape=sample_shape)
    assert rv.shape == sample_shape + batch_shape + event_shape
    assert rv.shape == rv.shape
    assert rv.sample_shape == sample_shape
    assert rv.distribution.batch_shape == batch_shape
    assert rv.distribution.event_shape == event_shape


def test_random_tensor_sample():
    num_samples = tf.cast(tfp.distributions.Poisson(rate=5.0).sample(), tf.int32)
    _ = ed.RandomVariable(tfp.distributions.Normal(loc=0.0, scale=1.0), sample_shape=num_samples)
