"""RandomVariable: a TFP distribution paired with one value, usable as a tensor.

Bayesian Layers (Tran et al., 2019, Sec. 2.1) represent weights, activations and outputs as
random variables: "Tensors augmented with distribution methods such as `sample` and `log_prob`;
by default, numerical ops operate on its sample Tensor". A `RandomVariable` holds

* `distribution`: a `tfp.distributions.Distribution`;
* `value`: one draw of shape `sample_shape + batch_shape + event_shape`. It is drawn lazily, on
  first use, so that an estimator which never needs the draw (Flipout, local reparameterization,
  deterministic VI) never pays for it.

It is tensor-like: `tf.is_tensor(rv)` is true, `tf.convert_to_tensor(rv)` returns its value, and
TF operators apply to the value. Keras 3 layers therefore accept it as an input, a functional
model can return it, and a loss can read `y_pred.distribution` (Keras passes a tensor-like
`y_pred` of the loss dtype through unchanged).
"""

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import sampling

tfd = tfp.distributions

__all__ = ["RandomVariable", "fixed_at"]


def _can_sample(distribution):
    """Whether the distribution's class implements sampling (TFP's base class does not)."""
    for cls in type(distribution).__mro__:
        if cls is tfd.Distribution:
            return False
        if any(name in vars(cls) for name in ("_sample_n", "_call_sample_n", "sample")):
            return True
    return True  # not a TFP distribution's hierarchy: left to the first draw


