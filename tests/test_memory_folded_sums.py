"""A sum over dims along which its operand is a broadcast (or of size 1) is a multiply (a
reshape) to XLA's simplifier: a cheap elementwise op fused into its readers, with no buffer
(`fusion.sums_of_broadcasts`). The gradients of `mean(expand_dims(v, 1))` and of
`mean(broadcast_to(s[None], (16,)))` are such sums; fuzz seed 19 #386, an SGD step data
parallel on 2x4, was 1.36 of XLA's bytes (three 64-byte scalar blocks XLA never makes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import toast_core as tc
from toast_core.cost.fusion import fused_away, materialized

MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})


def _sums_fused(fn, *args) -> list[bool]:
    """Whether each reduce_sum's result of `fn`'s gradient is fused away in the memory view."""
    prog = tc.analyze(tc.trace(fn, *args)).program
    fused = fused_away(prog, materialized(prog))
    return [fused[op.results[0]] for op in prog.ops if op.primitive == "reduce_sum"]


def test_a_sum_of_a_broadcast_is_fused_into_its_readers():
    s = jax.ShapeDtypeStruct((4,), jnp.float32)

    def spread(x):  # sum over the broadcast dim, read by a wider loop
        b = jnp.broadcast_to(jnp.sum(x * x)[None], (16,))
        return jnp.exp(jnp.sum(b)[None] * x)

    assert _sums_fused(spread, s) == [False, True]

    def unit(x):  # sum over a unit dim of a scalar's broadcast
        b = jnp.broadcast_to(jnp.sum(x * x), (1, 4))
        return jnp.exp(jnp.sum(b, axis=0) * x)

    assert _sums_fused(unit, s) == [False, True]


def test_a_sum_over_a_unit_dim_of_an_array_stays_a_buffer():
    # a bitcast of the buffer XLA stores for it (fuzz seed 19 #3's [1, 32] gradient)
    def unit(x, y):  # read by a wider loop
        return jnp.exp(jnp.sum(jnp.exp(x)[None], axis=0)[None, :] * y)

    x, y = jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((3, 4), jnp.float32)
    assert _sums_fused(unit, x, y) == [False]


def test_a_sum_of_an_array_read_by_a_wider_loop_stays_a_buffer():
    def centred(x):
        return jnp.exp(x - jnp.sum(x, axis=1, keepdims=True))

    assert _sums_fused(centred, jax.ShapeDtypeStruct((4, 8), jnp.float32)) == [False]


def _step(params, batch):
    """Fuzz seed 19 #386: SGD on `mean(expand_dims(max(v, cumsum(v, reverse)), 1))`."""

    def loss(p):
        v3 = batch["x1"] @ p["w2"]
        v5 = jnp.maximum(v3, lax.cumsum(v3, axis=0, reverse=True))
        return jnp.mean(jnp.expand_dims(v5, 1))

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


@pytest.mark.slow
def test_data_parallel_step_with_folded_sums_matches_xla():
    args = (
        {"w2": jax.ShapeDtypeStruct((8, 2), jnp.float32)},
        {"x1": jax.ShapeDtypeStruct((8,), jnp.float32)},
    )
    ana = tc.analyze(tc.trace(_step, *args))
    strategy = tc.baselines.all(ana, MESH_2X4)["data_parallel"][0]
    check = tc.validate(
        _step, args, ana, strategy, tc.jax_mesh(MESH_2X4), "tpu-v5e", check_numerics=False
    )
    # measured 176 bytes (a 136-byte block: the all-reduce and two cumsums' windows); the
    # model had 240 with the gradient's scalar sums of broadcasts in it
    assert abs(check.memory_ratio - 1) <= 0.10, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )
