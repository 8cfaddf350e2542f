"""The analytic cost model: collectives, roofline compute, memory, fits, efficiency, attribution.

The judges are hand arithmetic from shapes, the pure collective formulas, and XLA itself (the
compiled HLO's collectives and `cost_analysis()` of the unsharded function).
"""

from __future__ import annotations

import functools

import jax
import lookup
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh
from lookup import dim_name, value_id

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.apply.hlo import mesh_axes_of_group, parse_collectives
from toast_core.cost.collectives import COLLECTIVE_KINDS, collective_time_s

HW = tc.hardware("tpu-v5e")
MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})
MESH_8 = tc.MeshSpec({"data": 8})
F32 = 4


@functools.cache
def _workload(name: str, train: bool):
    w = MODEL_ZOO[name](size="tiny", train=train)
    return w, tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


@pytest.fixture(scope="module")
def mlp_fwd():
    return _workload("mlp", train=False)


@pytest.fixture(scope="module")
def mlp_train():
    return _workload("mlp", train=True)


@pytest.fixture(scope="module")
def gpt_train():
    return _workload("gpt", train=True)


def megatron_dp(ana: tc.Analysis, x: str = "x") -> tc.Strategy:
    """Hidden dim F on `model`, batch on `data`."""
    return tc.Strategy.make(
        ana, {dim_name(ana, x, 0): "data", dim_name(ana, "params.w1", 1): "model"}
    )


def jax_mesh(shape, names) -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(shape), names)


# -- the MLP acceptance example ---------------------------------------------------------------


def test_megatron_plus_data_parallel_mlp_is_one_all_reduce_of_the_output(mlp_fwd):
    _, ana = mlp_fwd
    report = tc.estimate(ana, megatron_dp(ana), MESH_2X4, HW)
    (c,) = report.collectives
    out = ana.program.values[c.value]
    assert (c.kind, c.mesh_axes, c.direction) == ("all-reduce", ("model",), "forward")
    assert out.output_name == "out" and out.id in ana.program.outputs
    assert ana.program.ops[c.op].primitive == "dot_general"
    # The local output y[B/2, O]: 8 x 32 floats, partial over the 4 model shards.
    assert c.bytes == c.result_bytes == 8 * 32 * F32
    assert c.time_s == pytest.approx(
        collective_time_s("all-reduce", 1024, ("model",), MESH_2X4, HW)
    )
    assert report.comm_s == pytest.approx(c.time_s)


def test_megatron_plus_data_parallel_train_step_has_one_forward_output_all_reduce(mlp_train):
    _, ana = mlp_train
    report = tc.estimate(ana, megatron_dp(ana, "batch.x"), MESH_2X4, HW)
    forward_model = [
        c for c in report.collectives if c.direction == "forward" and "model" in c.mesh_axes
    ]
    (c,) = forward_model
    assert c.kind == "all-reduce" and c.mesh_axes == ("model",)
    assert ana.program.values[c.value].shape == (16, 32)  # the MLP's output y_hat[B, O]
    # Everything else is data parallel: the loss and the two (model-sharded) weight gradients.
    rest = sorted(
        (c.kind, c.mesh_axes, c.bytes) for c in report.collectives if c is not forward_model[0]
    )
    assert rest == [
        ("all-reduce", ("data",), 4.0),
        ("all-reduce", ("data",), 128 * 32 * F32 / 4),
        ("all-reduce", ("data",), 64 * 128 * F32 / 4),
    ]


@pytest.mark.slow
def test_mlp_acceptance_matches_xla_compiled_hlo(mlp_fwd):
    w, ana = mlp_fwd
    check = tc.validate(
        w.fn, w.args, ana, megatron_dp(ana), jax_mesh((2, 4), ("data", "model")), HW
    )
    assert check.numerics_ok, check.max_abs_error
    assert check.compiled_collective_bytes == check.predicted_collective_bytes
    assert check.compiled_collective_bytes["all-reduce"] == 1024
    assert sum(check.compiled_collective_bytes.values()) == 1024
    (hlo,) = parse_collectives(check.hlo_text)
    assert hlo.kind == "all-reduce"
    assert mesh_axes_of_group(hlo.groups, (2, 4), ("data", "model")) == ("model",)


