"""Poisson point processes whose intensity is a layer (Tran et al., 2019, Sec. 2.2 footnote and
Sec. 2.5: "a Poisson process layer for scalable point process modeling").

`PoissonProcess(rate, bounds)` is a random variable over point patterns in a rectangular window
`W = [low_1, high_1] x ... x [low_d, high_d]`, with intensity `rate(x)` given by a Keras layer
or model (or any callable) mapping locations `[m, d]` to positive intensities `[m]` or `[m, 1]`.
Its log density at a pattern `X = {x_1, ..., x_n}` is

    log p(X) = sum_i log rate(x_i) - integral_W rate(x) dx,

with the integral by a fixed quadrature rule `sum_j w_j rate(u_j)` (see `PoissonProcessDistribution`
for the rules and their errors). The rate is called *once* per `log_prob`, on the pattern and the
quadrature nodes together, so a random rate (a `GaussianProcess` layer, whose output is one joint
draw at its inputs) is one function: `log_prob` is then the log-likelihood of a Cox process given
the rate's draw at `process.locations(X)`, the locations a posterior program evaluates its own
rate at. `sample()` draws a pattern by thinning (Lewis and Shedler, 1979).

Not a Keras layer: a pattern has a random number of points, so the process is a random variable
(`blayers.RandomVariable`, traceable: `condition`, `tape` and `make_log_joint` see it by `name`).
"""

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.random_variable import RandomVariable
from blayers.tracing import traceable

tfd = tfp.distributions

__all__ = ["PoissonProcess", "PoissonProcessDistribution", "quadrature_rule"]

QUADRATURES = ("midpoint", "gauss_legendre", "monte_carlo")


def _check_bounds(bounds):
    array = np.asarray(bounds, dtype="float64")
    if array.ndim == 1 and array.shape[0] == 2:
        array = array[None]
    if array.ndim != 2 or array.shape[1] != 2 or array.shape[0] < 1:
        raise ValueError(
            f"PoissonProcess: bounds must be [[low, high], ...], one pair per dimension; got "
            f"{bounds!r}."
        )
    if not np.all(np.isfinite(array)) or np.any(array[:, 1] <= array[:, 0]):
        raise ValueError(
            f"PoissonProcess: bounds need finite low < high in every pair; got {bounds!r}."
        )
    return array


def quadrature_rule(bounds, rule="midpoint", num_points=64, seed=0):
    """Nodes `[G, d]` and weights `[G]` with `sum_j w_j f(u_j) ~ integral_W f`.

    Args:
      bounds: `[[low, high], ...]`, one pair per dimension.
      rule: `'midpoint'`: the centres of a grid of `num_points` cells per dimension, each weighted
        by its volume; error `|W| / 24 * sum_k h_k^2 * max|d^2 f / dx_k^2|` for cell widths `h_k`.
        `'gauss_legendre'`: the tensor product of `num_points`-point Gauss-Legendre rules, exact
        for polynomials of degree `2 num_points - 1` per dimension and spectrally accurate for
        smooth rates. `'monte_carlo'`: `num_points` uniform nodes (in total) weighted `|W| / G`,
        drawn once from `seed`: unbiased over the draw, with standard error
        `|W| std(f(U)) / sqrt(G)`.
      num_points: per dimension (grid rules) or in total (`'monte_carlo'`).
      seed: the Monte Carlo nodes' seed.
    """
    bounds = _check_bounds(bounds)
    if rule not in QUADRATURES:
        raise ValueError(f"PoissonProcess: quadrature must be one of {QUADRATURES}, got {rule!r}.")
    if not isinstance(num_points, (int, np.integer)) or num_points < 1:
        raise ValueError(
            f"PoissonProcess: num_quadrature_points must be a positive integer, got {num_points!r}."
        )
    low, high = bounds[:, 0], bounds[:, 1]
    volume = float(np.prod(high - low))
    if rule == "monte_carlo":
        rng = np.random.default_rng(seed)
        nodes = low + (high - low) * rng.uniform(size=(num_points, len(bounds)))
        return nodes, np.full(num_points, volume / num_points)
    if rule == "midpoint":
        unit = (np.arange(num_points) + 0.5) / num_points
        unit_weights = np.full(num_points, 1.0 / num_points)
    else:
        unit, unit_weights = np.polynomial.legendre.leggauss(num_points)
        unit, unit_weights = (unit + 1) / 2, unit_weights / 2
    axes = [lo + (hi - lo) * unit for lo, hi in zip(low, high)]
    grids = np.meshgrid(*axes, indexing="ij")
    nodes = np.stack([g.ravel() for g in grids], axis=-1)
    weights = np.prod(np.meshgrid(*[unit_weights] * len(bounds), indexing="ij"), axis=0).ravel()
    return nodes, weights * volume


