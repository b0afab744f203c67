"""Stochastic output layers: deterministic computation on a tensor, returning a random variable
(Tran et al., 2019, Sec. 2.3 "Stochastic Output Layers").

Each layer maps its input (optionally through a trainable linear projection, `units`) to the
parameters of a distribution and returns a `RandomVariable`, so a model can end in one (a loss
reads `outputs.distribution.log_prob(labels)`, also in `model.fit`) and a stochastic output can
feed the next layer (its value is a draw). Without `units` the input's shape is kept:

* `Normal`: `loc = x`, `scale` a trainable per-feature vector (softplus); with `units`:
  `loc, scale = Dense(2 units)(x)` (heteroscedastic).
* `Bernoulli`, `Poisson`: logits / log-rates `= x` (or `Dense(units)(x)`).
* `Categorical`: logits `= x` over its last axis (or `Dense(units)(x)`, `units` classes).
* `MixtureLogistic(units, num_components)`, `MixtureNormal(units, num_components)`: per element,
  mixture logits, locations and scales from `3 * num_components` inputs on the last axis (or
  `Dense(units * 3 K)(x)`); the output has one value per `units` (or per input position).
* `Discretize`: a continuous random variable -> one over the integers whose probabilities are
  the continuous mass of unit bins `(k - 1/2, k + 1/2]`, the edge bins taking the tails
  (Salimans et al., 2017), computed by TFP's `QuantizedDistribution` in log space.
"""

import numbers

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import distributions as rv_lib
from blayers.layers.base import LocalLosses, NamedOutput, SeededLayer, register
from blayers.random_variable import RandomVariable, fixed_at

tfd = tfp.distributions
tfb = tfp.bijectors

__all__ = [
    "Bernoulli",
    "Categorical",
    "Discretize",
    "DistributionLambda",
    "MixtureLogistic",
    "MixtureNormal",
    "Normal",
    "Poisson",
]

_MIN_SCALE = 1e-5
_CONVERSIONS = ("sample", "mean", "mode")


def _check_conversion(layer, conversion):
    if conversion not in _CONVERSIONS:
        raise ValueError(
            f"{type(layer).__name__} ({layer.name}): convert_to_tensor_fn must be one of "
            f"{_CONVERSIONS}, got {conversion!r}."
        )
    return conversion


def _convert(layer, rv):
    """`rv` with its value fixed at the distribution's mean or mode, as the layer's
    `convert_to_tensor_fn` asks (a value an interceptor gave is kept)."""
    conversion = layer.convert_to_tensor_fn
    if conversion == "sample" or rv.value_given:
        return rv
    try:
        return fixed_at(rv, conversion)
    except NotImplementedError:
        raise ValueError(
            f"{type(layer).__name__} ({layer.name}): {type(rv.distribution).__name__} has no "
            f"analytic {conversion}; use convert_to_tensor_fn='sample'"
            + (" or 'mode'" if conversion == "mean" else "")
            + "."
        ) from None


class _Scale:
    """`scale = scale_floor + softplus(scale_multiplier * raw)` of the layers that produce a
    scale. The floor bounds the density (an unbounded one lets a fit collapse onto a few points
    and gives an infinite held-out NLL); the multiplier slows the raw scale's learning on
    unscaled inputs (TFP's regression tutorial uses `1e-3 + softplus(0.05 * raw)` for inputs
    in [-20, 60])."""

    def _init_scale(self, scale_floor, scale_multiplier):
        for argument, value in (
            ("scale_floor", scale_floor),
            ("scale_multiplier", scale_multiplier),
        ):
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value > 0:
                raise ValueError(
                    f"{type(self).__name__} ({self.name}): {argument} must be a positive number, "
                    f"got {value!r}."
                )
        self.scale_floor, self.scale_multiplier = float(scale_floor), float(scale_multiplier)

    def _scale(self, raw):
        return self.scale_floor + tf.nn.softplus(self.scale_multiplier * raw)

    def _scale_config(self):
        return {"scale_floor": self.scale_floor, "scale_multiplier": self.scale_multiplier}