# -- FSDP -------------------------------------------------------------------------------------


def test_fsdp_mlp_gathers_weights_and_reduce_scatters_gradients(mlp_train):
    _, ana = mlp_train
    fsdp = tc.baselines.fsdp(ana, MESH_8)
    assert fsdp is not None and fsdp.options, "FSDP needs the axis-clash cuts"
    report = tc.estimate(ana, fsdp, MESH_8, HW)
    prog = ana.program
    gathers = {
        (prog.values[c.value].name, c.bytes, c.direction)
        for c in report.collectives
        if c.kind == "all-gather"
    }
    assert gathers == {
        ("params.w1", 64 * 128 * F32, "forward"),
        ("params.w2", 128 * 32 * F32, "forward"),
    }
    scatters = sorted(
        (prog.values[c.value].size, c.bytes, c.result_bytes, c.direction, c.mesh_axes)
        for c in report.collectives
        if c.kind == "reduce-scatter"
    )
    assert scatters == [
        (128 * 32, 128 * 32 * F32, 128 * 32 * F32 / 8, "backward", ("data",)),
        (64 * 128, 64 * 128 * F32, 64 * 128 * F32 / 8, "backward", ("data",)),
    ]
    (loss,) = [c for c in report.collectives if c.kind == "all-reduce"]
    assert loss.bytes == F32 and loss.direction == "forward"
    # Pricing follows the ring formulas: V/W terms of a gather and a scatter of one weight match.
    by_kind = report.comm_s_by_kind()
    assert by_kind["all-gather"] == pytest.approx(by_kind["reduce-scatter"])


@pytest.mark.slow
def test_fsdp_mlp_collectives_match_xla(mlp_train):
    w, ana = mlp_train
    fsdp = tc.baselines.fsdp(ana, MESH_8)
    check = tc.validate(w.fn, w.args, ana, fsdp, jax_mesh((8,), ("data",)), HW)
    assert check.numerics_ok
    # XLA's CPU pipeline lowers a reduce-scatter to an all-reduce of the full buffer + a slice.
    assert (
        check.compiled_collective_bytes["all-gather"]
        == check.predicted_collective_bytes["all-gather"]
    )
    assert (
        check.compiled_collective_bytes["all-reduce"]
        == check.predicted_collective_bytes["all-reduce"]
    )
    assert (
        check.predicted_collective_bytes_target["reduce-scatter"] == (64 * 128 + 128 * 32) * F32 / 8
    )


def test_fsdp_gpt_gathers_each_sharded_parameter_and_reduces_its_gradient(gpt_train):
    _, ana = gpt_train
    fsdp = tc.baselines.fsdp(ana, MESH_8)
    assert fsdp is not None
    report = tc.estimate(ana, fsdp, MESH_8, HW)
    prog = ana.program
    sharded = [
        v
        for v in (prog.values[i] for i in prog.inputs)
        if v.name.startswith("params.") and any(fsdp.value_axes(ana, MESH_8, v.id))
    ]
    assert len(sharded) >= 3, "FSDP should shard several GPT parameters"
    gathered = {c.value for c in report.collectives if c.kind == "all-gather"}
    reduced_sizes = {
        prog.values[c.value].size
        for c in report.collectives
        if c.kind in ("reduce-scatter", "all-reduce") and c.mesh_axes == ("data",)
    }
    for v in sharded:
        assert v.id in gathered, f"{v.display()} is sharded but never gathered"
        assert v.size in reduced_sizes, f"the gradient of {v.display()} is never reduced"
    kinds = {c.kind for c in report.collectives}
    assert kinds <= {"all-gather", "reduce-scatter", "all-reduce"}
    assert "reduce-scatter" in kinds


# -- compute ----------------------------------------------------------------------------------


