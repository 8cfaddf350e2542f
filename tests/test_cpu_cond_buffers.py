"""A `cond` on XLA:CPU: the branch roots and the result are one buffer (`loop_buffers.
_branch_roots`: XLA's dataflow gives a conditional no value of its own), and the conditional
runs on tuples whose tables, with the branch index, are small temporaries
(`cpu_buffers.cond_state_buffers`). Fuzz seed 19 #681 was 1.59 of XLA's bytes, #1522 0.36."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from xla_memory import replicated_memory

import toast_core as tc
from toast_core.cost.cpu_buffers import COND_STATE_BUFFERS, cond_state_buffers
from toast_core.cost.loop_buffers import buffer_aliases
from toast_core.ir import primitives as prim

MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})
MESH_2X2X2 = tc.MeshSpec({"a": 2, "b": 2, "c": 2})


def _clipped_cond(params, batch):
    """Fuzz seed 19 #681 as the fuzzer writes it: an SGD step whose loss reads a cond of a
    temporary."""

    def forward(params, batch):
        v3 = jnp.einsum("abcd,bz->acdz", batch["x1"], params["w2"])
        v4 = jnp.minimum(batch["x1"], 0.3)
        v5 = lax.cond(jnp.sum(v4) > 0, lambda t: 2.0 * t, jnp.tanh, v4)
        return (v3, v5, jnp.transpose(v4, (1, 2, 3, 0)))

    def loss_fn(params, batch):
        return sum(jnp.mean(o) for o in forward(params, batch)) + 0.0, None

    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def _cond_output(params, batch):
    """Fuzz seed 19 #1522: the cond's result is an output."""
    x = batch["x1"]
    return (jnp.einsum("a,a->", x, x), lax.cond(jnp.sum(x) > 0, lambda t: 2.0 * t, jnp.tanh, x))


def _args(shape):
    params = {"w2": jax.ShapeDtypeStruct((4, 8), jnp.float32)} if len(shape) == 4 else {}
    return params, {"x1": jax.ShapeDtypeStruct(shape, jnp.float32)}


def _program(fn, shape):
    return tc.analyze(tc.trace(fn, *_args(shape))).program


def test_branch_roots_and_result_share_a_buffer():
    prog = _program(_clipped_cond, (24, 4, 16, 1))
    end = next(op for op in prog.ops if op.primitive == prim.COND_END)
    alias = buffer_aliases(prog)
    first, second = end.operands
    assert first not in alias  # the first branch's root owns it
    assert alias[second] == first and alias[end.results[0]] == first


def test_an_output_result_owns_the_buffer():
    prog = _program(_cond_output, (32,))
    end = next(op for op in prog.ops if op.primitive == prim.COND_END)
    alias = buffer_aliases(prog)
    assert all(alias[x] == end.results[0] for x in end.operands)


def test_each_cond_holds_its_tuples_and_index():
    prog = _program(_cond_output, (32,))
    ((_, lo, hi, scale, count, small),) = cond_state_buffers(prog)
    assert prog.ops[lo].primitive == prim.COND_START and prog.ops[hi].primitive == prim.COND_END
    assert (scale, count, small) == (0.0, 0, COND_STATE_BUFFERS)


def test_cond_memory_matches_xla():
    # measured 31,068 bytes for #681 (the model had 49,428, 1.59), 412 for #1522 (404: the
    # branch roots as temporaries in place of the three small buffers): the branch
    # roots in the result's buffer (the output's allocation for #1522) and three small buffers
    cases = ((_clipped_cond, (24, 4, 16, 1), MESH_2X4), (_cond_output, (32,), MESH_2X2X2))
    for fn, shape, mesh in cases:
        predicted, compiled = replicated_memory(fn, _args(shape), mesh)
        assert abs(predicted / compiled - 1) <= 0.3, (fn.__name__, predicted, compiled)
