"""AppTests of fitting where nothing fits: the Strategy page's memory with and without remat,
the Search page's "make it fit" panel and its mesh-shape comparison (helpers from test_app).

The panel is driven on GPT tiny over a made-up chip with about a megabyte of memory, so that
nothing fits on 8 devices while remat is forbidden, and each way out is priced in a second or two.
"""

from __future__ import annotations

import json

import pytest
from test_app import errors, goto, pins, start

import toast_core as tc
from toast_core.strategy.remat import POLICIES

TINY_CHIP = "tiny-chip"


@pytest.fixture(scope="module")
def gpt_tiny():
    from demos import MODEL_ZOO

    w = MODEL_ZOO["gpt"](size="tiny", train=True)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


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
    decisions = frame_with(at, "decision", "what")
    assert "remat[blocks]=full" in decisions["decision"].tolist()
    # A plan without remat: one curve, and what full remat would do to it.
    at.selectbox(key="w.strategy_choice").set_value("baseline: data_parallel").run()
    assert not [
        f for f in charts_on(at) if "with and without remat" in f["layout"]["title"]["text"]
    ]
    assert any("with every layer group recomputed" in c.value for c in at.caption)


def test_large_programs_get_the_plan_without_remat_drawn_when_priced(gpt_tiny, monkeypatch):
    """On llama3-70b pricing the plan without remat takes seconds: the page renders without it,
    says so, and draws it once the background pricing has ended (here forced on GPT tiny)."""
    import threading
    import time

    from app import cached, remat_views

    monkeypatch.setattr(remat_views, "FOREGROUND_OPS", 0)
    # The pricing waits for the test's word: the first run must find it unfinished.
    priced, price = threading.Event(), remat_views._comparison
    monkeypatch.setattr(remat_views, "_comparison", lambda *a: priced.wait(60) and price(*a))
    at = start()
    mesh = tc.MeshSpec.parse(at.session_state["mesh_text"])
    plan = tc.baselines.fsdp(gpt_tiny, mesh).with_remat(gpt_tiny, {"blocks": "dots"})
    key = at.session_state["model_spec"].key
    at.session_state["workspaces"][key]["imported"]["fsdp remat"] = plan
    at = goto(at, "strategy")
    at.selectbox(key="w.strategy_choice").set_value("imported: fsdp remat").run()
    assert not at.exception and not errors(at)
    assert any("Pricing the same plan without remat" in i.value for i in at.info)
    assert "Recompute flops" not in {m.label for m in at.metric}
    priced.set()
    deadline = time.time() + 60
    while not all(e.is_set() for k, e in cached._jobs.items() if k[0] == "remat"):
        assert time.time() < deadline, "the background pricing did not end"
        time.sleep(0.1)
    at.run()
    assert not any("Pricing the same plan without remat" in i.value for i in at.info)
    assert any("with and without remat" in f["layout"]["title"]["text"] for f in charts_on(at))
    assert "Recompute flops" in {m.label for m in at.metric}


@pytest.fixture
def tiny_chip(monkeypatch):
    """A made-up chip with 12 MB usable: GPT tiny at batch 256 fits 8 of them only with remat."""
    spec = tc.HardwareSpec(TINY_CHIP, 1.97e14, 8.1e11, int(12e6 / 0.9), 9e10, 2.5e10)
    monkeypatch.setitem(tc.HARDWARE_PRESETS, TINY_CHIP, spec)
    return spec


def slot_of(at) -> dict:
    ss = at.session_state
    return ss["runs"][(ss["model_spec"].key, ss["mesh_text"], ss["hardware"])]


def on_tiny_chip(no_remat: bool = True):
    """GPT tiny at batch 256 (activations dominate) on a chip whose memory only plans with remat,
    more devices or a smaller batch fit."""
    from app.cached import ModelSpec

    at = start()
    at.session_state["model_spec"] = ModelSpec("zoo", "gpt", "tiny", True, batch=256)
    at.session_state["hardware"] = TINY_CHIP
    at.session_state["hardware_input"] = TINY_CHIP
    if no_remat:
        forbids = [f"!remat[{g}]={p}" for g in ("blocks", "ln_f") for p in POLICIES[1:]]
        at.session_state["workspaces"][at.session_state["model_spec"].key] = {
            "pins": forbids,
            "imported": {},
        }
    at = goto(at, "search")
    # Simulations, not seconds, end these searches: the same result on a busy machine.
    at.number_input(key="w.num_simulations").set_value(30).run()
    at.number_input(key="w.budget_s").set_value(120.0).run()
    return at


def test_make_it_fit_prices_remat_more_devices_and_a_smaller_batch(tiny_chip):
    at = on_tiny_chip()
    at.button(key="run_search").click().run()
    assert not at.exception and not errors(at)[1:]
    assert slot_of(at)["best_fits"] is False
    assert "Make it fit" in [s.value for s in at.subheader]
    at.number_input(key="w.fit_budget_s").set_value(120.0).run()
    at.button(key="fit_find").click().run()
    assert not at.exception
    table = frame_with(at, "option", "change", "step time", "peak memory", "fits")
    assert len(table) == 3
    remat, mesh, batch = (table.iloc[i] for i in range(3))
    assert remat["fits"] == "yes" and "remat[blocks]=full" in remat["change"]
    assert mesh["option"].endswith("devices") and mesh["fits"] == "yes"
    assert batch["option"].startswith("Batch ") and batch["fits"] == "yes"
    assert any("Why fewer devices cannot fit" in c.value for c in at.caption)
    first_best = slot_of(at)["best"]

    # Apply remat: the forbids give way to remat pins, the search runs again and fits.
    at.button(key="fit_apply_remat").click().run()
    assert not at.exception
    assert set(pins(at)) == {"remat[blocks]=full", "remat[ln_f]=full"}
    slot = slot_of(at)
    assert slot["status"] == "done" and slot["best_fits"] is True and slot["runs"] == 2
    assert dict(slot["best"].remat) == {"blocks": "full", "ln_f": "full"}
    assert slot["previous"]["strategy"] == first_best  # nothing lost
    assert "Make it fit" not in [s.value for s in at.subheader]
    assert any("Applied" in i.value for i in at.info)


