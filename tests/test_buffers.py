"""Memory as XLA's buffer assignment lays it out (`cost/buffers.py`), and the buffers a remat
recomputation's barrier holds (`cost/remat.hold_barrier_inputs`)."""

from __future__ import annotations

import numpy as np
import pytest

import demos
import toast_core as tc
from toast_core.cost import CostOptions, evaluator
from toast_core.cost.buffers import (
    allocated_memory,
    buffer_intervals,
    place_in_output_allocations,
    timeline_of,
)
from toast_core.cost.remat import hold_barrier_inputs
from toast_core.strategy.remat import RematEffect, remat_effect

MESH = tc.MeshSpec({"data": 8})
HW = tc.hardware("h100-80gb")


@pytest.fixture(scope="module", params=["gpt", "flax"])
def model(request):
    overrides = {"batch": 16} if request.param == "gpt" else {"batch": 64, "depth": 3}
    w = demos.MODEL_ZOO[request.param](**overrides)
    return tc.analyze(tc.trace(w.fn, *w.args))


@pytest.mark.parametrize("policy", ["none", "dots", "full"])
@pytest.mark.parametrize("align", [0, 64])
def test_buffers_add_up_to_the_timeline(model, policy, align):
    """Every buffer of the evaluator's timeline, one interval each (a dropped residual two):
    summed per op they are the timeline, to the byte."""
    ana = model
    dp = tc.baselines.data_parallel(ana, MESH)
    strategy = dp if policy == "none" else dp.with_remat(ana, policy)
    for donate in (False, True):
        ev = evaluator(ana, MESH, HW, CostOptions(donate_outputs=donate))
        masks = strategy.fine_masks(ana, MESH)
        _, local, _ = ev._local(masks)
        pairs = ev._remat_pairs(strategy)
        effect = remat_effect(ev.remat, pairs) if pairs else None
        _, timeline = ev._memory(local, masks, effect, pairs, align)
        size, start, end, _ = buffer_intervals(ev, local, masks, effect, pairs, align)
        assert np.all(end > start) and np.all(size > 0)
        np.testing.assert_array_equal(timeline_of(size, start, end, ev.n_ops), timeline)


def test_allocated_memory_reserves_the_outputs_all_step(model):
    """Inputs + output allocations + the block's peak is at most the timeline's peak plus every
    output (the outputs are held from the start), and at least that peak but for one
    temporary handed to its reader's result in place (the timeline counts both at that op)."""
    ana = model
    ev = evaluator(ana, MESH, HW, CostOptions(donate_outputs=False))
    strategy = tc.baselines.data_parallel(ana, MESH).with_remat(ana, "full")
    report = ev.report(strategy)
    inputs, outputs, block = allocated_memory(ev, strategy)
    assert inputs == report.persistent_bytes
    out_ids = ana.program.outputs
    _, local, _ = ev._local(strategy.fine_masks(ana, MESH))
    assert outputs == pytest.approx(float(sum(local[v] for v in set(out_ids))))
    total = inputs + outputs + block.max()
    size, _, _, is_out = buffer_intervals(ev, local, strategy.fine_masks(ana, MESH), None, (), 0)
    handed = size[~is_out].max()
    assert report.peak_bytes - handed <= total <= report.peak_bytes + outputs + 1e-6


def test_a_temporary_borrows_an_idle_output_allocation():
    # ops 0..9; output 0 (100 bytes) made at op 8, output 1 (10 bytes) at op 9.
    size = np.array([100.0, 10.0, 80.0, 60.0, 120.0, 50.0])
    start = np.array([8, 9, 0, 2, 1, 7])
    end = np.array([10, 10, 5, 6, 3, 9])
    is_out = np.array([True, True, False, False, False, False])
    outputs, block = place_in_output_allocations(size, start, end, is_out, 10)
    assert outputs == 110.0
    # 120 fits no allocation; 80 borrows output 0's (idle until op 8); 60 overlaps 80 there and
    # is bigger than output 1: block; 50 lives into op 8, where output 0 is made, and is not
    # its size: XLA writes no 100-byte result over it, block.
    want = timeline_of(size[[3, 4, 5]], start[[3, 4, 5]], end[[3, 4, 5]], 10)
    np.testing.assert_array_equal(block, want)
    # Of output 0's size, its reader writes the output over it in place: it borrows the
    # allocation too, beside 80.
    size[5] = 100.0
    _, block = place_in_output_allocations(size, start, end, is_out, 10)
    want = timeline_of(size[[3, 4]], start[[3, 4]], end[[3, 4]], 10)
    np.testing.assert_array_equal(block, want)
    # One op later it would be live with output 0: block.
    end[5] = 10
    _, block = place_in_output_allocations(size, start, end, is_out, 10)
    want = timeline_of(size[[3, 4, 5]], start[[3, 4, 5]], end[[3, 4, 5]], 10)
    np.testing.assert_array_equal(block, want)


def test_the_barrier_holds_a_fused_recompute_input_from_its_producer():
    """A kept input that fusion folds into its readers still reaches the recomputation through
    the optimization barrier: a buffer from its producer to the recomputation. Unfused inputs
    already live to their last reader; the effect's extension covers the rest."""
    e = np.zeros(0, dtype=np.int64)
    effect = RematEffect(
        e, e, e, e, e, np.array([1, 2]), np.array([4, 4]), np.array([9, 9])
    )  # values 1 and 2 read by a recomputation at op 8; value 1 fused, made at op 3
    fused = np.array([False, True, False])
    producer = np.array([-1, 3, 2])
    local = np.array([5.0, 7.0, 11.0])
    delta = np.zeros(12)
    hold_barrier_inputs(delta, local, effect, fused, producer)
    assert np.cumsum(delta).tolist() == [0, 0, 0, 7, 7, 7, 7, 7, 7, 0, 0, 0]


def test_flax_layer_norm_product_is_held_for_the_next_block(model):
    """Flax MLP, `dots`: each Dense block's recomputation reads its LayerNorm's product (fused
    away without remat); the model holds it, one [B/8, F] buffer per block recomputed later."""
    ana = model
    ev = evaluator(ana, MESH, HW, CostOptions(donate_outputs=False))
    if "Dense_1" not in ev.remat.names:
        pytest.skip("the Flax MLP's case")
    strategy = tc.baselines.data_parallel(ana, MESH).with_remat(ana, "dots")
    effect = remat_effect(ev.remat, ev._remat_pairs(strategy))
    held = effect.extend_values[ev._is_fused[effect.extend_values]]
    _, local, _ = ev._local(strategy.fine_masks(ana, MESH))
    big = [v for v in held.tolist() if ana.program.values[v].shape == (64, 128)]
    assert len(big) == 3  # depth 3: the products of LayerNorm_0..2, read by Dense_1..3
    assert all(local[v] == 64 // 8 * 128 * 4 for v in big)
