"""`bayesianize`: a Keras model with its layers swapped for their Bayesian twins.

The twins of `keras.layers.Dense`, `Conv1D`/`Conv2D`/`Conv3D`, `Conv2DTranspose`, `LSTM`, `GRU`,
`Embedding` and `MultiHeadAttention` put a distribution (the `posterior`, default a mean-field
Normal) over each kernel, with a KL term against the `prior` in `model.losses` (Tran et al., 2019,
Sec. 2.1). Every other layer is cloned with its trained weights. With `moped_delta`, the
posterior starts at the trained solution (MOPED, Krishnan et al., 2020):

    q(w) = N(w*, (delta |w*|)^2),

the posterior mean at the pretrained weight `w*` and the stddev a fraction `delta` of its
magnitude; biases (deterministic, as in every blayers layer by default) keep their trained values.
"""

import keras
import numpy as np

from blayers import constraints as constraints_lib
from blayers import initializers as initializers_lib
from blayers.layers import attention, convolutional, dense, embeddings, recurrent
from blayers.layers.attention import fresh_identifier as _fresh

__all__ = ["bayesianize", "convertible_layer_types"]

_ESTIMATORS = ("flipout", "reparameterization", "local_reparameterization")
_SUFFIX = {
    "flipout": "Flipout",
    "reparameterization": "Reparameterization",
    "local_reparameterization": "LocalReparameterization",
}
_MODULES = (dense, convolutional, recurrent, embeddings, attention)


def _twin_class(prefix, estimator, keras_name):
    name = prefix + _SUFFIX[estimator]
    for module in _MODULES:
        if hasattr(module, name):
            return getattr(module, name)
    available = [
        suffix for suffix in _SUFFIX.values() if any(hasattr(m, prefix + suffix) for m in _MODULES)
    ]
    raise _refuse(
        keras_name,
        f"has no {estimator!r} twin in blayers; its twins use {', '.join(available)}",
        "Pass another estimator or exclude the layer",
    )


def convertible_layer_types():
    """The Keras layer classes `bayesianize` converts."""
    return (
        keras.layers.Dense,
        keras.layers.Conv1D,
        keras.layers.Conv2D,
        keras.layers.Conv3D,
        keras.layers.Conv2DTranspose,
        keras.layers.LSTM,
        keras.layers.GRU,
        keras.layers.Embedding,
        keras.layers.MultiHeadAttention,
    )


def _is_convertible(layer):
    # Exact types: a subclass of Dense may change what the layer computes.
    return type(layer) in convertible_layer_types()


def _weight_args(posterior, prior, kernel_names=("kernel",)):
    out = {}
    for name in kernel_names:
        out[f"{name}_initializer"] = _fresh(posterior)
        out[f"{name}_regularizer"] = _fresh(prior)
    return out


def _refuse(keras_name, why, remedy="Exclude the layer"):
    return ValueError(f"bayesianize: {keras_name} {why}. {remedy}.")


def _common(config):
    return {"name": config["name"], "dtype": config.get("dtype")}