def toy_hw(**overrides) -> tc.HardwareSpec:
    fields = dict(
        name="toy",
        peak_flops_per_s=1e9,
        hbm_bytes_per_s=1e12,
        hbm_capacity_bytes=2**30,
        fast_link_bytes_per_s=1e9,
        slow_link_bytes_per_s=1e8,
    )
    fields.update(overrides)
    return tc.hardware(fields)


def first_matmul(ana: tc.Analysis) -> int:
    x = value_id(ana, "x")
    return next(
        op.index for op in ana.program.ops if op.primitive == "dot_general" and x in op.operands
    )


@pytest.mark.parametrize(
    ("hw", "expected_s"),
    [
        (toy_hw(), 2 * 16 * 64 * 128 / 1e9),  # compute bound
        (toy_hw(flops_efficiency=0.5), 2 * 16 * 64 * 128 / 0.5e9),
        (
            toy_hw(peak_flops_per_s=1e15, hbm_bytes_per_s=1e6),
            (16 * 64 + 64 * 128 + 16 * 128) * F32 / 1e6,
        ),
    ],
)
def test_roofline_of_a_matmul_by_hand(mlp_fwd, hw, expected_s):
    _, ana = mlp_fwd
    report = tc.estimate(ana, tc.Strategy(), MESH_2X4, hw)
    cost = report.op_costs[first_matmul(ana)]
    assert cost.flops == 2 * 16 * 64 * 128
    assert cost.bytes == (16 * 64 + 64 * 128 + 16 * 128) * F32
    assert cost.time_s == pytest.approx(expected_s)


def test_roofline_of_a_sharded_matmul_by_hand(mlp_fwd):
    _, ana = mlp_fwd
    hw = toy_hw(peak_flops_per_s=1e15, hbm_bytes_per_s=1e6)
    report = tc.estimate(ana, megatron_dp(ana), MESH_2X4, hw)
    cost = report.op_costs[first_matmul(ana)]
    # x[B/2, D] @ w1[D, F/4] -> h[B/2, F/4]
    assert cost.flops == 2 * 8 * 64 * 32
    assert cost.bytes == (8 * 64 + 64 * 32 + 8 * 32) * F32
    assert cost.time_s == pytest.approx(cost.bytes / 1e6)


def test_a_row_major_reshape_between_buffers_is_a_free_view():
    """h = x @ w1 reshaped [16, 128] -> [16, 4, 32] before a batched matmul: XLA emits the
    reshape as a bitcast of the matmul's result (no copy), so it moves no bytes; a reshape
    whose result is fused into an elementwise reader is that fusion's read of h, and moves it."""

    def fn(x, w1, w2):
        h = (x @ w1).reshape(16, 4, 32)
        y = jax.numpy.einsum("bhd,hde->bhe", h, w2)
        return y, jax.numpy.tanh(h.reshape(16, 128))

    f32 = jax.numpy.float32
    args = (np.ones((16, 64), f32), np.ones((64, 128), f32), np.ones((4, 32, 8), f32))
    ana = tc.analyze(tc.trace(fn, *args))
    report = tc.estimate(ana, tc.Strategy(), MESH_2X4, HW)
    reshapes = [op for op in ana.program.ops if op.primitive == "reshape"]
    moved = sorted(report.op_costs[op.index].bytes for op in reshapes)
    assert moved == [0.0, 16 * 128 * F32]


def test_a_scan_writes_its_stacked_outputs_whole_once_before_the_loop():
    """XLA lowers a scan to a while loop over a zero-filled buffer per stacked output: one full
    write of ys[4, 16, 32] (the scan's end), beside the body's per-iteration slice writes."""

    def fn(x, w):
        def body(h, _):
            h = jax.numpy.tanh(h @ w)
            return h, h * 2.0

        return jax.lax.scan(body, x, None, length=4)

    f32 = jax.numpy.float32
    ana = tc.analyze(tc.trace(fn, np.ones((16, 32), f32), np.ones((32, 32), f32)))
    report = tc.estimate(ana, tc.Strategy(), MESH_2X4, HW)
    (end,) = [op for op in ana.program.ops if op.primitive == "scan_end"]
    assert report.op_costs[end.index].bytes == 4 * 16 * 32 * F32


