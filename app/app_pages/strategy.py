"""Strategy page: shardings in scaling-book notation, cost breakdown, memory, collectives, and the
strategy side by side with the baselines."""

from __future__ import annotations

import streamlit as st

from app import cached, charts, plan_views, remat_views, reports, state, ui
from app.fmt import fmt_bytes, fmt_s, fmt_s_short

ui.header(
    "Strategy",
    "What a strategy does to every tensor and what it costs: compute, communication by collective "
    "kind, per-device memory against capacity, each collective with its cause.",
)
plan_views.switch_if_requested()  # a what-if row was pinned: search under it at once
plan_views.switch_to_graph_if_requested()  # "Show this op in the graph"
loaded = ui.require_loaded()
ana = loaded.ana
mesh = state.mesh()
st.markdown(ui.context_line(loaded))
name, strategy, report = ui.picked_strategy_report(loaded)

# Three per row, values to three digits (the exact figures in the help): six in a row of a
# 1280 px window cut "369.200 ms" to "369.2…".
m = st.columns(3) + st.columns(3)
m[0].metric("Step time", fmt_s_short(report.step_time_s), help=f"{fmt_s(report.step_time_s)}.")
m[1].metric("Compute", fmt_s_short(report.compute_s), help=f"{fmt_s(report.compute_s)}.")
m[2].metric("Communication", fmt_s_short(report.comm_s), help=f"{fmt_s(report.comm_s)}.")
m[3].metric(
    "Efficiency",
    f"{report.efficiency:.1%}" if report.efficiency >= 0.01 else f"{report.efficiency:.3%}",
    help=f"The ideal step time over the estimated one. Ideal: {fmt_s(report.ideal_s)}, the "
    f"program's {report.total_flops:.3g} flops spread evenly over the {mesh.n_devices} devices at "
    f"{state.hardware_name()}'s peak rate, with no communication and no memory traffic.",
)
m[4].metric(
    "Peak memory / device",
    fmt_bytes(report.peak_bytes),
    f"{report.peak_bytes / report.capacity_bytes:.1%} of {fmt_bytes(report.capacity_bytes)} usable",
    delta_color="off" if report.fits else "inverse",
)
m[5].metric("Fits memory", "yes" if report.fits else "NO")
if not report.fits:
    st.error(
        f"This strategy needs {fmt_bytes(report.peak_bytes)} per device, over the "
        f"{fmt_bytes(report.capacity_bytes)} allowed on {state.hardware_name()}."
    )

st.subheader("Decisions")
rows = reports.decision_rows(ana, strategy, state.workspace()["pins"])
if rows:
    ui.table(rows, key="decisions")
    if reports.has_parts(strategy):
        st.caption(reports.PART_NOTE)
else:
    st.caption("No decision: everything is replicated.")

plan_views.why_this_plan(loaded, strategy, report)

st.subheader("Cost breakdown")
#: Figures are built once per plan (see `cached.figure`).
fig_key = (loaded.key, state.mesh_text(), state.hardware_name(), cached.strategy_key(strategy))
st.plotly_chart(
    cached.figure(
        "breakdown",
        fig_key,
        lambda: charts.cost_breakdown_figure(report.compute_s, report.comm_s_by_kind()),
    ),
    width="stretch",
)
by_bytes = report.collective_bytes_by_kind()
kind_rows = [
    {"kind": k, "time": fmt_s(t), "bytes per device": fmt_bytes(by_bytes.get(k, 0.0))}
    for k, t in report.comm_s_by_kind().items()
    if t or by_bytes.get(k)
]
if kind_rows:
    ui.table(kind_rows, key="kinds")

remat_views.memory_section(loaded, strategy, report)  # with and without the plan's remat

st.subheader("Baselines side by side")
if ui.rerun_when_priced(loaded):
    st.caption(
        "The baselines are being priced in the background (seconds on large models); they "
        "appear here, and in the strategy picker, when ready."
    )
    bl = {}
else:
    bl = cached.baseline_reports(loaded, state.mesh_text(), state.hardware_name())
compare = [("this: " + name, report)] + [
    (f"{b}", r) for b, (s, r) in bl.items() if s is not None and f"baseline: {b}" != name
]
# How a baseline departs from the textbook (e.g. the batch on fewer mesh axes than asked).
notes = {
    b: why
    for b, (s, why) in (cached.baselines(loaded.key, state.mesh_text(), ana) if bl else {}).items()
    if s is not None and why
}
chart_rows = [
    {
        "name": n,
        "compute_s": r.compute_s,
        "comm_s": r.comm_s,
        "peak_bytes": r.peak_bytes,
        "fits": r.fits,
    }
    for n, r in compare
]
st.plotly_chart(
    cached.figure(
        "strategies",
        (*fig_key, name, tuple(n for n, _ in compare)),
        lambda: charts.strategies_figure(chart_rows, report.capacity_bytes),
    ),
    width="stretch",
)
ui.table(
    [
        {
            "strategy": n,
            "step time": fmt_s(r.step_time_s),
            "vs this": f"{r.step_time_s / report.step_time_s:.2f}x" if report.step_time_s else "-",
            "compute": fmt_s(r.compute_s),
            "communication": fmt_s(r.comm_s),
            "peak memory": fmt_bytes(r.peak_bytes),
            "fits": "yes" if r.fits else "NO",
            "note": notes.get(n, ""),
        }
        for n, r in compare
    ]
    + [
        {
            "strategy": b,
            "step time": "n/a",
            "vs this": "",
            "compute": "",
            "communication": "",
            "peak memory": "",
            "fits": "",
            "note": f"not applicable: {why}",
        }
        for b, (s, why) in bl.items()
        if s is None
    ],
    key="baseline_table",
)

st.subheader("Shardings")
st.caption(
    "Scaling-book notation: `W[N0, N1_model]` is W with the dim of named dim N1 sharded on mesh "
    "axis `model`; `N3*N4` is a dim split into two named dims by a reshape."
)
f1, f2 = st.columns([3, 2])
query = f1.text_input("Filter tensors", key="sharding_filter", placeholder="e.g. attn.wq")
roles = f2.multiselect(
    "Roles",
    ["input", "parameter", "state", "output"],
    default=["input", "parameter", "output"],
    key="sharding_roles",
)
SHOWN_TENSORS = 200  # ~1 ms each (notation, per-device shape): llama3-70b has 2,900
matching = [
    vid
    for vid, role in reports.io_roles(ana).items()
    if role in roles and (not query or query.lower() in ana.program.values[vid].name.lower())
]
vrows = reports.value_rows(ana, strategy, mesh, matching[:SHOWN_TENSORS])
ui.table(vrows, height=min(460, 38 + 35 * max(len(vrows), 1)), key="shardings")
if len(matching) > SHOWN_TENSORS:
    st.caption(
        f"Showing {SHOWN_TENSORS} of {len(matching):,} tensors: filter by name to find others; "
        "the Markdown report on the Export page lists them all."
    )

st.subheader("Collectives")
crow = reports.collective_rows(ana, report)
st.caption(
    f"{len(report.collectives)} collectives per step, most expensive first"
    + (f" (showing {len(crow)})" if len(crow) < len(report.collectives) else "")
    + ". `bytes (full)` is the gathered buffer V of the alpha-beta model."
)
ui.table(crow, height=min(460, 38 + 35 * max(len(crow), 1)), key="collectives")

plan_views.op_section(loaded, strategy, report)