class RandomVariable:
    """A distribution and one value of it, behaving like the value in TF and Keras.

    Args:
      distribution: a `tfp.distributions.Distribution`.
      sample_shape: shape of the value's leading sample dimensions (default scalar).
      value: an explicit value. If None, `distribution.sample(sample_shape, seed=seed)` is drawn
        on first access and cached, so every use of the variable sees the same draw.
      seed: optional stateless seed (shape [2] integer tensor) or int for the lazy draw. Layers
        pass one from a `keras.random.SeedGenerator`, which keeps runs reproducible and
        XLA-compatible.
      replica_keys: the keys of a replicated layer's replicas (`blayers.sampling.replica_keys`):
        the leading batch axis is then the replica axis, and replica `r`'s slice of the lazy
        draw depends on `seed` and its own key alone.
    """

    is_tensor_like = True  # tf.is_tensor(rv) -> True; Keras leaves tensor-likes unconverted.

    def __init__(self, distribution, sample_shape=(), value=None, seed=None, replica_keys=None):
        if not isinstance(distribution, tfd.Distribution):
            raise TypeError(
                f"RandomVariable needs a tfp.distributions.Distribution, got {type(distribution)!r}."
            )
        self._distribution = distribution
        self._sample_shape = tf.TensorShape(sample_shape)
        self._seed = seed
        self._replica_keys = replica_keys
        if value is not None:
            value = tf.convert_to_tensor(value, dtype=distribution.dtype)
            expected = self._static_shape()
            if not expected.is_compatible_with(value.shape):
                raise ValueError(
                    f"RandomVariable value of shape {value.shape} does not match sample_shape + "
                    f"batch_shape + event_shape = {expected} of {distribution.name}."
                )
        elif not _can_sample(distribution):
            # Said now, not at the first use of a value that could never be drawn.
            raise NotImplementedError(
                f"RandomVariable: {type(distribution).__name__} ({distribution.name}) has no "
                "sampler; give the variable a value (value=...)."
            )
        self._value = value
        self._value_given = value is not None

    # -- the two halves --------------------------------------------------------------------------
    @property
    def distribution(self):
        """The `tfp.distributions.Distribution` of this random variable."""
        return self._distribution

    @property
    def sample_shape(self):
        """`tf.TensorShape` of the value's leading sample dimensions."""
        return self._sample_shape

    @property
    def has_value(self):
        """True once a value is fixed: given explicitly (e.g. by an interceptor) or already drawn."""
        return self._value is not None

    @property
    def value_given(self):
        """True if the value was given at construction (an interceptor such as `take_mean` or
        `condition` fixed it), False if it is (or will be) a draw from the distribution."""
        return self._value_given

    @property
    def seed(self):
        """The stateless seed of the lazy draw (None: unseeded or a given value)."""
        return self._seed

    @property
    def replica_keys(self):
        """The replicas' keys of the lazy draw (None: not replicated)."""
        return self._replica_keys

    @property
    def value(self):
        """The variable's value; drawn from the distribution on first access, then fixed."""
        if self._value is None:
            self._value = sampling.sample(
                self._distribution, self._sample_shape, self._seed, self._replica_keys
            )
        return self._value

    # -- tensor-like surface -----------------------------------------------------------------------
    def _static_shape(self):
        d = self._distribution
        return self._sample_shape.concatenate(d.batch_shape).concatenate(d.event_shape)

    @property
    def shape(self):
        if self._value is not None:
            return self._value.shape
        return self._static_shape()

    @property
    def dtype(self):
        return tf.as_dtype(self._distribution.dtype)

    @property
    def ndim(self):
        return self.shape.rank

    def get_shape(self):
        return self.shape

    def numpy(self):
        """Value as a NumPy array (eager only)."""
        return self.value.numpy()

    def __array__(self, dtype=None, copy=None):
        array = np.asarray(self.value)
        return array.astype(dtype) if dtype is not None else array

    def sample(self, sample_shape=(), seed=None):
        """A fresh draw from the distribution (does not change `value`)."""
        return self._distribution.sample(sample_shape, seed=seed)

    # -- the distribution's methods (the paper's `predictions.mean()`, `rv.log_prob(x)`,
    # `encoding.kl_divergence(blayers.Normal(0., 1.))`) are forwarded; see _forward below.

    def __repr__(self):
        # The value if drawn (a repr does not draw it): edward2's form.
        value = ""
        if self._value is not None and tf.executing_eagerly():
            array = self._value.numpy()
            text = repr(array) if np.ndim(array) == 0 else np.array2string(array, threshold=8)
            value = f" numpy={text}"
        return (
            f"<blayers.RandomVariable '{self._distribution.name}' shape={self.shape} "
            f"dtype={self.dtype.name}{value}>"
        )

    def __str__(self):
        # edward2's `RandomVariable("value", shape=..., dtype=...)`: printing reads the value.
        value = self.value
        text = np.array2string(value.numpy(), threshold=8) if tf.executing_eagerly() else "?"
        return f'RandomVariable("{text}", shape={self.shape}, dtype={self.dtype.name})'

    # Hashing is by identity (Keras and tf.nest keep layers' outputs in sets and dicts, and two
    # variables with equal values are still two variables). Comparison follows the value where
    # the other side is a value (a number, an array, a tensor): `rv == 0.` is the elementwise
    # tensor `rv.value == 0.`, as for a tensor. Between random variables (or other objects) it
    # is identity, so containers of random variables work.
    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        if _is_value(other):
            return tf.equal(self.value, tf.cast(other, self.dtype))
        return self is other

    def __ne__(self, other):
        if _is_value(other):
            return tf.not_equal(self.value, tf.cast(other, self.dtype))
        return self is not other

    def __bool__(self):
        # As a graph tensor: a random variable's truth is its value's, which Python control flow
        # must not silently read (edward2 raises the same error).
        raise TypeError(
            "Using a blayers.RandomVariable as a Python bool is not allowed: test its value "
            "(bool(rv.value), tf.reduce_any(rv.value)) or use tf.cond."
        )

    def __tf_tracing_type__(self, context):
        """`tf.function` traces once per random variable object: the distribution and value
        are captured by the trace (as edward2 does), so passing another variable retraces."""
        del context
        if tf.executing_eagerly():
            self.value  # noqa: B018 - draw now: a draw inside the trace would leak its tensor
        return _RandomVariableTraceType(self)

    def __float__(self):
        return float(self.value)

    def __int__(self):
        return int(self.value)

    def __len__(self):
        return len(self.value)

    def __iter__(self):
        if not tf.executing_eagerly():
            raise TypeError("Iterating over a symbolic RandomVariable is not allowed; index it.")
        return iter(self.value)

    def __getitem__(self, slices):
        """Slices the value and, where TFP can, the distribution too.

        The distribution is sliced when the variable has no sample dimensions and `slices` touch
        only batch dimensions (TFP's `Distribution.__getitem__`); then a `RandomVariable` comes back.
        Otherwise (event dimensions or sample dimensions sliced) the result is the sliced value, a
        plain tensor, since no TFP distribution describes it.
        """
        value = self.value[slices]
        indices = slices if isinstance(slices, tuple) else (slices,)
        used = sum(1 for i in indices if i is not Ellipsis and i is not None)
        batch_rank = self._distribution.batch_shape.rank
        if self._sample_shape.rank == 0 and batch_rank is not None and used <= batch_rank:
            try:
                distribution = self._distribution[slices]
            except (NotImplementedError, ValueError, TypeError, IndexError, tf.errors.OpError):
                distribution = None
            if (
                distribution is not None
                and distribution.event_shape == self._distribution.event_shape
            ):
                expected = distribution.batch_shape.concatenate(distribution.event_shape)
                if expected.is_compatible_with(value.shape):
                    return RandomVariable(distribution, value=value)
        return value


