"""Collectives combined as XLA's combiner passes combine them: the pure rule, the dependence
analysis, the per-backend thresholds, and the cost model paying latency once per combined op.

The judges are the rule read in XLA's `CombineInstructionsByKey` (hand cases) and XLA itself:
`tests/test_apply.py` checks predicted op counts after combining against compiled HLO.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from lookup import dim_name

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.cost import evaluator
from toast_core.cost.collectives import collective_time_s
from toast_core.cost.combine import combine, post_order, region_of_ops, site_inputs
from toast_core.mesh.spec import XLA_DEFAULT_COMBINE_BYTES, HardwareSpec

HW = tc.hardware("tpu-v5e")
MESH_8 = tc.MeshSpec({"data": 8})
AR = {"all-reduce": 100.0}


# -- the pure rule ------------------------------------------------------------------------------


def run(keys, sizes, inputs=None, thresholds=AR, kinds=None, max_count=256):
    n = len(keys)
    return combine(
        kinds or ["all-reduce"] * n,
        keys,
        sizes,
        None,
        list(range(n)),
        inputs or [0] * n,
        thresholds,
        max_count,
    )


def test_independent_collectives_of_one_key_merge_into_one_op():
    assert run(["k"] * 4, [10.0] * 4) == [0, 0, 0, 0]


def test_different_keys_never_merge_but_do_not_break_each_others_groups():
    assert run(["a", "b", "a", "b"], [10.0] * 4) == [0, 1, 0, 1]


def test_a_collective_reading_a_member_closes_the_group():
    # Collective 2 depends on collective 1 (bit 1 of its input bitset): XLA stops there.
    assert run(["k"] * 4, [10.0] * 4, inputs=[0, 0, 0b10, 0]) == [0, 0, 2, 2]


def test_the_byte_threshold_closes_groups_and_oversized_ones_stay_alone():
    assert run(["k"] * 4, [60.0, 30.0, 20.0, 50.0]) == [0, 0, 2, 2]
    # Alone over the threshold: it never merges, and the open group stays open across it.
    assert run(["k"] * 3, [10.0, 500.0, 10.0]) == [0, 1, 0]


def test_the_count_threshold_closes_groups():
    assert run(["k"] * 5, [1.0] * 5, max_count=2) == [0, 0, 2, 2, 4]


def test_kinds_without_a_threshold_never_combine():
    kinds = ["all-gather", "all-gather", "all-reduce", "all-reduce"]
    assert run(["g", "g", "r", "r"], [1.0] * 4, kinds=kinds) == [0, 1, 2, 2]


def test_order_is_xla_post_order_not_list_order():
    group = combine(["all-reduce"] * 3, ["k"] * 3, [1.0] * 3, [2, 0, 1], [0, 1, 2], [0, 0, 0], AR)
    assert group == [1, 1, 1]


def test_site_inputs_follow_data_through_ops():
    # op0: v0 -> v1 (partial sum on v1: site 0); op1: v1 -> v2; op2 reads v2 (use site 1) and
    # v0 (use site 2) -> v3.
    operands = [(0,), (1,), (2, 0)]
    results = [(1,), (2,), (3,)]
    sites = [("result", 0, 1), ("use", 2, 2), ("use", 2, 0)]
    assert site_inputs(operands, results, sites) == [0, 0b001, 0]


def test_post_order_visits_operands_depth_first_from_the_outputs():
    # v0 -> op0 -> v1; v0 -> op1 -> v2; op2(v2, v1) -> v3 (output). A dead op3 comes last.
    operands = [(0,), (0,), (2, 1), (0,)]
    results = [(1,), (2,), (3,), (4,)]
    assert post_order(operands, results, [3]) == [1, 0, 2, 3]


def test_regions_are_the_computations_xla_combines_within():
    primitives = ["add", "scan_start", "mul", "scan_end", "add"]
    assert region_of_ops(primitives, [0, 0, 1, 0, 0]) == [-1, -1, 1, -1, -1]


def test_each_branch_of_a_cond_is_its_own_region_and_the_cond_closes_them_all():
    """The tracer opens one `cond_start` per branch and closes them with one `cond_end`: ops
    after a two-branch cond are top level again, and a nested cond inside the first branch
    closes before the second branch opens."""
    primitives = ["cond_start", "mul", "cond_start", "add", "cond_end", "neg"]
    assert region_of_ops(primitives, [0, 1, 0, 1, 0, 0]) == [-1, 0, -1, 2, -1, -1]
    primitives = ["cond_start", "cond_start", "mul", "cond_start", "add", "cond_end"]
    primitives += ["cond_start", "sub", "cond_end", "neg"]
    depths = [0, 1, 2, 1, 2, 1, 0, 1, 0, 0]
    assert region_of_ops(primitives, depths) == [-1, 0, 1, 0, 3, 0, -1, 6, -1, -1]


def test_a_program_after_a_two_branch_cond_is_priced_at_top_level():
    """Loop constants after a cond hoist to the top level, not into the cond's first branch."""

    def fn(p, x):
        y = jax.lax.cond(x[0, 0] > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)
        return y @ p

    prog = tc.trace(fn, jnp.ones((8, 8)), jnp.ones((16, 8)), param_argnums=(0,))
    regions = region_of_ops([op.primitive for op in prog.ops], [op.region_depth for op in prog.ops])
    dot = next(i for i, op in enumerate(prog.ops) if op.primitive == "dot_general")
    assert regions[dot] == -1


# -- thresholds per backend -----------------------------------------------------------------------


def test_presets_carry_xlas_default_thresholds_and_round_trip():
    spec = tc.hardware("h100-80gb")
    for kind in ("all-reduce", "all-gather", "reduce-scatter"):
        assert spec.combine_threshold(kind) == XLA_DEFAULT_COMBINE_BYTES == 30 * 2**20 + 7
    assert spec.combine_threshold("all-to-all") == 0.0
    assert HardwareSpec.from_dict(spec.to_dict()) == spec
    custom = tc.hardware({**spec.to_dict(), "name": "x", "combine_threshold_bytes": {}})
    assert custom.combine_threshold_bytes == () and hash(custom)


@pytest.mark.parametrize(
    "value", [{"all-reduce": -1}, {"broadcast": 5}, {"all-reduce": float("inf")}, 7]
)
def test_bad_thresholds_raise_naming_the_field(value):
    data = {**HW.to_dict(), "combine_threshold_bytes": value}
    with pytest.raises(tc.ToastError, match="combine_threshold_bytes="):
        HardwareSpec.from_dict(data)


# -- the cost model ---------------------------------------------------------------------------------


@functools.cache
def mlp_train():
    w = MODEL_ZOO["mlp"](size="tiny", train=True)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


def data_parallel(ana):
    strategy = tc.baselines.data_parallel(ana, MESH_8)
    assert strategy is not None
    return strategy


def test_gradient_all_reduces_are_one_combined_op_paying_latency_once():
    ana = mlp_train()
    report = tc.estimate(ana, data_parallel(ana), MESH_8, HW)
    assert len(report.collectives) == 3 and len(report.combined) == 1
    (op,) = report.combined
    assert op.kind == "all-reduce" and op.members == (0, 1, 2)
    assert report.comm_s == pytest.approx(
        collective_time_s("all-reduce", op.bytes, ("data",), MESH_8, HW)
    )
    assert report.collective_ops_by_kind()["all-reduce"] == 1
    # The search's fast path agrees with the report.
    ev = evaluator(ana, MESH_8, HW)
    assert ev.score(data_parallel(ana).fine_masks(ana, MESH_8)).comm_s == pytest.approx(
        report.comm_s
    )


def test_without_thresholds_every_collective_pays_its_latency():
    ana = mlp_train()
    no_combining = tc.hardware({**HW.to_dict(), "name": "none", "combine_threshold_bytes": {}})
    report = tc.estimate(ana, data_parallel(ana), MESH_8, no_combining)
    assert len(report.combined) == 3
    alone = sum(
        collective_time_s(c.kind, c.bytes, c.mesh_axes, MESH_8, HW) for c in report.collectives
    )
    assert report.comm_s == pytest.approx(alone)
    assert alone > tc.estimate(ana, data_parallel(ana), MESH_8, HW).comm_s


def test_a_chain_of_partial_sums_is_never_combined():
    """a = sum(x over D); b = sum(tanh(a) * y over E), D and E both on `data`: the second
    all-reduce reads the first's result, so XLA cannot merge them though kind and axes agree."""

    def chain(x, y):
        a = jnp.sum(x, axis=1)
        return jnp.sum(jnp.tanh(a)[:, None] * y, axis=1)

    ana = tc.analyze(tc.trace(chain, jnp.ones((4, 16)), jnp.ones((4, 32))))
    strategy = tc.Strategy.make(ana, {dim_name(ana, "x", 1): "data", dim_name(ana, "y", 1): "data"})
    report = tc.estimate(ana, strategy, MESH_8, HW)
    reductions = [c for c in report.collectives if c.kind == "all-reduce"]
    assert len(reductions) == 2
    assert len({c.group for c in reductions}) == 2
    # The same two partial sums side by side (no dependence) merge into one op.

    def side_by_side(x, y):
        return jnp.sum(x, axis=1) + jnp.sum(y, axis=1)

    ana = tc.analyze(tc.trace(side_by_side, jnp.ones((4, 16)), jnp.ones((4, 32))))
    strategy = tc.Strategy.make(ana, {dim_name(ana, "x", 1): "data", dim_name(ana, "y", 1): "data"})
    report = tc.estimate(ana, strategy, MESH_8, HW)
    assert [c.kind for c in report.collectives] == ["all-reduce"] * 2
    assert len(report.combined) == 1


def test_cpu_view_turns_reduce_scatters_into_combinable_all_reduces():
    ana = mlp_train()
    mesh = tc.MeshSpec({"data": 8})
    fsdp = tc.baselines.fsdp(ana, mesh)
    assert fsdp is not None
    report = tc.estimate(ana, fsdp, mesh, HW)
    ev = evaluator(ana, mesh, HW)
    target = ev.combined_op_counts(report.collectives)
    cpu = ev.combined_op_counts(report.collectives, cpu=True)
    assert target["reduce-scatter"] >= 1 and cpu["reduce-scatter"] == 0
    # XLA CPU has no all-gather combiner: every all-gather stays its own op.
    assert cpu["all-gather"] == sum(c.kind == "all-gather" for c in report.collectives)
    assert cpu["all-reduce"] == 1


def test_combining_is_pure_jax_free_data():
    assert not any(isinstance(x, jax.Array) for x in run(["k"] * 2, [1.0, 1.0]))
