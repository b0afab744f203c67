"""Reversible layers: bijections that carry a random variable from input to output (Tran et
al., 2019, Sec. 2.4 "Reversible Layers"; normalizing flows).

The protocol: a reversible layer has `call` (forward), `reverse` (inverse) and
`log_det_jacobian(x)` (`log |det d call / dx|` per example; 0 for volume-preserving layers).
Called on a tensor it returns a tensor. Called on a `RandomVariable` it returns a
`RandomVariable` over the transformed distribution (`TransformedDistribution` with the layer as
a TFP bijector), whose `log_prob(y) = base.log_prob(reverse(y)) - log_det_jacobian(reverse(y))`.
Transformations act on the last axis (event rank 1); a base with scalar events (e.g.
`blayers.Normal(loc=tf.zeros([n, d]), scale=1.)`) has its last axis reinterpreted as the event.

* `Reverse(layer)`: swaps `call` and `reverse`; fails only when the missing direction is used.
* `Permute(order)`: a fixed permutation of the features.
* `ActNorm()`: per-feature affine `(x + b) * exp(s)` with data-dependent initialization
  (Kingma & Dhariwal, 2018): the first batch comes out with zero mean and unit variance.
* `MADE(hidden_dims, order)`: masked autoencoder (Germain et al., 2015): output `i` depends only
  on inputs before `i` in `order`; `params` outputs per input (inferred by `RealNVP`).
* `RealNVP(network)`: affine coupling (Dinh et al., 2017): `y = x` on a checkerboard half,
  `y = x * exp(s(x_m)) + t(x_m)` on the other, halves alternating between successive layers.
* `RevNetBlock(f, g)`: `y1 = x1 + f(x2)`, `y2 = x2 + g(y1)` (Gomez et al., 2017) with a custom
  gradient that reconstructs the block's input from its output and recomputes `f` and `g`.
"""

import itertools

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import distributions as rv_lib
from blayers.layers.base import NestedLayers, register
from blayers.layers.dense import dense_matmul
from blayers.random_variable import RandomVariable
from blayers.tracing import traceable

tfb = tfp.bijectors
tfd = tfp.distributions

__all__ = [
    "MADE",
    "ActNorm",
    "Permute",
    "RealNVP",
    "RevNetBlock",
    "Reverse",
    "ReversibleLayer",
    "StandardNormalBase",
    "TransformedRandomVariable",
]


class _LayerBijector(tfb.Bijector):
    """A reversible layer as a TFP bijector on the last axis."""

    def __init__(self, layer, dtype):
        self._layer = layer
        super().__init__(
            forward_min_event_ndims=layer.event_ndims,
            is_constant_jacobian=False,
            dtype=dtype,
            name=layer.name,
        )

    def _forward(self, x):
        return self._layer.forward(x)

    def _inverse(self, y):
        return self._layer.reverse(y)

    def _forward_log_det_jacobian(self, x):
        return self._layer.log_det_jacobian(x)


def _is_flow(distribution):
    """Whether `distribution` is a base pushed through reversible layers (by `call`). Duck-typed:
    TFP builds `TransformedDistribution` and `Chain` as private non-composite classes."""
    bijectors = getattr(getattr(distribution, "bijector", None), "bijectors", None)
    return (
        hasattr(distribution, "distribution")
        and bool(bijectors)
        and all(isinstance(b, _LayerBijector) for b in bijectors)
    )