def _twin(layer, estimator, posterior, prior, seed):
    """The blayers twin of `layer` (unbuilt)."""
    config = layer.get_config()
    keras_name = f"{type(layer).__name__} {layer.name!r}"
    base = {**_common(config), "seed": seed}
    if isinstance(layer, keras.layers.Dense):
        return _twin_class("Dense", estimator, keras_name)(
            units=config["units"],
            activation=config["activation"],
            use_bias=config["use_bias"],
            **_weight_args(posterior, prior),
            **base,
        )
    if isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)):
        if config.get("groups", 1) != 1:
            raise _refuse(
                keras_name, f"has groups={config['groups']}; blayers convolutions have one"
            )
        if config.get("data_format", "channels_last") != "channels_last":
            raise _refuse(keras_name, "is channels_first; blayers convolutions are channels_last")
        transpose = isinstance(layer, keras.layers.Conv2DTranspose)
        prefix = "Conv2DTranspose" if transpose else f"Conv{len(config['kernel_size'])}D"
        if transpose and config.get("output_padding") is not None:
            raise _refuse(
                keras_name, "sets output_padding, which blayers' transposed twins do not take"
            )
        return _twin_class(prefix, estimator, keras_name)(
            filters=config["filters"],
            kernel_size=config["kernel_size"],
            strides=config["strides"],
            padding=config["padding"],
            dilation_rate=config["dilation_rate"],
            activation=config["activation"],
            use_bias=config["use_bias"],
            **_weight_args(posterior, prior),
            **base,
        )
    if isinstance(layer, (keras.layers.LSTM, keras.layers.GRU)):
        is_lstm = isinstance(layer, keras.layers.LSTM)
        if not is_lstm and not config.get("reset_after", True):
            raise _refuse(
                keras_name, "has reset_after=False; blayers' GRU cells use reset_after=True"
            )
        if config.get("dropout") or config.get("recurrent_dropout"):
            raise _refuse(
                keras_name,
                "uses dropout, which blayers' cells do not take",
                "Exclude the layer or set the rates to 0",
            )
        cell_kwargs = {"unit_forget_bias": config["unit_forget_bias"]} if is_lstm else {}
        cell = _twin_class("LSTMCell" if is_lstm else "GRUCell", estimator, keras_name)(
            units=config["units"],
            activation=config["activation"],
            recurrent_activation=config["recurrent_activation"],
            use_bias=config["use_bias"],
            **_weight_args(posterior, prior, ("kernel", "recurrent")),
            seed=seed,
            dtype=config.get("dtype"),
            **cell_kwargs,
        )
        return keras.layers.RNN(
            cell,
            return_sequences=config["return_sequences"],
            return_state=config["return_state"],
            go_backwards=config["go_backwards"],
            stateful=config["stateful"],
            unroll=config["unroll"],
            **_common(config),
        )
    if isinstance(layer, keras.layers.Embedding):
        # One estimator for a lookup: a draw of the table (Flipout has no rows to sign-flip).
        return embeddings.EmbeddingReparameterization(
            input_dim=config["input_dim"],
            output_dim=config["output_dim"],
            embeddings_initializer=_fresh(posterior),
            embeddings_regularizer=_fresh(prior),
            mask_zero=config["mask_zero"],
            **base,
        )
    if isinstance(layer, keras.layers.MultiHeadAttention):
        axes = config.get("attention_axes")
        # Keras records the axes it resolved at build: (1,) for [batch, length, features].
        if axes is not None and tuple(np.atleast_1d(axes)) not in ((1,), (-2,)):
            raise ValueError(
                f"bayesianize: {keras_name} sets attention_axes; blayers' twin "
                "attends over the length axis only"
            )
        return _twin_class("MultiHeadAttention", estimator, keras_name)(
            num_heads=config["num_heads"],
            key_dim=config["key_dim"],
            value_dim=config["value_dim"],
            dropout=config["dropout"],
            use_bias=config["use_bias"],
            output_shape=config["output_shape"],
            kernel_initializer=_fresh(posterior),
            kernel_regularizer=_fresh(prior),
            **base,
        )
    raise TypeError(f"bayesianize: no twin for {keras_name}")  # _is_convertible guards this


def _trained_weights(layer):
    """The trained weights of a convertible layer by the twin's names, in the twin's shapes
    (Keras' attention projections are `[in, heads, depth]`; blayers' are `[in, heads*depth]`)."""
    if isinstance(layer, (keras.layers.LSTM, keras.layers.GRU)):
        cell = layer.cell
        out = {"kernel": cell.kernel, "recurrent_kernel": cell.recurrent_kernel}
        if cell.use_bias:
            out["bias"] = cell.bias
        return {k: np.asarray(keras.ops.convert_to_numpy(v)) for k, v in out.items()}
    if isinstance(layer, keras.layers.MultiHeadAttention):
        out = {}
        for projection, sub in (
            ("query", layer._query_dense),
            ("key", layer._key_dense),
            ("value", layer._value_dense),
            ("output", layer._output_dense),
        ):
            kernel = np.asarray(keras.ops.convert_to_numpy(sub.kernel))
            if projection == "output":
                out["output_kernel"] = kernel.reshape(-1, kernel.shape[-1])
            else:
                out[f"{projection}_kernel"] = kernel.reshape(kernel.shape[0], -1)
            if sub.bias is not None:
                out[f"{projection}_bias"] = np.asarray(
                    keras.ops.convert_to_numpy(sub.bias)
                ).reshape(-1)
        return out
    if isinstance(layer, keras.layers.Embedding):
        return {"embeddings": np.asarray(keras.ops.convert_to_numpy(layer.embeddings))}
    out = {"kernel": np.asarray(keras.ops.convert_to_numpy(layer.kernel))}
    if layer.use_bias:
        out["bias"] = np.asarray(keras.ops.convert_to_numpy(layer.bias))
    return out


def _bayesian_layer(twin):
    return twin.cell if isinstance(twin, keras.layers.RNN) else twin


