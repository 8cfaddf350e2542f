"""`tc.remat_comparison`: a plan beside the same plan without remat, attributed per remat group."""

from __future__ import annotations

import pytest

import toast_core as tc


@pytest.fixture(scope="module")
def gpt_tiny():
    from demos import MODEL_ZOO

    w = MODEL_ZOO["gpt"](size="tiny", train=True)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


MESH = tc.MeshSpec({"data": 2, "model": 4})


def test_full_remat_lowers_the_peak_and_costs_recompute_flops(gpt_tiny):
    plain = tc.baselines.data_parallel(gpt_tiny, MESH)
    plan = plain.with_remat(gpt_tiny, {"blocks": "full"})
    c = tc.remat_comparison(gpt_tiny, plan, MESH, "tpu-v5e")
    assert c.without_remat == tc.estimate(gpt_tiny, plain, MESH, tc.hardware("tpu-v5e"))
    assert c.peak_delta_bytes < 0 < c.step_time_delta_s
    assert 0.05 < c.recompute_flops_fraction < 0.5
    # The timelines are the two curves the explorer draws: same ops, lower peak with remat.
    assert len(c.with_remat.memory_timeline) == len(c.without_remat.memory_timeline)
    assert max(c.with_remat.memory_timeline) == pytest.approx(c.with_remat.peak_bytes)
    rows = {g.group: g for g in c.groups}
    assert set(rows) == set(tc.remat_groups(gpt_tiny))
    blocks = rows["blocks"]
    assert blocks.policy == "full" and blocks.layers == ("blocks[0]", "blocks[1]")
    assert blocks.recompute_ops > 0 and blocks.dropped_bytes_per_device > 0
    # One group recomputes: its share is the whole difference.
    assert blocks.step_time_delta_s == pytest.approx(c.step_time_delta_s)
    assert blocks.peak_delta_bytes == pytest.approx(c.peak_delta_bytes)
    assert blocks.recompute_flops_per_device == pytest.approx(
        c.with_remat.recompute_flops_per_device
    )
    assert rows["ln_f"].policy == "none" and rows["ln_f"].step_time_delta_s == 0.0


def test_a_plan_without_remat_compares_with_itself(gpt_tiny):
    plan = tc.baselines.fsdp(gpt_tiny, MESH)
    c = tc.remat_comparison(gpt_tiny, plan, MESH, "tpu-v5e")
    assert c.with_remat is c.without_remat and c.recompute_flops_fraction == 0.0
    assert all(g.policy == "none" and g.recompute_ops == 0 for g in c.groups)
    with pytest.raises(tc.ToastError, match="strategy"):
        tc.remat_comparison(gpt_tiny, "fsdp", MESH, "tpu-v5e")