class _OutputLayer(NamedOutput, SeededLayer):
    """A projection to `parameters_per_unit * units` when `units` is set; subclasses map the
    (projected) tensor to a distribution."""

    _args_doc = """    Args:
      units: output elements, projected from the input by a trainable `Dense` layer; None
        reads the distribution's parameters from the input itself.
      seed: seeds the output's draw (its `value`).
      convert_to_tensor_fn: what the returned random variable is as a tensor (what Keras
        metrics, `model.predict` and the next layer see): `'sample'` (a draw, the default),
        `'mean'` or `'mode'` of the distribution (as `tfp.layers`' argument of that name; a
        `RootMeanSquaredError` metric wants `'mean'`). The loss reads the distribution either way.
      output_name: name of the returned random variable (default: the layer's name).
      **kwargs: `keras.layers.Layer` arguments.
"""

    parameters_per_unit = 1

    def __init__(self, units=None, seed=None, convert_to_tensor_fn="sample", **kwargs):
        super().__init__(seed=seed, **kwargs)
        if units is not None and (not isinstance(units, int) or units <= 0):
            raise ValueError(
                f"{type(self).__name__}: units must be a positive int or None, got {units!r}."
            )
        self.convert_to_tensor_fn = _check_conversion(self, convert_to_tensor_fn)
        self.units = units
        self.projection = None
        if units is not None:
            self.projection = keras.layers.Dense(
                self.parameters_per_unit * units, name="projection", dtype=self.dtype_policy
            )

    def build(self, input_shape):
        if self.projection is not None and not self.projection.built:
            self.projection.build(input_shape)

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        if self.projection is not None:
            x = self.projection(x)
        return _convert(self, self._random_variable(x))

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "convert_to_tensor_fn": self.convert_to_tensor_fn,
        }


@register
class Normal(_Scale, LocalLosses, _OutputLayer):
    """`N(loc, scale)`: `loc = x` with a trainable per-feature scale, or (with `units`)
    `loc, raw = split(Dense(2 units)(x))`, `scale = scale_floor + softplus(scale_multiplier *
    raw)` (by default `1e-5 + softplus(raw)`).

    `prior='standard_normal'` makes it a VAE latent layer: `mean_batch sum_dims KL[q || N(0,
    1)]` joins `layer.losses` as a local (per-example) loss, the ELBO's latent term.

    Args:
      units: output elements (a `Dense(2 units)` projection gives locations and raw scales);
        None: the input is the location, with a trainable per-feature scale.
      prior: None, or `'standard_normal'` for a VAE latent.
      scale_floor: the smallest scale, added to the softplus (default 1e-5; 1e-3 for
        unstandardized targets, as TFP's tutorials).
      scale_multiplier: multiplies the raw scale inside the softplus (default 1; 0.05 as TFP's
        tutorials for raw, unscaled inputs).
      seed: seeds the output's draw.
      **kwargs: `keras.layers.Layer` arguments.
    """

    parameters_per_unit = 2

    def __init__(
        self, units=None, prior=None, scale_floor=_MIN_SCALE, scale_multiplier=1.0, **kwargs
    ):
        super().__init__(units=units, **kwargs)
        if prior not in (None, "standard_normal"):
            raise ValueError(f"Normal: prior must be None or 'standard_normal', got {prior!r}.")
        self.prior = prior
        self._init_scale(scale_floor, scale_multiplier)

    def call(self, inputs):
        rv = super().call(inputs)
        if self.prior is not None:
            kl = tfd.kl_divergence(rv.distribution, tfd.Normal(tf.zeros([], rv.dtype), 1.0))
            kl = tf.reduce_sum(kl, axis=list(range(1, kl.shape.rank))) if kl.shape.rank > 1 else kl
            self.add_loss(tf.reduce_mean(kl))
        return rv

    def get_config(self):
        return {**super().get_config(), "prior": self.prior, **self._scale_config()}

    def build(self, input_shape):
        super().build(input_shape)
        if self.units is None:
            self.raw_scale = self.add_weight(
                name="scale", shape=(input_shape[-1],), initializer="zeros"
            )

    def _random_variable(self, x):
        if self.units is None:
            scale = self._scale(self.raw_scale) + tf.zeros_like(x)
            loc = x
        else:
            loc, raw = tf.split(x, 2, axis=-1)
            scale = self._scale(raw)
        return rv_lib.Normal(loc=loc, scale=scale, seed=self.next_seed(), name=self.output_name)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units or input_shape[-1],)


