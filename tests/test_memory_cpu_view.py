"""Memory as XLA:CPU allocates it, the view `validate` compares with `memory_analysis()` (issue 14:
on random programs the prediction was within 30 % in only 62 % of validations, half of the small
ones off by 2x).

XLA:CPU places the temporaries at 64-byte aligned offsets of one block and counts the output
tuple's pointer table in the outputs: the SGD step on `x1 @ w2` below (w2: f32[2, 6] on a 2x4
mesh, data parallel) compiles to arguments 28 + outputs 44 (24 + 4 + a 16-byte table) + temps
88 (two f32[6] at offsets 0 and 64) = 160 bytes, where the unaligned live bytes peak at 80.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xla_memory import sgd_of_mean_matvec

import toast_core as tc
from toast_core.cost import CostOptions, evaluator

validate_mod = importlib.import_module("toast_core.apply.validate")

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 2, "model": 4})


def _sgd():
    params = {"w2": jax.ShapeDtypeStruct((2, 6), jnp.float32)}
    batch = {"x1": jax.ShapeDtypeStruct((2,), jnp.float32)}
    ana = tc.analyze(tc.trace(sgd_of_mean_matvec, params, batch))
    return ana, (params, batch)


def test_aligned_report_rounds_temporaries_but_not_inputs_or_outputs():
    ana, _ = _sgd()
    strategy = tc.baselines.data_parallel(ana, MESH)
    ev = evaluator(ana, MESH, HW, CostOptions(donate_outputs=False))
    plain = ev.report(strategy)
    aligned = ev.report(strategy, buffer_align_bytes=64)
    assert aligned.persistent_bytes == plain.persistent_bytes
    # every temporary here is under 64 bytes: each grows to 64, so the peak grows
    assert aligned.peak_bytes > plain.peak_bytes
    # at each op: the plain live bytes plus each live temporary's padding to 64
    _, local, _ = ev._local(strategy.fine_masks(ana, MESH))
    is_temp = np.array([not ana.program.values[v].is_output for v in ev.live_ids.tolist()])
    size = local[ev.live_ids]
    pad = np.where(is_temp, np.ceil(size / 64) * 64 - size, 0.0)
    assert pad.sum() > 0
    for k in range(len(ana.program.ops)):
        live = (ev.born <= k) & (k < ev.dies)
        want = plain.memory_timeline[k] + pad[live].sum()
        assert np.isclose(aligned.memory_timeline[k], want), k


def test_several_outputs_add_the_tuple_table():
    ana, _ = _sgd()
    strategy = tc.baselines.data_parallel(ana, MESH)
    report = evaluator(ana, MESH, HW, CostOptions(donate_outputs=False)).report(strategy)
    one = validate_mod.cpu_memory_bytes(report, 1)
    assert one == report.peak_bytes
    assert validate_mod.cpu_memory_bytes(report, 2) == one + 16


@pytest.mark.slow
def test_small_sgd_step_memory_matches_memory_analysis():
    """160 bytes compiled; the unaligned prediction without the table was 80 (ratio 0.5).

    136 predicted since outputs are laid out in allocations of their own (`cost/buffers.py`):
    the backward's f32[6] temporaries borrow the new w's allocation until the update writes
    it, where XLA computes the update first (its simplifier leaves it reading w and x alone)
    and puts both temporaries in the block: 0.85."""
    ana, args = _sgd()
    strategy = tc.baselines.data_parallel(ana, MESH)
    check = tc.validate(
        sgd_of_mean_matvec, args, ana, strategy, tc.jax_mesh(MESH), HW, check_numerics=False
    )
    assert check.compiled_memory_bytes == 160
    assert abs(check.memory_ratio - 1) <= 0.2, check.predicted_memory_bytes


def _fsdp_label_smoothing():
    from demos import MODEL_ZOO

    w = MODEL_ZOO["label-smoothing"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    mesh = tc.MeshSpec({"data": 8})
    return w, ana, mesh, tc.baselines.all(ana, mesh)["fsdp"][0]


def test_a_reduce_scatter_partial_still_live_is_counted_once():
    """XLA:CPU holds every FSDP gradient partial until the combined all-reduce after the last
    one; the target view's timeline at that op already holds the partials whose updates come
    later (the [256, 256] one), so only the others are added."""
    _, ana, mesh, strategy = _fsdp_label_smoothing()
    ev = evaluator(ana, mesh, HW, CostOptions(donate_outputs=False))
    report = ev.report(strategy, buffer_align_bytes=64)
    scattered = [c for c in report.collectives if c.kind == "reduce-scatter"]
    last = max(c.op for c in scattered)
    live = [c for c in scattered if c.op < last and ev.live_end[c.value] > last]
    assert sum(c.bytes for c in live) >= 256 * 256 * 4  # the hidden layer's gradient
    n = len(ana.program.outputs)
    twice = validate_mod.cpu_memory_bytes(report, n)
    once = validate_mod.cpu_memory_bytes(report, n, ev.live_end)
    assert twice - once == pytest.approx(sum(c.bytes for c in live))


@pytest.mark.slow
def test_fsdp_step_memory_within_30_percent_of_memory_analysis():
    """Label-smoothing MLP, FSDP on data=8: 829,124 bytes compiled (one 708 KB block: the
    combined all-reduce's three full gradients and their partials); predicted 1,125,980 when
    the [256, 256] partial was counted twice (1.36), 847,452 once (1.02)."""
    w, ana, mesh, strategy = _fsdp_label_smoothing()
    check = tc.validate(w.fn, w.args, ana, strategy, tc.jax_mesh(mesh), HW, check_numerics=False)
    assert abs(check.memory_ratio - 1) <= 0.1, check.predicted_memory_bytes