class ReversibleLayer(keras.layers.Layer):
    """Base class: subclasses implement `forward`, `reverse` and `log_det_jacobian`."""

    event_ndims = 1  # the last axis is the event (`log_det_jacobian` reduces it)

    def forward(self, x):
        raise NotImplementedError(f"{type(self).__name__} has no forward direction.")

    def reverse(self, y):
        raise NotImplementedError(f"{type(self).__name__} has no reverse direction.")

    def log_det_jacobian(self, x):
        """`log |det J_forward(x)|` per example (shape `x.shape[:-1]`)."""
        return tf.zeros(tf.shape(x)[:-1], x.dtype)

    def call(self, inputs):
        if isinstance(inputs, RandomVariable):
            base = inputs.distribution
            if base.event_shape.rank < self.event_ndims:  # the last axis is the flow's event
                base = tfd.Independent(base, reinterpreted_batch_ndims=1)
            bijector = _LayerBijector(self, inputs.dtype)
            if _is_flow(base):
                # Extend the chain rather than nest: TFP infers a nested transformed
                # distribution's batch shape in time exponential in the depth.
                bijector = tfb.Chain([bijector, *base.bijector.bijectors])
                base = base.distribution
            else:
                bijector = tfb.Chain([bijector])
            distribution = tfd.TransformedDistribution(base, bijector)
            return RandomVariable(distribution, value=self.forward(inputs.value))
        inputs = tf.convert_to_tensor(inputs)
        if not inputs.dtype.is_integer:  # integers: a discrete flow's one-hots, kept exact
            inputs = tf.cast(inputs, self.compute_dtype)
        return self.forward(inputs)

    def compute_output_shape(self, input_shape):
        return input_shape


@traceable
def TransformedRandomVariable(
    random_variable, reversible_layer, name=None, sample_shape=(), value=None
):
    """The random variable `f(x)`, `x ~ random_variable`, for a reversible layer `f`: its
    distribution is the pushforward (density by the change of variables, `log p(y) =
    log p_x(f^-1(y)) - log |det J_f(f^-1(y))|`), its value `f(x)` at `x`'s value. Edward2's
    `TransformedRandomVariable(rv, reversible_layer)`; the same as calling the layer on the
    variable, plus a `name` that interceptors (`blayers.tape`, `condition`) see.

    Args:
      random_variable: a `blayers.RandomVariable` (the base).
      reversible_layer: a `ReversibleLayer` (`RealNVP`, `ActNorm`, a discrete flow, ...), or
        edward2's duck-typed callable with `reverse(y)` and `log_det_jacobian(y)` (edward2's
        convention: the reverse map's log-determinant at the output).
      name: the variable's name for interceptors.
      sample_shape: draws of the transformed distribution instead of `f(x)` (with no value).
      value: an explicit value instead of `f(x)`.
    """
    del name  # read by interceptors (`traceable`)
    if not isinstance(random_variable, RandomVariable):
        raise TypeError(
            f"TransformedRandomVariable needs a blayers.RandomVariable, got {random_variable!r}."
        )
    if not isinstance(reversible_layer, ReversibleLayer):
        if not all(hasattr(reversible_layer, m) for m in ("reverse", "log_det_jacobian")):
            raise TypeError(
                "TransformedRandomVariable needs a blayers.layers.ReversibleLayer (or an "
                "edward2-style callable with `reverse` and `log_det_jacobian`), got "
                f"{reversible_layer!r}."
            )
        reversible_layer = _Edward2Reversible(reversible_layer)
    transformed = reversible_layer(random_variable)
    if value is None and not tuple(sample_shape):
        return transformed
    return RandomVariable(transformed.distribution, sample_shape=sample_shape, value=value)


class _Edward2Reversible(ReversibleLayer):
    """An edward2-style reversible callable as a `ReversibleLayer`: `layer(x)` forward,
    `layer.reverse(y)`, and `layer.log_det_jacobian(y)` in edward2's convention, the
    log-determinant of the reverse map at the output (`log p(y) = log p(reverse(y)) +
    log_det_jacobian(y)`), so the forward map's at `x` is `-log_det_jacobian(layer(x))`."""

    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        self._wrapped = layer
        self.built = True  # no weights of its own (Keras would otherwise trace `call` to build)

    def call(self, inputs):
        if isinstance(inputs, RandomVariable):
            # Elementwise (edward2's `Exp`) or per event: as the layer's log-determinant says.
            x = inputs.value
            elementwise = self.log_det_jacobian(x).shape.rank == x.shape.rank
            self.event_ndims = 0 if elementwise else 1
        return super().call(inputs)

    def forward(self, x):
        return tf.convert_to_tensor(self._wrapped(x))

    def reverse(self, y):
        return self._wrapped.reverse(y)

    def log_det_jacobian(self, x):
        return -self._wrapped.log_det_jacobian(self.forward(x))


