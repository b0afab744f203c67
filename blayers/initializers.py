"""Distribution initializers: Keras layers whose variables parameterize a weight's distribution.

Bayesian Layers (Tran et al., 2019, Sec. 2.1) overload `kernel_initializer`: an initializer is
a callable taking the weight's shape and returning a *distribution over the weight*. Here each
trainable initializer is a `keras.layers.Layer`:

* `init(shape, dtype)` builds the variables on first use (shape `shape`), then returns a new
  `RandomVariable` over `Independent(dist, reinterpreted_batch_ndims=len(shape))` every call;
* the variables are ordinary Keras weights of the layer that owns the initializer, so they train,
  save and load with it.

Defaults (all documented below) follow Blundell et al. (2015) and Edward2: means start small,
standard deviations are `softplus` of an unconstrained variable initialized so that the initial
stddev lies between 1e-3 and 5e-2 (uniform in the unconstrained space, i.e. `rho ~ U(-6.907,
-2.971)`): narrow enough that the network starts near its mean, wide enough to learn.

`get(identifier)` accepts these names (snake_case, as in gin), CamelCase class names, Keras
initializer names (deterministic weights), dicts from `serialize`, and instances.
"""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import constraints as constraints_lib
from blayers import distributions as rv_lib
from blayers import fused, regularizers, sampling, seeds
from blayers.random_variable import RandomVariable
from blayers.registry import ArgsDoc, Registry
from blayers.replicas import ReplicaInitializer

tfd = tfp.distributions

__all__ = [
    "RHO_RANGE",
    "NormalPrior",
    "OrthogonalRandomFeatures",
    "RandomSign",
    "TrainableDeterministic",
    "TrainableGlorotNormal",
    "TrainableHalfCauchy",
    "TrainableHeNormal",
    "TrainableInitializer",
    "TrainableLogNormal",
    "TrainableMixtureOfDeltas",
    "TrainableMultivariateNormal",
    "TrainableNormal",
    "TrainableNormalFixedStddev",
    "TrainableNormalSharedStddev",
    "deserialize",
    "get",
    "independent_draws",
    "is_distribution_initializer",
    "serialize",
]

# softplus^{-1}(1e-3) and softplus^{-1}(5e-2): the initial stddev range of the Normal family.
_RHO_MIN = float(constraints_lib.softplus_inverse(1e-3))
_RHO_MAX = float(constraints_lib.softplus_inverse(5e-2))
RHO_RANGE = (_RHO_MIN, _RHO_MAX)  # the unconstrained range of the Normal family's initial stddev
_REGISTRY = Registry(
    "initializer",
    "blayers.initializers",
    keras.initializers.get,
    "'glorot_uniform', 'he_normal', 'zeros'",
)
_register = _REGISTRY.register


def _default_stddev_initializer():
    return keras.initializers.RandomUniform(minval=_RHO_MIN, maxval=_RHO_MAX)


class _Parameter:
    """(initializer, regularizer, constraint) of one distribution parameter."""

    def __init__(self, initializer, regularizer, constraint):
        self.initializer = keras.initializers.get(initializer)
        self.regularizer = regularizers.get(regularizer)
        self.constraint = constraints_lib.get(constraint)

    def config(self, name):
        return {
            f"{name}_initializer": _REGISTRY.serialize(self.initializer),
            f"{name}_regularizer": _REGISTRY.serialize(self.regularizer),
            f"{name}_constraint": _REGISTRY.serialize(self.constraint),
        }


