"""A loop on XLA:CPU (issue 14, fuzz seed 16 #856): a carry whose initial value is a program
input is copied into the loop's state (the arguments are not donated), and the state tuple's
table and counter are small temporaries while the loop runs (`loop_buffers.
buffer_aliases`, `cpu_buffers.loop_state_buffers`). #856 was 0.17 of XLA's bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import toast_core as tc
from toast_core.cost.cpu_buffers import LOOP_STATE_BUFFERS, loop_state_buffers
from toast_core.cost.loop_buffers import buffer_aliases
from toast_core.ir import primitives as prim

HW = tc.hardware("tpu-v5e")
MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})


def _smoothed(params, batch):
    """Fuzz seed 16 #856: a `fori_loop` over an input, its result the output."""
    return (lax.fori_loop(0, 3, lambda i, c: 0.9 * c + 0.1 * jnp.tanh(c), batch["x1"]),)


def _args():
    return {}, {"x1": jax.ShapeDtypeStruct((4, 8), jnp.float32)}


def _program(fn):
    return tc.analyze(tc.trace(fn, *_args())).program


def test_an_updated_input_carry_is_a_buffer_of_its_own():
    prog = _program(_smoothed)
    start = next(op for op in prog.ops if op.primitive == prim.SCAN_START)
    alias = buffer_aliases(prog)
    carry = start.results[int(dict(start.params)["num_consts"])]
    assert carry not in alias  # the copy XLA makes of x, not x itself
    (out,) = prog.outputs
    assert alias.get(out) == carry


def test_a_carry_made_in_the_step_is_updated_in_place():
    def scaled(params, batch):
        return (lax.fori_loop(0, 3, lambda i, c: 0.9 * c + 0.1 * jnp.tanh(c), batch["x1"] * 2.0),)

    prog = _program(scaled)
    start = next(op for op in prog.ops if op.primitive == prim.SCAN_START)
    carry = start.results[int(dict(start.params)["num_consts"])]
    init = start.operands[int(dict(start.params)["num_consts"])]
    assert buffer_aliases(prog).get(carry) == init  # XLA's loop writes over `x1 * 2`


def test_each_loop_holds_its_state():
    prog = _program(_smoothed)
    rows = loop_state_buffers(prog)
    assert len(rows) == 1
    _, lo, hi, scale, count, small = rows[0]
    assert prog.ops[lo].primitive == prim.SCAN_START and prog.ops[hi].primitive == prim.SCAN_END
    assert (scale, count, small) == (0.0, 0, LOOP_STATE_BUFFERS)


@pytest.mark.slow
def test_loop_memory_matches_xla():
    args = _args()
    ana = tc.analyze(tc.trace(_smoothed, *args))
    strategy = tc.baselines.all(ana, MESH_2X4)["data_parallel"][0]
    check = tc.validate(
        _smoothed, args, ana, strategy, tc.jax_mesh(MESH_2X4), HW, check_numerics=False
    )
    # measured 193 bytes: 32 of x, the 32-byte copy in the output's allocation, 129 of state
    assert abs(check.predicted_memory_bytes / check.compiled_memory_bytes - 1) <= 0.2, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )
