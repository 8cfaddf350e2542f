"""A `top_k` that keeps its whole dim and whose indices nothing reads is XLA's sort of the values
alone: the indices are never made (`cost/top_k_sorts.py`; fuzz seed 17 #867, 1.42 of XLA's
bytes with them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from xla_memory import replicated_memory

import toast_core as tc
from toast_core.cost.top_k_sorts import whole_dim_sorts

MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})


def _args():
    return {}, {"x": jax.ShapeDtypeStruct((16, 8, 2), jnp.float32)}


def _values_reshaped(params, batch):
    """The values of a top_k of the whole last dim, reshaped: XLA's bitcast of its sort."""
    return (lax.top_k(batch["x"], 2)[0].reshape(128, 2),)


def _program(f, args=None):
    return tc.analyze(tc.trace(f, *(args or _args()))).program


def test_the_unread_indices_of_a_whole_dim_top_k_are_not_made():
    prog = _program(_values_reshaped)
    (op,) = [op for op in prog.ops if op.primitive == "top_k"]
    (sorted_op,) = [o for o in whole_dim_sorts(prog).ops if o.primitive == "top_k"]
    assert sorted_op.results == op.results[:1]


def test_a_top_k_whose_indices_are_read_or_that_keeps_fewer_is_unchanged():
    def indices(params, batch):
        return (lax.top_k(batch["x"], 2)[1],)

    def fewer(params, batch):
        return (lax.top_k(batch["x"], 1)[0],)

    prog = _program(indices)
    assert whole_dim_sorts(prog) is prog
    prog = _program(fewer)
    assert whole_dim_sorts(prog) is prog


@pytest.mark.slow
def test_whole_dim_top_k_memory_matches_xla():
    """XLA's buffers: the parameter and the sort's values, the output's (2,048 bytes); with the
    unread s32 indices the model had 3,072."""
    predicted, compiled = replicated_memory(_values_reshaped, _args(), MESH_2X4)
    assert predicted == compiled == 2048, (predicted, compiled)


def test_a_dead_top_k_keeps_nothing():
    """Fuzz seed 18 #619: a top_k only the loss reads, inside a while loop's gradient
    accumulation, is dead; `without_dead_ops` leaves it no operand, which `whole_dim_sorts` must
    pass over (it raised IndexError in every search and validation of the program)."""
    from fuzz.pipeline import Front, front
    from fuzz.programs import generate

    outcomes = list(front(generate(18, 619), ["8"]))
    assert [o for o in outcomes if not isinstance(o, Front) and o.kind != "ok"] == []
    ana = next(o for o in outcomes if isinstance(o, Front)).ana
    assert any(op.primitive == "top_k" for op in ana.program.ops)


def _two_calls_and_a_sort(x):
    """Two TopK calls (a repeat of the first merged by CSE), a whole-dim top_k (a sort, no
    call) and a dead top_k (removed)."""
    a = lax.top_k(x, 2)[0] * 2.0
    b = lax.top_k(x * 3.0, 3)[0][:, :2]
    _ = lax.top_k(x + 1.0, 2)
    return a + b + lax.top_k(x, 2)[0], lax.top_k(x, 16)[0] * 2.0


@pytest.mark.parametrize(
    ("fn", "calls"),
    [(lambda x: lax.top_k(x, 2)[0] * 2.0, 1), (_two_calls_and_a_sort, 2)],
    ids=["one", "two"],
)
def test_each_top_k_call_counts_minus_one_flop_as_xla_does(fn, calls):
    """XLA's cost analysis marks a custom call's flops unknown, -1, and adds it to the total
    (fuzz seed 19 #117: a lone `top_k`, 0 predicted of XLA's 1 flop). Held to XLA's count."""
    from xla_flops import unsharded_flops

    from toast_core.cost.top_k_sorts import top_k_call_flops

    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    assert top_k_call_flops(tc.trace(fn, x)) == -calls
    predicted, compiled = unsharded_flops(fn, x)
    assert predicted == compiled
