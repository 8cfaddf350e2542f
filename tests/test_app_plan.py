"""AppTests of the explaining parts of the explorer: why this plan, the per-op view, the top of
the search tree and the MCTS lesson (helpers from test_app)."""

from __future__ import annotations

import json

from test_app import errors, goto, gpt_tiny, pins, run_slot, start  # noqa: F401 (fixture)

from app.cached import ModelSpec


def frame_with(at, *columns: str):
    """The first dataframe on the page holding these columns (display-only frames carry no key)."""
    for d in at.dataframe:
        if set(columns) <= set(d.value.columns):
            return d.value
    raise AssertionError(f"no table with columns {columns}")


def test_why_this_plan_table_pins_an_alternative_and_searches():
    at = goto(start(), "strategy")
    at.selectbox(key="w.strategy_choice").set_value("baseline: data_parallel").run()
    assert not at.exception
    assert "Why this plan" in [s.value for s in at.subheader]
    table = at.dataframe(key="whatif_table").value
    assert len(table) > 0 and {"decision", "instead", "Δ step time", "collectives vanish"} <= set(
        table.columns
    )
    # Sorted by consequence: alternatives that fit first, larger changes before smaller ones.
    assert table["fits"].iloc[0] == "yes" or (table["fits"] == "NO").all()
    pin_text = at.button(key="whatif_pin").label
    at.button(key="whatif_pin").click().run()
    assert not at.exception and not errors(at)
    # The pins of the first row joined the workspace and a search ran under them.
    wanted = pin_text.removeprefix("Pin ").removesuffix(" and search again").split(", ")
    assert set(wanted) <= set(pins(at))
    assert run_slot(at)["status"] == "done" and run_slot(at)["pins"] == pins(at)


def test_per_op_view_shows_shardings_case_and_collectives():
    at = goto(start(), "strategy")
    at.selectbox(key="w.strategy_choice").set_value("baseline: data_parallel").run()
    assert "Per-op view" in [s.value for s in at.subheader]
    costliest = frame_with(at, "op", "where", "flops / device")
    assert len(costliest) > 0
    cases = set()
    for op in at.selectbox(key="op_pick").options[:20]:
        at.selectbox(key="op_pick").set_value(int(op.split(" ")[0][1:])).run()
        assert not at.exception
        metrics = {m.label: m.value for m in at.metric}
        cases.add(metrics["Case"])
        shardings = frame_with(at, "operand or result", "sharding")
        assert shardings["operand or result"].iloc[-1] == "result"
    # Data parallelism: matmuls over the batch reduce gradients (partial sums over `data`).
    assert "contracting-sharded" in cases
    # Any op by index, not only the costliest.
    at.number_input(key="op_index").set_value(0).run()
    assert not at.exception and "#0" in "\n".join(m.value for m in at.markdown)


def test_search_page_shows_the_top_of_the_tree():
    at = goto(start(), "search")
    at.number_input(key="w.budget_s").set_value(1.0).run()
    at.button(key="run_search").click().run()
    assert not at.exception and not errors(at)
    edges = run_slot(at)["tree_top"]
    assert edges and edges[0].depth == 1 and edges[0].visits >= 1
    assert "The search tree" in [s.value for s in at.subheader]
    sunburst = next(
        json.loads(p.proto.spec)
        for p in at.get("plotly_chart")
        if json.loads(p.proto.spec)["data"][0]["type"] == "sunburst"
    )
    assert sunburst["data"][0]["customdata"][1:] == [e.visits for e in edges]
    tree = frame_with(at, "action", "visits", "mean reward")
    assert tree["visits"].tolist() == [e.visits for e in edges]


def test_versus_previous_best_groups_the_parts_of_a_named_dim():
    import toast_core as tc
    from app import reports

    # N0 cut into 21 parts (as a conflict's cut does on the U-Net), all moved from data to model.
    parts = tuple((f"N0.{i}", ("data",)) for i in range(21))
    old = tc.Strategy(parts + (("N1", ("model",)),))
    new = tc.Strategy(tuple((n, ("model",)) for n, _ in parts))
    rows = reports.strategy_diff(old, new)
    assert rows[0] == {
        "decision": "N0.0 ... N0.20 (21 parts of N0)",
        "before": "data",
        "after": "model",
    }
    assert rows[1] == {"decision": "N1", "before": "model", "after": "-"}
    assert len(rows) == 2


def test_mcts_lesson_walks_through_one_search_with_its_tree():
    from app.lessons import LESSONS

    at = goto(start(), "learn")
    i = next(k for k, lesson in enumerate(LESSONS) if "MCTS" in lesson.title)
    at.radio(key="w.lesson").set_value(i).run()
    assert not at.exception and not errors(at)
    text = "\n".join(m.value for m in at.markdown)
    for word in ("**state**", "**An action**", "*Rollout*", "**The reward**"):
        assert word in text
    # The tree of the short search, as a table with visits.
    assert "| action | visits | mean reward |" in text and "shard" in text
    at.button(key="load_lesson").click().run()
    assert not at.exception and at.session_state["model_spec"].model == "mlp"