def _moped(old, twin, delta):
    """Posterior means at the trained weights, stddevs `delta |w|`; deterministic weights (the
    biases) take their trained values."""
    target = _bayesian_layer(twin)
    for name, value in _trained_weights(old).items():
        init = getattr(target, f"{name}_initializer", None)
        if name in target.random_weight_names():
            if not isinstance(init, initializers_lib.TrainableNormal):
                raise ValueError(
                    f"bayesianize: moped_delta needs a Normal posterior (trainable_normal and its "
                    f"variants); {target.name!r}'s {name} has {type(init).__name__}."
                )
            constraint = init._parameters["stddev"].constraint
            if (
                getattr(constraint, "__name__", type(constraint).__name__).lower().find("softplus")
                < 0
            ):
                raise ValueError(
                    f"bayesianize: moped_delta sets the stddev through softplus; {target.name!r}'s "
                    f"{name} posterior has stddev_constraint {constraint!r}."
                )
            if tuple(init.stddev.shape) != value.shape:
                raise ValueError(
                    f"bayesianize: moped_delta needs a per-weight stddev; {target.name!r}'s {name} "
                    f"posterior has stddev of shape {tuple(init.stddev.shape)}."
                )
            init.mean.assign(value.astype(init.mean.dtype))
            stddev = np.maximum(delta * np.abs(value), 1e-8)
            init.stddev.assign(constraints_lib.softplus_inverse(stddev).astype(init.stddev.dtype))
        else:
            weight = getattr(target, name)
            weight.assign(value.reshape(weight.shape).astype(weight.dtype))


def _selected(layer, include, exclude):
    def matches(patterns):
        for pattern in patterns:
            if isinstance(pattern, str) and pattern == layer.name:
                return True
            if isinstance(pattern, type) and isinstance(layer, pattern):
                return True
        return False

    if include is not None and not matches(include):
        return False
    return not (exclude is not None and matches(exclude))


def _as_list(value):
    if value is None or isinstance(value, (list, tuple)):
        return value
    return [value]


def bayesianize(
    model,
    estimator="flipout",
    prior="prior",
    posterior="trainable_normal",
    moped_delta=None,
    include=None,
    exclude=None,
    seed=None,
):
    """A copy of `model` whose convertible layers are Bayesian.

    Args:
      model: a functional or sequential `keras.Model` (built). A subclassed model cannot be
        rebuilt layer by layer: the error names its first convertible layer; use blayers' layers
        in its `__init__` instead.
      estimator: `'flipout'` (default), `'reparameterization'` or
        `'local_reparameterization'` (dense and convolutional layers only). An `Embedding`
        becomes `EmbeddingReparameterization` whatever the estimator.
      prior: the kernels' regularizer (the KL to the prior): a blayers regularizer name or
        instance (default `'prior'`, the configurable default prior `N(0, 1)`), or None.
      posterior: the kernels' distribution initializer (default `'trainable_normal'`).
      moped_delta: when set, the posterior starts at the trained weights,
        `q(w) = N(w*, (moped_delta |w*|)^2)` (MOPED); otherwise the Bayesian kernels start
        from `posterior`'s own initialization and only the other layers keep their weights.
      include: layer names or classes to convert (default every convertible layer).
      exclude: layer names or classes to keep as they are.
      seed: seeds the twins' estimator noise.

    Returns:
      A new `keras.Model`; `model` is unchanged. Its KL terms are in `model.losses` (scale them
      with `blayers.set_kl_scale(1 / num_examples)` before `fit`).
    """
    if estimator not in _ESTIMATORS:
        raise ValueError(f"bayesianize: estimator {estimator!r} is not one of {_ESTIMATORS}.")
    if moped_delta is not None and not moped_delta > 0:
        raise ValueError(f"bayesianize: moped_delta={moped_delta!r} must be positive.")
    include, exclude = _as_list(include), _as_list(exclude)
    names = {layer.name for layer in model.layers}
    for pattern in (include or []) + (exclude or []):
        if isinstance(pattern, str) and pattern not in names:
            raise ValueError(
                f"bayesianize: no layer named {pattern!r} in {model.name!r} (layers: "
                f"{sorted(names)})."
            )
    is_graph = isinstance(
        model, (keras.Sequential, keras.Function)
    )  # functional models are Functions
    if not is_graph:
        candidates = [
            layer.name
            for layer in model._flatten_layers(include_self=False, recursive=True)
            if _is_convertible(layer)
        ]
        raise ValueError(
            f"bayesianize: {model.name!r} is a subclassed model ({type(model).__name__}), which "
            "cannot be rebuilt layer by layer"
            + (f"; its convertible layers start with {candidates[0]!r}" if candidates else "")
            + ". Build it from blayers' layers instead, or wrap its parts in a functional model."
        )
    pairs = []

    def clone(layer):
        if _is_convertible(layer) and _selected(layer, include, exclude):
            twin = _twin(layer, estimator, posterior, prior, seed)
        else:
            twin = layer.__class__.from_config(layer.get_config())
        pairs.append((layer, twin))
        return twin

    new = keras.models.clone_model(model, clone_function=clone)
    for old, twin in pairs:
        if _is_convertible(old) and old is not twin and _selected(old, include, exclude):
            if moped_delta is not None:
                _moped(old, twin, float(moped_delta))
        elif old.weights:
            twin.set_weights(old.get_weights())
    return new