def _is_value(other):
    return isinstance(other, (int, float, complex, np.ndarray, np.generic)) or (
        tf.is_tensor(other) and not isinstance(other, RandomVariable)
    )


class _RandomVariableTraceType(tf.types.experimental.TraceType):
    """Identity-keyed trace type: one `tf.function` trace per random variable object."""

    def __init__(self, rv):
        self._rv = rv

    def is_subtype_of(self, other):
        return self == other

    def most_specific_common_supertype(self, others):
        return self if all(self == other for other in others) else None

    def placeholder_value(self, placeholder_context):
        del placeholder_context
        return self._rv

    def to_tensors(self, value):
        del value
        return []

    def __eq__(self, other):
        return isinstance(other, _RandomVariableTraceType) and other._rv is self._rv

    def __hash__(self):
        return id(self._rv)

    def __repr__(self):
        return f"RandomVariableTraceType({self._rv!r})"


def fixed_at(rv, statistic="mean"):
    """A random variable over `rv`'s distribution whose value is the distribution's
    `statistic` (`'mean'` or `'mode'`) broadcast to the value's shape. Raises TFP's
    `NotImplementedError` where the distribution has no analytic one."""
    value = tf.cast(getattr(rv.distribution, statistic)(), rv.dtype)
    d = rv.distribution
    if rv.shape.is_fully_defined():
        shape = rv.shape
    else:
        shape = tf.concat(
            [
                tf.constant(rv.sample_shape.as_list(), tf.int32),
                d.batch_shape_tensor(),
                d.event_shape_tensor(),
            ],
            0,
        )
    return RandomVariable(d, sample_shape=rv.sample_shape, value=tf.broadcast_to(value, shape))


def _unwrap(value):
    """A random variable argument stands for its distribution where one is expected (the
    other side of a KL) and for its value elsewhere."""
    return value.distribution if isinstance(value, RandomVariable) else value


