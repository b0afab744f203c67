"""edward2's `edward2/tensorflow/generated_random_variables_test.py`, translated (`ed.Normal`
is `blayers.Normal`; `ed.make_random_variable` and `ed.make_log_joint_fn` are blayers' under
the same names)."""

import inspect

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import blayers as ed


def test_bernoulli_doc():
    assert len(ed.Bernoulli.__doc__) > 0
    assert inspect.cleandoc(tfp.distributions.Bernoulli.__init__.__doc__) in ed.Bernoulli.__doc__
    assert ed.Bernoulli.__name__ == "Bernoulli"


@pytest.mark.parametrize(
    "logits, n",
    [(np.zeros(1), [1]), (np.zeros(1), [5]), (np.zeros(5), [1]), (np.zeros(5), [5])],
    ids=["1d_rv_1d_event", "1d_rv_5d_event", "5d_rv_1d_event", "5d_rv_5d_event"],
)
def test_bernoulli_log_prob(logits, n):
    rv = ed.Bernoulli(logits)
    dist = tfp.distributions.Bernoulli(logits)
    x = rv.distribution.sample(n)
    np.testing.assert_array_equal(rv.distribution.log_prob(x), dist.log_prob(x))


@pytest.mark.parametrize(
    "logits, n",
    [
        (0.0, 1),
        (0.0, [1]),
        (np.array([0.0]), [1]),
        (np.array([0.0]), [5]),
        (np.array([-0.2, 0.8]), [1]),
        (np.array([-0.2, 0.8]), [5]),
    ],
    ids=[
        "0d_rv_0d_sample",
        "0d_rv_1d_sample",
        "1d_rv_1d_sample",
        "1d_rv_5d_sample",
        "2d_rv_1d_sample",
        "2d_rv_5d_sample",
    ],
)
def test_bernoulli_sample(logits, n):
    rv = ed.Bernoulli(logits)
    dist = tfp.distributions.Bernoulli(logits)
    assert rv.distribution.sample(n).shape == dist.sample(n).shape


@pytest.mark.parametrize(
    "rv_cls, sample_shape, batch_shape, event_shape, kwargs",
    [
        (ed.Bernoulli, [], [], [], {"probs": 0.5}),
        (ed.Bernoulli, [], [2, 3], [], {"logits": np.zeros([2, 3])}),
        (ed.Bernoulli, [2], [], [], {"probs": 0.5}),
        (ed.Bernoulli, [2, 1], [], [], {"probs": 0.5}),
        (ed.Dirichlet, [], [], [3], {"concentration": np.ones(3)}),
        (ed.Dirichlet, [], [2], [3], {"concentration": np.ones([2, 3])}),
        (ed.Dirichlet, [1], [], [3], {"concentration": np.ones(3)}),
        (ed.Dirichlet, [2, 1], [], [3], {"concentration": np.ones(3)}),
    ],
    ids=[
        "0d_bernoulli",
        "2d_bernoulli",
        "2x0d_bernoulli",
        "2x1d_bernoulli",
        "3d_dirichlet",
        "2x3d_dirichlet",
        "1x3d_dirichlet",
        "2x1x3d_dirichlet",
    ],
)
def test_shape(rv_cls, sample_shape, batch_shape, event_shape, kwargs):
    rv = rv_cls(sample_shape=sample_shape, **kwargs)
    assert rv.shape == sample_shape + batch_shape + event_shape
    assert rv.sample_shape == sample_shape
    assert rv.distribution.batch_shape == batch_shape
    assert rv.distribution.event_shape == event_shape


@pytest.mark.parametrize(
    "cls, value, kwargs",
    [
        (ed.Normal, 2, {"loc": 0.5, "scale": 1.0}),
        (ed.Normal, [2], {"loc": [0.5], "scale": [1.0]}),
        (ed.Poisson, 2, {"rate": 0.5}),
    ],
)
def test_value_shape_and_dtype(cls, value, kwargs):
    rv = cls(value=value, **kwargs)
    value_shape = rv.value.shape
    expected_shape = rv.sample_shape.concatenate(rv.distribution.batch_shape).concatenate(
        rv.distribution.event_shape
    )
    assert value_shape == expected_shape
    assert rv.distribution.dtype == rv.value.dtype


@pytest.mark.parametrize(
    "cls, value, kwargs",
    [
        (ed.Normal, 2, {"loc": [0.5, 0.5], "scale": 1.0}),
        (ed.Normal, 2, {"loc": [0.5], "scale": [1.0]}),
        (ed.Normal, np.zeros([10, 3]), {"loc": [0.5, 0.5], "scale": [1.0, 1.0]}),
    ],
)
def test_value_mismatch_raises(cls, value, kwargs):
    with pytest.raises(ValueError):
        cls(value=tf.convert_to_tensor(value), **kwargs)


def test_make_random_variable():
    """Tests that manual wrapping is the same as the built-in solution."""
    custom_normal = ed.make_random_variable(tfp.distributions.Normal)

    def model_builtin():
        return ed.Normal(1.0, 0.1, name="x")

    def model_wrapped():
        return custom_normal(1.0, 0.1, name="x")

    log_joint_builtin = ed.make_log_joint_fn(model_builtin)
    log_joint_wrapped = ed.make_log_joint_fn(model_wrapped)
    assert float(log_joint_builtin(x=7.0)) == float(log_joint_wrapped(x=7.0))
