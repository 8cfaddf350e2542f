"""Named dims page: the dimension-equivalence graph, conflicts and the named dim table."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from app import charts, graph_views, state, ui
from app.dim_names import public_text
from app.fmt import binary_unit, fmt_bytes

CONFLICT_BOXES = {"auto": "auto", "each": "one box per conflict", "kind": "one box per kind"}
AUTO_CONFLICT_BOXES = 12

ui.header(
    "Named dims",
    "Tensor dims that must be sharded alike form one named dim (one colour). Conflicts (red) are "
    "where that grouping cannot hold as is; each option is a set of cuts (reshards).",
)
loaded = ui.require_loaded()
ana = loaded.ana
st.markdown(ui.context_line(loaded))

with st.expander("Filter and summarize", expanded=len(ana.named_dims) > 40):
    c1, c2, c3, c4 = st.columns(4)
    c1.multiselect(
        "Named dims holding",
        list(charts.DIM_KINDS),
        **state.bound("nd_kinds"),
        help="parameter: a parameter or optimizer-state dim; data: a data input's dim; other: "
        "intermediates only.",
    )
    c2.number_input(
        "Min bytes covered (MiB)",
        min_value=0.0,
        step=1.0,
        **state.bound("nd_min_mib"),
    )
    c3.number_input(
        "Top N by bytes",
        min_value=1,
        max_value=2000,
        step=5,
        **state.bound("nd_top_n"),
    )
    c4.multiselect(
        "Tensors",
        list(charts.TENSOR_ROLES),
        **state.bound("nd_roles"),
    )
    d1, d2, d3, d4 = st.columns(4)
    d1.checkbox(
        "Collapse repeated layers",
        **state.bound("nd_collapse"),
    )
    d1.checkbox(
        "Draw optimizer state with its parameter",
        **state.bound("nd_merge_state"),
    )
    d2.checkbox(
        "Only named dims in conflicts",
        **state.bound("nd_conflicts_only"),
    )
    d3.checkbox(
        "Show conflicts",
        **state.bound("nd_show_conflicts"),
    )
    d4.checkbox(
        "Show conflict sites",
        **state.bound("nd_show_sites"),
    )
    d4.radio(
        "Conflicts in the graph",
        list(CONFLICT_BOXES),
        format_func=CONFLICT_BOXES.__getitem__,
        **state.bound("nd_conflict_boxes"),
        help="auto: one box per conflict (repeated layers as one) up to "
        f"{AUTO_CONFLICT_BOXES} boxes, else one box per conflict kind; the table below the "
        "graph lists each conflict.",
    )


def _conflict_picked(names: list[str]) -> None:
    """A conflict row picked: show its details below the table too."""
    rows = graph_views.selected_rows("conflict_table")
    if rows and rows[0] < len(names):
        st.session_state["conflict_detail"] = names[rows[0]]


n_boxes = len({ana.group_of_conflict.get(c.id, (c.id,))[0] for c in ana.conflicts})
boxes = st.session_state.nd_conflict_boxes
detail = boxes == "each" or (boxes == "auto" and n_boxes <= AUTO_CONFLICT_BOXES)
flt = charts.GraphFilter(
    kinds=tuple(st.session_state.nd_kinds),
    min_bytes=float(st.session_state.nd_min_mib) * 2**20,
    top_n=int(st.session_state.nd_top_n),
    conflicts_only=bool(st.session_state.nd_conflicts_only),
    collapse=bool(st.session_state.nd_collapse),
    tensor_roles=tuple(st.session_state.nd_roles),
    show_conflicts=bool(st.session_state.nd_show_conflicts),
    show_sites=bool(st.session_state.nd_show_sites),
    merge_state=bool(st.session_state.nd_merge_state),
    conflict_detail=detail,
)
# Selections that the graph highlights: a row of the named dims or conflicts table (picked on
# an earlier run; the tables are below), the op of the select box or the ops table.
nodes = charts.dim_nodes(ana, flt.collapse)
picked_dims = tuple(m for r in graph_views.selected_rows("named_dim_table") if r < len(nodes)
                    for m in nodes[r].members)  # fmt: skip
picked_conflicts = tuple(
    k
    for r in graph_views.selected_rows("conflict_table")
    if r < len(ana.conflicts)
    for k in ana.group_of_conflict.get(r, (r,))
)
g1, g2 = st.columns(2)
op = graph_views.op_picker(loaded, g1)
groups = graph_views.group_options(ana, nodes)
if st.session_state.get("graph_group") not in groups:
    st.session_state.pop("graph_group", None)
g2.selectbox(
    "Show one group in full",
    list(groups),
    format_func=groups.__getitem__,
    key="graph_group",
    help="The graph draws identical layers as one node (`×k layers`) and conflicts as one box "
    "per layer group or per kind; this draws one of them in full below the graph.",
)
flt = replace(flt, highlight_dims=picked_dims, highlight_conflicts=picked_conflicts, op=op)
shown = charts.select_dims(ana, flt)
total = len(nodes)
st.caption(
    f"Showing {len(shown)} of {total} {'collapsed ' if flt.collapse else ''}named dim nodes "
    f"({len(ana.named_dims)} named dims), largest bytes covered first."
)
if not detail and ana.conflicts:
    st.caption(
        f"{len(ana.conflicts)} conflicts ({n_boxes} after grouping repeated layers) are drawn as "
        "one box per kind; pick 'one box per conflict' above, or see each in the table below."
    )
graph = charts.named_dim_graph(ana, flt)
st.markdown(charts.legend_html(), unsafe_allow_html=True)
st.graphviz_chart(graph, width="stretch")
st.caption(
    "Each named dim reads: name · size, what it is (batch, sequence, features, hidden...: from the "
    "tensors holding it) with up to two of them, and the bytes it covers. `×k layers`: k identical "
    "layers drawn as one. Edges say which dim of a tensor the named dim is. Thick red border: a "
    "self or reshape conflict breaks the named dim; dashed red border: an axis clash limits its "
    "mesh axes."
)
graph_views.group_detail(ana, st.session_state.get("graph_group", ""), nodes, flt)
if op >= 0:
    graph_views.op_view(loaded, op)
with st.expander("DOT source"):
    st.download_button("Download .dot", graph.source, file_name="named_dims.dot", key="dl_dot")
    st.code(graph.source[:20000], language="dot")

st.subheader(
    "Conflicts",
    help="Where tying dims together cannot hold as is: a named dim twice in one tensor (self), a "
    "reshape that mixes dims (reshape), or a parameter dim meeting the batch (axis clash). Each "
    "option is a set of cuts (reshards) that resolves it; the search picks one or none.",
)
if not ana.conflicts:
    st.success("No conflicts: every named dim can take any mesh axis that divides it.")
else:
    rows = []
    for c in ana.conflicts:
        group = ana.group_of_conflict.get(c.id, ())
        rows.append(
            {
                "conflict": c.name,
                "kind": c.kind,
                "named dims": ", ".join(f"N{d}" for d in c.named_dims),
                "description": public_text(c.description),
                "site": public_text(c.sites[0].text) if c.sites else "",
                "options": len(c.options),
                "cheapest cut": fmt_bytes(min((o.bytes for o in c.options), default=None)),
                "layer group": ", ".join(f"K{k}" for k in group) if len(group) > 1 else "",
            }
        )
    names = [c.name for c in ana.conflicts]
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        height=min(400, 38 + 35 * len(rows)),
        key="conflict_table",
        on_select=lambda: _conflict_picked(names),
        selection_mode="single-row",
    )
    st.caption("Pick a row to highlight the conflict in the graph and show its details.")
    pick = st.selectbox("Conflict details", names, key="conflict_detail")
    c = ana.conflict(pick)
    st.markdown(f"**{c.name}** ({c.kind}): {public_text(c.description)}")
    st.markdown("Sites:\n" + "\n".join(f"- `{public_text(s.text)}`" for s in c.sites[:8]))
    if c.options:
        st.markdown(
            "Options (pin with `"
            + c.name
            + "=<option>` on the Search page):\n"
            + "\n".join(
                f"- option {o.index} ({fmt_bytes(o.bytes)} resharded): {public_text(o.description)}"
                for o in c.options
            )
        )
    else:
        st.markdown("No cut separates the clash: leave its named dim unsharded.")


st.subheader("Named dims", help="Pick a row to highlight the named dim in the graph.")
# One binary unit for the column (Streamlit's "bytes" format is decimal: MB next to our MiB).
scale, unit = binary_unit(max((n.bytes_covered for n in nodes), default=0))
rows = [
    {
        (f"bytes covered ({unit})" if k == "bytes_covered" else k): (
            v / scale if k == "bytes_covered" else v
        )
        for k, v in row.items()
    }
    for row in graph_views.dim_rows(loaded, flt.collapse)
]
st.dataframe(
    rows,
    hide_index=True,
    width="stretch",
    height=min(560, 38 + 35 * len(rows)),
    column_config={
        f"bytes covered ({unit})": st.column_config.NumberColumn(
            format=f"%.1f {unit}",
            help="Bytes of every tensor dim the named dim ties together (its tensors' sizes, "
            "summed): what sharding it on n devices divides by n.",
        ),
        "is": st.column_config.TextColumn(
            help="What the named dim is, from the tensors holding it: a data input's leading dim "
            "is the batch, its last the features; a dim joining two weights is hidden..."
        ),
        "conflicts": st.column_config.TextColumn(
            help="Conflicts involving this named dim (see the Conflicts table)"
        ),
        "reduces at": st.column_config.TextColumn(
            help="Ops that sum over this dim: sharded there, they leave partial sums to reduce"
        ),
        "needs replication at": st.column_config.TextColumn(
            help="Ops that need the whole dim on every device: sharded, it is gathered there"
        ),
    },
    key="named_dim_table",
    on_select="rerun",
    selection_mode="single-row",
)
graph_views.op_table(loaded)
if ana.diagnostics:
    st.subheader(
        "Diagnostics",
        help="What the analysis could not model exactly (unknown primitives, dims it keeps "
        "unsharded) and how it prices them; a plan stays legal, only its estimate is rougher.",
    )
    for d in ana.diagnostics:
        st.warning(d)
