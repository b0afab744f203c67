"""`blayers.lab.mesh.random.NoiseSource`: noise that is a function of (seed, op, step, draw, index)
alone, so every layout lowers to the same numbers, with the moments and independence of
standard normal and Rademacher draws."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from blayers.lab.mesh.random import NoiseSource, mtf, reference_normal

SHAPE = (6, 8, 10)
LAYOUTS = {
    "1": ("model:1", ""),
    "2": ("model:2", "a:model"),
    "2x2": ("batch:2,model:2", "batch:batch;b:model"),
    "4": ("model:4", "a:model"),
}


def _lowered(mesh_shape, layout, seed=3, step=5, draw=0):
    """The first op's normal draw and the second op's signs on a mesh of processors that all
    sit on the CPU (the placement of slices is what a layout changes)."""
    with tf.Graph().as_default():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        shape = mtf.Shape(
            [mtf.Dimension(name, size) for name, size in zip(("batch", "a", "b"), SHAPE)]
        )
        source = NoiseSource(seed, tf.constant(step, tf.int64), tf.constant(draw, tf.int64))
        normal = source.normal(mesh, shape)
        signs = source.rademacher(mesh, shape)
        size = mtf.convert_to_shape(mesh_shape).size
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mtf.convert_to_shape(mesh_shape),
            mtf.convert_to_layout_rules(layout) if layout else mtf.LayoutRules([]),
            ["/cpu:0"] * size,
        )
        lowering = mtf.Lowering(graph, {mesh: impl})
        fetch = [lowering.export_to_tf_tensor(t) for t in (normal, signs)]
        with tf.compat.v1.Session() as session:
            return session.run(fetch)


def test_every_layout_lowers_to_the_same_noise_as_the_reference():
    reference = reference_normal(3, 1, 5, 0, SHAPE)
    first_normal, first_signs = _lowered(*LAYOUTS["1"])
    np.testing.assert_allclose(first_normal, reference, atol=1e-5)
    for name, (mesh_shape, layout) in LAYOUTS.items():
        normal, signs = _lowered(mesh_shape, layout)
        np.testing.assert_array_equal(normal, first_normal, err_msg=name)
        np.testing.assert_array_equal(signs, first_signs, err_msg=name)
    assert set(np.unique(first_signs)) == {-1.0, 1.0}


def test_the_seed_step_and_draw_each_change_the_noise_and_reruns_repeat_it():
    base, _ = _lowered(*LAYOUTS["2"])
    again, _ = _lowered(*LAYOUTS["2"])
    np.testing.assert_array_equal(base, again)
    for changed in ({"seed": 4}, {"step": 6}, {"draw": 1}):
        other, _ = _lowered(*LAYOUTS["2"], **changed)
        assert np.abs(np.corrcoef(base.ravel(), other.ravel())[0, 1]) < 5 / np.sqrt(base.size)


def test_normals_are_standard_and_independent():
    n = (400, 500)
    z = reference_normal(0, 1, 0, 0, n)
    size = z.size
    assert abs(z.mean()) < 5 / np.sqrt(size)
    assert abs(z.var() - 1.0) < 5 * np.sqrt(2.0 / size)
    assert abs(stats.kurtosis(z.ravel())) < 5 * np.sqrt(24.0 / size)
    assert stats.kstest(z.ravel(), "norm").pvalue > 1e-4
    # Neighbours along either axis, consecutive ops and consecutive steps are uncorrelated.
    pairs = {
        "row": (z[:, :-1], z[:, 1:]),
        "column": (z[:-1], z[1:]),
        "op": (z, reference_normal(0, 2, 0, 0, n)),
        "step": (z, reference_normal(0, 1, 1, 0, n)),
        "draw": (z, reference_normal(0, 1, 0, 1, n)),
    }
    for name, (a, b) in pairs.items():
        r = np.corrcoef(a.ravel(), b.ravel())[0, 1]
        assert abs(r) < 5 / np.sqrt(a.size), name
    # Squares too: the hash leaks no dependence into the scale.
    r = np.corrcoef(z[:, :-1].ravel() ** 2, z[:, 1:].ravel() ** 2)[0, 1]
    assert abs(r) < 5 / np.sqrt(size)


def test_uniforms_stay_inside_the_unit_interval_in_float32():
    from blayers.lab.mesh.random import uniform_from_bits

    bits = tf.constant([0, 1, 2**31, 2**32 - 1], tf.uint32)
    u = uniform_from_bits(bits, tf.float32).numpy()
    assert np.all((u > 0) & (u < 1)), u
    assert np.all(np.isfinite(tf.math.ndtri(u).numpy()))


def test_too_large_a_tensor_is_refused():
    with tf.Graph().as_default():
        mesh = mtf.Mesh(mtf.Graph(), "mesh")
        shape = mtf.Shape([mtf.Dimension("a", 2**17), mtf.Dimension("b", 2**16)])
        with pytest.raises(ValueError, match="2\\^32"):
            NoiseSource(0, tf.constant(0, tf.int64)).normal(mesh, shape)