def _analysis(model: str):
    import toast_core as tc
    from demos import MODEL_ZOO

    w = MODEL_ZOO[model](size="tiny", train=True)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


def test_named_dims_read_as_what_they_are():
    from app.dim_names import DimNamer

    mlp = _analysis("mlp")
    namer = DimNamer(mlp)
    roles = {namer.holder(nd): namer.role(nd) for nd in mlp.named_dims}
    assert roles["batch.x.0, batch.y.0"] == "batch"
    assert roles["params.w1.1, params.w2.0"] == "hidden"
    # The MLP's output dim is the targets' features, not "batch.y.1 of parameters".
    assert roles["batch.y.1"] == "features"
    gpt = DimNamer(_analysis("gpt"))
    assert {gpt.role(nd) for nd in gpt.ana.named_dims} >= {"batch", "sequence", "hidden"}


def test_graph_is_readable_with_a_legend_and_no_internal_names():
    import re

    at = goto(start(), "named_dims")
    dot = at.get("graphviz_chart")[0].proto.spec
    # Laid out at the size Streamlit draws labels (see the test below), nothing smaller.
    assert set(re.findall(r"fontsize=([\d.]+)", dot)) == {"9.6"}
    assert not re.search(r"\w#\d+", dot), "internal value names like slice#237 in the graph"
    assert "…" not in dot  # conflict boxes wrap instead of cutting
    dim_labels = " ".join(re.findall(r'\tnd\d+ \[label="([^"]*)"', dot))
    assert "sequence" in dim_labels and "batch" in dim_labels
    assert any("data input" in m.value and "conflict" in m.value for m in at.markdown)
    table = frame_with(at, "named dim", "is")
    assert "batch" in set(table["is"].str.split(" ").str[0])


def test_large_programs_draw_one_conflict_box_per_kind():
    at = start()
    at.session_state["model_spec"] = ModelSpec("zoo", "unet", "tiny", True)
    at.run()
    goto(at, "named_dims")
    dot = at.get("graphviz_chart")[0].proto.spec
    # 33 conflicts on the U-Net: one box per kind, each conflict still in the table.
    assert "axis_clash conflicts" in dot and "\tk0 " not in dot
    assert len(frame_with(at, "conflict", "kind")) == len(_analysis("unet").conflicts)
    at.radio(key="w.nd_conflict_boxes").set_value("each").run()
    assert "\tk0 " in at.get("graphviz_chart")[0].proto.spec


def test_long_memory_timelines_are_drawn_as_an_envelope_that_keeps_the_peak():
    from app import charts

    timeline = [float((i * 7919) % 1000) for i in range(31_000)]
    timeline[12_345] = 5_000.0
    xs, ys = charts.envelope(timeline)
    assert len(xs) <= 2 * charts.TIMELINE_POINTS + 2 and xs == sorted(xs)
    assert max(ys) == 5_000.0 and xs[ys.index(5_000.0)] == 12_345
    assert min(ys) == min(timeline)
    assert charts.envelope([1.0, 2.0]) == ([0, 1], [1.0, 2.0])


def test_why_this_plan_waits_for_a_click_on_large_programs():
    at = goto(start("default"), "strategy")
    assert at.button(key="explain_plan")  # GPT-2: 5,258 ops, seconds of pricing
    assert not [d for d in at.dataframe if "instead" in d.value.columns]
    at.button(key="explain_plan").click().run()
    assert not at.exception
    table = frame_with(at, "decision", "instead", "Δ step time")
    assert 0 < len(table) <= 20  # one page of rows
    # Computed once per plan: the table stays on the next run without a click.
    at.run()
    assert frame_with(at, "decision", "instead", "Δ step time").equals(table)


def _graphs(at) -> list[str]:
    return [g.proto.spec for g in at.get("graphviz_chart")]


