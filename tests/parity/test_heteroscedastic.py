"""edward2's `edward2/tensorflow/layers/heteroscedastic_test.py`, translated. blayers' output
layers return their logits by default (a Keras layer's one tensor); edward2's return the tuple
`(logits, log_probs, probs, variance)` by default, so every layer here is built with
`logits_only=False` (README). The graph-mode branches (`tf.compat.v1`) have no Keras 3
counterpart and are left out; the eager branches are translated."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import layers as ed_layers
from blayers.layers import heteroscedastic

tfd = tfp.distributions

CASES = [
    ("_MCSoftmaxDense_logit_noise_normal_10", tfd.Normal, 10, "MCSoftmaxDense", None),
    (
        "_MCSoftmaxDense_logit_noise_normal_10_tune_temp",
        tfd.Normal,
        10,
        "MCSoftmaxDense",
        {"tune_temperature": True, "temperature_lower_bound": 1.1, "temperature_upper_bound": 1.2},
    ),
    ("_MCSoftmaxDense_logit_noise_logistic_10", tfd.Logistic, 10, "MCSoftmaxDense", None),
    ("_MCSoftmaxDense_logit_noise_gumbel_10", tfd.Gumbel, 10, "MCSoftmaxDense", None),
    ("_MCSoftmaxDenseFA_logit_noise_normal_10", tfd.Normal, 10, "MCSoftmaxDenseFA", None),
    (
        "_MCSoftmaxDenseFA_logit_noise_normal_10_tune_temp",
        tfd.Normal,
        10,
        "MCSoftmaxDenseFA",
        {"tune_temperature": True, "temperature_lower_bound": 1.1, "temperature_upper_bound": 1.2},
    ),
    ("_MCSigmoidDenseFA_logit_noise_normal_10", tfd.Normal, 10, "MCSigmoidDenseFA", None),
    ("_MCSoftmaxDenseFAPE_logit_noise_normal_10", tfd.Normal, 10, "MCSoftmaxDenseFAPE", None),
    ("_MCSigmoidDenseFAPE_logit_noise_normal_10", tfd.Normal, 10, "MCSigmoidDenseFAPE", None),
    ("_MCSigmoidDenseFA_logit_noise_normal_2", tfd.Normal, 2, "MCSigmoidDenseFA", None),
    (
        "_MCSigmoidDenseFA_logit_noise_normal_2_tune_temp",
        tfd.Normal,
        2,
        "MCSigmoidDenseFA",
        {"tune_temperature": True, "temperature_lower_bound": 1.1, "temperature_upper_bound": 1.2},
    ),
    ("_MCSigmoidDenseFA_logit_noise_logistic_2", tfd.Logistic, 2, "MCSigmoidDenseFA", None),
    ("_MCSigmoidDenseFA_logit_noise_gumbel_2", tfd.Gumbel, 2, "MCSigmoidDenseFA", None),
    ("_Exact_logit_noise_normal_2", tfd.Normal, 2, "Exact", None),
    ("_Exact_logit_noise_logistic_2", tfd.Logistic, 2, "Exact", None),
    ("_EnsembleGibbsCE_10", tfd.Normal, 10, "EnsembleGibbsCE", None),
    ("_EnsembleGibbsCE_2", tfd.Normal, 2, "EnsembleGibbsCE", None),
    ("_EnsembleEnsembleCE_10", tfd.Normal, 10, "EnsembleEnsembleCE", None),
    ("_EnsembleEnsembleCE_2", tfd.Normal, 2, "EnsembleEnsembleCE", None),
]


def cases(function):
    return pytest.mark.parametrize(
        "logit_noise, num_classes, model_type, kwargs",
        [case[1:] for case in CASES],
        ids=[case[0] for case in CASES],
    )(function)


class Classifier(keras.Model):
    """Wrapper for classifiers defined below."""

    def __init__(
        self, model_type="MCSoftmaxDense", num_classes=2, logit_noise=tfd.Normal, **kwargs
    ):
        super().__init__()
        if model_type == "MCSoftmaxDense":
            self.classifier = DenseClassifier(num_classes, **kwargs)
        elif model_type == "MCSoftmaxDenseFA":
            self.classifier = DenseFAClassifier(
                num_classes, num_factors=max(num_classes // 2, 2), **kwargs
            )
        elif model_type == "MCSigmoidDenseFA":
            self.classifier = SigmoidDenseFAClassifier(
                num_classes,
                num_factors=max(num_classes // 2, 2) if num_classes > 2 else 0,
                **kwargs,
            )
        elif model_type == "MCSoftmaxDenseFAPE":
            self.classifier = DenseFAClassifier(
                num_classes,
                num_factors=max(num_classes // 2, 2),
                parameter_efficient=True,
                **kwargs,
            )
        elif model_type == "MCSigmoidDenseFAPE":
            self.classifier = SigmoidDenseFAClassifier(
                num_classes,
                num_factors=max(num_classes // 2, 2),
                parameter_efficient=True,
                **kwargs,
            )
        elif model_type == "Exact":
            self.classifier = ExactSigmoidDenseClassifier(num_classes, logit_noise)
        elif model_type == "EnsembleGibbsCE":
            self.classifier = EnsembleClassifier(num_classes, averaging="gibbs_cross_ent")
        elif model_type == "EnsembleEnsembleCE":
            self.classifier = EnsembleClassifier(num_classes, averaging="ensemble_cross_ent")

    def call(self, inputs, **kwargs):
        return self.classifier(inputs, **kwargs)


class DenseClassifier(keras.Model):
    """Feedforward neural network with MCSoftmaxDense output layer."""

    def __init__(
        self,
        num_classes,
        logit_noise=tfd.Normal,
        temperature=1.0,
        train_mc_samples=1000,
        test_mc_samples=1000,
        compute_pred_variance=False,
        tune_temperature=False,
        temperature_lower_bound=None,
        temperature_upper_bound=None,
    ):
        super().__init__()
        self.hidden_layer = keras.layers.Dense(16)
        self.output_layer = ed_layers.MCSoftmaxDense(
            num_classes=num_classes,
            logit_noise=logit_noise,
            temperature=temperature,
            train_mc_samples=train_mc_samples,
            test_mc_samples=test_mc_samples,
            compute_pred_variance=compute_pred_variance,
            tune_temperature=tune_temperature,
            temperature_lower_bound=temperature_lower_bound,
            temperature_upper_bound=temperature_upper_bound,
            logits_only=False,
        )

    def call(self, inputs, training=True, seed=None):
        hidden_x = self.hidden_layer(inputs)
        return self.output_layer(hidden_x, training=training, seed=seed)


class DenseFAClassifier(keras.Model):
    """Feedforward neural network with MCSoftmaxDenseFA output layer."""

    def __init__(
        self,
        num_classes,
        num_factors,
        temperature=1.0,
        parameter_efficient=False,
        train_mc_samples=1000,
        test_mc_samples=1000,
        compute_pred_variance=False,
        tune_temperature=False,
        temperature_lower_bound=None,
        temperature_upper_bound=None,
    ):
        super().__init__()
        self.hidden_layer = keras.layers.Dense(16)
        self.output_layer = ed_layers.MCSoftmaxDenseFA(
            num_classes=num_classes,
            num_factors=num_factors,
            temperature=temperature,
            parameter_efficient=parameter_efficient,
            train_mc_samples=train_mc_samples,
            test_mc_samples=test_mc_samples,
            compute_pred_variance=compute_pred_variance,
            tune_temperature=tune_temperature,
            temperature_lower_bound=temperature_lower_bound,
            temperature_upper_bound=temperature_upper_bound,
            logits_only=False,
        )

    def call(self, inputs, training=True, seed=None):
        hidden_x = self.hidden_layer(inputs)
        return self.output_layer(hidden_x, training=training, seed=seed)


class SigmoidDenseFAClassifier(keras.Model):
    """Feedforward neural network with MCSigmoidDenseFA output layer."""

    def __init__(
        self,
        num_classes,
        num_factors,
        temperature=1.0,
        parameter_efficient=False,
        train_mc_samples=1000,
        test_mc_samples=1000,
        compute_pred_variance=False,
        tune_temperature=False,
        temperature_lower_bound=None,
        temperature_upper_bound=None,
    ):
        super().__init__()
        self.hidden_layer = keras.layers.Dense(16)
        self.output_layer = ed_layers.MCSigmoidDenseFA(
            1 if num_classes == 2 else num_classes,
            num_factors=num_factors,
            temperature=temperature,
            parameter_efficient=parameter_efficient,
            train_mc_samples=train_mc_samples,
            test_mc_samples=test_mc_samples,
            compute_pred_variance=compute_pred_variance,
            tune_temperature=tune_temperature,
            temperature_lower_bound=temperature_lower_bound,
            temperature_upper_bound=temperature_upper_bound,
            logits_only=False,
        )

    def call(self, inputs, training=True, seed=None):
        hidden_x = self.hidden_layer(inputs)
        return self.output_layer(hidden_x, training=training, seed=seed)


class ExactSigmoidDenseClassifier(keras.Model):
    """Feedforward neural network with ExactSigmoidDense output layer."""

    def __init__(self, num_classes, logit_noise):
        super().__init__()
        self.hidden_layer = keras.layers.Dense(16)
        self.output_layer = ed_layers.ExactSigmoidDense(
            1 if num_classes == 2 else num_classes, logit_noise=logit_noise, logits_only=False
        )

    def call(self, inputs, training=True, seed=None):
        hidden_x = self.hidden_layer(inputs)
        return self.output_layer(hidden_x, training=training)


class EnsembleClassifier(keras.Model):
    """Feedforward neural network with Ensemble output layer."""

    def __init__(self, num_classes, averaging, ensemble_weighting=(0.8, 0.2)):
        super().__init__()
        self.hidden_layer = keras.layers.Dense(16)
        if num_classes == 2:
            layer_1 = ed_layers.MCSigmoidDenseFA(1, logits_only=False)
            layer_2 = ed_layers.ExactSigmoidDense(1, logits_only=False)
        else:
            layer_1 = ed_layers.MCSoftmaxDense(num_classes=num_classes, logits_only=False)
            layer_2 = ed_layers.MCSoftmaxDenseFA(
                num_classes=num_classes, num_factors=num_classes // 2, logits_only=False
            )
        self.output_layer = ed_layers.EnsembleHeteroscedasticOutputs(
            num_classes,
            (layer_1, layer_2),
            ensemble_weighting=ensemble_weighting,
            averaging=averaging,
            logits_only=False,
        )

    def call(self, inputs, training=True):
        hidden_x = self.hidden_layer(inputs)
        return self.output_layer(hidden_x, training=training)


def create_dataset(num_classes):
    x = np.asarray([[1.0, 2.0], [0.5, 1.5], [0.2, 0.15], [-0.3, 0.0]])
    y = np.asarray([[i % num_classes] for i in range(4)])
    return tf.convert_to_tensor(x), tf.convert_to_tensor(y)


@cases
def test_layer_construction(logit_noise, num_classes, model_type, kwargs):
    kwargs = {} if kwargs is None else kwargs
    if model_type == "MCSoftmaxDense":
        output_layer = ed_layers.MCSoftmaxDense(
            num_classes=num_classes, logit_noise=logit_noise, **kwargs
        )
        assert output_layer is not None


@cases
def test_model_construction(logit_noise, num_classes, model_type, kwargs):
    kwargs = {} if kwargs is None else kwargs
    if model_type == "MCSoftmaxDense":
        classifier = DenseClassifier(num_classes, logit_noise, **kwargs)
    elif model_type == "EnsembleEnsembleCE":
        classifier = EnsembleClassifier(num_classes, "ensemble_cross_ent")
    elif model_type == "EnsembleGibbsCE":
        classifier = EnsembleClassifier(num_classes, "gibbs_cross_ent")
    else:
        return
    assert classifier is not None


def test_ensemble_weighting():
    classifier = EnsembleClassifier(2, "ensemble_cross_ent", ensemble_weighting=(0.5, 0.5))
    assert classifier is not None
    classifier = EnsembleClassifier(2, "ensemble_cross_ent", ensemble_weighting=(0.8, 0.2))
    assert classifier is not None
    with pytest.raises(ValueError):
        EnsembleClassifier(2, "ensemble_cross_ent", ensemble_weighting=(0.4, 0.5))
    with pytest.raises(ValueError):
        EnsembleClassifier(2, "ensemble_cross_ent", ensemble_weighting=(1.5, -0.5))


def _check_probabilities(probs, num_classes, model_type):
    if num_classes == 2 or "Sigmoid" in model_type:
        for prob in np.asarray(probs).flatten():
            assert prob + (1.0 - prob) == pytest.approx(1.0, abs=0.5e-2)
    else:
        for prob in np.asarray(tf.reduce_sum(probs, axis=-1)).flatten():
            assert prob == pytest.approx(1.0, abs=0.5e-2)


@cases
def test_model_outputs(logit_noise, num_classes, model_type, kwargs):
    kwargs = {} if kwargs is None else kwargs
    x, _ = create_dataset(num_classes)
    classifier = Classifier(model_type, num_classes, logit_noise, **kwargs)
    res = classifier(x)
    probs, log_probs = res[2], res[1]
    assert probs is not None and log_probs is not None
    _check_probabilities(probs, num_classes, model_type)
    res = classifier(x, training=False)
    probs, log_probs = res[2], res[1]
    assert probs is not None and log_probs is not None
    _check_probabilities(probs, num_classes, model_type)


def _train_step(classifier, loss_fn, x, y):
    optimizer = keras.optimizers.Adam()
    with tf.GradientTape() as tape:
        log_preds = classifier(x)[1]
        loss_value = loss_fn(y, log_preds)
    grads = tape.gradient(loss_value, classifier.trainable_weights)
    grads, _ = tf.clip_by_global_norm(grads, 2.5)
    optimizer.apply_gradients(zip(grads, classifier.trainable_weights))
    return float(loss_value)


@cases
def test_train_step(logit_noise, num_classes, model_type, kwargs):
    kwargs = {} if kwargs is None else kwargs
    x, y = create_dataset(num_classes)
    classifier = Classifier(model_type, num_classes, logit_noise, **kwargs)
    if num_classes == 2:
        loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
    else:
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    loss_value = _train_step(classifier, loss_fn, x, y)
    assert loss_value > 0
    if kwargs.get("tune_temperature"):
        contains_temperature = False
        pre_sigmoid_temperature = np.nan
        for w in classifier.trainable_weights:
            if "pre_sigmoid_temperature" in w.name:
                contains_temperature = True
                pre_sigmoid_temperature = w.numpy()
                break
        assert contains_temperature
        lower = kwargs["temperature_lower_bound"]
        upper = kwargs["temperature_upper_bound"]
        initial_temperature = (upper + lower) * 0.5
        temperature = heteroscedastic.compute_temperature(pre_sigmoid_temperature, lower, upper)
        # We have made a gradient step, the temperatures must differ.
        assert float(temperature) != initial_temperature


@cases
def test_predictive_variance(logit_noise, num_classes, model_type, kwargs):
    kwargs = {} if kwargs is None else kwargs
    if model_type == "Exact" or model_type.startswith("Ensemble"):
        return
    x, _ = create_dataset(num_classes)
    classifier = Classifier(
        model_type, num_classes, logit_noise, compute_pred_variance=True, **kwargs
    )
    pred_variance = classifier(x)[3]
    assert pred_variance is not None
    for per_class_variance in np.asarray(pred_variance).flatten():
        assert per_class_variance > 0


SEGMENTATION_CASES = pytest.mark.parametrize(
    "num_classes, num_factors",
    [(10, 5), (10, 0)],
    ids=["_classes_10_factors_5", "_classes_10_factors_0"],
)


class SegmentationClassifier(keras.Model):
    """Segmentation classifier."""

    def __init__(self, num_classes, num_factors):
        super().__init__()
        self.hidden_layer = keras.layers.Dense(16)
        self.output_layer = ed_layers.MCSoftmaxDenseFASegmentation(
            num_classes, num_factors, logits_only=False
        )

    def call(self, inputs, training=True):
        hidden = self.hidden_layer(inputs, training=training)
        return self.output_layer(hidden, training=training)


def create_segmentation_dataset(num_classes):
    x = np.random.normal(size=(4, 32, 32, 16))
    y = np.random.choice(num_classes, size=(4, 32, 32))
    return tf.convert_to_tensor(x), tf.convert_to_tensor(y)


@SEGMENTATION_CASES
def test_segmentation_layer_construction(num_classes, num_factors):
    output_layer = ed_layers.MCSoftmaxDenseFASegmentation(num_classes, num_factors)
    assert output_layer is not None


@SEGMENTATION_CASES
def test_segmentation_model_construction(num_classes, num_factors):
    classifier = SegmentationClassifier(num_classes, num_factors)
    assert classifier is not None


@SEGMENTATION_CASES
def test_segmentation_model_outputs(num_classes, num_factors):
    x, _ = create_segmentation_dataset(num_classes)
    classifier = SegmentationClassifier(num_classes, num_factors)
    for training in (True, False):
        res = classifier(x, training=training)
        probs, log_probs = res[2], res[1]
        assert probs is not None and log_probs is not None
        total_probs = np.asarray(tf.reduce_sum(probs, axis=-1)).flatten()
        np.testing.assert_allclose(total_probs, 1.0, atol=0.5e-2)


@SEGMENTATION_CASES
def test_segmentation_train_step(num_classes, num_factors):
    x, y = create_segmentation_dataset(num_classes)
    classifier = SegmentationClassifier(num_classes, num_factors)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    assert _train_step(classifier, loss_fn, x, y) > 0