@register
class Reverse(NestedLayers, ReversibleLayer):
    """The inverse of a reversible layer: `call` is its `reverse` and vice versa.

    Args:
      layer: the reversible layer to invert.
      **kwargs: `keras.layers.Layer` arguments.
    """

    nested_layer_args = ("layer",)

    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        self.layer = layer

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)

    def forward(self, x):
        return self.layer.reverse(x)

    def reverse(self, y):
        return self.layer.forward(y)

    def log_det_jacobian(self, x):
        return -self.layer.log_det_jacobian(self.layer.reverse(x))

    def get_config(self):
        return {**super().get_config(), **self._nested_config()}


@register
class Permute(ReversibleLayer):
    """Fixed permutation of the last axis: `order` a list, `'reverse'`, or `'random'` (seed).

    Args:
      order: a permutation of the features (list), `'reverse'`, or `'random'`.
      seed: seeds the `'random'` permutation.
      **kwargs: `keras.layers.Layer` arguments.
    """

    def __init__(self, order="reverse", seed=None, **kwargs):
        super().__init__(**kwargs)
        self.order, self.seed = order, seed

    def build(self, input_shape):
        d = input_shape[-1]
        if self.order == "reverse":
            perm = np.arange(d)[::-1]
        elif self.order == "random":
            perm = np.random.RandomState(self.seed).permutation(d)
        else:
            perm = np.asarray(self.order)
            if sorted(perm.tolist()) != list(range(d)):
                raise ValueError(f"Permute: order {self.order} is not a permutation of {d}.")
        # NumPy, not tensors: a layer built inside a trace must not keep a graph constant.
        self._perm = perm.astype(np.int32)
        self._inverse_perm = np.argsort(perm).astype(np.int32)

    def forward(self, x):
        return tf.gather(x, self._perm, axis=-1)

    def reverse(self, y):
        return tf.gather(y, self._inverse_perm, axis=-1)

    def get_config(self):
        order = self.order if isinstance(self.order, str) else list(map(int, self.order))
        return {**super().get_config(), "order": order, "seed": self.seed}


@register
class ActNorm(ReversibleLayer):
    """`y = (x + bias) * exp(log_scale)` per feature, initialized from the first batch so that
    it comes out with zero mean and unit variance (Kingma & Dhariwal, 2018)."""

    def build(self, input_shape):
        d = input_shape[-1]
        self.bias = self.add_weight(name="bias", shape=(d,), initializer="zeros")
        self.log_scale = self.add_weight(name="log_scale", shape=(d,), initializer="zeros")
        self.initialized = self.add_weight(
            name="initialized", shape=(), initializer="zeros", trainable=False
        )

    def _initialize(self, x):
        def init():
            flat = tf.reshape(x, [-1, tf.shape(x)[-1]])
            mean, variance = tf.nn.moments(flat, axes=[0])
            self.bias.assign(-mean)
            self.log_scale.assign(-0.5 * tf.math.log(variance + 1e-6))
            self.initialized.assign(1.0)
            return tf.constant(True)

        return tf.cond(self.initialized > 0, lambda: tf.constant(False), init)

    def forward(self, x):
        with tf.control_dependencies([self._initialize(x)]):
            return (x + self.bias) * tf.exp(self.log_scale)

    def reverse(self, y):
        return y * tf.exp(-self.log_scale) - self.bias

    def log_det_jacobian(self, x):
        return tf.reduce_sum(self.log_scale) + tf.zeros(tf.shape(x)[:-1], x.dtype)