def test_make_it_fit_applies_more_devices_or_a_smaller_batch_and_keeps_the_old_run(tiny_chip):
    at = on_tiny_chip()
    at.button(key="run_search").click().run()
    old_key = at.session_state["model_spec"].key
    old_run = (old_key, at.session_state["mesh_text"], TINY_CHIP)
    at.number_input(key="w.fit_budget_s").set_value(120.0).run()
    at.button(key="fit_find").click().run()
    # More devices: the mesh changes, its run starts with the plan priced there (under the remat
    # forbids), a search runs on it and keeps it unless it finds better; the old run is kept.
    mesh = frame_with(at, "option", "change", "fits").iloc[1]
    at.button(key="fit_apply_mesh").click().run()
    assert not at.exception and f"`{at.session_state['mesh_text']}`" in mesh["change"]
    slot = slot_of(at)
    assert slot["status"] == "done" and slot["best_fits"] is True and slot["previous"] is not None
    assert at.session_state["runs"][old_run]["best_fits"] is False
    assert not dict(slot["best"].remat)  # the forbids held
    # Back to the old mesh (as the Model page does), then a smaller batch.
    at.session_state["mesh_text"] = old_run[1]
    at.run()
    at.button(key="fit_find").click().run()
    batch = frame_with(at, "option", "fits").iloc[2]["option"]  # "Batch 4 instead of 8"
    at.button(key="fit_apply_batch").click().run()
    assert not at.exception
    spec = at.session_state["model_spec"]
    assert spec.batch == int(batch.split()[1]) and spec.key != old_key
    assert slot_of(at)["status"] == "done" and slot_of(at)["best_fits"] is True
    # The model at its own batch keeps its pins and its run.
    ss = at.session_state
    assert ss["runs"][(old_key, ss["mesh_text"], TINY_CHIP)]["best"] is not None
    assert len(ss["workspaces"][old_key]["pins"]) == 2 * len(POLICIES[1:])


def test_mesh_shapes_are_compared_charted_and_one_is_applied(gpt_tiny):
    at = goto(start(), "search")
    assert "Mesh shapes of 8 devices" in [s.value for s in at.subheader]
    # Simulations, not seconds, end each shape's search: the same ranking on a busy machine.
    at.number_input(key="w.num_simulations").set_value(20).run()
    at.number_input(key="w.mesh_budget_s").set_value(120.0).run()
    at.button(key="mesh_compare").click().run()
    assert not at.exception and not errors(at)
    ss = at.session_state
    ranking = ss["mesh_rankings"][(ss["model_spec"].key, 8, "tpu-v5e", ())]
    shapes = {str(p.mesh) for p in ranking}
    assert shapes == {str(m) for m in tc.mesh_shapes(8, "tpu-v5e")}
    fig = next(f for f in charts_on(at) if any(t.get("name") == "step time" for t in f["data"]))
    bars = {t["name"]: t for t in fig["data"]}
    assert sorted(bars["step time"]["y"]) == sorted(shapes)
    assert bars["step time"]["x"] == [p.step_time_s for p in ranking]
    assert len(frame_with(at, "mesh", "step time", "peak memory", "remat")) == len(ranking)
    # Use another shape: the mesh changes, its slot starts with that plan, a search runs.
    other = next(s for s in (str(p.mesh) for p in ranking) if s != ss["mesh_text"])
    at.selectbox(key="mesh_pick").set_value(other).run()
    at.button(key="mesh_use").click().run()
    assert not at.exception
    assert at.session_state["mesh_text"] == other
    slot = slot_of(at)
    assert slot["status"] == "done" and slot["previous"] is not None
    assert at.session_state["mesh_input"] == other  # the Model page shows it too


def test_make_it_fit_says_why_an_option_does_not_apply(monkeypatch):
    """A forward pass has nothing to recompute; its weights alone outgrow the chip at any batch."""
    from app.cached import ModelSpec

    spec = tc.HardwareSpec(TINY_CHIP, 1.97e14, 8.1e11, int(0.01e6 / 0.9), 9e10, 2.5e10)
    monkeypatch.setitem(tc.HARDWARE_PRESETS, TINY_CHIP, spec)
    at = start()
    at.session_state["model_spec"] = ModelSpec("zoo", "gpt", "tiny", False)
    at.session_state["hardware"] = TINY_CHIP
    at.session_state["hardware_input"] = TINY_CHIP
    at = goto(at, "search")
    at.number_input(key="w.num_simulations").set_value(20).run()
    at.number_input(key="w.budget_s").set_value(120.0).run()
    at.button(key="run_search").click().run()
    assert slot_of(at)["best_fits"] is False
    at.number_input(key="w.fit_budget_s").set_value(120.0).run()
    at.button(key="fit_find").click().run()
    assert not at.exception
    table = frame_with(at, "option", "change", "fits")
    remat, mesh, batch = (table.iloc[i] for i in range(3))
    assert "no remat group" in remat["change"] and remat["fits"] == ""
    # Tiny dims stop dividing long before 512 devices: more of them stop helping.
    assert mesh["change"].startswith("no power of two up to 512 devices fits; the closest: ")
    assert batch["change"].startswith("no smaller batch fits: batch 1 needs")
    assert all(at.button(key=f"fit_apply_{k}").disabled for k in ("remat", "mesh", "batch"))