def test_a_matmul_reads_an_all_gathered_weight_at_its_gathered_size():
    """FSDP: w1[64, 128] is sharded 8 ways and all-gathered before x[16, 64] @ w1; the matmul
    reads the gathered buffer (XLA's fusion takes the all-gather's result), not the shard."""
    _, ana = _workload("mlp", train=True)
    strategy = tc.baselines.all(ana, MESH_2X4)["fsdp"][0]
    report = tc.estimate(ana, strategy, MESH_2X4, HW)
    w1 = value_id(ana, "params.w1")
    dot = next(
        op.index for op in ana.program.ops if op.primitive == "dot_general" and w1 in op.operands
    )
    assert any(c.kind == "all-gather" and c.value == w1 for c in report.collectives)
    # x[16/8, 64] @ w1[64, 128] -> h[16/8, 128]
    assert report.op_costs[dot].bytes == (2 * 64 + 64 * 128 + 2 * 128) * F32


@pytest.mark.parametrize("strategy_name", ["replicated", "data_parallel", "fsdp", "dp_megatron"])
def test_every_op_follows_the_roofline_and_compute_is_their_sum(gpt_train, strategy_name):
    _, ana = gpt_train
    strategy = tc.baselines.all(ana, MESH_2X4)[strategy_name][0]
    report = tc.estimate(ana, strategy, MESH_2X4, HW)
    peak = HW.peak_flops_per_s * HW.flops_efficiency
    for cost in report.op_costs:
        work = cost.flops + cost.transcendentals
        assert cost.time_s == pytest.approx(max(work / peak, cost.bytes / HW.hbm_bytes_per_s))
    assert report.compute_s == pytest.approx(sum(c.time_s for c in report.op_costs))
    assert report.step_time_s == pytest.approx(report.compute_s + report.comm_s)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_total_flops_match_xla_cost_analysis_of_the_unsharded_function(name, mlp_train, gpt_train):
    w, ana = {"mlp": mlp_train, "gpt": gpt_train}[name]
    compiled = jax.jit(w.fn).lower(*w.args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    report = tc.estimate(ana, tc.Strategy(), MESH_8, HW)
    assert report.total_flops == pytest.approx(cost["flops"], rel=0.01)
    assert report.transcendentals_per_device == pytest.approx(
        cost.get("transcendentals", 0.0), rel=0.01
    )


def test_sharding_divides_the_work(gpt_train):
    _, ana = gpt_train
    replicated = tc.estimate(ana, tc.Strategy(), MESH_8, HW)
    dp = tc.estimate(ana, tc.baselines.data_parallel(ana, MESH_8), MESH_8, HW)
    assert replicated.flops_per_device == pytest.approx(replicated.total_flops)
    # The batch splits (nearly) every op 8 ways; parameter updates stay whole, reductions add.
    assert replicated.flops_per_device / 8 < dp.flops_per_device < replicated.flops_per_device / 5
    assert dp.total_flops == replicated.total_flops


# -- time, efficiency, overlap ----------------------------------------------------------------


def test_efficiency_is_ideal_over_step_time(mlp_train):
    _, ana = mlp_train
    for name, (strategy, _) in tc.baselines.all(ana, MESH_2X4).items():
        if strategy is None:
            continue
        r = tc.estimate(ana, strategy, MESH_2X4, HW)
        assert r.ideal_s == pytest.approx(r.total_flops / (8 * HW.peak_flops_per_s)), name
        assert r.efficiency == pytest.approx(r.ideal_s / r.step_time_s), name
        assert 0 < r.efficiency <= 1, name


def test_overlap_hides_communication(mlp_train):
    _, ana = mlp_train
    strategy = tc.baselines.data_parallel(ana, MESH_8)
    none = tc.estimate(ana, strategy, MESH_8, HW)
    half = tc.estimate(ana, strategy, MESH_8, HW, tc.CostOptions(overlap=0.5))
    full = tc.estimate(ana, strategy, MESH_8, HW, tc.CostOptions(overlap=1.0))
    assert none.comm_s > 0
    assert half.step_time_s == pytest.approx(none.compute_s + 0.5 * none.comm_s)
    assert full.step_time_s == pytest.approx(none.compute_s)


# -- memory -----------------------------------------------------------------------------------


def test_persistent_memory_by_hand(mlp_train):
    _, ana = mlp_train
    weights, data = (64 * 128 + 128 * 32) * F32, (16 * 64 + 16 * 32) * F32
    replicated = tc.estimate(ana, tc.Strategy(), MESH_8, HW)
    dp = tc.estimate(ana, tc.baselines.data_parallel(ana, MESH_8), MESH_8, HW)
    fsdp = tc.estimate(ana, tc.baselines.fsdp(ana, MESH_8), MESH_8, HW)
    assert replicated.persistent_bytes == weights + data
    assert dp.persistent_bytes == weights + data / 8
    assert fsdp.persistent_bytes == (weights + data) / 8


def test_memory_falls_with_sharding(mlp_train, gpt_train):
    for _, ana in (mlp_train, gpt_train):
        peak = {
            name: tc.estimate(ana, s, MESH_8, HW).peak_bytes
            for name, (s, _) in tc.baselines.all(ana, MESH_8).items()
            if s is not None
        }
        assert peak["data_parallel"] < peak["replicated"]
        assert peak["fsdp"] < peak["data_parallel"]
        assert peak["megatron"] < peak["replicated"]
    _, ana = gpt_train
    dp = {
        n: tc.estimate(ana, tc.baselines.data_parallel(ana, m), m, HW).peak_bytes
        for n, m in ((2, tc.MeshSpec({"data": 2})), (4, tc.MeshSpec({"data": 4})), (8, MESH_8))
    }
    assert dp[2] > dp[4] > dp[8]


def test_memory_timeline_is_attributable(gpt_train):
    _, ana = gpt_train
    report = tc.estimate(ana, tc.baselines.dp_megatron(ana, MESH_2X4), MESH_2X4, HW)
    timeline = np.asarray(report.memory_timeline)
    assert len(timeline) == len(ana.program.ops)
    assert report.peak_bytes == pytest.approx(timeline.max())
    assert timeline[report.peak_op] == pytest.approx(report.peak_bytes)
    assert np.all(timeline >= report.persistent_bytes - 1e-6)


def test_donated_outputs_reuse_their_inputs(mlp_train):
    _, ana = mlp_train
    donated = tc.estimate(ana, tc.Strategy(), MESH_8, HW)
    kept = tc.estimate(ana, tc.Strategy(), MESH_8, HW, tc.CostOptions(donate_outputs=False))
    # Without donation the new weights w1, w2 are extra buffers live at the end of the step.
    end = kept.memory_timeline[-1] - donated.memory_timeline[-1]
    assert end == pytest.approx((64 * 128 + 128 * 32) * F32)
    assert kept.peak_bytes >= donated.peak_bytes


def test_fits_compares_peak_with_capacity_minus_headroom(mlp_train):
    _, ana = mlp_train
    hw = toy_hw(hbm_capacity_bytes=100_000)
    dp = tc.estimate(ana, tc.baselines.data_parallel(ana, MESH_8), MESH_8, hw)
    fsdp = tc.estimate(ana, tc.baselines.fsdp(ana, MESH_8), MESH_8, hw)
    assert dp.capacity_bytes == fsdp.capacity_bytes == pytest.approx(90_000)
    assert dp.peak_bytes > 90_000 and not dp.fits
    assert fsdp.peak_bytes <= 90_000 and fsdp.fits
    tight = tc.estimate(
        ana, tc.baselines.fsdp(ana, MESH_8), MESH_8, hw, tc.CostOptions(memory_headroom=0.6)
    )
    assert tight.capacity_bytes == pytest.approx(40_000)
    assert tight.fits == (tight.peak_bytes <= 40_000)
    roomy = tc.estimate(
        ana, tc.baselines.data_parallel(ana, MESH_8), MESH_8, hw, tc.CostOptions(memory_headroom=0)
    )
    assert roomy.capacity_bytes == 100_000


# -- collectives: attribution and the pure formulas -------------------------------------------


@pytest.mark.parametrize(
    "mesh",
    [MESH_2X4, MESH_8, tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2}, slow_axes=("data",))],
    ids=str,
)
def test_every_collective_is_attributed(gpt_train, mesh):
    _, ana = gpt_train
    prog = ana.program
    seen = 0
    for name, (strategy, _) in tc.baselines.all(ana, mesh).items():
        if strategy is None:
            continue
        report = tc.estimate(ana, strategy, mesh, HW)
        for c in report.collectives:
            seen += 1
            assert c.kind in COLLECTIVE_KINDS, name
            assert c.mesh_axes and set(c.mesh_axes) <= set(mesh.axis_names), name
            assert len(set(c.mesh_axes)) == len(c.mesh_axes)
            assert c.bytes > 0 and c.result_bytes > 0 and c.count >= 1
            # Alone, a member would cost more than its share of the combined op.
            alone_s = collective_time_s(c.kind, c.bytes, c.mesh_axes, mesh, HW)
            assert c.time_s <= alone_s * (1 + 1e-9)
            op = prog.ops[c.op]
            assert c.value in op.operands + op.results, (name, c.cause)
            assert c.direction in ("forward", "backward")
            assert prog.values[c.value].display() in c.cause
        assert report.comm_s == pytest.approx(sum(c.time_s * c.count for c in report.collectives))
        # A combined op costs one collective of its members' bytes together (latency once).
        members = sorted(i for op in report.combined for i in op.members)
        assert members == list(range(len(report.collectives)))
        for k, op in enumerate(report.combined):
            assert {report.collectives[i].group for i in op.members} == {k}
            assert {
                (report.collectives[i].kind, report.collectives[i].mesh_axes) for i in op.members
            } == {(op.kind, op.mesh_axes)}
            assert op.time_s == pytest.approx(
                collective_time_s(op.kind, op.bytes, op.mesh_axes, mesh, HW), rel=1e-6
            )
        assert report.comm_s == pytest.approx(sum(op.time_s * op.count for op in report.combined))
        by_kind = report.collective_bytes_by_kind()
        assert sum(by_kind.values()) == pytest.approx(
            sum(c.result_bytes * c.count for c in report.collectives)
        )
    assert seen > 20


