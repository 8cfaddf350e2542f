"""Predicted per-device flops of sharded gathers against XLA's `cost_analysis()` (issue 14, fuzz
seed 16's small programs): the index bookkeeping XLA's partitioner adds to a gather whose indexed
dim is sharded, and the fill mask of `jnp.take` counted on its shards (`masked_gather.py`)."""

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc

F32 = jnp.float32


def predicted_and_compiled(fn, args, axes: dict[str, int]) -> tuple[float, float]:
    """(predicted, compiled) flops per device of `fn` under the data-parallel baseline."""
    mesh = tc.MeshSpec(axes)
    ana = tc.analyze(tc.trace(fn, *args))
    strategy = tc.baselines.data_parallel(ana, mesh)
    assert strategy is not None
    rep = tc.validate(fn, args, ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"))
    assert rep.numerics_ok
    return rep.predicted_flops, rep.compiled_flops


def lookup(rows: int, width: int, k: int):
    return {
        "x": jax.ShapeDtypeStruct((rows, width), F32),
        "i": jax.ShapeDtypeStruct((k,), jnp.int32),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rows", "axes"),
    [
        (4, {"data": 4}),  # one local row, the dim cut over the whole mesh (fuzz seed 16 #1357)
        (8, {"data": 4}),  # two local rows: the offset subtract per index
        (8, {"data": 2, "model": 2}),  # a dim cut over some mesh axes: the offset looked up
    ],
)
def test_a_gather_along_a_sharded_dim_tests_each_index_against_the_local_rows(rows, axes):
    """`x[i]` with x's rows sharded (the masked rule): a clamp, two compares, an or (and the
    offset subtract) per index, and a select per result element before the all-reduce; the
    unsharded gather counts none of it (0.48 of XLA before)."""
    predicted, compiled = predicted_and_compiled(
        lambda b: b["x"][b["i"]], (lookup(rows, 16, 1),), axes
    )
    assert predicted == compiled


@pytest.mark.slow
def test_a_take_with_fill_masks_on_its_result_shard_and_tests_every_index():
    """Fuzz seed 16 #1410: `jnp.take(x, i, axis=1)` with x's rows on 8 devices: each device
    selects its 8 result elements and tests the bounds of the one index (3 flops), 11 flops,
    not the global 67 / 8."""

    def fn(b):
        return jnp.take(b["x"], b["i"], axis=1)

    predicted, compiled = predicted_and_compiled(fn, (lookup(64, 32, 1),), {"data": 8})
    assert predicted == compiled
