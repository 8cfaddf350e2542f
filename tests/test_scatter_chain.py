"""Partial sums XLA turns into reduce-scatters: at their uses, or after size-1 reshapes only
(`toast_core.cost.scatter_chain`). The compiled checks are in test_compiled_collectives.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_core as tc
from toast_core.cost.incremental import Incremental
from toast_core.cost.scatter_chain import scatter_values

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 8})


def bias_step(lr: float):
    """A train step whose bias gradient JAX computes as `reduce_sum` [B, S, D] -> [D], then
    `reshape` -> [1, 1, D] and `reduce_sum` over the size-1 dims (the transposes of the bias's
    broadcast), read by the update `b - lr * g`: with lr = 1 the update reads the gradient
    itself, else through a multiply."""

    def step(params, x):
        def loss(p):
            return jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2)

        grads = jax.grad(loss)(params)
        if lr == 1.0:
            return jax.tree.map(lambda a, g: a - g, params, grads)
        return jax.tree.map(lambda a, g: a - lr * g, params, grads)

    f32 = jnp.float32
    params = {"w": jax.ShapeDtypeStruct((64, 64), f32), "b": jax.ShapeDtypeStruct((64,), f32)}
    return step, (params, jax.ShapeDtypeStruct((16, 8, 64), f32))


@functools.cache
def _analysis(lr: float):
    fn, args = bias_step(lr)
    return tc.analyze(tc.trace(fn, *args, param_argnums=(0,)))


def _bias_gradient_op(ana) -> int:
    """The `reduce_sum` [B, S, D] -> [D] of the bias gradient."""
    prog = ana.program
    (op,) = [
        o
        for o in prog.ops
        if o.primitive == "reduce_sum" and prog.values[o.operands[0]].shape == (16, 8, 64)
    ]
    return op.index


def _collective_of(report, op: int):
    (c,) = [c for c in report.collectives if c.op == op]
    return c


def test_the_chain_follows_size_one_reshapes_to_the_value_the_update_reads():
    ana = _analysis(1.0)
    prog = ana.program
    op = _bias_gradient_op(ana)
    gradient = prog.ops[op].results[0]
    chain = [gradient]
    while prog.ops[prog.uses()[chain[-1]][0][0]].primitive in ("reshape", "reduce_sum"):
        chain.append(prog.ops[prog.uses()[chain[-1]][0][0]].results[0])
    assert [prog.values[v].shape for v in chain] == [(64,), (1, 1, 64), (64,)]
    everywhere = {use for uses in prog.uses() for use in uses}
    assert scatter_values(prog, gradient, prog.uses(), everywhere) == tuple(chain)
    # A value the update reads through a multiply ends the chain there.
    ana = _analysis(0.1)
    prog = ana.program
    gradient = prog.ops[_bias_gradient_op(ana)].results[0]
    assert len(scatter_values(prog, gradient, prog.uses(), everywhere)) == 3


@pytest.mark.parametrize(("lr", "kind"), [(1.0, "reduce-scatter"), (0.1, "all-reduce")])
def test_fsdp_reduce_scatters_a_bias_gradient_read_after_size_one_reshapes_only(lr, kind):
    """Under FSDP the update reads the bias gradient sharded [D_data]. Read through the size-1
    reshapes alone, XLA reduce-scatters the partial sum (all-reduce, bitcast, dynamic-slice);
    read through a multiply, the multiply runs on the whole all-reduced gradient and the
    all-reduce stays one."""
    ana = _analysis(lr)
    strategy = tc.baselines.all(ana, MESH)["fsdp"][0]
    report = tc.estimate(ana, strategy, MESH, HW)
    c = _collective_of(report, _bias_gradient_op(ana))
    assert (c.kind, c.mesh_axes) == (kind, ("data",))
    assert c.result_bytes == 64 * 4 / (8 if kind == "reduce-scatter" else 1)


@pytest.mark.parametrize("reverse", [False, True])
def test_incremental_prices_the_chain_as_the_full_evaluator_does(reverse):
    """Reaching FSDP one fine class at a time, in either order (the chain's last use sharded
    before or after the partial sum's axis is set), every delta equals a full evaluation."""
    ana = _analysis(1.0)
    ev = tc.cost.evaluator(ana, MESH, HW)
    target = tc.baselines.all(ana, MESH)["fsdp"][0].fine_masks(ana, MESH)
    masks = np.zeros_like(target)
    inc = Incremental(ev)
    inc.tab.full_limit = float("inf")
    inc.score(masks)
    changed = np.flatnonzero(target != masks)
    for f in changed[::-1] if reverse else changed:
        parent = masks.copy()
        masks[f] = target[f]
        got, want = inc.score(masks, parent), ev.score(masks)
        assert got.comm_s == pytest.approx(want.comm_s, rel=1e-12)
        assert got.step_time_s == pytest.approx(want.step_time_s, rel=1e-12)
    assert inc.full_evaluations == 1


def test_a_weight_gradient_transposed_before_its_sharded_update_is_reduce_scattered():
    """The label-smoothing MLP's weight gradients come out of the backward matmuls as [F, D] and
    are transposed to the weights' [D, F] before the update reads them sharded: XLA slices the
    all-reduced gradient first and transposes the piece, so it reduce-scatters (measured)."""
    from demos import MODEL_ZOO

    w = MODEL_ZOO["label-smoothing"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    prog = ana.program
    mesh = tc.MeshSpec({"data": 2, "model": 4})
    report = tc.estimate(ana, tc.baselines.all(ana, mesh)["fsdp"][0], mesh, HW)
    transposed = [
        c
        for c in report.collectives
        if prog.ops[c.op].primitive == "dot_general"
        and [prog.ops[o].primitive for o, _ in prog.uses()[c.value]] == ["transpose"]
    ]
    assert len(transposed) == 3
    assert {(c.kind, c.mesh_axes) for c in transposed} == {("reduce-scatter", ("data", "model"))}