def test_gradient_reductions_are_backward_and_the_loss_forward(mlp_train):
    _, ana = mlp_train
    report = tc.estimate(ana, tc.baselines.data_parallel(ana, MESH_8), MESH_8, HW)
    directions = sorted((ana.program.values[c.value].rank, c.direction) for c in report.collectives)
    assert directions == [(0, "forward"), (2, "backward"), (2, "backward")]


AXES = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([1, 1, 2, 3, 4, 8]), min_size=1
)


@given(
    axes=AXES,
    kind=st.sampled_from(COLLECTIVE_KINDS),
    v1=st.integers(0, 2**34),
    v2=st.integers(0, 2**34),
    data=st.data(),
)
def test_collective_time_is_monotone_and_size_one_axes_are_free(axes, kind, v1, v2, data):
    slow = data.draw(st.lists(st.sampled_from(sorted(axes)), unique=True))
    mesh = tc.MeshSpec(axes, slow_axes=slow)
    used = tuple(data.draw(st.lists(st.sampled_from(sorted(axes)), unique=True, min_size=1)))
    small, large = sorted((v1, v2))
    t_small = collective_time_s(kind, small, used, mesh, HW)
    t_large = collective_time_s(kind, large, used, mesh, HW)
    assert 0.0 <= t_small <= t_large
    real = tuple(a for a in used if mesh.size(a) > 1)
    assert t_large == collective_time_s(kind, large, real, mesh, HW)
    if not real or large == 0:
        assert t_large == 0.0


