"""Collectives on loop constants run once per loop, not once per iteration (XLA hoists them).

The judge: XLA's optimized HLO, whose loop bodies run `known_trip_count` times
(`hlo_loops.computation_counts`); a collective in the entry computation runs once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from lookup import dim_name

import toast_core as tc
from toast_core.apply.hlo import parse_collectives
from toast_core.apply.hlo_loops import computation_counts
from toast_core.cost import evaluator
from toast_core.cost.hoist import use_counts

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 2, "model": 4})
MICRO = 4


def accumulate(w, xs):
    """Sum over microbatches xs[i] of tanh(xs[i] @ w): xs is a loop constant the body slices."""

    def body(i, acc):
        x = lax.dynamic_index_in_dim(xs, i, keepdims=False)
        return acc + jnp.tanh(x @ w).sum(0)

    return lax.fori_loop(0, MICRO, body, jnp.zeros(w.shape[1], jnp.float32))


def _args():
    k1, k2 = jax.random.split(jax.random.key(0))
    w = jax.random.normal(k1, (32, 64), jnp.float32)
    xs = jax.random.normal(k2, (MICRO, 16, 32), jnp.float32)
    return w, xs


def _plan():
    """The microbatch dim of xs on `data`: the body's dynamic slice needs xs gathered."""
    ana = tc.analyze(tc.trace(accumulate, *_args()))
    return ana, tc.Strategy.make(ana, {dim_name(ana, "xs", 0): ("data",)}, {}, "micro")


def _gathers(report):
    return [c for c in report.collectives if c.kind == "all-gather"]


def test_a_gather_of_a_loop_constant_counts_once():
    ana, plan = _plan()
    report = tc.estimate(ana, plan, MESH, HW)
    (gather,) = _gathers(report)
    assert ana.program.ops[gather.op].trip_count == MICRO  # read in the body...
    assert gather.count == 1  # ...gathered once, before the loop
    assert report.collective_bytes_by_kind()["all-gather"] == 16 * 32 * MICRO * 4
    # The search's fast path prices it alike.
    ev = evaluator(ana, MESH, HW)
    assert ev.score(plan.fine_masks(ana, MESH)).comm_s == pytest.approx(report.comm_s, rel=1e-12)


def test_a_partial_sum_in_the_body_still_counts_every_iteration():
    """w's output dim on `model` is contracted by nothing; xs's feature dim on `model` makes the
    matmul a partial sum in the body: its all-reduce runs once per iteration."""
    ana = tc.analyze(tc.trace(accumulate, *_args()))
    plan = tc.Strategy.make(ana, {dim_name(ana, "xs", 2): ("model",)}, {}, "k")
    report = tc.estimate(ana, plan, MESH, HW)
    sums = [c for c in report.collectives if c.kind == "all-reduce"]
    assert sums and all(c.count == MICRO for c in sums)


def test_constants_of_nested_loops_count_at_the_loop_they_enter():
    """An outer-loop constant read in the inner body runs once; an inner-loop constant made in
    the outer body runs once per outer iteration; a carry runs every inner iteration."""

    def nested(a):
        def outer(i, acc):
            b = acc * 2.0  # made in the outer body, a constant of the inner loop

            def inner(j, c):
                return c + a + b

            return lax.fori_loop(0, 5, inner, acc)

        return lax.fori_loop(0, 3, outer, jnp.zeros_like(a))

    prog = tc.trace(nested, jnp.ones(8, jnp.float32))
    (add_a, add_b) = [op for op in prog.ops if op.primitive == "add" and op.trip_count == 15]
    uses = [(add_a.index, v) for v in add_a.operands] + [(add_b.index, add_b.operands[1])]
    counts, _ = use_counts(prog, uses)
    # add_a = carry + a: the carry every iteration, a (an outer constant) once.
    assert counts.tolist() == [15.0, 1.0, 3.0]


@pytest.mark.slow
def test_predicted_gather_bytes_equal_the_compiled_ones_counting_loop_trips():
    ana, plan = _plan()
    report = tc.estimate(ana, plan, MESH, HW)
    check = tc.validate(accumulate, _args(), ana, plan, tc.jax_mesh(MESH), HW)
    assert check.numerics_ok
    counts = computation_counts(check.hlo_text)
    compiled = [
        (c.result_bytes, counts.get(c.computation, 1))
        for c in parse_collectives(check.hlo_text)
        if c.kind == "all-gather"
    ]
    assert compiled and all(n == 1 for _, n in compiled)  # XLA hoisted them out of the loop
    predicted = sum(c.result_bytes * c.count for c in _gathers(report))
    assert predicted == sum(b * n for b, n in compiled)
    assert check.predicted_step_time_s == pytest.approx(check.compiled_step_time_s, rel=0.10)
    assert np.isfinite(check.compiled_step_time_s)
