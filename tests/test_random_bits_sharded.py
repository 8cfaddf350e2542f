"""Predicted per-device flops of a dropout whose mask is cut, against XLA's `cost_analysis()`:
the partitioner runs the threefry on each device's elements and builds each element's counter,
its global index, from the device's offsets along the cut dims
(`flops_measured.sharded_random_bits_flops`), which the global count's share misses."""

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc


def dropout(params, batch):
    """The fuzz programs' dropout (`fuzz/programs.py`): a Bernoulli mask from a raw key."""
    key = jax.random.fold_in(batch["key"], 1)
    keep = jax.random.bernoulli(key, 0.9, batch["x"].shape)
    return jnp.where(keep, batch["x"] / 0.9, 0.0)


def predicted_and_compiled(shape, axes, cut):
    """(predicted, compiled) flops per device with dim d of `x` (and so of the mask) cut by the
    mesh axes `cut[d]`."""
    args = (
        {},
        {
            "x": jax.ShapeDtypeStruct(shape, jnp.float32),
            "key": jax.ShapeDtypeStruct((2,), jnp.uint32),
        },
    )
    mesh = tc.MeshSpec(axes)
    ana = tc.analyze(tc.trace(dropout, *args))
    bits = next(op for op in ana.program.ops if op.primitive == "random_bits")
    dims = ana.value_named_dims(bits.results[0])
    strategy = tc.Strategy(tuple((f"N{dims[d][0]}", names) for d, names in cut.items()))
    rep = tc.validate(dropout, args, ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"))
    assert rep.numerics_ok
    return rep.predicted_flops, rep.compiled_flops


@pytest.mark.parametrize(
    ("shape", "axes", "cut"),
    [
        # fuzz seed 19 #2512: 275 flops predicted as the global count's share, XLA 302
        ((2, 16), {"a": 2, "b": 2, "c": 2}, {0: ("a",), 1: ("b", "c")}),
        # the offset read from the partition id itself (a cut by the whole mesh)
        ((32,), {"data": 8}, {0: ("data",)}),
        ((16, 8), {"a": 2, "b": 4}, {0: ("a",), 1: ("b",)}),
        # a broadcast scalar term added to a 1-D one: the add runs on the 1-D term alone
        ((8, 4, 4), {"a": 2, "b": 2, "c": 2}, {0: ("a", "b", "c")}),
        ((2, 2, 8), {"a": 2, "b": 2, "c": 2}, {1: ("b",), 2: ("a", "c")}),
        # a dim cut to one position per device, a broadcast scalar before the whole row
        ((3, 16), {"a": 2, "b": 3}, {0: ("b",)}),
    ],
    ids=["2512", "whole", "2d", "scalar-sink", "3d", "row"],
)
def test_a_cut_dropout_mask_counts_each_devices_counters(shape, axes, cut):
    """Each device's counter work (its offsets, added and shifted into the threefry's two
    words) is most of the miss on small masks: 0.911 of XLA's flops for #2512. The count must
    match exactly."""
    predicted, compiled = predicted_and_compiled(shape, axes, cut)
    assert predicted == compiled