def test_graph_highlights_the_picked_op_and_shows_its_per_op_view(gpt_tiny):  # noqa: F811
    import re

    from app import charts

    at = goto(start(), "named_dims")
    assert "\top [" not in _graphs(at)[0]
    groups = charts.op_groups(gpt_tiny)
    matmul = next(g[0] for g in groups if gpt_tiny.program.ops[g[0]].primitive == "dot_general")
    at.selectbox(key="graph_op").set_value(matmul).run()
    assert not at.exception and not errors(at)
    dot = _graphs(at)[0]
    op_node = re.search(r'\top \[label="([^"]*)"', dot)
    assert op_node and op_node.group(1).startswith("dot_general(")
    assert not re.search(r"\w#\d+", op_node.group(1))  # no internal value names
    held = set(charts.op_dims(gpt_tiny, matmul))
    linked = {int(n) for n in re.findall(r"\top -> nd(\d+)", dot)}
    # Every named dim the op holds is drawn (as its layer group's node) and linked to the op.
    nodes = charts.dim_nodes(gpt_tiny, True)
    assert linked == {n.rep for n in nodes if held & set(n.members)}
    assert charts.HIGHLIGHT_LINE in dot
    # Its per-op view, under the plan of the Strategy page.
    assert {m.label for m in at.metric} >= {"Case", "Flops / device"}
    assert frame_with(at, "operand or result", "sharding")["operand or result"].iloc[-1] == "result"
    # From the Strategy page's per-op view to the graph.
    goto(at, "strategy")
    op = at.selectbox(key="op_pick").value
    at.button(key="op_to_graph").click().run()
    assert not at.exception
    assert at.session_state["graph_op"] == op
    assert re.search(r'\top \[label="', _graphs(at)[0])


def _op_table_rows(at) -> list[int]:
    """The rows selected in the Named dims page's ops table (its key changes with its version)."""
    version = at.session_state["op_table_version"] if "op_table_version" in at.session_state else 0
    return list(at.session_state[f"op_table_{version}"]["selection"]["rows"])


def test_op_picked_in_the_box_is_the_selected_row_of_the_ops_table(gpt_tiny):  # noqa: F811
    from app import charts

    at = goto(start(), "named_dims")
    assert _op_table_rows(at) == []
    reps = [g[0] for g in charts.op_groups(gpt_tiny)]
    for row in (3, 1):  # one pick, then another: the table follows each
        at.selectbox(key="graph_op").set_value(reps[row]).run()
        assert not at.exception
        assert _op_table_rows(at) == [row]
        assert at.session_state["graph_op"] == reps[row]
    at.selectbox(key="graph_op").set_value(-1).run()  # (none): no row
    assert _op_table_rows(at) == []


def test_graph_draws_a_selection_the_filters_leave_out_and_one_group_in_full(gpt_tiny):  # noqa: F811
    from app import charts

    nodes = charts.dim_nodes(gpt_tiny, True)
    last = nodes[-1]
    flt = charts.GraphFilter(top_n=1, highlight_dims=last.members)
    dot = charts.named_dim_graph(gpt_tiny, flt).source
    assert f"\tnd{last.rep} " in dot and f"\tnd{nodes[1].rep} " not in dot
    assert charts.HIGHLIGHT_LINE in dot
    # A conflict picked in the table gets its own box even when conflicts are drawn per kind.
    flt = charts.GraphFilter(conflict_detail=False, highlight_conflicts=(0,))
    dot = charts.named_dim_graph(gpt_tiny, flt).source
    assert "\tk0 " in dot and "conflicts" in dot

    at = goto(start(), "named_dims")
    group = next(n for n in nodes if len(n.members) > 1)
    name = gpt_tiny.named_dims[group.rep].name
    at.selectbox(key="graph_group").set_value(name).run()
    assert not at.exception
    overview, detail = _graphs(at)
    # Every layer's named dim, each its own node, with the tensors of each layer.
    for m in group.members:
        assert f"\tnd{m} " in detail
    assert "[*]" not in detail and "[*]" in overview
    at.selectbox(key="graph_group").set_value("K0").run()
    detail = _graphs(at)[1]
    k0 = gpt_tiny.conflicts[0]
    assert all(f"option {o.index} (" in detail for o in k0.options)


def test_graph_is_laid_out_at_the_size_streamlit_draws_its_labels(gpt_tiny):  # noqa: F811
    """Streamlit's CSS draws every `st.graphviz_chart` label at `twoSm * 0.8` (9.6 px), whatever
    DOT's fontsize: a layout for larger text scaled llama3-70b's labels down to ~8 px."""
    import re
    from pathlib import Path

    import streamlit

    from app import charts

    js = Path(streamlit.__file__).parent / "static" / "static" / "js"
    chart_js = next(js.glob("GraphVizChart.*.js")).read_text()
    assert re.search(r"fontSize:`calc\(\$\{\w+\.fontSizes\.twoSm\} \* 0\.8\)`", chart_js)
    assert any("twoSm:`0.75rem`" in f.read_text() for f in js.glob("utils.*.js"))
    drawn_px = round(16 * 0.75 * 0.8, 3)
    assert float(charts.FONT_PT) == float(charts.EDGE_FONT_PT) == drawn_px
    assert f"fontsize={charts.FONT_PT}" in charts.named_dim_graph(gpt_tiny).source
