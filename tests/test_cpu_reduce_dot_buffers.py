"""Two buffer rules of XLA:CPU's memory (issue 14, fuzz seed 15): a reduction its tree
reduction splits stores the operand a fusion would have computed in registers, and a dot (or
convolution) never writes its result over an operand it reads last."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost.cpu_buffers import (
    broadcasts_per_layout,
    dot_broadcasts,
    dot_operand_copies,
    tree_reduced_operands,
)
from toast_core.cost.fusion import materialized

HW = tc.hardware("tpu-v5e")
MESH_8 = tc.MeshSpec({"data": 8})


def _summed(x):
    return jnp.sum(jnp.tanh(x) * 2.0 + x)


def _rows(shape):
    prog = tc.analyze(tc.trace(_summed, jax.ShapeDtypeStruct(shape, jnp.float32))).program
    return [row[3] for row in tree_reduced_operands(prog, materialized(prog))]


def test_a_tree_reduced_operand_is_stored_with_its_windows():
    # x[128, 4]: 512 elements, a reduced dim over 32: the operand and 4 x 1 window results
    assert _rows((128, 4)) == [1.0, 4 / 512]
    assert _rows((2000,)) == [1.0, 63 / 2000]


@pytest.mark.parametrize("shape", [(32, 32), (64, 64), (8, 16)])
def test_a_reduction_the_cpu_does_not_split_fuses_its_operand(shape):
    # no reduced dim over 32, or 4,096 elements or more: one fused reduce (measured: none)
    assert _rows(shape) == []


def _broadcast_dot(params, batch):
    """Fuzz #183: the dot that makes the output reads a broadcast last."""
    v2 = jnp.broadcast_to(batch["x1"][None], (8, 32))
    return (jnp.einsum("ab,az->bz", v2, params["w3"]),)


def _broadcast_dot_args():
    params = {"w3": jax.ShapeDtypeStruct((8, 8), jnp.float32)}
    return params, {"x1": jax.ShapeDtypeStruct((32,), jnp.float32)}


def test_a_dot_never_writes_over_an_operand_it_reads_last():
    ana = tc.analyze(tc.trace(_broadcast_dot, *_broadcast_dot_args()))
    strategy = tc.baselines.all(ana, MESH_8)["replicated"][0]
    # measured: 384 bytes of arguments, the 1,024-byte output and the broadcast's 1,024 bytes
    # of temporaries beside it (it was placed in the output's allocation: 1,408)
    assert predicted_cpu_memory_bytes(ana, strategy, MESH_8, HW) == 2432


def test_a_full_reduction_of_a_reshape_reduces_the_reshaped_value():
    # XLA folds the reshape into the reduce: sum(v.reshape(-1)) with v [12, 3, 8] has no dim
    # over 32, so its tree reduction does not split it (fuzz seed 15 #17)
    def flat(x):
        return jnp.sum((jnp.tanh(x) * 2.0).reshape(-1))

    prog = tc.analyze(tc.trace(flat, jax.ShapeDtypeStruct((12, 3, 8), jnp.float32))).program
    assert tree_reduced_operands(prog, materialized(prog)) == []
    assert _rows((288,)) == [1.0, 9 / 288]  # the same elements, flat from the start


def _self_outer(params, batch):
    """Fuzz #72: `v @ v.T` with v a broadcast of x[8] to [8, 64]."""
    v = jnp.broadcast_to(batch["x1"][None], (8, 64))
    return (jnp.einsum("ab,cb->ac", v, v),)


def test_a_dot_writing_a_partial_leaves_the_output_allocation_to_its_operands():
    # data parallel on 2x2x2 cuts the contracted dim: the dot writes a partial temporary and
    # the all-reduce the output, so the broadcast it reads last may sit in the output's
    # allocation until then (measured: 32 + 256 + 256 = 544 bytes)
    args = ({}, {"x1": jax.ShapeDtypeStruct((64,), jnp.float32)})
    ana = tc.analyze(tc.trace(_self_outer, *args))
    mesh = tc.MeshSpec({"a": 2, "b": 2, "c": 2})
    strategy = tc.baselines.all(ana, mesh)["data_parallel"][0]
    assert predicted_cpu_memory_bytes(ana, strategy, mesh, HW) == 544


def _seed_loss(p, x):
    return jnp.mean(jnp.einsum("abcd,de->abce", x, p["w"]))


def _seed_dots(params, batch):
    """Fuzz #86: a two-micro-batch accumulation of the gradients of `mean(x @ w)`: the mean's
    seed broadcast is read by the weight-gradient dot as [32, 256] and by the (loop-invariant)
    input-gradient dot as [256, 32]."""

    def body(i, acc):
        g = jax.grad(_seed_loss, argnums=(0, 1))(params, batch["x"][i])
        return acc[0] + g[0]["w"], acc[1] + g[1]

    zeros = (jnp.zeros((8, 32)), jnp.zeros((2, 16, 8, 8)))
    return jax.lax.fori_loop(0, 2, body, zeros)


def _seed_dots_args():
    params = {"w": jax.ShapeDtypeStruct((8, 32), jnp.float32)}
    return params, {"x": jax.ShapeDtypeStruct((2, 2, 16, 8, 8), jnp.float32)}


def test_a_broadcast_only_dots_read_in_a_loop_is_made_once_per_layout():
    ana = tc.analyze(tc.trace(_seed_dots, *_seed_dots_args()))
    prog = ana.program
    mat = materialized(prog)
    (seed,) = dot_broadcasts(prog, mat)
    assert prog.values[seed].shape == (2, 16, 8, 32)
    rows = broadcasts_per_layout(prog, mat)
    readers = sorted(o for o, _ in prog.uses()[seed])
    # the two dots read it in two layouts: a broadcast for each, made just before it
    assert [(lo, hi) for _, lo, hi, *_ in rows] == [(o, o) for o in readers]
    # and no layout copy of it besides
    assert seed not in dot_operand_copies(prog, mat)[0].tolist()


def test_outside_loops_a_broadcast_keeps_its_buffer():
    args = _seed_dots_args()
    args = (args[0], {"x": jax.ShapeDtypeStruct((2, 16, 8, 8), jnp.float32)})
    fn = jax.grad(_seed_loss, argnums=(0, 1))
    prog = tc.analyze(tc.trace(lambda p, b: fn(p, b["x"]), *args)).program
    assert dot_broadcasts(prog, materialized(prog)) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "fn, args, within",
    [
        (lambda x: (_summed(x),), (jax.ShapeDtypeStruct((128, 4), jnp.float32),), 0.05),
        (lambda x: (_summed(x),), (jax.ShapeDtypeStruct((2000,), jnp.float32),), 0.05),
        (_broadcast_dot, _broadcast_dot_args(), 0.05),
        # measured 76,884 bytes: 0.89 of them (1.32 with the seed held across both dots and a
        # copy beside it); the rest is the loop's scheduling, which the model does not follow
        (_seed_dots, _seed_dots_args(), 0.15),
    ],
    ids=["tree-reduced-128x4", "tree-reduced-2000", "dot-reads-broadcast-last", "seed-in-a-loop"],
)
def test_cpu_reduce_and_dot_buffers_match_xla(fn, args, within):
    ana = tc.analyze(tc.trace(fn, *args))
    strategy = tc.baselines.all(ana, MESH_8)["replicated"][0]
    check = tc.validate(fn, args, ana, strategy, tc.jax_mesh(MESH_8), HW, check_numerics=False)
    assert abs(check.predicted_memory_bytes / check.compiled_memory_bytes - 1) <= within, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )
