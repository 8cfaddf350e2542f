"""`tc.op_view`: one op under a strategy, its scaling-book case, costs and collectives."""

from __future__ import annotations

import pytest
from lookup import dim_name, zoo_analysis

import toast_core as tc

MESH = tc.MeshSpec({"data": 2, "model": 4})
HW = tc.hardware("tpu-v5e")


analysis = zoo_analysis


def forward_matmuls(ana: tc.Analysis) -> tuple[int, int]:
    """The MLP's two forward matmuls: x @ w1 and h @ w2."""
    dots = [op.index for op in ana.program.ops if op.primitive == "dot_general"]
    return dots[0], dots[1]


def view(strategy: tc.Strategy, op: int, ana: tc.Analysis | None = None) -> tc.OpView:
    ana = ana or analysis()
    return tc.op_view(ana, strategy, MESH, tc.estimate(ana, strategy, MESH, HW), op)


def test_replicated_matmul_has_no_sharded_dim_and_no_collective():
    ana = analysis()
    first, _ = forward_matmuls(ana)
    v = view(tc.Strategy(), first)
    assert v.case == "replicated" and v.collectives == () and v.reduced_axes == ()
    assert v.operands[1].startswith("params.w1[") and "_" not in v.operands[1].split("[")[1]


def test_megatron_pair_is_free_dims_then_contracting_with_the_all_reduce():
    ana = analysis()
    first, second = forward_matmuls(ana)
    hidden = dim_name(ana, "params.w1", 1)
    plan = tc.Strategy.make(ana, {hidden: ("model",)})
    up, down = view(plan, first), view(plan, second)
    assert up.case == "batch-sharded" and up.collectives == ()
    assert f"{hidden}_model" in up.operands[1] and f"{hidden}_model" in up.results[0]
    # The second matmul contracts over the hidden dim: partial sums reduced over `model`.
    assert down.case == "contracting-sharded" and down.reduced_axes == ("model",)
    assert [(c.kind, c.mesh_axes) for c in down.collectives] == [("all-reduce", ("model",))]
    assert down.comm_s > 0
    assert "model" in down.explanation


def test_batch_and_hidden_sharded_is_both_and_flops_scale_with_the_devices():
    ana = analysis()
    _, second = forward_matmuls(ana)
    batch, hidden = dim_name(ana, "batch.x", 0), dim_name(ana, "params.w1", 1)
    both = tc.Strategy.make(ana, {batch: ("data",), hidden: ("model",)})
    v = view(both, second)
    assert v.case == "both" and v.reduced_axes == ("model",)
    full = view(tc.Strategy(), second)
    assert v.flops_per_device == pytest.approx(full.flops_per_device / MESH.n_devices)


def test_elementwise_ops_are_described_without_a_reduction():
    ana = analysis()
    batch = dim_name(ana, "batch.x", 0)
    dp = tc.Strategy.make(ana, {batch: ("data",)})
    report = tc.estimate(ana, dp, MESH, HW)
    ops = ana.program.ops
    relu = next(op.index for op in ops if op.primitive == "max")
    v = tc.op_view(ana, dp, MESH, report, relu)
    assert v.case == "sharded" and v.reduced_axes == ()
    # Every op of the program has a view, not only matmuls.
    cases = {tc.op_view(ana, dp, MESH, report, i).case for i in range(len(ops))}
    assert cases <= set(tc.cost.opview.CASES) and "contracting-sharded" in cases


def test_costliest_ops_are_sorted_by_compute_plus_communication():
    ana = analysis()
    dp = tc.baselines.data_parallel(ana, MESH)
    report = tc.estimate(ana, dp, MESH, HW)
    top = tc.costliest_ops(report, 4)
    assert len(top) == 4

    def total(i):
        return report.op_costs[i].time_s + sum(
            c.time_s * c.count for c in report.collectives if c.op == i
        )

    assert [total(i) for i in top] == sorted((total(i) for i in top), reverse=True)
    assert total(top[-1]) >= max(total(i) for i in range(len(report.op_costs)) if i not in top)


def test_bad_op_index_is_one_line_naming_the_argument():
    ana = analysis()
    report = tc.estimate(ana, tc.Strategy(), MESH, HW)
    with pytest.raises(tc.ToastError, match=r"`op=9999`"):
        tc.op_view(ana, tc.Strategy(), MESH, report, 9999)