def random_legal_strategy(data, ana: tc.Analysis, mesh: tc.MeshSpec) -> tc.Strategy:
    return lookup.random_legal_strategy(data, ana, mesh, (0, 6), "")


@settings(max_examples=20)
@given(data=st.data())
def test_size_one_mesh_axes_change_nothing(data):
    """A strategy on a mesh with an extra size-1 axis costs what it costs without that axis."""
    _, ana = _workload("mlp", True)
    with_one = tc.MeshSpec({"data": 2, "one": 1, "model": 4})
    without = MESH_2X4
    strategy = random_legal_strategy(data, ana, with_one)
    stripped = tc.Strategy.make(
        ana,
        {n: tuple(a for a in axes if a != "one") for n, axes in strategy.shardings},
        strategy.options,
        remat=dict(strategy.remat),
    )
    a = tc.estimate(ana, strategy, with_one, HW)
    b = tc.estimate(ana, stripped, without, HW)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9, abs=1e-15)
    assert a.comm_s == pytest.approx(b.comm_s, rel=1e-9, abs=1e-15)
    assert a.peak_bytes == pytest.approx(b.peak_bytes)
    assert all("one" not in c.mesh_axes for c in a.collectives)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        (lambda ana: tc.estimate(ana, tc.Strategy(), "data=8", HW), "mesh='data=8'"),
        (lambda ana: tc.estimate(ana, tc.Strategy(), {"data": 8}, HW), "mesh={'data': 8}"),
        (lambda ana: tc.estimate(ana, tc.Strategy(), MESH_8, "tpu-v99"), "hardware='tpu-v99'"),
        (lambda ana: tc.estimate(ana, tc.Strategy(), MESH_8, {"name": "x"}), "missing"),
        (lambda ana: tc.estimate(ana, tc.Strategy(), MESH_8, 3), "hardware=3"),
        (lambda ana: tc.estimate(ana, None, MESH_8, HW), "strategy=None"),
        (lambda ana: tc.estimate("ana", tc.Strategy(), MESH_8, HW), "ana='str'"),
        (
            lambda ana: tc.estimate(ana, tc.Strategy(), MESH_8, HW, tc.CostOptions(overlap=1.5)),
            "overlap=1.5",
        ),
        (
            lambda ana: tc.estimate(
                ana, tc.Strategy(), MESH_8, HW, tc.CostOptions(memory_headroom=-1)
            ),
            "memory_headroom=-1",
        ),
        (lambda ana: tc.MeshSpec({"data": 0}), "axes['data']=0"),
        (lambda ana: tc.MeshSpec.parse("data=two"), "mesh='data=two'"),
        (lambda ana: toy_hw(hbm_bytes_per_s=-1.0), "hbm_bytes_per_s=-1.0"),
        (
            lambda ana: tc.estimate(ana, tc.Strategy.make(ana, {"N0": "model"}), MESH_8, HW),
            "shardings[N0]='model'",
        ),
    ],
)
def test_bad_mesh_hardware_and_arguments_raise_toast_error(mlp_fwd, call, shown):
    _, ana = mlp_fwd
    with pytest.raises(tc.ToastError) as info:
        call(ana)
    assert shown in str(info.value)