class PoissonProcessDistribution(tfd.Distribution):
    """Inhomogeneous Poisson process on a rectangle, as a TFP distribution over patterns.

    Event shape `[None, d]`: a pattern of any size. `log_prob(points)` is
    `sum_i log rate(x_i) - sum_j w_j rate(u_j)` (`-inf` if a point lies outside the window);
    `sample()` thins a homogeneous process of rate `max_rate`.

    Args:
      rate: callable (a Keras layer or model) mapping locations `[m, d]` to positive
        intensities `[m]` or `[m, 1]`, per unit volume.
      bounds: the window, `[[low, high], ...]`, one pair per dimension.
      quadrature: `'midpoint'` (default), `'gauss_legendre'` or `'monte_carlo'`
        (`quadrature_rule`, which states each rule's error).
      num_quadrature_points: nodes per dimension (grid rules) or in total (Monte Carlo).
      max_rate: an upper bound of the rate over the window, for thinning. None: 2x the largest
        rate at the quadrature nodes (enough for a rate that is smooth at the grid's scale); a
        draw finding a larger rate raises, naming the bound to pass.
      quadrature_seed: seed of the Monte Carlo nodes (drawn once, at construction).
      validate_args, name: as TFP's.
    """

    def __init__(
        self,
        rate,
        bounds,
        quadrature="midpoint",
        num_quadrature_points=64,
        max_rate=None,
        quadrature_seed=0,
        dtype=tf.float32,
        validate_args=False,
        name="PoissonProcess",
    ):
        parameters = dict(locals())
        if not callable(rate):
            raise TypeError(
                f"PoissonProcess: rate must be a callable (a Keras layer or model) mapping "
                f"locations [m, d] to intensities, got {type(rate).__name__}."
            )
        self._rate = rate
        self._bounds = _check_bounds(bounds)
        self._quadrature = quadrature
        nodes, weights = quadrature_rule(
            self._bounds, quadrature, num_quadrature_points, quadrature_seed
        )
        self._nodes = tf.constant(nodes, dtype)
        self._weights = tf.constant(weights, dtype)
        if max_rate is not None and not (np.isfinite(max_rate) and max_rate > 0):
            raise ValueError(f"PoissonProcess: max_rate must be positive, got {max_rate!r}.")
        self._max_rate = max_rate
        super().__init__(
            dtype=dtype,
            reparameterization_type=tfd.NOT_REPARAMETERIZED,
            validate_args=validate_args,
            allow_nan_stats=True,
            parameters=parameters,
            name=name,
        )

    @property
    def rate(self):
        return self._rate

    @property
    def bounds(self):
        """`[d, 2]` array of the window's `[low, high]` per dimension."""
        return self._bounds.copy()

    @property
    def volume(self):
        """`|W|`."""
        return float(np.prod(self._bounds[:, 1] - self._bounds[:, 0]))

    @property
    def dimension(self):
        return len(self._bounds)

    def quadrature(self):
        """`(nodes [G, d], weights [G])` of the integral."""
        return self._nodes, self._weights

    def locations(self, points):
        """`concat(points, nodes)`: where `log_prob(points)` evaluates the rate (rows `:n` are
        the pattern). A posterior program evaluates its rate here to match the model's."""
        points = tf.convert_to_tensor(points, self.dtype)
        return tf.concat([tf.reshape(points, [-1, self.dimension]), self._nodes], 0)

    def _rate_at(self, locations):
        rate = self._rate(locations)
        rate = tf.convert_to_tensor(rate.value if isinstance(rate, RandomVariable) else rate)
        if rate.shape.rank == 2 and rate.shape[-1] == 1:
            rate = rate[:, 0]
        if rate.shape.rank != 1:
            raise ValueError(
                f"PoissonProcess: rate must map locations [m, {self.dimension}] to intensities "
                f"[m] or [m, 1]; got shape {rate.shape}."
            )
        return tf.cast(rate, self.dtype)

    def _event_shape(self):
        return tf.TensorShape([None, self.dimension])

    def _event_shape_tensor(self):
        return tf.constant([-1, self.dimension], tf.int32)

    def _batch_shape(self):
        return tf.TensorShape([])

    def _batch_shape_tensor(self):
        return tf.constant([], tf.int32)

    def _inside(self, points):
        low = tf.constant(self._bounds[:, 0], self.dtype)
        high = tf.constant(self._bounds[:, 1], self.dtype)
        return tf.reduce_all((points >= low) & (points <= high))

    def _log_prob(self, points):
        points = tf.convert_to_tensor(points, self.dtype)
        if points.shape.rank != 2 or points.shape[-1] not in (None, self.dimension):
            raise ValueError(
                f"PoissonProcess.log_prob takes one pattern [n, {self.dimension}], got shape "
                f"{points.shape}."
            )
        n = tf.shape(points)[0]
        rate = self._rate_at(self.locations(points))
        log_prob = tf.reduce_sum(tf.math.log(rate[:n])) - tf.reduce_sum(self._weights * rate[n:])
        return tf.where(self._inside(points), log_prob, tf.constant(-np.inf, self.dtype))

    def integrated_rate(self):
        """`sum_j w_j rate(u_j)`, the quadrature of `integral_W rate` (the expected count)."""
        return tf.reduce_sum(self._weights * self._rate_at(self._nodes))

    def _sample_n(self, n, seed=None):
        if isinstance(n, int) and n != 1 or (tf.get_static_value(n) not in (None, 1)):
            raise ValueError(
                "PoissonProcess: a pattern has a random number of points, so patterns are drawn "
                "one at a time (sample_shape=())."
            )
        seed = tfp.random.sanitize_seed(seed)
        count_seed, location_seed, keep_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 3)
        )
        max_rate = self._max_rate
        if max_rate is None:
            max_rate = 2.0 * tf.reduce_max(self._rate_at(self._nodes))
        max_rate = tf.cast(max_rate, self.dtype)
        count = tf.random.stateless_poisson([], count_seed, max_rate * self.volume, tf.int32)
        low = tf.constant(self._bounds[:, 0], self.dtype)
        width = tf.constant(self._bounds[:, 1] - self._bounds[:, 0], self.dtype)
        candidates = low + width * tf.random.stateless_uniform(
            tf.stack([count, self.dimension]), location_seed, dtype=self.dtype
        )
        rate = self._rate_at(candidates)
        check = tf.debugging.assert_less_equal(
            rate,
            max_rate,
            message=(
                "PoissonProcess.sample: the rate exceeds max_rate, the thinning bound; pass a "
                "larger max_rate"
            ),
        )
        with tf.control_dependencies([check]):
            keep = tf.random.stateless_uniform([count], keep_seed, dtype=self.dtype) * max_rate
        return tf.boolean_mask(candidates, keep < rate)[None]

    def _mean(self):  # see integrated_rate() for the expected count
        raise NotImplementedError("A point pattern has no mean.")  # intentional


