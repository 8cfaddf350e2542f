"""Predicted step time against the XLA-judged one on the zoo cases nearest the 10 % target
(issue 10, bench/fidelity.py): the ops XLA's CSE removes move no bytes in the model, and the
CPU's tree-reduction reduce-windows are judged fused into their reduce as on TPU/GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import demos
import toast_core as tc
from toast_core.cost import evaluator

HW = tc.hardware("tpu-v5e")
MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})


def test_a_repeated_reduce_moves_no_bytes():
    """`sum(h)` written twice over a dot's result (a BatchNorm's mean and its variance's mean):
    XLA's CSE keeps one reduce, which reads h once; the repeat neither reads nor writes."""

    def f(x, w):
        h = x @ w
        return jnp.sum(h, axis=0) * jnp.sum(h, axis=0)

    x = jax.ShapeDtypeStruct((32, 64), jnp.float32)
    w = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    ana = tc.analyze(tc.trace(f, x, w))
    prog = ana.program
    first, repeat = [op.index for op in prog.ops if op.primitive == "reduce_sum"]
    report = evaluator(ana, tc.MeshSpec({"data": 8}), HW).report(
        tc.baselines.replicated(ana, tc.MeshSpec({"data": 8}))
    )
    moved = {c.op: c.bytes for c in report.op_costs}
    assert moved.get(first, 0.0) >= 32 * 256 * 4  # reads h
    assert moved.get(repeat, 0.0) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(("model", "was"), [("batchnorm", 1.085), ("flax", 0.918)])
def test_replicated_step_time_matches_the_judge(model, was):
    """Replicated on 2x4 (compute only): batchnorm was predicted 1.085x the judged time (its
    repeated `sum(h)` read h twice), the Flax MLP 0.918x (the judge charged the CPU's tree
    reductions as unfused reduce-windows); both now within 5 %."""
    w = demos.MODEL_ZOO[model](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    strategy = tc.baselines.replicated(ana, MESH_2X4)
    check = tc.validate(
        w.fn, w.args, ana, strategy, tc.jax_mesh(MESH_2X4), HW, check_numerics=False
    )
    assert abs(check.step_time_ratio - 1.0) < 0.05, (model, was, check.step_time_ratio)
