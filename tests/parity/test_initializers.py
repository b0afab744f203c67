"""edward2's `edward2/tensorflow/initializers_test.py`, translated (`ed.initializers` is
`blayers.initializers`). blayers' random variables draw their value on first use (README), so
`rv.value` is read where edward2 reads the value drawn at construction."""

import numpy as np
import tensorflow as tf

import blayers


def test_trainable_deterministic():
    tf.random.set_seed(345689)
    shape = (100,)
    initializer = blayers.initializers.get("trainable_deterministic")
    rv = initializer(shape)
    # Get distribution of rv -> get distribution of Independent.
    loc = rv.distribution.distribution.loc
    atol = np.sqrt(6 / sum(shape)) + 1e-8
    np.testing.assert_allclose(tf.convert_to_tensor(loc), np.zeros(shape), atol=atol)
    assert rv.shape == shape


def test_trainable_half_cauchy():
    tf.random.set_seed(2832)
    shape = (3,)
    initializer = blayers.initializers.get("trainable_half_cauchy")
    half_cauchy = initializer(shape)
    # Get distribution of rv -> get distribution of Independent.
    loc = half_cauchy.distribution.distribution.loc
    scale = half_cauchy.distribution.distribution.scale
    np.testing.assert_allclose(tf.convert_to_tensor(loc), np.zeros(shape), atol=1e-4)
    target_scale = np.log(1.0 + np.exp(-3.0))
    np.testing.assert_allclose(
        tf.convert_to_tensor(scale), target_scale * np.ones(shape), atol=5e-2
    )
    assert tuple(half_cauchy.shape) == shape
    assert np.all(np.asarray(half_cauchy.value) >= 0.0)


def test_trainable_log_normal():
    tf.random.set_seed(345689)
    shape = (100,)
    initializer = blayers.initializers.get("trainable_log_normal")
    log_normal = initializer(shape)
    # Get distribution of rv -> get distribution of Independent.
    loc = log_normal.distribution.distribution.loc
    scale = log_normal.distribution.distribution.scale
    np.testing.assert_allclose(tf.convert_to_tensor(loc), np.zeros(shape), atol=1e-4)
    target_scale = np.log(1.0 + np.exp(-3.0))
    np.testing.assert_allclose(
        tf.convert_to_tensor(scale), target_scale * np.ones(shape), atol=5e-2
    )
    assert np.all(np.asarray(tf.convert_to_tensor(log_normal)) > 0.0)
    assert log_normal.shape == shape


def test_trainable_normal():
    tf.random.set_seed(345689)
    shape = (100,)
    initializer = blayers.initializers.get("trainable_normal")
    normal = initializer(shape)
    # Get distribution of rv -> get distribution of Independent.
    loc = normal.distribution.distribution.loc
    scale = normal.distribution.distribution.scale
    np.testing.assert_allclose(tf.convert_to_tensor(loc), np.zeros(shape), atol=1e-4)
    target_scale = np.log(1.0 + np.exp(-3.0))
    np.testing.assert_allclose(
        tf.convert_to_tensor(scale), target_scale * np.ones(shape), atol=5e-2
    )
    assert normal.shape == shape


def test_trainable_mixture_of_deltas():
    tf.random.set_seed(345689)
    shape = (100,)
    num_components = 5
    initializer = blayers.initializers.TrainableMixtureOfDeltas(num_components)
    mixture_shape = [*list(shape), num_components]
    rv = initializer(shape)
    # Get distribution of rv -> get distribution of Independent.
    probs = rv.distribution.distribution.mixture_distribution.probs
    loc = rv.distribution.distribution.components_distribution.loc
    np.testing.assert_allclose(
        tf.convert_to_tensor(probs),
        tf.broadcast_to([[1 / num_components] * num_components], mixture_shape),
        atol=1e-4,
    )
    np.testing.assert_allclose(tf.convert_to_tensor(loc), tf.zeros_like(loc), atol=1.0)
    assert rv.shape == shape


def test_orthogonal_random_features():
    tf.random.set_seed(42)
    stddev = 0.125
    num_rows = 512
    num_cols = 2 * num_rows
    shape = (num_rows, num_cols)
    initializer = blayers.initializers.OrthogonalRandomFeatures(stddev=stddev, random_norm=False)
    orthogonal_matrix = initializer(shape=shape)
    # Verify matrix shape.
    assert orthogonal_matrix.shape == tf.TensorShape(shape)
    # Verify column norm.
    squared_column_norm = num_rows * stddev**2
    norm_vector_expected = [squared_column_norm] * num_cols
    norm_vector_observed = tf.reduce_sum(orthogonal_matrix**2, axis=0)
    np.testing.assert_allclose(norm_vector_expected, norm_vector_observed, atol=1e-5, rtol=1e-6)
    # Verify orthogonal_matrix is a concatenation of two orthogonal matrices.
    inner_prod_expected = tf.eye(num_rows) * squared_column_norm
    orth_mat1 = orthogonal_matrix[:, :num_rows]
    orth_mat2 = orthogonal_matrix[:, num_rows:]
    inner_prod_observed1 = tf.matmul(orth_mat1, tf.transpose(orth_mat1))
    inner_prod_observed2 = tf.matmul(orth_mat2, tf.transpose(orth_mat2))
    np.testing.assert_allclose(inner_prod_observed1, inner_prod_expected, atol=1e-3, rtol=1e-6)
    np.testing.assert_allclose(inner_prod_observed2, inner_prod_expected, atol=1e-3, rtol=1e-6)


def test_initializers_get():
    assert isinstance(
        blayers.initializers.get("trainable_normal"), blayers.initializers.TrainableNormal
    )
