"""Two buffer rules of XLA:CPU's memory (issue 14, fuzz seed 15): a reduction its tree
reduction splits stores the operand a fusion would have computed in registers, and a dot (or
convolution) never writes its result over an operand it reads last."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost.cpu_buffers import tree_reduced_operands
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


@pytest.mark.slow
@pytest.mark.parametrize(
    "fn, args",
    [
        (lambda x: (_summed(x),), (jax.ShapeDtypeStruct((128, 4), jnp.float32),)),
        (lambda x: (_summed(x),), (jax.ShapeDtypeStruct((2000,), jnp.float32),)),
        (_broadcast_dot, _broadcast_dot_args()),
    ],
    ids=["tree-reduced-128x4", "tree-reduced-2000", "dot-reads-broadcast-last"],
)
def test_cpu_reduce_and_dot_buffers_match_xla(fn, args):
    ana = tc.analyze(tc.trace(fn, *args))
    strategy = tc.baselines.all(ana, MESH_8)["replicated"][0]
    check = tc.validate(fn, args, ana, strategy, tc.jax_mesh(MESH_8), HW, check_numerics=False)
    assert abs(check.predicted_memory_bytes / check.compiled_memory_bytes - 1) <= 0.05, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )
