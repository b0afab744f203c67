"""edward2's `edward2/tensorflow/layers/random_feature_test.py`, translated. edward2's
`RandomFeatureGaussianProcess` returns `(logits, covariance)` by default (`return_gp_cov=True`);
blayers' returns the logits (a drop-in for a classifier's `Dense`), so the calls that read the
covariance pass `return_gp_cov=True`. blayers' random features are always edward2's "custom"
ones (`use_custom_random_features=True`, the only value), the covariance layer is
`layer.gp_cov_layer` (edward2's private `_gp_cov_layer`), the RBF kernel is TFP's, and a model
is saved as a `.keras` file (Keras 3 has no SavedModel `model.save(dir)`). edward2's two
commented-out tests are left out."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import layers as ed_layers

_RBF = tfp.math.psd_kernels.ExponentiatedQuadratic(amplitude=1.0, length_scale=1.0)


def RBF_KERN_FUNC(x1, x2):  # edward2's name
    return _RBF.matrix(x1, x2)


def _generate_normal_data(num_sample, num_dim, loc):
    """Generates random data sampled from i.i.d. normal distribution."""
    return np.random.normal(size=(num_sample, num_dim), loc=loc, scale=1.0 / np.sqrt(num_dim))


def _generate_rbf_data(x_data, orthogonal=True):
    """Generates high-dim data that is the eigen components of a RBF kernel."""
    k_rbf = RBF_KERN_FUNC(x_data, x_data)
    x_orth, x_diag, _ = np.linalg.svd(k_rbf)
    if orthogonal:
        return x_orth
    return np.diag(np.sqrt(x_diag)).dot(x_orth.T)


def _make_minibatch_iterator(data_numpy, batch_size, num_epoch):
    """Makes a tf.data.Dataset for given batch size and num epoches."""
    dataset = tf.data.Dataset.from_tensor_slices(data_numpy)
    dataset = dataset.repeat(num_epoch).batch(batch_size)
    return iter(dataset)


class Setup:
    num_data_dim = 10
    num_inducing = 1024
    num_train_sample = 1024
    num_test_sample = 256

    def __init__(self):
        self.prec_tolerance = {"atol": 1e-3, "rtol": 5e-2}
        self.cov_tolerance = {"atol": 5e-2, "rtol": 2.0}
        self.rbf_kern_func = RBF_KERN_FUNC
        self.x_tr = _generate_normal_data(self.num_train_sample, self.num_data_dim, loc=0.0)
        self.x_ts = _generate_normal_data(self.num_test_sample, self.num_data_dim, loc=1.0)


@pytest.fixture
def setup():
    return Setup()


@pytest.mark.parametrize(
    "generate_orthogonal_data", [False, True], ids=["rbf_data", "orthogonal_data"]
)
def test_laplace_covariance_minibatch(setup, generate_orthogonal_data):
    """Tests if model correctly learns population-lvel precision matrix."""
    batch_size = 50
    epochs = 1000
    x_data = _generate_rbf_data(setup.x_ts, generate_orthogonal_data)
    data_iterator = _make_minibatch_iterator(x_data, batch_size, epochs)

    # Estimates precision matrix using minibatch.
    cov_estimator = ed_layers.LaplaceRandomFeatureCovariance(momentum=0.999, ridge_penalty=0)

    for minibatch_data in data_iterator:
        _ = cov_estimator(minibatch_data, training=True)

    # Evaluation
    prec_mat_expected = x_data.T.dot(x_data)
    prec_mat_computed = cov_estimator.precision_matrix.numpy() * setup.num_test_sample

    np.testing.assert_allclose(prec_mat_computed, prec_mat_expected, **setup.prec_tolerance)


def test_random_feature_linear_kernel(setup):
    """Tests if linear kernel indeed leads to an identity mapping."""
    rfgp_model = ed_layers.RandomFeatureGaussianProcess(
        units=1,
        normalize_input=False,
        gp_kernel_type="linear",
        scale_random_features=False,
        return_gp_cov=True,
        return_random_features=True,
    )

    _, _, gp_feature = rfgp_model(setup.x_tr, training=True)

    # Check if linear kernel leads to identity mapping.
    np.testing.assert_allclose(gp_feature, setup.x_tr, **setup.prec_tolerance)


def test_no_matrix_update_during_test(setup):
    """Tests if the precision matrix is not updated during testing."""
    # Enable exact updates so precision matrix update can be detected.
    rfgp_model = ed_layers.RandomFeatureGaussianProcess(
        units=1, gp_cov_momentum=-1, return_gp_cov=True
    )

    # Training.
    _, gp_covmat_null = rfgp_model(setup.x_tr, training=True)
    prec_mat_before_call = rfgp_model.gp_cov_layer.precision_matrix.numpy()

    # First inference call.
    _ = rfgp_model(setup.x_ts, training=False)
    prec_mat_first_call = rfgp_model.gp_cov_layer.precision_matrix.numpy()
    cov_mat_first_call = rfgp_model.gp_cov_layer.covariance_matrix.numpy()

    # Second inference call.
    _ = rfgp_model(setup.x_ts, training=False)
    prec_mat_second_call = rfgp_model.gp_cov_layer.precision_matrix.numpy()
    cov_mat_second_call = rfgp_model.gp_cov_layer.covariance_matrix.numpy()

    # Second training call.
    _, gp_covmat_null = rfgp_model(setup.x_tr, training=True)
    prec_mat_resumed_train = rfgp_model.gp_cov_layer.precision_matrix.numpy()

    np.testing.assert_allclose(gp_covmat_null, tf.eye(setup.num_train_sample), atol=1e-4)
    # Tests if precision matrix stays the same during repeated calls.
    np.testing.assert_allclose(prec_mat_first_call, prec_mat_before_call, atol=1e-4)
    np.testing.assert_allclose(prec_mat_second_call, prec_mat_before_call, atol=1e-4)
    # Tests if precision matrix is updated during resumed training.
    assert not np.allclose(prec_mat_resumed_train, prec_mat_before_call, atol=1e-4)
    # Tests if covaraince matrix stays the same during repeated calls.
    gp_dim = prec_mat_before_call.shape[0]
    prec_mat_before_call = prec_mat_before_call + rfgp_model.gp_cov_ridge_penalty * tf.eye(
        gp_dim, gp_dim
    )
    # tf.test's assertAllClose: rtol = atol = 1e-6.
    tolerance = {"rtol": 1e-6, "atol": 1e-6}
    np.testing.assert_allclose(cov_mat_first_call, tf.linalg.inv(prec_mat_before_call), **tolerance)
    np.testing.assert_allclose(
        cov_mat_second_call, tf.linalg.inv(prec_mat_before_call), **tolerance
    )


def test_if_update_covmat_flags(setup):
    """Tests if covariance update is properly flipped during train / test."""
    rfgp_model = ed_layers.RandomFeatureGaussianProcess(units=1)

    # First training call  after which `if_update_covariance` should be True.
    _ = rfgp_model(setup.x_tr, training=True)
    update_cov_before_call = rfgp_model.gp_cov_layer.if_update_covariance.numpy()

    # First inference call after which `if_update_covariance` should be False.
    _ = rfgp_model(setup.x_ts, training=False)
    update_cov_first_call = rfgp_model.gp_cov_layer.if_update_covariance.numpy()

    # Second inference call after which `if_update_covariance` should be False.
    _ = rfgp_model(setup.x_ts, training=False)
    update_cov_second_call = rfgp_model.gp_cov_layer.if_update_covariance.numpy()

    # Second training call after which `if_update_covariance` should be True.
    _ = rfgp_model(setup.x_tr, training=True)
    update_cov_resumed_train = rfgp_model.gp_cov_layer.if_update_covariance.numpy()

    assert update_cov_before_call
    assert not update_cov_first_call
    assert not update_cov_second_call
    assert update_cov_resumed_train


def test_state_saving_and_loading(tmp_path):
    """Tests if the loaded model returns same results."""
    input_data = np.random.random((1, 2))
    rfgp_model = ed_layers.RandomFeatureGaussianProcess(units=1, return_gp_cov=True)

    inputs = keras.Input((2,), batch_size=1)
    outputs = rfgp_model(inputs)
    model = keras.Model(inputs, outputs)
    gp_output, gp_covmat = model.predict(input_data, verbose=0)

    # Save and then load the model.
    saved_model_path = tmp_path / "rfgp_model.keras"
    model.save(saved_model_path)
    new_model = keras.models.load_model(saved_model_path)

    gp_output_new, gp_covmat_new = new_model.predict(input_data, verbose=0)
    np.testing.assert_allclose(gp_output, gp_output_new, atol=1e-4, rtol=1e-6)
    np.testing.assert_allclose(gp_covmat, gp_covmat_new, atol=1e-4, rtol=1e-6)