# -- reshards as arrays -----------------------------------------------------------------------


def _reshard_collectives_one_by_one(ev, first, odd, vsub, usub, gathered, moved):
    """The reference: each reshard priced alone by `_exact_reshard` or `_gathers` and one
    all-to-all (the loop the array version replaced)."""
    kinds, masks, factors, of, buffer = [], [], [], [], np.ones(len(first))
    for r, i in enumerate(first.tolist()):
        if odd[i]:
            colls, buffer[r] = ev._exact_reshard(vsub[i], usub[i])
        else:
            colls, buffer[r] = ev._gathers(gathered[i])
            colls.append(
                (
                    COLLECTIVE_KINDS.index("all-to-all"),
                    int(moved[i]),
                    buffer[r] * ev.mask_ways[int(moved[i])],
                )
            )
        for kind, mask, factor in colls:
            if mask:
                kinds.append(kind), masks.append(mask), factors.append(factor), of.append(r)
    return buffer, kinds, masks, factors, of


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_reshards_as_arrays_equal_the_reshards_one_by_one(data):
    """Every reshard's collectives and buffer, computed for all reshards at once, are bit for bit
    those of pricing each reshard alone, in the same order."""
    _, ana = _workload("gpt", True)
    mesh = tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2})
    ev = tc.cost.evaluator(ana, mesh, HW)
    masks = random_legal_strategy(data, ana, mesh).fine_masks(ana, mesh)
    seen = []
    real = ev._reshard_collectives

    def spy(*args):
        seen.append((args, real(*args)))
        return seen[-1][1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ev, "_reshard_collectives", spy)
        ev._compute_reshards(masks)
    for args, (buffer, kind, mask, factor, of) in seen:
        ref = _reshard_collectives_one_by_one(ev, *args)
        assert np.array_equal(buffer, ref[0])
        assert kind.tolist() == ref[1] and mask.tolist() == ref[2]
        assert factor.tolist() == ref[3] and of.tolist() == ref[4]