def align_value(value, shape, what, dtype=None):
    """`value` fitted to a random variable's `shape` (sample + batch + event) before a density:
    a value of shape `(N,)` for a variable of shape `(N, 1)` (labels without the output's
    trailing axis) is expanded to `(N, 1)`; a value of lower rank that would broadcast the
    variable to a larger shape (`(N,)` against `(M, 1)`, which TFP evaluates as `(M, N)`) is
    refused naming both shapes. Values with leading sample axes, or of the full rank, pass
    as they are.

    Args:
      value: the value (tensor-like).
      shape: the variable's `tf.TensorShape`.
      what: names the caller in the error (`"Normal 'y'.log_prob"`).
      dtype: the variable's dtype (a hint for converting Python and NumPy values).
    """
    value = tf.convert_to_tensor(value, dtype_hint=dtype)
    shape = tf.TensorShape(shape)
    if shape.rank is None or value.shape.rank is None:
        return value
    k, r = value.shape.rank, shape.rank
    if k == 0 or k >= r:
        return value
    tail = shape[k:]
    if value.shape.is_compatible_with(shape[:k]) and all(d == 1 for d in tail):
        return tf.reshape(value, tf.concat([tf.shape(value), tf.ones([r - k], tf.int32)], 0))
    # Aligned from the right, a value axis other than 1 must equal the variable's.
    pairs = zip(value.shape.as_list(), shape[r - k :].as_list())
    if any(v not in (None, 1) and d is not None and v != d for v, d in pairs):
        raise ValueError(
            f"{what}: a value of shape {value.shape.as_list()} does not fit the random "
            f"variable's shape {shape.as_list()}; TFP would broadcast the two into a larger "
            f"array, not one log-density per element. Pass a value of shape {shape.as_list()} "
            "(labels of shape [N] for an output of shape [N, 1]: `y[:, None]`), or call the "
            "`.distribution`'s method to broadcast on purpose."
        )
    return value


_VALUE_METHODS = (
    "log_prob",
    "prob",
    "cdf",
    "log_cdf",
    "survival_function",
    "log_survival_function",
    "quantile",
)


def _forward(name, takes_distribution=False):
    method = getattr(tfd.Distribution, name)

    def forwarded(self, *args, **kwargs):
        if takes_distribution:
            args = tuple(_unwrap(a) for a in args)
            kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        else:
            args = tuple(a.value if isinstance(a, RandomVariable) else a for a in args)
        if name in _VALUE_METHODS and args:
            what = f"{self._distribution.name}.{name}"
            value = align_value(args[0], self._static_shape(), what, self._distribution.dtype)
            args = (value, *args[1:])
        return getattr(self._distribution, name)(*args, **kwargs)

    forwarded.__name__ = name
    forwarded.__doc__ = f"`self.distribution.{name}(...)` (TFP's `Distribution.{name}`)." + (
        "" if method.__doc__ is None else "\n\n" + method.__doc__.split("\n")[0]
    )
    setattr(RandomVariable, name, forwarded)


for _name in ("mean", "mode", "stddev", "variance", "covariance", "entropy", *_VALUE_METHODS):
    _forward(_name)
for _name in ("kl_divergence", "cross_entropy"):
    _forward(_name, takes_distribution=True)


def _convert(rv, dtype=None, name=None, as_ref=False):
    del as_ref
    return tf.convert_to_tensor(rv.value, dtype=dtype, name=name)


tf.register_tensor_conversion_function(RandomVariable, _convert)


def _overload_operator(name):
    tensor_op = getattr(tf.Tensor, name)

    def operator(self, *args):
        return tensor_op(self.value, *args)

    operator.__name__ = name
    operator.__doc__ = f"`tf.Tensor.{name}` applied to the value."
    setattr(RandomVariable, name, operator)


for _name in (
    "__abs__",
    "__neg__",
    "__invert__",
    "__pos__",
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__floordiv__",
    "__rfloordiv__",
    "__mod__",
    "__rmod__",
    "__pow__",
    "__rpow__",
    "__matmul__",
    "__rmatmul__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__and__",
    "__rand__",
    "__or__",
    "__ror__",
    "__xor__",
    "__rxor__",
):
    if hasattr(tf.Tensor, _name):
        _overload_operator(_name)

# NumPy must defer to our reflected operators (np.ones(3) + rv -> rv.__radd__).
RandomVariable.__array_priority__ = 100