def _made_masks(degrees_in, hidden_dims, rng, channels=1):
    """Masks (in -> hidden, hidden -> hidden, ..., hidden -> out) of MADE; `degrees_in` are the
    positions' degrees, each position carrying `channels` input features."""
    d = len(degrees_in)
    degrees = [np.repeat(degrees_in, channels)]
    for units in hidden_dims:
        low = min(int(degrees[-1].min()), d - 1)
        degrees.append(np.arange(units) % max(d - 1, 1) + low if d > 1 else np.zeros(units, int))
    masks = [
        (deg_out[None, :] >= deg_in[:, None]).astype("float32")
        for deg_in, deg_out in itertools.pairwise(degrees)
    ]
    masks.append((degrees_in[None, :] > degrees[-1][:, None]).astype("float32"))
    return masks


@register
class MADE(keras.layers.Layer):
    """Masked autoencoder for distribution estimation (Germain et al., 2015).

    Maps `[..., d]` to `[..., d, params]` where output `i` depends only on inputs that come
    before `i` in `order` (`'left-to-right'`, `'right-to-left'` or `'random'` with `seed`): its
    Jacobian is strictly triangular in that order. `params` is inferred by `RealNVP` (2: shift
    and log-scale) when left None.

    With `event_ndims=2` the inputs are `[..., length, channels]` (several channels per
    autoregressive position, e.g. one-hot tokens for discrete flows) and the outputs
    `[..., length, params]`: output position `i` sees every channel of the positions before
    `i`.

    Args:
      hidden_dims: sizes of the masked hidden layers (the paper's `MADE([512, 512])`).
      order: `'left-to-right'`, `'right-to-left'` or `'random'`.
      params: outputs per position (None: set by the layer that uses it).
      activation: hidden activation (default relu).
      use_bias: biases in the masked layers.
      event_ndims: 1 (`[..., d]` inputs) or 2 (`[..., length, channels]`).
      seed: seeds a `'random'` order and the masks' degrees.
      input_order: edward2's name for `order`.
      hidden_order: the hidden units' degrees, `'left-to-right'` (cycling through the
        positions, edward2's default; the only one here).
      **kwargs: `keras.layers.Layer` arguments.

    edward2's form is accepted too: `MADE(units, hidden_dims, input_order=..., ...)`, `units`
    being `params`.
    """

    def __init__(
        self,
        hidden_dims,
        order="left-to-right",
        params=None,
        activation="relu",
        use_bias=True,
        event_ndims=1,
        seed=None,
        input_order=None,
        hidden_order="left-to-right",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(hidden_dims, (int, np.integer)):  # edward2: MADE(units, hidden_dims)
            if not isinstance(order, (list, tuple)):
                raise TypeError(
                    f"MADE: with an int first argument (edward2's units) the second is the "
                    f"hidden sizes, got {order!r}."
                )
            params, hidden_dims, order = int(hidden_dims), order, "left-to-right"
        if input_order is not None:
            order = input_order
        if hidden_order != "left-to-right":
            raise ValueError(
                f"MADE: hidden_order must be 'left-to-right' (the only one), got {hidden_order!r}."
            )
        if event_ndims not in (1, 2):
            raise ValueError(f"MADE: event_ndims must be 1 or 2, got {event_ndims!r}.")
        self.use_bias, self.event_ndims = use_bias, event_ndims
        if order not in ("left-to-right", "right-to-left", "random"):
            raise ValueError(
                f"MADE: order must be 'left-to-right', 'right-to-left' or 'random', got {order!r}."
            )
        self.hidden_dims = [int(h) for h in hidden_dims]
        self.order, self.params, self.seed = order, params, seed
        self.activation = keras.activations.get(activation)

    def build(self, input_shape):
        channels = 1
        if self.event_ndims == 2:
            d, channels = input_shape[-2], input_shape[-1]
        else:
            d = input_shape[-1]
        if d is None or channels is None:
            raise ValueError(f"MADE ({self.name}) needs known event sizes, got {input_shape}.")
        params = self.params or 1
        self.params = params
        rng = np.random.RandomState(self.seed)
        if self.order == "left-to-right":
            degrees = np.arange(d)
        elif self.order == "right-to-left":
            degrees = np.arange(d)[::-1]
        else:
            degrees = rng.permutation(d)
        self.input_degrees = degrees
        masks = _made_masks(degrees, self.hidden_dims, rng, channels)
        masks[-1] = np.repeat(masks[-1], params, axis=1)  # `params` outputs per input
        self._masks = masks  # NumPy: a MADE built inside a trace keeps no graph constant
        self._event = (d, channels)
        sizes = [d * channels, *self.hidden_dims, d * params]
        self.kernels, self.biases = [], []
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
            last = i == len(sizes) - 2
            self.kernels.append(
                self.add_weight(
                    name=f"kernel_{i}",
                    shape=(fan_in, fan_out),
                    initializer="zeros" if last else "glorot_uniform",
                )
            )
            self.biases.append(
                self.add_weight(name=f"bias_{i}", shape=(fan_out,), initializer="zeros")
                if self.use_bias
                else None
            )

    def call(self, inputs):
        h = tf.convert_to_tensor(inputs, self.compute_dtype)
        d, channels = self._event
        batch_shape = tf.shape(h)[: h.shape.rank - self.event_ndims]
        h = tf.reshape(h, tf.concat([batch_shape, [d * channels]], 0))
        for i, (kernel, bias, mask) in enumerate(zip(self.kernels, self.biases, self._masks)):
            h = dense_matmul(h, kernel * mask)
            if bias is not None:
                h = h + bias
            if i < len(self.kernels) - 1:
                h = self.activation(h)
        # Output columns are input-major: unit i's `params` outputs are adjacent.
        return tf.reshape(h, tf.concat([batch_shape, [d, self.params]], 0))

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dims": self.hidden_dims,
            "order": self.order,
            "params": self.params,
            "seed": self.seed,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "event_ndims": self.event_ndims,
        }