@traceable
def PoissonProcess(rate, bounds, value=None, seed=None, sample_shape=(), **kwargs):
    """A random variable over point patterns: an inhomogeneous Poisson process on `bounds`.

    Args:
      rate: a Keras layer or model (or callable) mapping locations `[m, d]` to positive
        intensities `[m]` or `[m, 1]`; a random one (GP layers then softplus) makes a Cox process.
      bounds: the window `[[low, high], ...]`, one pair per dimension (1-D, 2-D, ...).
      value: an observed pattern `[n, d]` (else one is drawn by thinning on first use).
      seed: stateless seed of the draw.
      sample_shape: `()`: a pattern has a random size, so patterns are drawn one at a time.
      **kwargs: `PoissonProcessDistribution`'s `quadrature`, `num_quadrature_points`,
        `max_rate`, `quadrature_seed`, `dtype` (the integral's rule and its error, the thinning
        bound, the locations' dtype) and `name`, the variable's name (`condition`, `tape`,
        `make_log_joint`; default `'PoissonProcess'`).

    Example (the homogeneous process: `log_prob(X) = n log(lam) - lam |W|`):
      ```python
      rate = lambda x: tf.fill([tf.shape(x)[0]], 3.0)
      process = blayers.layers.PoissonProcess(rate, bounds=[[0., 2.]], value=[[0.5], [1.2]])
      process.log_prob(process.value)      # 2 log 3 - 6
      ```
    """
    return RandomVariable(
        PoissonProcessDistribution(rate, bounds, **kwargs),
        sample_shape=sample_shape,
        value=value,
        seed=seed,
    )
