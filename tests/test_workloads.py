"""Every zoo model end to end: trace, analyze (no unknown primitives), search, validate on XLA.

Validation checks numerics, per-device flops and transcendentals against `cost_analysis()`, and
collective bytes. Also the repeated-layer grouping and the scan-over-layers variant: the scanned
and unrolled GPT price the same strategy (data parallel) at the same step time.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.apply.hlo import parse_collectives
from toast_core.cost.collectives import collective_time_s

MESH = tc.MeshSpec({"data": 2, "model": 4})
HW = tc.hardware("tpu-v5e")


def _analysis(name: str, **kw):
    w = MODEL_ZOO[name](size="tiny", **kw)
    return w, tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


def assert_compute_matches_xla(name: str, check: tc.ValidationReport) -> None:
    assert check.flops_ratio == pytest.approx(1.0, abs=0.05), (name, check.rows()[0])
    assert check.predicted_transcendentals == pytest.approx(
        check.compiled_transcendentals, rel=0.02
    ), name


@pytest.fixture(scope="module")
def jax_mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


#: Known gaps of the cost model on zoo programs, each a failing assertion we keep visible: strict
#: xfail, so the test fails (XPASS) the day the gap closes.
KNOWN_GAPS: dict[str, str] = {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_GAPS[n], strict=True))
        if n in KNOWN_GAPS
        else n
        for n in sorted(MODEL_ZOO)
    ],
)
def test_zoo_model_end_to_end(name, jax_mesh):
    w, ana = _analysis(name, train=True)
    assert not ana.diagnostics, ana.diagnostics
    assert len(ana.named_dims) < ana.n_tensor_dims / 4
    result = tc.search(ana, MESH, HW, budget_s=None, num_simulations=40, seed=0)
    feasible = [t for t in result.baselines.values() if t is not None]
    assert result.report.step_time_s <= min(feasible) * (1 + 1e-9)
    check = tc.validate(w.fn, w.args, ana, result.best, jax_mesh, HW)
    assert check.numerics_ok, (name, check.max_abs_error)
    assert_compute_matches_xla(name, check)
    # A sharded strategy too, so the comparison exercises collectives.
    strategy = tc.baselines.all(ana, MESH)["data_parallel"][0]
    check = tc.validate(w.fn, w.args, ana, strategy, jax_mesh, HW)
    assert check.numerics_ok, (name, check.max_abs_error)
    assert_compute_matches_xla(name, check)
    compiled = dict.fromkeys(check.compiled_collective_bytes, 0.0)
    for c in parse_collectives(check.hlo_text):
        compiled[c.kind] += c.result_bytes
    for kind, nbytes in compiled.items():
        predicted = check.predicted_collective_bytes[kind]
        assert predicted == pytest.approx(nbytes, rel=0.25, abs=64), (name, kind)


def test_scan_and_unrolled_gpt_price_data_parallel_alike_but_for_loop_latency():
    """Same bytes and flops; but XLA combines the scanned body's gradient all-reduces inside the
    loop (compiled: a 12-tuple all-reduce in the while body, a 6-tuple one outside), so the
    scanned step pays that op's latency every iteration where the unrolled one pays one op."""
    reports = {}
    for name in ("gpt", "gpt-scan"):
        _, ana = _analysis(name)
        strategy = tc.baselines.all(ana, MESH)["data_parallel"][0]
        reports[name] = tc.estimate(ana, strategy, MESH, HW)
    unrolled, scanned = reports["gpt"], reports["gpt-scan"]

    def latency_s(report):  # one byte's collective is all latency
        return sum(
            op.count * collective_time_s(op.kind, 1.0, op.mesh_axes, MESH, HW)
            for op in report.combined
        )

    assert [op.count for op in unrolled.combined] == [1]
    assert sorted(op.count for op in scanned.combined) == [1, 2]  # 2 layers in the loop
    assert scanned.comm_s - latency_s(scanned) == pytest.approx(
        unrolled.comm_s - latency_s(unrolled), rel=0.01
    )
    assert scanned.collective_bytes_by_kind() == pytest.approx(unrolled.collective_bytes_by_kind())
    # XLA fuses across layers only when they are unrolled: a little more duplicated elementwise work.
    assert scanned.flops_per_device == pytest.approx(unrolled.flops_per_device, rel=0.02)


def test_repeated_layers_form_decision_groups():
    from toast_core.strategy import constrain, space_of

    w = MODEL_ZOO["gpt"](size="gpt2", n_layers=6)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    # Per-layer named dims (heads, head dim, MLP hidden) come in groups of 6.
    assert ana.dim_groups and all(len(g) == 6 for g in ana.dim_groups)
    self_groups = [g for g in ana.conflict_groups if ana.conflicts[g[0]].kind == "self"]
    assert [len(g) for g in self_groups] == [6]
    space = space_of(ana, MESH)
    units = space.units(())
    # The search decides each kind of per-layer dim once, not once per layer.
    assert len(units) <= len(ana.named_dims) - 5 * len(ana.dim_groups)
    # A pin still singles out one layer: its named dim leaves its group.
    layer0 = ana.named_dims[ana.dim_groups[0][0]]
    pinned = constrain(space, [f"{layer0.name}@model"])
    pinned_units = space.units(pinned.root.options, pinned.pinned_fines)
    grouped = [u for u in pinned_units if len(u.dims) == 5]
    assert grouped, "the other five layers stay grouped"
    assert all(layer0.name not in u.dims for u in pinned_units)