@register
class RealNVP(NestedLayers, ReversibleLayer):
    """Affine coupling (Dinh et al., 2017) with a checkerboard mask over the features.

    `network` (e.g. `MADE`, or any layer mapping `[..., d]` to `[..., 2d]` or `[..., d, 2]`)
    computes the shift `t` and log-scale `s` from the kept half `x * m`; the other half becomes
    `x * exp(s) + t`. `parity` (0 or 1) picks the kept half; when None, successive `RealNVP`
    layers alternate.

    Args:
      network: the shift-and-log-scale network (the paper's `MADE([512, 512])`).
      parity: 0 or 1, the kept half (None: alternate).
      **kwargs: `keras.layers.Layer` arguments.
    """

    nested_layer_args = ("network",)

    _next_parity = 0

    def __init__(self, network, parity=None, **kwargs):
        super().__init__(**kwargs)
        if parity is None:
            parity = RealNVP._next_parity
            RealNVP._next_parity = 1 - parity
        self.network, self.parity = network, int(parity)
        if isinstance(network, MADE) and network.params is None:
            network.params = 2

    def build(self, input_shape):
        d = input_shape[-1]
        self._mask = (np.arange(d) % 2 == self.parity).astype("float32")  # NumPy (traces)
        if not self.network.built:
            self.network.build(input_shape)

    def _shift_and_log_scale(self, kept):
        out = self.network(kept)
        if out.shape.rank == kept.shape.rank + 1:
            shift, log_scale = out[..., 0], out[..., 1]
        else:
            shift, log_scale = tf.split(out, 2, axis=-1)
        free = 1.0 - self._mask
        return shift * free, tf.tanh(log_scale) * free  # tanh keeps early steps stable

    def forward(self, x):
        x = tf.convert_to_tensor(x, self.compute_dtype)
        shift, log_scale = self._shift_and_log_scale(x * self._mask)
        return x * self._mask + (1.0 - self._mask) * (x * tf.exp(log_scale) + shift)

    def reverse(self, y):
        y = tf.convert_to_tensor(y, self.compute_dtype)
        shift, log_scale = self._shift_and_log_scale(y * self._mask)
        return y * self._mask + (1.0 - self._mask) * ((y - shift) * tf.exp(-log_scale))

    def log_det_jacobian(self, x):
        x = tf.convert_to_tensor(x, self.compute_dtype)
        _, log_scale = self._shift_and_log_scale(x * self._mask)
        return tf.reduce_sum(log_scale, axis=-1)

    def get_config(self):
        return {
            **super().get_config(),
            "parity": self.parity,
            **self._nested_config(),
        }


@register
class RevNetBlock(NestedLayers, ReversibleLayer):
    """Reversible residual block (Gomez et al., 2017) on the two halves of the last axis:
    `y1 = x1 + f(x2)`, `y2 = x2 + g(y1)`; volume-preserving (log-det 0).

    The backward pass reconstructs `x` from `y` and recomputes `f` and `g` (a custom gradient)
    rather than storing its inputs and `f`, `g` activations. Each block still keeps its output
    for its own backward pass, so a chain of blocks grows by one output per block; put the
    blocks in a `RevNetStack` to reconstruct through the whole stack with memory flat in depth.

    Args:
      f, g: layers mapping one half of the features to a tensor of the same shape.
      **kwargs: `keras.layers.Layer` arguments.
    """

    nested_layer_args = ("f", "g")

    def __init__(self, f, g, **kwargs):
        super().__init__(**kwargs)
        self.f, self.g = f, g

    def build(self, input_shape):
        half = tuple(input_shape[:-1]) + (input_shape[-1] // 2,)
        for net in (self.f, self.g):
            if not net.built:
                net.build(half)

    def forward(self, x):
        x1, x2 = tf.split(x, 2, axis=-1)
        f, g = self.f, self.g

        @tf.custom_gradient
        def block(x1, x2):
            y1 = x1 + f(x2)
            y2 = x2 + g(y1)

            def grad(dy1, dy2, variables=None):
                # `variables`: the tf.Variables of f and g that TF saw in the forward pass.
                variables = list(variables or [])
                zero = tf.UnconnectedGradients.ZERO
                # Recompute only once the gradient arrives (see `RevNetStack`).
                with tf.control_dependencies([dy1, dy2]):
                    y1_, y2_ = tf.identity(y1), tf.identity(y2)
                with tf.GradientTape() as tape:
                    tape.watch(y1_)
                    g_y1 = g(y1_)
                dg = tape.gradient(
                    g_y1, [y1_, *variables], output_gradients=dy2, unconnected_gradients=zero
                )
                dy1_total = dy1 + dg[0]
                x2_rebuilt = y2_ - g_y1  # reconstruct the input instead of storing it
                with tf.GradientTape() as tape:
                    tape.watch(x2_rebuilt)
                    f_x2 = f(x2_rebuilt)
                df = tape.gradient(
                    f_x2,
                    [x2_rebuilt, *variables],
                    output_gradients=dy1_total,
                    unconnected_gradients=zero,
                )
                variable_grads = [a + b for a, b in zip(dg[1:], df[1:])]
                return (dy1_total, dy2 + df[0]), variable_grads

            return (y1, y2), grad

        y1, y2 = block(x1, x2)
        return tf.concat([y1, y2], axis=-1)

    def reverse(self, y):
        y1, y2 = tf.split(y, 2, axis=-1)
        x2 = y2 - self.g(y1)
        return tf.concat([y1 - self.f(x2), x2], axis=-1)

    def get_config(self):
        return {**super().get_config(), **self._nested_config()}


@register
class RevNetStack(NestedLayers, ReversibleLayer):
    """A sequence of `RevNetBlock`s with one custom gradient for the whole stack (Gomez et
    al., 2017): the backward pass starts from the stack's output and reconstructs each block's
    input from its output, block by block, recomputing one block's activations at a time.
    Measured (`benchmarks/revnet_memory.py`, batch 1024, width 256): activation memory of a
    gradient step stays flat in depth (about 0.03 MB per block, against 3.5 MB for a plain
    residual stack); only the parameter gradients grow.

    Args:
      blocks: the `RevNetBlock`s, applied in order.
      **kwargs: `keras.layers.Layer` arguments.
    """

    nested_layer_args = ("blocks",)

    def __init__(self, blocks, **kwargs):
        super().__init__(**kwargs)
        if not blocks or not all(isinstance(b, RevNetBlock) for b in blocks):
            raise ValueError("RevNetStack takes a non-empty list of RevNetBlock layers.")
        self.blocks = list(blocks)

    def build(self, input_shape):
        for block in self.blocks:
            if not block.built:
                block.build(input_shape)

    def _nested_config(self):
        serialize = keras.saving.serialize_keras_object
        return {"blocks": [serialize(b) for b in self.blocks]}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["blocks"] = [keras.saving.deserialize_keras_object(b) for b in config["blocks"]]
        return cls(**config)

    @staticmethod
    def _plain(block, x):
        x1, x2 = tf.split(x, 2, axis=-1)
        y1 = x1 + block.f(x2)
        return tf.concat([y1, x2 + block.g(y1)], axis=-1)

    def forward(self, x):
        blocks = self.blocks

        @tf.custom_gradient
        def stack(x):
            y = x
            for block in blocks:
                y = self._plain(block, y)

            def grad(dy, variables=None):
                variables = list(variables or [])
                position = {id(v): i for i, v in enumerate(variables)}
                grads = [None] * len(variables)
                y_current = y
                for block in reversed(blocks):
                    # Rebuild this block's input only once the gradient reaches it: the
                    # rebuilds depend on `y` alone, so the executor would otherwise run them
                    # all up front and hold every block's input at once.
                    with tf.control_dependencies([dy]):
                        x_prev = block.reverse(tf.identity(y_current))
                    # The block's own tf.Variables (Keras wraps each in `.value`).
                    own = [w.value for w in block.trainable_variables]
                    with tf.GradientTape() as tape:
                        tape.watch(x_prev)
                        out = self._plain(block, x_prev)
                    parts = tape.gradient(
                        out,
                        [x_prev, *own],
                        output_gradients=dy,
                        unconnected_gradients=tf.UnconnectedGradients.ZERO,
                    )
                    dy = parts[0]
                    for variable, part in zip(own, parts[1:]):
                        if id(variable) in position:
                            grads[position[id(variable)]] = part
                    y_current = x_prev  # only this block's activations are alive
                return dy, [
                    g if g is not None else tf.zeros_like(v) for g, v in zip(grads, variables)
                ]

            return y, grad

        return stack(x)

    def reverse(self, y):
        for block in reversed(self.blocks):
            y = block.reverse(y)
        return y

    def get_config(self):
        return {**super().get_config(), **self._nested_config()}


@register
class StandardNormalBase(keras.layers.Layer):
    """A standard Normal random variable shaped like the input: the base of a flow.

    `StandardNormalBase()(x)` returns `blayers.Normal(zeros_like(x), 1)`; reversible layers
    applied to it carry its `log_prob` through their bijectors (`realnvp_flow`). The input only
    sets the shape and the batch size."""

    def call(self, inputs):
        zeros = tf.zeros_like(tf.convert_to_tensor(inputs, self.compute_dtype))
        return rv_lib.Normal(loc=zeros, scale=1.0)

    def compute_output_shape(self, input_shape):
        return input_shape
