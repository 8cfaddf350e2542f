"""The explorer's pages under Streamlit's AppTest (no browser, no server).

The default demo is GPT-2 small shapes (train step, mesh data=2,model=4, tpu-v5e), where the best
plan really shards; most pages are exercised on GPT tiny, which is faster to redraw. Bad input
(a user file with a syntax error, a user function that raises, bad mesh text, bad pins, bad
strategy JSON) must show a one-line message and keep the previous state, never a traceback.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import toast_core as tc
from app import charts, reports
from app.cached import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app" / "streamlit_app.py")
RED = charts.CONFLICT_LINE


def start(size: str = "tiny") -> AppTest:
    """The explorer with the GPT demo at `size` committed (`"default"`: as a new user finds it)."""
    at = AppTest.from_file(APP, default_timeout=180)
    if size != "default":
        at.session_state["model_spec"] = ModelSpec("zoo", "gpt", size, True)
        at.session_state["zoo_size"] = size
    at.run()
    assert not at.exception, at.exception
    return at


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"app_pages/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def markdown(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def pins(at: AppTest) -> list[str]:
    return list(at.session_state["workspaces"][at.session_state["model_spec"].key]["pins"])


def run_slot(at: AppTest) -> dict:
    return at.session_state["runs"][
        (at.session_state["model_spec"].key, at.session_state["mesh_text"], "tpu-v5e")
    ]


@pytest.fixture(scope="module")
def gpt_tiny():
    from demos import MODEL_ZOO

    w = MODEL_ZOO["gpt"](size="tiny", train=True)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


# -- Model page ---------------------------------------------------------------------------------


def test_model_page_loads_default_demo(gpt_tiny):
    at = start()
    assert at.title[0].value == "Model"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Named dims"] == str(len(gpt_tiny.named_dims))
    assert metrics["Conflicts"] == str(len(gpt_tiny.conflicts))
    assert metrics["Tensor dims"] == str(gpt_tiny.n_tensor_dims)
    assert "gpt tiny (train step)" in [s.value for s in at.subheader]
    assert not errors(at)


def test_model_page_loads_another_zoo_model_and_keeps_it_across_pages():
    at = start()
    at.selectbox(key="w.zoo_model").set_value("mlp").run()
    assert at.selectbox(key="w.zoo_size").options[0] == "tiny"
    at.button(key="load_zoo").click().run()
    assert not at.exception
    assert at.session_state["model_spec"].model == "mlp"
    assert any("Loaded mlp tiny" in s.value for s in at.success)
    goto(at, "named_dims")
    goto(at, "model")
    # The widget came back with the committed choice, not the default.
    assert at.selectbox(key="w.zoo_model").value == "mlp"
    assert "mlp tiny (train step)" in [s.value for s in at.subheader]


def test_bad_mesh_text_shows_error_and_keeps_previous_mesh():
    at = start()
    at.text_input(key="w.mesh_input").input("data=two,model=4").run()
    assert not at.exception
    msgs = errors(at)
    assert msgs and "mesh" in msgs[0] and "data=two" in msgs[0]
    assert at.session_state["mesh_text"] == "data=2,model=4"
    at.text_input(key="w.mesh_input").input("data=4, model=2").run()
    assert not errors(at)
    assert at.session_state["mesh_text"] == "data=4,model=2"


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _load_file(at: AppTest, target: str) -> AppTest:
    at.radio(key="w.source").set_value("Python file").run()
    at.text_input(key="w.file_target").input(target).run()
    at.button(key="load_file").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_user_file_with_syntax_error_shows_file_and_line(tmp_path):
    path = _write(tmp_path, "broken.py", "import jax\n\ndef make(:\n    return 1\n")
    at = _load_file(start(), f"{path}:make")
    msgs = errors(at)
    assert len(msgs) == 1 and msgs[0].startswith("broken.py:3: SyntaxError")
    assert "Traceback" not in msgs[0]
    assert at.session_state["model_spec"].model == "gpt"  # the previous model stays loaded
    assert "gpt tiny (train step)" in [s.value for s in at.subheader]


def test_user_function_that_raises_shows_file_and_line(tmp_path):
    path = _write(
        tmp_path,
        "raises.py",
        """\
        import jax.numpy as jnp


        def make():
            raise ValueError("no weights here")
        """,
    )
    at = _load_file(start(), f"{path}:make")
    msgs = errors(at)
    assert msgs == ["raises.py:5: make() raised ValueError: no weights here"]
    assert at.session_state["model_spec"].model == "gpt"


def test_user_fn_failing_in_trace_and_missing_function(tmp_path):
    path = _write(
        tmp_path,
        "shapes.py",
        """\
        import jax.numpy as jnp


        def step(x):
            return x @ jnp.ones((3, 3))


        def make():
            return step, (jnp.ones((4, 5)),)
        """,
    )
    at = _load_file(start(), f"{path}:make")
    msgs = errors(at)
    assert msgs and msgs[0].startswith("shapes.py:5:") and "TypeError" in msgs[0]
    at.text_input(key="w.file_target").input(f"{path}:nothing").run()
    at.button(key="load_file").click().run()
    assert "expected a function `nothing` in shapes.py" in errors(at)[0]
    at.text_input(key="w.file_target").input("no_such_file.py:make").run()
    at.button(key="load_file").click().run()
    assert "expected an existing Python file" in errors(at)[0]


def test_user_file_loads_and_analyzes(tmp_path):
    path = _write(
        tmp_path,
        "good.py",
        """\
        import jax.numpy as jnp


        def make():
            def layer(x, w):
                return jnp.tanh(x @ w)

            return layer, (jnp.ones((8, 16)), jnp.ones((16, 4)))
        """,
    )
    at = _load_file(start(), f"{path}:make")
    assert not errors(at)
    assert at.session_state["model_spec"].source == "file"
    assert "good.py:make" in [s.value for s in at.subheader]
    assert {m.label: m.value for m in at.metric}["Named dims"] == "3"


# -- Named dims page ----------------------------------------------------------------------------


def test_named_dims_graph_table_and_filters(gpt_tiny):
    at = goto(start(), "named_dims")
    dot = at.get("graphviz_chart")[0].proto.spec
    assert "digraph" in dot and RED in dot and "K0" in dot
    assert "self" in dot and "option 0" in dot  # conflicts in red with their options
    tables = at.dataframe
    assert len(tables) >= 2  # conflicts, named dims
    n_nodes = dot.count("\tnd")
    assert n_nodes >= 2

    at.number_input(key="w.nd_top_n").set_value(2).run()
    dot2 = at.get("graphviz_chart")[0].proto.spec
    assert len({line.split()[0] for line in dot2.splitlines() if line.startswith("\tnd")}) <= 3
    assert any("Showing 2 of" in c.value for c in at.caption)

    at.checkbox(key="w.nd_collapse").uncheck().run()
    at.number_input(key="w.nd_top_n").set_value(100).run()
    dot3 = at.get("graphviz_chart")[0].proto.spec
    shown = {line.split()[0] for line in dot3.splitlines() if line.startswith("\tnd")}
    assert len(shown) == len(gpt_tiny.named_dims)

    at.checkbox(key="w.nd_show_conflicts").uncheck().run()
    assert RED not in at.get("graphviz_chart")[0].proto.spec
    at.selectbox(key="conflict_detail").set_value("K1").run()
    assert "**K1**" in markdown(at)
    # Filters survive a page switch.
    goto(goto(at, "model"), "named_dims")
    assert at.checkbox(key="w.nd_show_conflicts").value is False


# -- Search page --------------------------------------------------------------------------------


def test_search_runs_pins_and_re_search_keeps_pins(gpt_tiny):
    at = goto(start(), "search")
    at.number_input(key="w.budget_s").set_value(1.0).run()
    at.button(key="run_search").click().run()
    assert not at.exception and not errors(at)
    slot = run_slot(at)
    assert slot["status"] == "done" and slot["best"] is not None
    assert len(slot["history"]) >= 2
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert fig["data"][0]["name"] == "best found" and len(fig["data"][0]["x"]) >= 2
    assert {m.label for m in at.metric} >= {"Best step time", "Peak memory / device"}

    # Bad pins: a message, and the pin list is untouched.
    at.text_input(key="pin_text").input("N999@model").run()
    at.button(key="add_typed_pin").click().run()
    assert not at.exception
    assert "N999" in errors(at)[0] and pins(at) == []
    at.text_input(key="pin_text").input("shard everything").run()
    at.button(key="add_typed_pin").click().run()
    assert "expected N3@model" in errors(at)[0] and pins(at) == []

    # A pin built from the selectboxes: the batch named dim on `data`.
    batch = next(nd.name for nd in gpt_tiny.named_dims if nd.is_input and not nd.is_persistent)
    at.selectbox(key="pin_dim").set_value(batch).run()
    at.selectbox(key="pin_axes").set_value("data").run()
    at.button(key="add_dim_pin").click().run()
    assert not errors(at) and pins(at) == [f"{batch}@data"]
    # A contradictory pin names both pins.
    at.selectbox(key="pin_axes").set_value("model").run()
    at.button(key="add_dim_pin").click().run()
    assert "contradictory" in errors(at)[0] and pins(at) == [f"{batch}@data"]

    first_best = run_slot(at)["best"]
    at.button(key="run_search").click().run()
    assert not at.exception and not errors(at)
    slot = run_slot(at)
    assert slot["pins"] == [f"{batch}@data"] and pins(at) == [f"{batch}@data"]
    assert dict(slot["best"].shardings)[batch] == ("data",)
    assert slot["previous"]["strategy"] == first_best
    assert "Versus the previous best" in [s.value for s in at.subheader]
    assert f"`{batch}@data`" in markdown(at)

    # Conflict pins from the selectboxes, and removal.
    at.selectbox(key="pin_conflict").set_value("K0").run()
    at.selectbox(key="pin_option").set_value("1").run()
    at.radio(key="pin_k_mode").set_value("forbid").run()
    at.button(key="add_conflict_pin").click().run()
    assert pins(at) == [f"{batch}@data", "!K0=1"]
    at.button(key="rm_pin_0").click().run()
    assert pins(at) == ["!K0=1"]
    # Pins and results survive a page switch.
    goto(goto(at, "strategy"), "search")
    assert pins(at) == ["!K0=1"] and run_slot(at)["best"] is not None
    assert at.get("plotly_chart")


# -- Strategy page ------------------------------------------------------------------------------


def test_strategy_page_shows_costs_memory_collectives_and_baselines():
    at = goto(start(), "strategy")
    labels = {m.label for m in at.metric}
    assert {"Step time", "Compute", "Communication", "Peak memory / device"} <= labels
    # Values short enough for a third of a 1280 px page (units in the value, three digits).
    values = {m.label: m.value for m in at.metric}
    assert all(len(values[k]) <= 8 for k in ("Step time", "Compute", "Communication")), values
    at.selectbox(key="w.strategy_choice").set_value("baseline: data_parallel").run()
    assert not at.exception
    figs = [json.loads(p.proto.spec) for p in at.get("plotly_chart")]
    assert len(figs) == 3  # cost breakdown, memory timeline, baselines side by side
    names = {t.get("name") for f in figs for t in f["data"]}
    assert "live bytes per device" in names and "communication" in names
    assert any("all-reduce" in (n or "") for n in names)
    assert "Collectives" in [s.value for s in at.subheader]
    assert any("collectives per step" in c.value for c in at.caption)
    assert at.session_state["strategy_choice"] == "baseline: data_parallel"
    # The choice is shared with the Export page.
    goto(at, "export")
    assert at.selectbox(key="w.strategy_choice").value == "baseline: data_parallel"


# -- Validate page ------------------------------------------------------------------------------


@pytest.mark.slow
def test_validate_page_compiles_and_compares():
    at = goto(start(), "validate")
    at.selectbox(key="w.strategy_choice").set_value("baseline: data_parallel").run()
    at.button(key="run_validate").click().run()
    assert not at.exception and not errors(at)
    assert any("Numerics match" in s.value for s in at.success)
    quantities = at.dataframe[0].value["quantity"].tolist()
    assert quantities[0] == "flops per device"
    assert "memory per device (bytes)" in quantities


def test_validate_page_explains_shape_only_workloads_and_too_many_devices():
    at = start()
    at.selectbox(key="w.zoo_model").set_value("mlp").run()
    at.selectbox(key="w.zoo_size").set_value("large").run()
    at.button(key="load_zoo").click().run()
    goto(at, "validate")
    assert any("shapes only" in i.value for i in at.info)
    goto(at, "model")
    at.selectbox(key="w.zoo_size").set_value("tiny").run()
    at.button(key="load_zoo").click().run()
    at.text_input(key="w.mesh_input").input("data=4,model=4").run()
    goto(at, "validate")
    assert any("needs 16 devices" in e for e in errors(at))


# -- Learn page ---------------------------------------------------------------------------------


def test_learn_lessons_compute_numbers_and_load():
    at = goto(start(), "learn")
    for i in range(5):
        at.radio(key="w.lesson").set_value(i).run()
        assert not at.exception and not errors(at)
        text = markdown(at)
        assert "step time" in text or "self-conflict" in text
        assert any(ch.isdigit() for ch in text)
    at.radio(key="w.lesson").set_value(3).run()  # attention's sequence conflict
    text = markdown(at)
    assert "self-conflict" in text and "would hold mesh axis 'model' twice" in text
    at.button(key="load_lesson").click().run()
    assert not at.exception and not errors(at)
    loaded_pins = pins(at)
    assert any(p.endswith("@model") for p in loaded_pins)
    assert any(p.startswith("K") and p.endswith("=0") for p in loaded_pins)
    assert at.session_state["mesh_text"] == "data=2,model=4"
    at.radio(key="w.lesson").set_value(1).run()  # Megatron on the MLP
    at.button(key="load_lesson").click().run()
    assert at.session_state["model_spec"].model == "mlp"
    assert pins(at) == ["params.w1.1@model"]
    goto(at, "search")
    assert "params.w1.1@model" in markdown(at)


# -- Export page --------------------------------------------------------------------------------


def test_export_json_snippet_report_and_import(gpt_tiny):
    at = goto(start(), "export")
    at.selectbox(key="w.strategy_choice").set_value("baseline: fsdp").run()
    codes = {c.language: c.value for c in at.code}
    doc = json.loads(codes["json"])
    assert doc["name"] == "fsdp" and doc["shardings"] and doc["options"]
    strategy = tc.Strategy.from_json(codes["json"], gpt_tiny)
    assert strategy.shardings

    snippet = codes["python"]
    namespace: dict = {}
    exec(compile(snippet.split("def shardings")[0], "snippet", "exec"), namespace)
    mesh = tc.MeshSpec.parse("data=2,model=4")
    in_specs, out_specs = tc.partition_specs(gpt_tiny, strategy, mesh)
    assert namespace["in_specs"] == tuple(in_specs) and namespace["out_specs"] == out_specs

    assert any(d.label == "Download report (Markdown)" for d in at.get("download_button"))
    assert "# TOAST sharding report" in markdown(at)

    # Import it back under a new name; then a broken JSON is refused with a message.
    doc["name"] = "mine"
    at.text_area(key="import_text").input(json.dumps(doc)).run()
    at.button(key="import_text_button").click().run()
    assert not errors(at)
    assert at.session_state["strategy_choice"] == "imported: mine"
    assert json.loads({c.language: c.value for c in at.code}["json"])["name"] == "mine"
    at.text_area(key="import_text").input('{"schema": 1, "shardings": {"N999": ["data"]}}').run()
    at.button(key="import_text_button").click().run()
    assert "N999" in errors(at)[0]
    assert at.session_state["strategy_choice"] == "imported: mine"


def test_reports_diff_and_pins_are_consistent(gpt_tiny):
    mesh = tc.MeshSpec.parse("data=2,model=4")

    base = tc.baselines.all(gpt_tiny, mesh)
    dp, fsdp = base["data_parallel"][0], base["fsdp"][0]
    rows = reports.strategy_diff(dp, fsdp)
    assert {r["decision"] for r in rows} >= {f"K{k}" for k, _ in fsdp.options}
    assert reports.strategy_diff(dp, dp) == []
    assert set(reports.decisions_as_pins(fsdp)) == {
        *(f"K{k}={o}" for k, o in fsdp.options),
        *(f"{n}@{'+'.join(a)}" for n, a in fsdp.shardings),
    }
    events = list(
        tc.search_iter(
            gpt_tiny,
            mesh,
            tc.hardware("tpu-v5e"),
            budget_s=None,
            num_simulations=0,
            pins=[p for p in reports.decisions_as_pins(fsdp) if not p.startswith("!")],
        )
    )
    found = events[-1].best_strategy
    # Pinned decisions are kept; the search may add decisions on top of them.
    assert dict(fsdp.shardings).items() <= dict(found.shardings).items()
    assert dict(fsdp.options).items() <= dict(found.options).items()


# -- Issue 12: the default demo and the defects a new user hit -----------------------------------


@pytest.fixture(scope="module")
def gpt2():
    from demos import MODEL_ZOO

    w = MODEL_ZOO["gpt"](size="gpt2", train=True)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


def _baseline_times(ana, mesh_text="data=2,model=4", hw="tpu-v5e") -> dict:

    mesh = tc.MeshSpec.parse(mesh_text)
    out = {}
    for name, (s, _) in tc.baselines.all(ana, mesh).items():
        if s is not None:
            r = tc.estimate(ana, s, mesh, tc.hardware(hw))
            out[name] = r.step_time_s if r.fits else None
    return out


def test_default_demo_search_shards_and_beats_every_baseline(gpt2):
    at = start("default")
    assert "gpt gpt2 (train step)" in [s.value for s in at.subheader]
    assert {m.label: m.value for m in at.metric}["Named dims"] == str(len(gpt2.named_dims))
    wait_for_baselines(goto(at, "search"))
    # The chart names each baseline it cannot draw, and why (expert parallel has no expert dim
    # here; one that does not fit says so).
    times = _baseline_times(gpt2)
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    notes = [t["name"] for t in fig["data"] if t.get("visible") == "legendonly"]
    assert "expert_parallel: not applicable" in notes, notes
    for name in (n for n, t in times.items() if t is None):
        assert any(n.startswith(f"{name}: does not fit") for n in notes), (name, notes)
    assert "that apply and fit" in fig["layout"]["title"]["text"]
    at.number_input(key="w.budget_s").set_value(4.0).run()
    at.button(key="run_search").click().run()
    assert not at.exception and not errors(at)
    slot = run_slot(at)
    assert slot["status"] == "done" and slot["best_fits"]
    assert slot["best"].shardings, "the default search must shard"
    feasible = [t for t in times.values() if t is not None]
    assert feasible and slot["best_step_time_s"] < min(feasible)
    assert not any("Everything replicated" in i.value for i in at.info)

    # "Pin all" freezes the plan: the next search has nothing to decide and stops at once.
    at.button(key="pin_all_best").click().run()
    assert not errors(at)
    assert len(pins(at)) > len(slot["best"].shardings) and any(p.endswith("@-") for p in pins(at))
    at.button(key="run_search").click().run()
    slot = run_slot(at)
    assert slot["status"] == "done" and slot["iteration"] == 0
    assert slot["elapsed_s"] < 2.0, slot["elapsed_s"]  # the budget is 4 s


def test_search_page_says_why_replication_wins():
    at = goto(start(), "search")
    at.number_input(key="w.budget_s").set_value(1.0).run()
    at.button(key="run_search").click().run()
    assert not run_slot(at)["best"].shardings  # GPT tiny: a step is shorter than a collective
    why = [i.value for i in at.info if "Everything replicated" in i.value]
    assert why and "sharding does not pay" in why[0] and "of which" in why[0]
    assert "communication" in why[0] and any(u in why[0] for u in ("us", "ms"))


def _event(ana, fits: bool, t: float, done: bool, iteration: int = 0) -> tc.SearchEvent:
    return tc.SearchEvent(
        iteration=iteration,
        elapsed_s=0.1,
        best_step_time_s=t,
        best_peak_bytes=2.0**30 * (40 if not fits else 1),
        best_fits=fits,
        best_strategy=tc.Strategy(name="search"),
        tree_size=1,
        evaluations=1,
        evals_per_s=10.0,
        done=done,
    )


def test_no_stale_infeasible_box_after_the_search_finds_a_plan_that_fits(monkeypatch, gpt_tiny):
    def fake_search_iter(ana, *args, **kwargs):
        yield _event(ana, False, 1.0, False)
        yield _event(ana, False, 0.9, False, 5)
        yield _event(ana, True, 0.5, True, 9)

    at = goto(start(), "search")
    monkeypatch.setattr(tc, "search_iter", fake_search_iter)
    at.button(key="run_search").click().run()
    assert run_slot(at)["best_fits"] is True
    assert not [e for e in errors(at) if "NO MEMORY-FEASIBLE" in e], errors(at)


def test_iterations_read_seeding_before_the_tree_search():
    from app import state

    slot = {"status": "running", "iteration": 0}
    assert state.iterations_shown(slot) == "seeding"
    assert state.iterations_shown({"status": "running", "iteration": 7}) == 7
    assert state.iterations_shown({"status": "done", "iteration": 0}) == 0


def test_a_stopped_worse_run_does_not_replace_the_better_best(gpt_tiny):

    at = goto(start(), "search")
    at.number_input(key="w.budget_s").set_value(1.0).run()
    at.button(key="run_search").click().run()
    slot = run_slot(at)
    better, better_t = slot["best"], slot["best_step_time_s"]
    # What Stop leaves behind: a run still marked running, with a worse best, same pins.
    worse = tc.baselines.all(gpt_tiny, tc.MeshSpec.parse("data=2,model=4"))["data_parallel"][0]
    slot["previous"] = {
        "strategy": better,
        "step_time_s": better_t,
        "peak_bytes": slot["best_peak_bytes"],
        "fits": True,
        "pins": [],
    }
    slot.update(status="running", best=worse, best_step_time_s=better_t * 30, iteration=288)
    at.run()
    slot = run_slot(at)
    assert slot["status"] == "stopped"
    assert slot["best"] == better and slot["previous"]["strategy"] == worse
    assert any("Stopped at iteration 288" in i.value for i in at.info)
    assert {m.label: m.value for m in at.metric}["Iterations"] == "288"
    assert any("stays the search best" in i.value for i in at.info)
    goto(at, "strategy")
    assert at.session_state["strategy_choice"] == "search best"


def test_events_after_stop_do_not_move_the_stopped_iteration(monkeypatch, gpt_tiny):
    """Stop starts a new script run (Streamlit's fast reruns) that settles the slot while the
    interrupted run is still recording events: those must not move the iteration shown."""
    from app import state

    def search_iter_stopped_at_5(ana, *args, **kwargs):
        yield _event(ana, True, 1.0, False, 0)
        yield _event(ana, True, 0.9, False, 5)
        state.settle_interrupted(state.run_slot())  # what the Stop button's run does meanwhile
        yield _event(ana, True, 0.8, False, 9)
        yield _event(ana, True, 0.7, True, 12)

    at = goto(start(), "search")
    monkeypatch.setattr(tc, "search_iter", search_iter_stopped_at_5)
    at.button(key="run_search").click().run()
    slot = run_slot(at)
    assert (slot["status"], slot["iteration"], slot["best_step_time_s"]) == ("stopped", 5, 0.9)
    at.run()  # the Stop button's run draws the settled slot
    assert any("Stopped at iteration 5;" in i.value for i in at.info), [i.value for i in at.info]
    assert {m.label: m.value for m in at.metric}["Iterations"] == "5"


def test_search_page_does_not_wait_for_the_baselines(monkeypatch):
    """On llama3-70b the baselines take ~10 s to price: the Search page renders at once, says
    they are being priced, and draws their lines once the background pricing ends."""
    import threading
    import time

    from app import cached

    release = threading.Event()
    real = cached.baseline_reports

    def slow_baseline_reports(*args, **kwargs):
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(cached, "baseline_reports", slow_baseline_reports)
    monkeypatch.setattr(cached, "_warming", set())
    monkeypatch.setattr(cached, "_priced", set(), raising=False)
    at = start()  # the Model page starts the pricing in the background
    began = time.perf_counter()
    goto(at, "search")
    assert time.perf_counter() - began < 10
    chart = at.get("plotly_chart")[0].proto.spec
    assert "being priced" in chart and "data_parallel" not in chart
    assert at.button(key="run_search")
    release.set()
    wait_for_baselines(at)
    chart = at.get("plotly_chart")[0].proto.spec
    assert "being priced" not in chart and "data_parallel" in chart


def wait_for_baselines(at: AppTest) -> AppTest:
    """Waits for the background pricing of the baselines (see `cached.warm`), then reruns."""
    import time

    from app import cached

    loaded = cached.load(at.session_state["model_spec"])
    key = (loaded, at.session_state["mesh_text"], at.session_state["hardware"])
    deadline = time.time() + 120
    while cached.baseline_reports_if_ready(*key) is None and time.time() < deadline:
        time.sleep(0.2)
    at.run()
    return at


def test_leaving_the_search_page_during_a_run_says_it_stopped():
    at = goto(start(), "search")
    at.number_input(key="w.budget_s").set_value(0.5).run()
    at.button(key="run_search").click().run()
    run_slot(at)["status"] = "running"  # as if the user left while it ran
    goto(at, "strategy")
    assert any("stopped when you left the Search page" in w.value for w in at.warning)
    assert run_slot(at)["status"] == "stopped"


def test_units_are_binary_in_tables_and_charts():
    at = goto(start(), "named_dims")
    table = next(d.value for d in at.dataframe if "named dim" in d.value.columns)
    assert any(c.startswith("bytes covered (") and "iB)" in c for c in table.columns)
    goto(at, "strategy")
    for chart in at.get("plotly_chart"):
        layout = json.loads(chart.proto.spec)["layout"]
        for name, axis in layout.items():
            if name.startswith(("xaxis", "yaxis")):
                assert axis.get("ticksuffix") != "B", (name, axis)  # SI ticks print decimal MB


def test_strategy_errors_stay_one_short_line(gpt_tiny):
    at = goto(start(), "export")
    doc = {"schema": 1, "shardings": {f"N{100 + i}": ["data"] for i in range(52)}}
    at.text_area(key="import_text").input(json.dumps(doc)).run()
    at.button(key="import_text_button").click().run()
    msg = errors(at)[0]
    assert "\n" not in msg and len(msg) < 400, (len(msg), msg)
    assert "got 52" in msg and "(+47 more)" in msg and "N0..N11" in msg


def test_export_previews_large_artifacts(monkeypatch):
    from app import ui

    monkeypatch.setattr(ui, "PREVIEW_CHARS", 600)
    at = goto(start(), "export")
    at.selectbox(key="w.strategy_choice").set_value("baseline: fsdp").run()
    assert all(len(c.value) <= 600 for c in at.code)
    assert any("the download has all of it" in c.value for c in at.caption)
    head, note = ui.preview("a\n" * 1000, 100)
    assert len(head) <= 100 and head.endswith("a") and "of 1,001 lines" in note
    assert ui.preview("short", 100) == ("short", "")


@pytest.mark.slow
def test_validate_compiles_the_default_at_the_real_size():
    at = goto(start("default"), "validate")
    assert any("shapes only" in i.value for i in at.info)
    at.selectbox(key="w.strategy_choice").set_value("baseline: fsdp").run()
    at.button(key="run_validate").click().run()
    assert not at.exception and not errors(at), errors(at)
    assert "Compiled at the real size" in [s.value for s in at.subheader]
    assert any("Numerics not compared" in c.value for c in at.caption)
    table = at.dataframe[0].value
    flops = table[table["quantity"] == "flops per device"]["predicted / compiled"].iloc[0]
    assert 0.9 <= float(flops.rstrip("x")) <= 1.1, flops


def test_metric_seconds_keep_three_digits():
    from app.fmt import fmt_s_short

    assert [fmt_s_short(t) for t in (0.3692, 0.09306, 0.9999, 1.5, 1.23e-5, -0.1276, 0.0)] == [
        "369 ms", "93.1 ms", "1.00 s", "1.50 s", "12.3 us", "-128 ms", "0 s"
    ]  # fmt: skip


def test_background_pricing_waits_while_a_page_runs(monkeypatch):
    """`cached.warm` prices baselines between page runs: one interpreter lock is shared, and
    pricing beside a page run made the first Search visit on llama3-70b take 3-4 s."""
    import threading
    import time

    from app import cached

    resumed: list[float] = []

    def background() -> None:
        cached._yield_to_pages()
        resumed.append(time.perf_counter())

    with cached.foreground():
        worker = threading.Thread(target=background)
        worker.start()
        time.sleep(0.3)
        assert not resumed  # waiting while the page runs
        page_ended = time.perf_counter()
    worker.join(5)
    assert resumed and resumed[0] >= page_ended
    # A page that never ends (a long search) does not starve it.
    monkeypatch.setattr(cached, "YIELD_MAX_S", 0.2)
    with cached.foreground():
        start_s = time.perf_counter()
        cached._yield_to_pages()
        assert 0.15 < time.perf_counter() - start_s < 2
