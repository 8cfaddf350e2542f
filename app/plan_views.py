"""Two sections of the Strategy page: "why this plan" (the what-if table of `tc.explain`, with a
one-click pin-and-search) and the per-op view (`tc.op_view` of any op of the program).

The what-if table prices every alternative of every decision: seconds on GPT-2, about a minute on
llama3-70b. So it is computed on request (automatically on small programs), cached per (model,
mesh, hardware, strategy), and shown a page of rows at a time.
"""

from __future__ import annotations

import math

import streamlit as st

import toast_core as tc
from app import cached, reports, state
from app.dim_names import public_text
from app.fmt import fmt_bytes, fmt_s

#: Programs with at most this many ops get their what-if table without a click (under ~1 s).
AUTO_EXPLAIN_OPS = 2_000
ROWS_PER_PAGE = 20
COSTLIEST_SHOWN = 15
OP_CHOICES = 60


def _ms_delta(x: float) -> str:
    if math.isnan(x):
        return ""
    return ("+" if x > 0 else "−" if x < 0 else "±") + fmt_s(abs(x))


def _what(ana: tc.Analysis, r) -> str:
    """A named dim as what it is (`1024 sequence (batch.targets.1, ...)`), a conflict's text
    without internal value numbers."""
    if r.decision.startswith("N"):
        return reports.dim_label(ana, tc.parent_name(r.decision.split("..")[0]))
    return public_text(r.what)


def whatif_rows(rows, ana: tc.Analysis) -> list[dict]:
    """Table rows of `tc.WhatIf` records (legal ones priced, illegal ones with the reason)."""
    out = []
    for r in rows:
        out.append(
            {
                "decision": r.decision,
                "what": _what(ana, r),
                "now": r.current,
                "instead": r.alternative,
                "Δ step time": _ms_delta(r.delta_step_s) if r.legal else "illegal",
                "step time": fmt_s(r.step_time_s) if r.legal else "",
                "communication": fmt_s(r.comm_s) if r.legal else "",
                "peak memory": fmt_bytes(r.peak_bytes) if r.legal else "",
                "fits": ("yes" if r.fits else "NO") if r.legal else "",
                "collectives appear": "; ".join(r.appear),
                "collectives vanish": "; ".join(r.vanish),
                "pins": ", ".join(r.pins) if r.legal else r.why_illegal,
            }
        )
    return out


def _pin_target(text: str) -> str:
    """`N3` of `N3@model` or `!N3@data`, `K2` of `K2=1`: what a pin decides."""
    return text.lstrip("!").split("@")[0].split("=")[0]


def pin_and_search(pins: tuple[str, ...]) -> None:
    """Callback: replace the workspace pins on the same decisions by `pins`, then ask the Search
    page to run (the page switch happens in the script body, `switch_if_requested`)."""
    targets = {_pin_target(p) for p in pins}
    current = state.workspace()["pins"]
    kept = [p for p in current if _pin_target(p) not in targets]
    new = kept + [p for p in pins if p not in kept]
    try:
        cached.check_pins(state.loaded(), state.mesh_text(), state.hardware_name(), tuple(new))
    except tc.ToastError as exc:
        state.set_error("whatif", str(exc))
        return
    current[:] = new
    state.set_error("whatif", None)
    state.set_error("pins", None)
    st.session_state["search_requested"] = True
    st.session_state["switch_to_search"] = True


def switch_if_requested() -> None:
    if st.session_state.pop("switch_to_search", False):
        st.switch_page("app_pages/search.py")


