"""Loop constants and carries share buffers with what they enter and leave the loop as (issue 10:
a gradient accumulation loop's parameters and accumulators were counted twice in memory)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.cost import CostOptions, estimate
from toast_core.cost.loop_buffers import buffer_aliases
from toast_core.ir import primitives as prim


def _accumulate(w, xs):
    def body(i, g):
        return g + jax.grad(lambda w: jnp.sum(jnp.tanh(xs[i] @ w)))(w)

    return jax.lax.fori_loop(0, xs.shape[0], body, jnp.zeros_like(w))


def _accumulating_loop():
    """`_accumulate` traced: (program, buffer aliases, its loop's start and end ops, the start's
    params)."""
    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    xs = jax.ShapeDtypeStruct((4, 8, 64), jnp.float32)
    prog = tc.trace(_accumulate, w, xs)
    (start,) = [op for op in prog.ops if op.primitive == prim.SCAN_START]
    (end,) = [op for op in prog.ops if op.primitive == prim.SCAN_END]
    return prog, buffer_aliases(prog), start, end, dict(start.params)


def test_scan_constants_and_carries_alias_their_operands():
    prog, alias, start, end, params = _accumulating_loop()
    n = params["num_consts"] + params["num_carry"]
    pairs = list(zip(start.results[:n], start.operands[:n]))
    literal = [(r, o) for r, o in pairs if prog.values[o].role in ("literal", "constant")]
    assert all(alias[r] == o or alias[r] == alias.get(o) for r, o in pairs if (r, o) not in literal)
    # the counter starts from a literal 0, read-only: XLA copies it into the loop's state
    assert literal and all(r not in alias for r, _ in literal)
    # the final carry is the carry buffer, itself the initial value's
    assert (
        alias[end.results[0]] == alias.get(end.operands[0], end.operands[0])
        or end.operands[0] in alias
    )
    assert len(alias) >= n


def test_a_carry_updated_in_place_shares_the_initial_carrys_buffer():
    prog, alias, start, end, params = _accumulating_loop()
    first_carry = params["num_consts"]
    init = start.operands[first_carry + 1]  # (i, g): g's zeros
    updated = end.operands[1]  # g + dg, made in the body
    assert alias[updated] == alias.get(init, init)
    assert alias[end.results[1]] == alias.get(init, init)


def _swap(x, y):
    def body(i, c):
        a, b = c
        new_a = jnp.sin(b)  # made while the old a is still to be read
        new_b = a + 1.0
        return new_a, new_b

    return jax.lax.fori_loop(0, 3, body, (x, y))


def test_a_carry_read_after_its_update_is_made_keeps_its_own_buffer():
    x = jax.ShapeDtypeStruct((16,), jnp.float32)
    prog = tc.trace(lambda x, y: _swap(x * 2.0, y * 2.0), x, x)
    alias = buffer_aliases(prog)
    (start,) = [op for op in prog.ops if op.primitive == prim.SCAN_START]
    (end,) = [op for op in prog.ops if op.primitive == prim.SCAN_END]
    n_consts, n_carry = dict(start.params)["num_consts"], dict(start.params)["num_carry"]
    carry_ops = start.operands[n_consts : n_consts + n_carry]
    new_a, new_b = end.operands[n_carry - 2 : n_carry]
    a0, b0 = carry_ops[-2:]
    assert new_a not in alias  # XLA copies: the old a is read (by new_b) after new_a is made
    assert alias[new_b] == alias.get(b0, b0)


def test_loop_buffers_are_not_counted_twice():
    w = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    xs = jax.ShapeDtypeStruct((4, 8, 256), jnp.float32)
    ana = tc.analyze(tc.trace(_accumulate, w, xs))
    mesh = tc.MeshSpec({"data": 8})
    report = estimate(ana, tc.Strategy(()), mesh, tc.hardware("tpu-v5e"), CostOptions())
    start = next(i for i, op in enumerate(ana.program.ops) if op.primitive == prim.SCAN_START)
    # Entering the loop holds w (256 KiB), the zero accumulator (256 KiB) and xs (32 KiB): the
    # body's view of w and its carry are those buffers, not two more (4.25 x 256 KiB before).
    assert report.memory_timeline[start] < 2.5 * 256 * 256 * 4


@pytest.mark.slow
def test_grad_accum_memory_within_30_percent_of_compiled():
    w = MODEL_ZOO["grad-accum"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    mesh = tc.MeshSpec({"data": 2, "model": 4})
    plan = tc.baselines.all(ana, mesh)["replicated"][0]
    rep = tc.validate(
        w.fn, w.args, ana, plan, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"), check_numerics=False
    )
    assert abs(rep.memory_ratio - 1.0) <= 0.30


def _fsdp_grad_accum():
    w = MODEL_ZOO["grad-accum"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    mesh = tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2})
    return w, ana, mesh


def test_weights_gathered_for_a_loop_are_held_until_it_ends():
    _, ana, mesh = _fsdp_grad_accum()
    plan = tc.baselines.all(ana, mesh)["fsdp"][0]
    report = estimate(ana, plan, mesh, tc.hardware("tpu-v5e"), CostOptions(donate_outputs=False))
    ops = ana.program.ops
    start = next(op.index for op in ops if op.primitive == prim.SCAN_START)
    end = next(op.index for op in ops if op.primitive == prim.SCAN_END)
    weights = sum(ana.program.values[v].nbytes for v in ana.program.inputs[:2])  # w1, w2
    # Every body op holds the whole w1 and w2, gathered once before the loop (the all-gathers
    # read by `scan_start`), beside the gradient accumulators of their size: 2 x 96 KiB. Priced
    # at `scan_start` only, the body ops held the accumulators and their own temporaries.
    body = report.memory_timeline[start + 1 : end]
    assert min(body) >= 2 * weights


@pytest.mark.slow
@pytest.mark.parametrize("plan_name", ["fsdp", "fsdp_megatron"])
def test_fsdp_grad_accum_memory_matches_compiled(plan_name):
    w, ana, mesh = _fsdp_grad_accum()
    plan = tc.baselines.all(ana, mesh)[plan_name][0]
    rep = tc.validate(
        w.fn, w.args, ana, plan, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"), check_numerics=False
    )
    # Measured 0.77 (fsdp) and 0.80 (fsdp_megatron) with the gathered weights priced at the
    # loop's entry only, 1.01 held through the loop.
    assert abs(rep.memory_ratio - 1.0) <= 0.15


def test_the_counter_step_is_written_in_place():
    """`fori_loop`'s body reads `xs[i]` after `i + 1` is made: XLA still writes the step over
    the counter and copies the old value for those readers (the copy `loop_state_buffers`
    counts; fuzz seed 17 #841)."""
    prog, alias, start, end, params = _accumulating_loop()
    counter = start.results[params["num_consts"]]
    step = end.operands[0]
    assert prog.values[counter].shape == () and prog.values[step].shape == ()
    assert any(
        op.index > prog.producers()[step] and counter in op.operands for op in prog.ops[: end.index]
    )
    assert alias[step] == counter
