"""AppTests of fitting where nothing fits: the Strategy page's memory with and without remat,
the Search page's "make it fit" panel and its mesh-shape comparison (helpers from test_app).

The panel is driven on GPT tiny over a made-up chip with about a megabyte of memory, so that
nothing fits on 8 devices while remat is forbidden, and each way out is priced in a second or two.
"""

from __future__ import annotations

import json

import pytest
from test_app import errors, goto, gpt_tiny, pins, start  # noqa: F401 (fixture)

import toast_core as tc

TINY_CHIP = "tiny-chip"


def frame_with(at, *columns: str):
    """The first dataframe on the page holding these columns (display-only frames carry no key)."""
    for d in at.dataframe:
        if set(columns) <= set(d.value.columns):
            return d.value
    raise AssertionError(f"no table with columns {columns}")


def charts_on(at) -> list[dict]:
    return [json.loads(p.proto.spec) for p in at.get("plotly_chart")]


def test_strategy_page_draws_memory_with_and_without_the_plans_remat(gpt_tiny):
    at = start()
    mesh = tc.MeshSpec.parse(at.session_state["mesh_text"])
    plain = tc.baselines.data_parallel(gpt_tiny, mesh)
    plan = plain.with_remat(gpt_tiny, {"blocks": "full"})
    key = at.session_state["model_spec"].key
    at.session_state["workspaces"][key]["imported"]["dp remat"] = plan
    at = goto(at, "strategy")
    at.selectbox(key="w.strategy_choice").set_value("imported: dp remat").run()
    assert not at.exception and not errors(at)
    hw = tc.hardware("tpu-v5e")
    with_r, without_r = (
        tc.estimate(gpt_tiny, plan, mesh, hw),
        tc.estimate(gpt_tiny, plain, mesh, hw),
    )
    fig = next(f for f in charts_on(at) if "with and without remat" in f["layout"]["title"]["text"])
    names = [t["name"] for t in fig["data"]]
    assert any(n.startswith("without remat") for n in names)
    assert any(n.startswith("with the plan's remat") for n in names)
    # Two curves of the same program, the lower peak with remat; the usable memory as a line.
    curves = {t["name"].split(" (")[0]: t["y"] for t in fig["data"]}
    assert max(curves["with the plan's remat"]) < max(curves["without remat"])
    assert len(curves["with the plan's remat"]) == len(with_r.memory_timeline)
    assert any("usable" in a["text"] for a in fig["layout"]["annotations"])
    metrics = {m.label: m.value for m in at.metric}
    frac = with_r.recompute_flops_per_device / with_r.flops_per_device
    assert metrics["Recompute flops"] == f"{frac:.1%}"
    assert metrics["Peak vs no remat"].startswith("-")
    assert metrics["Step time vs no remat"].startswith("+")
    groups = frame_with(at, "remat group", "policy")
    blocks = groups[groups["remat group"] == "blocks"].iloc[0]
    assert blocks["policy"] == "full" and blocks["layers"].startswith("2: blocks[0]")
    assert with_r.peak_bytes < without_r.peak_bytes
    # A plan without remat: one curve, and what full remat would do to it.
    at.selectbox(key="w.strategy_choice").set_value("baseline: data_parallel").run()
    assert not [
        f for f in charts_on(at) if "with and without remat" in f["layout"]["title"]["text"]
    ]
    assert any("with every layer group recomputed" in c.value for c in at.caption)