def test_distinct_rows_packed_and_as_bytes_agree():
    from toast_core.cost.model import _distinct_rows

    rows = np.random.default_rng(0).integers(0, 8, size=(200, 3, 2))
    rows[50:] = rows[:150]  # repeats
    packed = _distinct_rows(rows, 3)  # 6 entries x 3 bits: one int64
    as_bytes = _distinct_rows(rows, 63)  # too wide to pack
    for distinct, first, inverse in (packed, as_bytes):
        assert np.array_equal(distinct[inverse], rows)
        assert np.array_equal(rows[first], distinct)
        assert all(first[inverse[i]] <= i for i in range(len(rows)))
    assert sorted(packed[1].tolist()) == sorted(as_bytes[1].tolist())


def test_plain_reshards_as_arrays_equal_them_one_by_one_with_all_to_alls():
    """The plain path with axes that change dim (all-to-alls), which few small strategies reach."""
    _, ana = _workload("gpt", True)
    ev = tc.cost.evaluator(ana, tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2}), HW)
    rng = np.random.default_rng(1)
    n, rank = 40, 3
    gathered, moved = rng.integers(0, 8, size=(n, rank)), rng.integers(0, 8, size=n)
    first, odd = np.arange(0, n, 2), np.zeros(n, dtype=bool)
    args = (first, odd, None, None, gathered, moved)
    buffer, kind, mask, factor, of = ev._reshard_collectives(*args)
    ref = _reshard_collectives_one_by_one(ev, *args)
    assert np.array_equal(buffer, ref[0]) and COLLECTIVE_KINDS.index("all-to-all") in ref[1]
    assert kind.tolist() == ref[1] and mask.tolist() == ref[2]
    assert factor.tolist() == ref[3] and of.tolist() == ref[4]


def test_a_dim_leaving_one_of_its_two_mesh_axes_is_permuted_then_gathered_over_it_alone():
    """FSDP x Megatron: `w1[D, F_(data, model)]` read as `w1[D, F_model]`. XLA's partitioner
    permutes the shards (to F on (model, data)) and all-gathers over `data` alone (replica
    groups of 2, measured on the MLP train step on 2x4): 1 ring step of latency, not the
    1 + 3 of a gather over both mesh axes."""
    _, ana = _workload("mlp", True)
    strategy = tc.baselines.all(ana, MESH_2X4)["fsdp_megatron"][0]
    report = tc.estimate(ana, strategy, MESH_2X4, HW)
    w1 = value_id(ana, "params.w1")
    kinds = [(c.kind, c.mesh_axes) for c in report.collectives if c.value == w1]
    assert sorted(kinds) == [("all-gather", ("data",)), ("collective-permute", ("data", "model"))]
    (gather,) = [c for c in report.collectives if c.value == w1 and c.kind == "all-gather"]
    assert gather.bytes == 64 * 128 * F32 / 4  # the [64, 128 / 4] piece each model shard needs