def why_this_plan(loaded: cached.Loaded, strategy: tc.Strategy, report: tc.CostReport) -> None:
    st.subheader(
        "Why this plan",
        help="Each decision of the plan (a named dim's mesh axes, a conflict's option) changed "
        "alone to each alternative, priced by the same cost model; sorted by consequence "
        "(alternatives that fit first, then by how much the step time changes).",
    )
    n_ops = len(loaded.ana.program.ops)
    key = cached.explain_key(loaded, strategy, state.mesh_text(), state.hardware_name())
    done = st.session_state.setdefault("explained", set())
    if key not in done and n_ops > AUTO_EXPLAIN_OPS:
        st.caption(
            f"Prices every alternative of every decision: {n_ops:,} ops, from a few seconds "
            "(GPT-2) to about a minute (llama3-70b); cached once computed."
        )
        if not st.button("Explain this plan", key="explain_plan", icon=":material/help:"):
            return
    with st.spinner("Pricing every alternative of every decision..."):
        table = cached.explain(loaded, strategy, state.mesh_text(), state.hardware_name())
    done.add(key)
    best = table.best_alternative()
    legal = [r for r in table.rows if r.legal]
    if best is None:
        st.success(
            f"No single change makes this plan faster while fitting: {len(legal)} alternatives "
            f"of {len({r.decision for r in table.rows})} decisions priced, none better."
        )
    else:
        st.warning(
            f"Changing `{best.decision}` from `{best.current}` to `{best.alternative}` alone "
            f"would save {fmt_s(-best.delta_step_s)} per step ({fmt_s(best.step_time_s)}): the "
            "search has not converged, or a pin holds it."
        )
    show_illegal = st.toggle("Show illegal alternatives", key="whatif_illegal", value=False)
    rows = list(table.rows) if show_illegal else legal
    n_pages = max(1, -(-len(rows) // ROWS_PER_PAGE))
    p1, p2 = st.columns([1, 5], vertical_alignment="bottom")
    page = p1.number_input("Page", 1, n_pages, 1, key="whatif_page") if n_pages > 1 else 1
    start = (int(page) - 1) * ROWS_PER_PAGE
    shown = rows[start : start + ROWS_PER_PAGE]
    p2.caption(
        f"Rows {start + 1}-{start + len(shown)} of {len(rows)}. Parts of one named dim after cuts "
        "on the same mesh axes are one decision (`N3.0..N3.5`); collectives are itemized for the "
        "most consequential rows. Select a row, then pin it."
    )
    event = st.dataframe(
        whatif_rows(shown, loaded.ana),
        hide_index=True,
        width="stretch",
        key="whatif_table",
        on_select="rerun",
        selection_mode="single-row",
        column_config={
            "Δ step time": st.column_config.TextColumn(
                help="Step time of the alternative minus this plan's"
            ),
            "fits": st.column_config.TextColumn(help="Peak memory within the device capacity"),
        },
    )
    picked = event.selection.rows[0] if event and event.selection.rows else 0
    pickable = [r for r in shown if r.legal]
    if not pickable:
        return
    row = shown[picked] if picked < len(shown) and shown[picked].legal else pickable[0]
    st.button(
        f"Pin {', '.join(row.pins)} and search again",
        key="whatif_pin",
        type="primary",
        icon=":material/push_pin:",
        on_click=pin_and_search,
        args=(row.pins,),
        help="Adds the pins that force this alternative to the workspace pins (replacing pins on "
        "the same decision) and starts a search on the Search page.",
    )
    msg = state.error("whatif")
    if msg:
        st.error(msg)


# -- per-op view ----------------------------------------------------------------------------------


def _op_label(prog, i: int) -> str:
    return f"#{i} {prog.ops[i].where()}"


def op_section(loaded: cached.Loaded, strategy: tc.Strategy, report: tc.CostReport) -> None:
    prog = loaded.ana.program
    st.subheader(
        "Per-op view",
        help="Any op of the program under this plan: what each device holds of its operands and "
        "results, the scaling-book case (replicated; batch-sharded: only free dims sharded, no "
        "communication; contracting-sharded: a reduced dim sharded, partial sums; both), its "
        "per-device flops and bytes, and the collectives it causes.",
    )
    top = tc.costliest_ops(report, OP_CHOICES)
    comm = {}
    for c in report.collectives:
        comm[c.op] = comm.get(c.op, 0.0) + c.time_s * c.count
    st.caption(
        f"The {COSTLIEST_SHOWN} costliest of {len(prog.ops):,} ops (compute + communication)"
    )
    st.dataframe(
        [
            {
                "op": i,
                "primitive": prog.ops[i].primitive,
                "where": prog.ops[i].where(),
                "compute": fmt_s(report.op_costs[i].time_s),
                "communication": fmt_s(comm.get(i, 0.0)),
                "flops / device": f"{report.op_costs[i].flops:.3g}",
            }
            for i in top[:COSTLIEST_SHOWN]
        ],
        hide_index=True,
        width="stretch",
        key="costliest_ops",
    )
    c1, c2 = st.columns([4, 1.4], vertical_alignment="bottom")
    if st.session_state.get("op_pick") not in top:
        st.session_state.pop("op_pick", None)
    c1.selectbox(
        f"Op (the {len(top)} costliest)",
        top,
        format_func=lambda i: _op_label(prog, i),
        key="op_pick",
    )
    typed = c2.number_input(
        "or any op by index",
        min_value=-1,
        max_value=len(prog.ops) - 1,
        value=-1,
        key="op_index",
        help="-1: use the selection on the left",
    )
    op = int(typed) if typed >= 0 else int(st.session_state.op_pick)
    op_detail(loaded, strategy, report, op)
    st.button(
        "Show this op in the graph",
        key="op_to_graph",
        icon=":material/hub:",
        on_click=_show_in_graph,
        args=(op,),
        help="Opens the Named dims page with this op highlighted in the dimension-equivalence "
        "graph, linked to the named dims it holds.",
    )


def _show_in_graph(op: int) -> None:
    st.session_state["graph_op"] = op
    st.session_state["switch_to_graph"] = True


def switch_to_graph_if_requested() -> None:
    if st.session_state.pop("switch_to_graph", False):
        st.switch_page("app_pages/named_dims.py")


def op_detail(
    loaded: cached.Loaded, strategy: tc.Strategy, report: tc.CostReport, op: int, key: str = ""
) -> None:
    """`tc.op_view` of one op: its case, per-device flops and bytes, the sharding of each operand
    and result, its collectives (`key` prefixes the widget keys, for a second page using it)."""
    ana, prog = loaded.ana, loaded.ana.program
    v = tc.op_view(ana, strategy, state.mesh(), report, op)
    st.markdown(f"**#{v.op} `{v.primitive}`** {v.where.split(' ', 1)[1] if ' ' in v.where else ''}")
    m = st.columns([1.7, 1, 1, 1])  # "contracting-sharded" in full
    m[0].metric("Case", v.case)
    m[1].metric("Flops / device", f"{v.flops_per_device:.3g}")
    m[2].metric(
        "Bytes / device", fmt_bytes(v.bytes_per_device), help="Bytes the op reads and writes"
    )
    m[3].metric(
        "Compute + comm",
        fmt_s(v.compute_s + v.comm_s),
        f"comm {fmt_s(v.comm_s)}",
        delta_color="off",
        delta_arrow="off",
    )
    st.markdown(v.explanation)
    st.dataframe(
        [
            {"operand or result": f"operand {k}", "sharding": public_text(t)}
            for k, t in enumerate(v.operands)
        ]
        + [{"operand or result": "result", "sharding": public_text(t)} for t in v.results],
        hide_index=True,
        width="stretch",
        key=f"{key}op_shardings",
    )
    if v.collectives:
        st.dataframe(
            [
                {
                    "kind": c.kind,
                    "mesh axes": "+".join(c.mesh_axes),
                    "time": fmt_s(c.time_s * c.count),
                    "count": c.count,
                    "bytes (full)": fmt_bytes(c.bytes),
                    "value": prog.values[c.value].display() if c.value >= 0 else "",
                    "cause": c.cause,
                }
                for c in v.collectives
            ],
            hide_index=True,
            width="stretch",
            key=f"{key}op_collectives",
        )
    else:
        st.caption("No collective attributed to this op.")