class TrainableInitializer(ArgsDoc, keras.layers.Layer):
    """Base class: a layer holding the variational parameters of one weight.

    Subclasses declare their parameters with `_parameter(name, ...)` in `__init__`, and implement
    `_distribution(params, shape)` returning the elementwise distribution (batch shape `shape`)
    from the constrained parameter tensors. Everything else (building, shape checks, the random
    variable, seeds, config) lives here once.

    A replicated layer (`blayers.replicas`) sets `replica_seeds` before building it: the weight's
    shape then leads with the replica axis, each parameter's replica slices are initialized as
    one replica's with its own seed, and a draw's replica slices depend on their own keys.

    Args:
      seed: seeds the weight's draws (their stateless seeds come from this initializer's own
        `SeedGenerator`, saved with the model).
      **kwargs: `keras.layers.Layer` arguments.
    """

    replica_seeds = None  # set by a replicated layer before `build`

    def __init__(self, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.seed = seed
        self._parameters = {}
        self._param_shapes = {}
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.weight_shape = None

    def _parameter(self, name, initializer, regularizer, constraint, shape_fn=None):
        self._parameters[name] = _Parameter(initializer, regularizer, constraint)
        self._param_shapes[name] = shape_fn

    def build(self, input_shape):
        """Creates the parameter variables for a weight of shape `input_shape`."""
        shape = tuple(int(d) for d in input_shape)
        self.weight_shape = shape
        replicas = self.replica_seeds
        one = shape[1:] if replicas is not None else shape  # one replica's weight
        for name, param in self._parameters.items():
            shape_fn = self._param_shapes[name]
            param_shape = tuple(shape_fn(one) if shape_fn else one)
            initializer = param.initializer
            if replicas is not None:
                param_shape = (len(replicas), *param_shape)
                initializer = ReplicaInitializer(initializer, replicas)
            variable = self.add_weight(
                name=name,
                shape=param_shape,
                initializer=initializer,
                regularizer=param.regularizer,
            )
            setattr(self, name, variable)
        self.built = True

    def __call__(self, shape, dtype=None):
        shape = tuple(int(d) for d in shape)
        if not self.built:
            self.build(shape)
        elif shape != self.weight_shape:
            raise ValueError(
                f"Initializer {self.name!r} holds the variables of a weight of shape "
                f"{self.weight_shape} and cannot serve shape {shape}: pass a new instance (or a "
                "name) to each layer."
            )
        return self.random_variable()

    def parameters(self, with_variance=False):
        """The distribution's parameters: variables passed through their constraints. With
        `with_variance`, for a weight whose layer reads the variance (`variance_wanted`), also
        `'variance'`, formed with the stddev in one pass."""
        out = {}
        for name, param in self._parameters.items():
            value = getattr(self, name)
            if (
                with_variance
                and name == "stddev"
                and self.variance_wanted
                and hasattr(param.constraint, "with_square")
            ):
                out["stddev"], out["variance"] = param.constraint.with_square(value)
                continue
            out[name] = param.constraint(value) if param.constraint else tf.identity(value)
        return out

    def _draw_parameters(self):
        """The parameters a draw's distribution is formed from (with the variance where the
        layer reads it)."""
        return self.parameters(with_variance=True)

    # Set by a layer whose estimator reads the weight's variance (`add_bayesian_weight`).
    variance_wanted = False
    # `(mean, stddev)` of the Normal prior whose KL the layer adds for this weight, set by the
    # layer before each draw (`BayesianLayer.call_weights`): a trainable Normal then forms its
    # parameters and that KL together. None: each on its own.
    kl_prior = None

    @property
    def replica_keys(self):
        """The replicas' keys of the weight's draws (None: not replicated); computed once."""
        if self.replica_seeds is None:
            return None
        if getattr(self, "_replica_keys", None) is None:
            self._replica_keys = sampling.replica_keys(self.replica_seeds)
        return self._replica_keys

    def random_variable(self):
        """A fresh `RandomVariable` over the weight (value drawn lazily, on first use)."""
        distribution = self._distribution(self._draw_parameters(), self.weight_shape)
        return rv_lib.Independent(
            distribution,
            reinterpreted_batch_ndims=len(self.weight_shape),
            seed=seeds.next_seed(self.seed_generator),
            name=getattr(self, "variable_name", None) or self.name,
            replica_keys=self.replica_keys,
        )

    def redraw(self, rv):
        """`rv`, one draw of this initializer, formed again from the variables' current values:
        the same value (its seed, or the value an interceptor gave it) with parameters computed
        now, so a gradient tape opened after the draw still reaches the variables (a recurrent
        cell draws at `get_initial_state` and forms its weights at every step). Interceptors
        saw the first construction and are not consulted again."""
        distribution = tfd.Independent(
            self._distribution(self._draw_parameters(), self.weight_shape),
            reinterpreted_batch_ndims=len(self.weight_shape),
            name=rv.distribution.name,
        )
        value = rv.value if rv.value_given else None
        return RandomVariable(distribution, value=value, seed=rv.seed, replica_keys=rv.replica_keys)

    def _distribution(self, params, shape):
        raise NotImplementedError  # abstract; intentional

    def get_build_config(self):
        # Built by the owning layer's `build`, inside its name scope, so the variables' paths
        # (`dense_flipout/kernel/mean`) are the same after `keras.models.load_model`.
        return None

    def get_config(self):
        config = super().get_config()
        config.pop("trainable", None)
        config.pop("dtype", None)
        config["seed"] = self.seed
        for name, param in self._parameters.items():
            config.update(param.config(name))
        return config


@_register("trainable_normal")
class TrainableNormal(TrainableInitializer):
    """Trainable mean-field Normal: `w ~ N(mean, softplus(rho)^2)` elementwise.

    Defaults: `mean ~ TruncatedNormal(stddev=1e-5)` (tiny, so the initial network is dominated by
    its prior-like noise, as in Edward2), `rho ~ U(-6.907, -2.971)` so that the initial stddev
    lies in [1e-3, 5e-2].
    """

    _args_doc = """    Args:
      mean_initializer: Keras initializer of the mean (default as described above).
      stddev_initializer: Keras initializer of the unconstrained stddev parameter `rho`.
      mean_regularizer, stddev_regularizer: Keras regularizers of those variables.
      mean_constraint: applied to the mean at each use (default None).
      stddev_constraint: maps `rho` to the stddev at each use (default `'softplus'`).
      seed: seeds the weight's draws.
      **kwargs: `keras.layers.Layer` arguments.
"""

    _mean_default = staticmethod(lambda: keras.initializers.TruncatedNormal(stddev=1e-5))

    def __init__(
        self,
        mean_initializer=None,
        stddev_initializer=None,
        mean_regularizer=None,
        stddev_regularizer=None,
        mean_constraint=None,
        stddev_constraint="softplus",
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        self._parameter(
            "mean", mean_initializer or self._mean_default(), mean_regularizer, mean_constraint
        )
        self._parameter(
            "stddev",
            stddev_initializer or _default_stddev_initializer(),
            stddev_regularizer,
            stddev_constraint,
            self._stddev_shape,
        )

    _stddev_shape = None

    def _draw_parameters(self):
        params = self._parameters_with_kl()
        return params if params is not None else super()._draw_parameters()

    def _parameters_with_kl(self):
        """The parameters and their KL against `kl_prior` in one fused pass each way
        (`fused.normal_posterior_and_kl`), or None where that does not apply: no prior set, a
        constrained mean, a stddev map other than softplus, a subclass's own distribution, or
        parameters that are not large float32 tensors of the weight's shape."""
        prior = self.kl_prior
        mean_param, stddev_param = self._parameters["mean"], self._parameters["stddev"]
        if (
            prior is None
            or mean_param.constraint is not None
            or type(stddev_param.constraint) is not constraints_lib.Softplus
            or type(self)._distribution is not TrainableNormal._distribution
        ):
            return None
        loc, rho = tf.convert_to_tensor(self.mean), tf.convert_to_tensor(self.stddev)
        if loc.shape != rho.shape or not fused.should_fuse(loc.shape, loc.dtype):
            return None
        square = self.variance_wanted
        loc, out, kl = fused.normal_posterior_and_kl(loc, rho, *prior, square=square)
        if square:
            # The stddev apart: a traced step that reads only the variance prunes it.
            params = {"mean": loc, "stddev": fused.softplus(rho), "variance": out}
        else:
            params = {"mean": loc, "stddev": out}
        params["kl"] = (prior, kl)
        return params

    def _distribution(self, params, shape):
        distribution = tfd.Normal(loc=params["mean"], scale=params["stddev"])
        if "variance" in params:  # `sampling.normal_variance` reads it
            distribution.blayers_variance = params["variance"]
        if "kl" in params:  # `sampling.attached_normal_kl` reads it
            distribution.blayers_kl = params["kl"]
        return distribution


@_register("trainable_he_normal")
class TrainableHeNormal(TrainableNormal):
    """Trainable Normal whose mean starts He-normal (`sqrt(2 / fan_in)`, for ReLU nets)."""

    _mean_default = staticmethod(keras.initializers.HeNormal)


@_register("trainable_glorot_normal")
class TrainableGlorotNormal(TrainableNormal):
    """Trainable Normal whose mean starts Glorot-normal (`sqrt(2 / (fan_in + fan_out))`)."""

    _mean_default = staticmethod(keras.initializers.GlorotNormal)


@_register("trainable_normal_shared_stddev")
class TrainableNormalSharedStddev(TrainableNormal):
    """Trainable Normal with one scalar stddev shared by all entries of the weight."""

    _stddev_shape = staticmethod(lambda shape: ())


@_register("trainable_normal_fixed_stddev")
class TrainableNormalFixedStddev(TrainableInitializer):
    """Normal with a trainable mean and a fixed, non-trainable stddev (default 1e-2).

    Args:
      stddev: the fixed standard deviation (positive).
      mean_initializer: Keras initializer of the mean (default TruncatedNormal(stddev=1e-5)).
      mean_regularizer: Keras regularizer of the mean.
      mean_constraint: applied to the mean at each use.
      seed: seeds the weight's draws.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        stddev=1e-2,
        mean_initializer=None,
        mean_regularizer=None,
        mean_constraint=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        if not stddev > 0:
            raise ValueError(f"TrainableNormalFixedStddev needs stddev > 0, got {stddev}.")
        self.stddev = float(stddev)
        self._parameter(
            "mean",
            mean_initializer or TrainableNormal._mean_default(),
            mean_regularizer,
            mean_constraint,
        )

    def _distribution(self, params, shape):
        return tfd.Normal(loc=params["mean"], scale=tf.cast(self.stddev, params["mean"].dtype))

    def get_config(self):
        return {**super().get_config(), "stddev": self.stddev}


@_register("trainable_multivariate_normal")
class TrainableMultivariateNormal(TrainableInitializer):
    """Trainable full-covariance Normal over all of a weight's `p` entries, for small layers:
    `vec(w) ~ N(vec(mean), L L^T)` with `L` lower-triangular, `diag(L) = softplus(rho)` and the
    strictly lower part free (`p (p + 1) / 2` scale parameters; `p` at most `max_entries`).

    It starts mean-field (off-diagonal zero, `rho` as `trainable_normal`'s). The weight's
    distribution is a `MultivariateNormalTriL` reshaped to the weight; `normal_kl_divergence`
    takes its KL analytically. The reparameterization and Flipout estimators draw from it
    exactly (Flipout's sign flips keep a draw valid, the distribution being symmetric about its
    mean); local reparameterization, exact only for a factorized q, refuses it.

    Args:
      mean_initializer: Keras initializer of the mean (default TruncatedNormal(stddev=1e-5)).
      stddev_initializer: Keras initializer of `rho`, the unconstrained diagonal of `L`.
      off_diagonal_initializer: Keras initializer of `L`'s strictly lower part (default zeros).
      max_entries: the largest weight it accepts (its covariance has `p^2` entries).
      seed: seeds the weight's draws.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        mean_initializer=None,
        stddev_initializer=None,
        off_diagonal_initializer="zeros",
        max_entries=4096,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        self.max_entries = int(max_entries)
        self._parameter("mean", mean_initializer or TrainableNormal._mean_default(), None, None)
        self._parameter(
            "stddev",
            stddev_initializer or _default_stddev_initializer(),
            None,
            "softplus",
            lambda shape: (int(np.prod(shape)),),
        )
        self._parameter(
            "off_diagonal",
            off_diagonal_initializer,
            None,
            None,
            lambda shape: (int(np.prod(shape)),) * 2,
        )

    def build(self, input_shape):
        if self.replica_seeds is not None:
            raise ValueError(
                "trainable_multivariate_normal has no replica axis (its covariance would mix "
                "replicas); replicated layers take a mean-field initializer such as "
                "'trainable_normal'."
            )
        size = int(np.prod(input_shape))
        if size > self.max_entries:
            raise ValueError(
                f"trainable_multivariate_normal: a weight of shape {tuple(input_shape)} has "
                f"{size} entries, more than max_entries={self.max_entries} (its covariance "
                f"would have {size**2} parameters); use it for small layers."
            )
        super().build(input_shape)

    def _full_distribution(self, params):
        scale_tril = tf.linalg.set_diag(
            tf.linalg.band_part(params["off_diagonal"], -1, 0), params["stddev"]
        )
        return (
            tfd.MultivariateNormalTriL(tf.reshape(params["mean"], [-1]), scale_tril),
            tfp.bijectors.Reshape(self.weight_shape, event_shape_in=[scale_tril.shape[-1]]),
        )

    def random_variable(self):
        distribution, reshape = self._full_distribution(self.parameters())
        return rv_lib.TransformedDistribution(
            distribution,
            reshape,
            seed=seeds.next_seed(self.seed_generator),
            name=getattr(self, "variable_name", None) or self.name,
        )

    def redraw(self, rv):
        distribution, reshape = self._full_distribution(self.parameters())
        distribution = tfd.TransformedDistribution(distribution, reshape, name=rv.distribution.name)
        value = rv.value if rv.value_given else None
        return RandomVariable(distribution, value=value, seed=rv.seed)

    def get_config(self):
        config = super().get_config()
        for name in ("mean", "stddev", "off_diagonal"):  # fixed here, not arguments
            config.pop(f"{name}_regularizer")
            config.pop(f"{name}_constraint")
        return {**config, "max_entries": self.max_entries}


@_register("trainable_log_normal")
class TrainableLogNormal(TrainableInitializer):
    """Trainable LogNormal for positive weights: `log w ~ N(loc, softplus(rho)^2)`."""

    _args_doc = """    Args:
      loc_initializer: Keras initializer of `loc` (default TruncatedNormal(stddev=1e-5)).
      scale_initializer: Keras initializer of the unconstrained scale `rho`.
      loc_regularizer, scale_regularizer: Keras regularizers of those variables.
      loc_constraint: applied to `loc` at each use (default None).
      scale_constraint: maps `rho` to the scale at each use (default `'softplus'`).
      seed: seeds the weight's draws.
      **kwargs: `keras.layers.Layer` arguments.
"""

    def __init__(
        self,
        loc_initializer=None,
        scale_initializer=None,
        loc_regularizer=None,
        scale_regularizer=None,
        loc_constraint=None,
        scale_constraint="softplus",
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        self._parameter(
            "loc",
            loc_initializer or keras.initializers.TruncatedNormal(stddev=1e-5),
            loc_regularizer,
            loc_constraint,
        )
        self._parameter(
            "scale",
            scale_initializer or _default_stddev_initializer(),
            scale_regularizer,
            scale_constraint,
        )

    def _distribution(self, params, shape):
        return tfd.LogNormal(loc=params["loc"], scale=params["scale"])


@_register("trainable_half_cauchy")
class TrainableHalfCauchy(TrainableLogNormal):
    """Trainable HalfCauchy(loc, softplus(rho)): heavy-tailed positive weights (horseshoe)."""

    def _distribution(self, params, shape):
        return tfd.HalfCauchy(loc=params["loc"], scale=params["scale"])


@_register("trainable_deterministic")
class TrainableDeterministic(TrainableInitializer):
    """Point mass at a trainable `loc` (default Glorot-uniform). KL regularizers then reduce to
    the negative log prior, i.e. MAP estimation.

    Args:
      loc_initializer: Keras initializer of `loc` (default `'glorot_uniform'`).
      loc_regularizer: Keras regularizer of `loc`.
      loc_constraint: applied to `loc` at each use.
      seed: unused by a point mass; kept for a uniform signature.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        loc_initializer="glorot_uniform",
        loc_regularizer=None,
        loc_constraint=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        self._parameter("loc", loc_initializer, loc_regularizer, loc_constraint)

    def _distribution(self, params, shape):
        return tfd.Deterministic(loc=params["loc"])


@_register("normal_prior")
class NormalPrior(TrainableInitializer):
    """The prior itself, `w ~ N(mean, stddev^2)` elementwise, with nothing to train.

    The paper's function prior with Bayesian neural-net layers (Tran et al., 2019, Sec. 2.5,
    footnote 6): "set the initializer to return the desired weight prior and remove the default
    regularizer". `DenseReparameterization(units, kernel_initializer=NormalPrior(name='w'),
    kernel_regularizer=None)` in a model program draws functions from the prior, and
    `blayers.programs.make_log_joint` counts `log p(w)` under the name `'w'`.

    Args:
      mean, stddev: the Normal's parameters (stddev positive).
      seed: seeds the weight's draws.
      **kwargs: `keras.layers.Layer` arguments (`name`: the weight variable's name).
    """

    def __init__(self, mean=0.0, stddev=1.0, seed=None, **kwargs):
        super().__init__(seed=seed, **kwargs)
        if not stddev > 0:
            raise ValueError(f"NormalPrior needs stddev > 0, got {stddev}.")
        self.mean, self.stddev = float(mean), float(stddev)

    def _distribution(self, params, shape):
        del params
        return tfd.Normal(
            loc=tf.fill(shape, tf.constant(self.mean, self.compute_dtype)),
            scale=tf.constant(self.stddev, self.compute_dtype),
        )

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "stddev": self.stddev}


@_register("trainable_mixture_of_deltas")
class TrainableMixtureOfDeltas(TrainableInitializer):
    """A mixture of `num_components` point masses with trainable locations and mixture logits,
    elementwise: `w ~ sum_k pi_k delta(loc_k)`. Each draw picks one component per entry (not
    reparameterizable in the choice: the gradient reaches the selected locations, the mixture
    weights learn through the KL's score). With `num_components` members it is an ensemble of
    point estimates as a distribution (edward2's `TrainableMixtureOfDeltas`).

    Args:
      num_components: point masses per entry.
      loc_initializer: Keras initializer of the locations `[*shape, num_components]`
        (default Glorot-uniform per component, so components differ).
      logits_initializer: of the mixture logits (default zeros: uniform weights).
      loc_regularizer, loc_constraint: of the locations.
      seed: seeds the component choices.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        num_components=5,
        loc_initializer="glorot_uniform",
        logits_initializer="zeros",
        loc_regularizer=None,
        loc_constraint=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        if not isinstance(num_components, int) or num_components < 1:
            raise ValueError(
                f"TrainableMixtureOfDeltas needs a positive integer num_components, got "
                f"{num_components!r}."
            )
        self.num_components = num_components
        component_shape = staticmethod(lambda shape: (*shape, num_components)).__func__
        self._parameter(
            "loc", _PerComponent(loc_initializer), loc_regularizer, loc_constraint, component_shape
        )
        self._parameter("logits", logits_initializer, None, None, component_shape)

    def _distribution(self, params, shape):
        # Trained as logits; the mixture reads its weights as `probs` (edward2's).
        return tfd.MixtureSameFamily(
            tfd.Categorical(probs=tf.nn.softmax(params["logits"], axis=-1)),
            tfd.Deterministic(loc=params["loc"]),
        )

    def get_config(self):
        config = super().get_config()
        config["num_components"] = self.num_components
        config["loc_initializer"] = _REGISTRY.serialize(self._parameters["loc"].initializer.base)
        # The logits take no regularizer or constraint arguments.
        config.pop("logits_regularizer", None)
        config.pop("logits_constraint", None)
        return config


def independent_draws(initializer, shape, count, dtype=None):
    """`count` independent draws of a Keras `initializer` of `shape` (ensemble members, mixture
    components, experts). Keras' unseeded initializers repeat their values call after call, so
    each draw gets its own seed (consecutive from the initializer's, or a random one)."""
    config = initializer.get_config()
    if "seed" not in config:
        return [initializer(shape, dtype) for _ in range(count)]
    base = config["seed"] if config["seed"] is not None else np.random.randint(2**30)
    cls = type(initializer)
    return [cls.from_config({**config, "seed": base + k})(shape, dtype) for k in range(count)]


class _PerComponent(keras.initializers.Initializer):
    """Initializes `[*shape, K]` as K independent draws of a Keras initializer of `shape` (so a
    fan-based initializer sees the weight's fans, not the component axis)."""

    def __init__(self, base):
        self.base = keras.initializers.get(base)

    def __call__(self, shape, dtype=None):
        return tf.stack(independent_draws(self.base, shape[:-1], shape[-1], dtype), axis=-1)


@_register("random_sign")
class RandomSign(keras.initializers.Initializer):
    """Deterministic initializer: entries `+1` with probability `probs`, else `-1` (the random
    sign initialization of BatchEnsemble and rank-1 factors, Wen et al. 2020; Dusenberry et al.
    2020).

    Args:
      probs: probability of `+1`.
      seed: seeds the signs.
    """

    def __init__(self, probs=0.5, seed=None):
        if not 0.0 <= probs <= 1.0:
            raise ValueError(f"random_sign needs 0 <= probs <= 1, got {probs}.")
        self.probs, self.seed = float(probs), seed
        self._generator = keras.random.SeedGenerator(seed)

    def __call__(self, shape, dtype=None):
        dtype = dtype or "float32"
        u = keras.random.uniform(shape, seed=self._generator, dtype=dtype)
        return tf.where(u < self.probs, tf.ones_like(u), -tf.ones_like(u))

    def get_config(self):
        return {"probs": self.probs, "seed": self.seed}


@_register("orthogonal_random_features")
class OrthogonalRandomFeatures(keras.initializers.Initializer):
    """Orthogonal random features (Yu et al., 2016): a `[d, D]` projection whose columns come
    in blocks of `d` orthogonal directions, each column rescaled by an independent chi(d) norm,
    so columns are marginally `N(0, stddev^2 I)` (the RBF kernel's spectral density) but within
    a block exactly orthogonal, which lowers the variance of the kernel approximation
    `phi(x)^T phi(y)` compared with i.i.d. Gaussian features.

    Args:
      stddev: the marginal standard deviation of the entries (1 / length scale).
      random_norm: the columns' norms are chi(d) draws (Yu et al.'s Theorem 1); False: all
        `sqrt(d)`, their mean square (Theorem 2).
      seed: seeds the directions and norms.
    """

    def __init__(self, stddev=1.0, random_norm=True, seed=None):
        if not stddev > 0:
            raise ValueError(f"orthogonal_random_features needs stddev > 0, got {stddev}.")
        self.stddev, self.random_norm, self.seed = float(stddev), bool(random_norm), seed

    def __call__(self, shape, dtype=None):
        if len(shape) != 2:
            raise ValueError(
                f"orthogonal_random_features initializes [input_dim, num_features] kernels, got "
                f"shape {shape}."
            )
        d, num = int(shape[0]), int(shape[1])
        rng = np.random.RandomState(self.seed)
        blocks = []
        for _ in range(-(-num // d)):
            q, r = np.linalg.qr(rng.randn(d, d))
            q = q * np.sign(np.diag(r))  # Haar-distributed rotation
            norms = np.sqrt(rng.chisquare(d, size=d) if self.random_norm else np.full(d, d))
            blocks.append(q * norms[None, :])
        matrix = self.stddev * np.concatenate(blocks, axis=1)[:, :num]
        return tf.constant(matrix, dtype=dtype or "float32")

    def get_config(self):
        return {"stddev": self.stddev, "random_norm": self.random_norm, "seed": self.seed}


def is_distribution_initializer(initializer):
    """True if `initializer` returns a distribution over the weight (a `TrainableInitializer`)."""
    return isinstance(initializer, TrainableInitializer)


serialize = _REGISTRY.serialize
deserialize = _REGISTRY.deserialize


def get(identifier):
    """An initializer from None, a name, a config dict, or an instance.

    Names: `trainable_normal`, `trainable_he_normal`, ... (or `TrainableNormal`, ...) give a new
    distribution initializer; any other name is looked up among Keras initializers
    (`'glorot_uniform'`, `'zeros'`), giving a deterministic weight.
    """
    return _REGISTRY.get(identifier)