@register
class Bernoulli(_OutputLayer):
    """`Bernoulli(logits = x)` (or `Dense(units)(x)`); values are float 0/1."""

    def _random_variable(self, x):
        return rv_lib.Bernoulli(
            logits=x, dtype=x.dtype, seed=self.next_seed(), name=self.output_name
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units or input_shape[-1],)


@register
class Poisson(_OutputLayer):
    """`Poisson(log_rate = x)` (or `Dense(units)(x)`)."""

    def _random_variable(self, x):
        return rv_lib.Poisson(log_rate=x, seed=self.next_seed(), name=self.output_name)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units or input_shape[-1],)


@register
class Categorical(_OutputLayer):
    """`Categorical(logits = x)` over the last axis (or `Dense(units)(x)`, `units` classes);
    the output drops that axis."""

    def _random_variable(self, x):
        return rv_lib.Categorical(logits=x, seed=self.next_seed(), name=self.output_name)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1])


class _Mixture(_Scale, _OutputLayer):
    component = None

    def __init__(
        self, units=None, num_components=5, scale_floor=_MIN_SCALE, scale_multiplier=1.0, **kwargs
    ):
        if not isinstance(num_components, int) or num_components <= 0:
            raise ValueError(
                f"{type(self).__name__}: num_components must be a positive int, got "
                f"{num_components!r}."
            )
        self.num_components = int(num_components)
        self.parameters_per_unit = 3 * self.num_components
        super().__init__(units=units, **kwargs)
        self._init_scale(scale_floor, scale_multiplier)

    def _random_variable(self, x):
        k = self.num_components
        if self.units is not None:
            x = tf.reshape(x, tf.concat([tf.shape(x)[:-1], [self.units, 3 * k]], 0))
        elif x.shape[-1] != 3 * k:
            raise ValueError(
                f"{type(self).__name__}({k}) without units needs 3 * {k} = {3 * k} "
                f"inputs on the last axis, got {x.shape[-1]}."
            )
        logits, loc, raw_scale = tf.split(x, 3, axis=-1)
        scale = self._scale(raw_scale)
        return rv_lib.MixtureSameFamily(
            mixture_distribution=tfd.Categorical(logits=logits),
            components_distribution=self.component(loc=loc, scale=scale),
            seed=self.next_seed(),
            name=self.output_name,
        )

    def compute_output_shape(self, input_shape):
        if self.units is not None:
            return tuple(input_shape[:-1]) + (self.units,)
        return tuple(input_shape[:-1])

    def get_config(self):
        return {
            **super().get_config(),
            "num_components": self.num_components,
            **self._scale_config(),
        }


@register
class MixtureLogistic(_Mixture):
    """Mixture of `num_components` logistics per output element (PixelCNN++'s likelihood).

    Args:
      units: output elements (the paper's Figure 6: `MixtureLogistic(3, num_components=5)`, one
        mixture per RGB channel), projected by a trainable `Dense(3 * num_components * units)`;
        None reads the `3 * num_components` mixture parameters (logits, locations, raw scales)
        from the input's last axis.
      num_components: mixture components per element.
      scale_floor, scale_multiplier: `scale = scale_floor + softplus(scale_multiplier * raw)`
        (defaults 1e-5 and 1).
    """

    component = tfd.Logistic


@register
class MixtureNormal(_Mixture):
    """Mixture of `num_components` Normals per output element (a mixture density network).

    Args:
      units: output elements, projected by a trainable `Dense(3 * num_components * units)`;
        None reads the mixture parameters from the input's last axis.
      num_components: mixture components per element.
      scale_floor, scale_multiplier: `scale = scale_floor + softplus(scale_multiplier * raw)`
        (defaults 1e-5 and 1).
    """

    component = tfd.Normal


