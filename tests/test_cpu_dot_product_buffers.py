"""XLA:CPU's dot products (issue 14, fuzz seed 16): a dot with no free dim over 1 on either side
on a device is a multiply and a fused reduce, so the values the model stores only for it are not
stored (`cpu_buffers.dot_product_fused`). Fuzz seed 16 #1367 (data parallel on 2x2x2) was 1.64
of XLA's bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.cost.cpu_buffers import dot_product_fused
from toast_core.cost.dot_products import is_dot_product
from toast_core.cost.fusion import fused_away, materialized

HW = tc.hardware("tpu-v5e")
MESH_2X2X2 = tc.MeshSpec({"a": 2, "b": 2, "c": 2})


def _program(fn, *shapes):
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return tc.analyze(tc.trace(fn, *args)).program


def _dot(prog):
    return next(op for op in prog.ops if op.primitive == "dot_general")


def _stored(prog):
    return [not f for f in fused_away(prog, materialized(prog))]


def _global(prog):
    return lambda op, pos: prog.values[prog.ops[op].operands[pos]].shape


@pytest.mark.parametrize(
    "shapes, spec, reduced",
    [
        # measured in XLA:CPU's compiled HLO: a `reduce` fusion, or still a `dot`
        (((64,), (64,)), "a,a->", True),
        (((64,), (64, 1)), "a,az->z", True),
        (((4, 64), (4, 64)), "bk,bk->b", True),
        (((2,), (2, 8)), "a,az->z", False),
        (((16, 16), (16,)), "ab,b->a", False),
        (((3, 4), (4, 5)), "ab,bc->ac", False),
    ],
)
def test_only_dots_without_free_dims_are_dot_products(shapes, spec, reduced):
    prog = _program(lambda x, w: jnp.einsum(spec, jnp.sin(x), w), *shapes)
    assert is_dot_product(_dot(prog), _global(prog)) is reduced


def _checkpoint_dot(params, batch):
    """Fuzz seed 16 #1367: `x[2] @ w[2, 8]`, a dot product once w's 8 columns are split 8 ways."""
    v3 = jax.checkpoint(lambda t: jnp.sin(t) * jnp.tanh(t))(batch["x2"])
    return (v3 @ params["w4"],)


def _checkpoint_dot_args():
    return {"w4": jax.ShapeDtypeStruct((2, 8), jnp.float32)}, {
        "x2": jax.ShapeDtypeStruct((2,), jnp.float32)
    }


def test_the_device_shapes_decide():
    ana = tc.analyze(tc.trace(_checkpoint_dot, *_checkpoint_dot_args()))
    prog = ana.program
    assert dot_product_fused(prog, _stored(prog)) == []  # [2] @ [2, 8] stays a dot
    (v3,) = [v.id for v in prog.values if v.shape == (2,) and v.role == "intermediate"][-1:]
    split = lambda op, pos: (2, 1) if pos == 1 else (2,)  # noqa: E731  (w's 8 columns split 8 ways)
    assert dot_product_fused(prog, _stored(prog), split) == [v3]


@pytest.mark.slow
@pytest.mark.parametrize(
    "fn, args, mesh, baseline",
    [
        (_checkpoint_dot, _checkpoint_dot_args(), MESH_2X2X2, "data_parallel"),
    ],
    ids=["checkpoint-dp"],
)
def test_dot_product_memory_matches_xla(fn, args, mesh, baseline):
    ana = tc.analyze(tc.trace(fn, *args))
    strategy = tc.baselines.all(ana, mesh)[baseline][0]
    check = tc.validate(fn, args, ana, strategy, tc.jax_mesh(mesh), HW, check_numerics=False)
    assert abs(check.predicted_memory_bytes / check.compiled_memory_bytes - 1) <= 0.15, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )
