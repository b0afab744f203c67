"""Layout-invariant, reproducible noise for Mesh TensorFlow graphs.

`mtf.random_normal` on a placement mesh seeds each slice with `hash((random.random(),
slice_begin))`: Python's unseeded `random` and its per-process string hash. Two runs with the
same seed then draw different weight noise, and a model split over 2 devices draws different
noise from the same model on 1 device, so neither a rerun nor a layout change can be checked
against another.

`NoiseSource` makes every noise entry a function of `(seed, op, step, draw, i)` alone, where `i`
is the entry's index in the *whole* (unsplit) tensor: each device hashes the global indices of
its own slice, so any layout lowers to the same numbers and generates only its own share of
them. The hash is two rounds of the `lowbias32` integer finalizer (Wellons, 2018) over the
index keyed by the op; a uniform takes its top 23 bits and a normal is `ndtri(uniform)`. Tests
check the moments, independence across neighbours, ops and steps, and the equality across
layouts.
"""

import math

import numpy as np
import tensorflow as tf

from blayers.lab.mesh.compat import import_mesh_tensorflow

mtf = import_mesh_tensorflow()

__all__ = ["NoiseSource"]

_M1, _M2 = 0x7FEB352D, 0x846CA68B


class _Constants:
    """The uint32 constants and slice indices of one graph's noise, each made once: the hash
    made its five constants afresh at each of its hundreds of rounds, a third of a mesh
    Transformer's graph, and every layer of one shape recomputed the same slice's indices.
    Eagerly (the reference), or with `keep=False` (the functions' default, which may be called
    in any graph), nothing is kept."""

    def __init__(self, keep=True):
        self._made = {} if keep else None

    def _once(self, key, make):
        if self._made is None or tf.executing_eagerly():
            return make()
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def u32(self, value):
        return self._once(("u32", value), lambda: tf.constant(value, tf.uint32))

    def indices(self, full_shape, begin, slice_shape):
        key = ("indices", tuple(full_shape), tuple(begin), tuple(slice_shape))
        return self._once(key, lambda: global_indices(full_shape, begin, slice_shape))


_UNKEPT = _Constants(keep=False)


def _mix(x, c=_UNKEPT):
    """`lowbias32`: a bijective avalanche on uint32 (multiplication wraps modulo 2^32); `c`
    holds the graph's constants."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, c.u32(16)))
    x = x * c.u32(_M1)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, c.u32(15)))
    x = x * c.u32(_M2)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, c.u32(16)))


def _u32(value):
    return tf.cast(tf.bitwise.bitwise_and(tf.cast(value, tf.int64), 0xFFFFFFFF), tf.uint32)


def hash_bits(indices, key, c=_UNKEPT):
    """32 random bits per uint32 `indices` entry under the uint32 scalar `key`."""
    return _mix(
        tf.bitwise.bitwise_xor(_mix(tf.bitwise.bitwise_xor(indices, key), c), _mix(~key, c)), c
    )


def global_indices(full_shape, begin, slice_shape):
    """uint32 row-major indices, in the full tensor of `full_shape`, of the slice starting at
    `begin` with `slice_shape`."""
    index = tf.zeros([1] * len(full_shape), tf.int64)
    stride = 1
    for axis in reversed(range(len(full_shape))):
        shape = [1] * len(full_shape)
        shape[axis] = slice_shape[axis]
        positions = tf.range(begin[axis], begin[axis] + slice_shape[axis], dtype=tf.int64)
        index = index + tf.reshape(positions * stride, shape)
        stride *= full_shape[axis]
    return _u32(tf.broadcast_to(index, slice_shape))


def uniform_from_bits(bits, dtype, c=_UNKEPT):
    """`(k + 1/2) / 2^23` for the top 23 bits `k`: strictly inside (0, 1) in float32 too (with
    24 bits the largest value would round to 1, where `ndtri` is infinite)."""
    top = tf.cast(tf.bitwise.right_shift(bits, c.u32(9)), tf.float64)
    return tf.cast((top + 0.5) / 2.0**23, dtype)


class _CounterRandom(mtf.Operation):
    """An mtf op whose lowering hashes each slice's global indices (see the module)."""

    def __init__(self, mesh, shape, key, kind, dtype, constants):
        super().__init__([], mesh=mesh, name=f"counter_{kind}")
        self._key, self._kind, self._constants = key, kind, constants
        self._outputs = [mtf.Tensor(self, shape, dtype)]
        self._splittable_dims, self._unsplittable_dims = (
            self._initialize_all_dimensions_as_splittable()
        )

    def lower(self, lowering):
        impl = lowering.mesh_impl(self)
        if not isinstance(impl, mtf.placement_mesh_impl.PlacementMeshImpl):
            raise NotImplementedError(  # intentional: SIMD (TPU) meshes are not supported
                "NoiseSource lowers on placement meshes (CPU or GPU devices); "
                f"got {type(impl).__name__}."
            )
        shape = self.outputs[0].shape
        full = shape.to_integer_list
        slice_shape = impl.slice_shape(shape)
        dtype = self.outputs[0].dtype

        def draw(pnum):
            c = self._constants(impl.devices[pnum])  # made on the slice's device
            indices = c.indices(full, impl.slice_begin(shape, pnum), slice_shape)
            bits = hash_bits(indices, self._key, c)
            if self._kind == "rademacher":
                top = tf.bitwise.right_shift(bits, c.u32(31))
                return 1.0 - 2.0 * tf.cast(top, dtype)
            uniform = uniform_from_bits(bits, tf.float64 if dtype == tf.float64 else tf.float32, c)
            return tf.cast(tf.math.ndtri(uniform), dtype)

        lowering.set_tensor_lowering(self.outputs[0], impl.slicewise(draw, impl.laid_out_pnum()))


class NoiseSource:
    """Counter-based noise for the mtf graph of one run.

    Args:
      seed: the run's seed (a Python int).
      step: an int tf tensor (the global step): each training step draws fresh noise.
      draw: an int tf tensor told apart from the step (default 0): evaluation feeds
        1, 2, ... to average distinct weight draws at one step.

    Ops are numbered in the order the graph creates them, so a graph built the same way draws
    the same noise whatever its layout.
    """

    def __init__(self, seed, step, draw=None):
        c = self._keys = _Constants()
        self._base = _mix(_u32(int(seed) & 0xFFFFFFFF) ^ c.u32(0x9E3779B9), c)
        self._step = _u32(step)
        draw = _u32(draw if draw is not None else 0)
        self._draw = _mix(draw + c.u32(0x85EBCA6B), c)
        self._ops = 0
        self._slices = {}  # device -> _Constants

    def _constants(self, device):
        return self._slices.setdefault(device, _Constants())

    def _key(self):
        self._ops += 1
        c = self._keys
        key = _mix(self._base ^ _u32(self._ops), c)
        key = _mix(key ^ self._step, c)
        return _mix(key ^ self._draw, c)

    def _check(self, shape):
        if math.prod(shape.to_integer_list) > 2**32:
            raise ValueError(f"NoiseSource: {shape} has more than 2^32 entries.")

    def normal(self, mesh, shape, dtype=tf.float32):
        """Standard normal entries of the mtf `shape`."""
        shape = mtf.convert_to_shape(shape)
        self._check(shape)
        return _CounterRandom(mesh, shape, self._key(), "normal", dtype, self._constants).outputs[0]

    def rademacher(self, mesh, shape, dtype=tf.float32):
        """Independent +-1 signs of the mtf `shape`."""
        shape = mtf.convert_to_shape(shape)
        self._check(shape)
        return _CounterRandom(
            mesh, shape, self._key(), "rademacher", dtype, self._constants
        ).outputs[0]


def reference_normal(seed, op, step, draw, shape):
    """The entries `NoiseSource(seed, step, draw)`'s `op`-th (1-based) op draws for `shape`,
    computed eagerly on one device: what every layout must lower to (for tests)."""
    source = NoiseSource(seed, tf.constant(step), tf.constant(draw))
    source._ops = op - 1
    key = source._key()
    bits = hash_bits(global_indices(list(shape), [0] * len(shape), list(shape)), key)
    return np.asarray(tf.math.ndtri(uniform_from_bits(bits, tf.float64)))