@register
class Discretize(NamedOutput, keras.layers.Layer):
    """Discretizes a continuous random variable onto the integers `low..high`.

    `P(k) = F(k + 1/2) - F(k - 1/2)` inside, `P(low) = F(low + 1/2)` and
    `P(high) = 1 - F(high - 1/2)` at the edges, evaluated in log space by TFP's
    `QuantizedDistribution`: from log-CDFs left of the median and log-survival functions right
    of it, so both tails are stable. A mixture (`MixtureLogistic`) is discretized component by
    component and mixed afterwards, because a mixture's survival function is `1 - CDF`, which
    rounds to 0 in the upper tail (`log_prob = nan` at 200 for locations near 100).

    Args:
      low, high: the integer range (0 and 255 for 8-bit pixels).
      output_name: name of the returned random variable (default: the layer's name).
    """

    def __init__(self, low=0, high=255, **kwargs):
        super().__init__(**kwargs)
        self.low, self.high = float(low), float(high)

    def call(self, inputs):
        if not isinstance(inputs, RandomVariable):
            raise TypeError(
                "Discretize takes a RandomVariable (e.g. MixtureLogistic's output), "
                f"got {type(inputs).__name__}."
            )
        distribution = inputs.distribution
        if isinstance(distribution, tfd.MixtureSameFamily):
            return rv_lib.MixtureSameFamily(
                mixture_distribution=distribution.mixture_distribution,
                components_distribution=self._quantize(distribution.components_distribution),
                name=self.output_name,
            )
        return self._quantize(distribution, constructor=rv_lib.QuantizedDistribution)

    def _quantize(self, distribution, constructor=tfd.QuantizedDistribution):
        shifted = tfd.TransformedDistribution(
            distribution, tfb.Shift(tf.constant(-0.5, distribution.dtype))
        )
        kwargs = {"name": self.output_name} if constructor is not tfd.QuantizedDistribution else {}
        return constructor(shifted, low=self.low, high=self.high, **kwargs)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "low": self.low, "high": self.high}


@register
class DistributionLambda(SeededLayer):
    """Any distribution made from the input by a function: `make_distribution_fn(x) ->
    tfd.Distribution`, returned as a `RandomVariable` (the counterpart of
    `tfp.layers.DistributionLambda`, e.g. TFP's regression tutorial's
    `lambda t: tfd.Normal(loc=t[..., :1], scale=1e-3 + tf.math.softplus(0.05 * t[..., 1:]))`).

    Args:
      make_distribution_fn: `fn(x) -> tfd.Distribution`; saved as a Keras-serializable function
        (a `lambda` needs `safe_mode=False` to load, as Keras' own `Lambda` layer).
      convert_to_tensor_fn: `'sample'` (default), `'mean'` or `'mode'`, as the other stochastic
        output layers.
      seed: seeds the output's draw.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, make_distribution_fn, convert_to_tensor_fn="sample", **kwargs):
        super().__init__(**kwargs)
        if isinstance(make_distribution_fn, dict):
            make_distribution_fn = keras.saving.deserialize_keras_object(make_distribution_fn)
        if not callable(make_distribution_fn):
            raise TypeError(
                f"DistributionLambda ({self.name}): make_distribution_fn must be callable, got "
                f"{make_distribution_fn!r}."
            )
        self.make_distribution_fn = make_distribution_fn
        self.convert_to_tensor_fn = _check_conversion(self, convert_to_tensor_fn)

    def call(self, inputs):
        distribution = self.make_distribution_fn(inputs)
        if not isinstance(distribution, tfd.Distribution):
            raise TypeError(
                f"DistributionLambda ({self.name}): make_distribution_fn returned "
                f"{type(distribution).__name__}, not a tfp.distributions.Distribution."
            )
        return _convert(self, RandomVariable(distribution, seed=self.next_seed()))

    def compute_output_spec(self, inputs):
        # The function runs once on a zero batch of one: its distribution's shape, with the
        # input's batch dimension.
        example = tf.zeros([1 if d is None else d for d in inputs.shape], inputs.dtype)
        distribution = self.make_distribution_fn(example)
        shape = distribution.batch_shape.concatenate(distribution.event_shape).as_list()
        if shape and inputs.shape[0] is None:
            shape[0] = None
        return keras.KerasTensor(shape, distribution.dtype.name)

    def get_config(self):
        return {
            **super().get_config(),
            "make_distribution_fn": keras.saving.serialize_keras_object(self.make_distribution_fn),
            "convert_to_tensor_fn": self.convert_to_tensor_fn,
        }
