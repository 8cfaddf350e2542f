"""Named dims page: what links the graph with the tables, and the graph's expandable detail.

`st.graphviz_chart` cannot report a click, so selection goes through widgets, both ways:

* an op is picked in a select box or in the ops table (by what it reads and makes, never by an
  internal name): the graph draws it as a gold box linked to the named dims it holds, and its
  per-op view (`tc.op_view`: shardings, case, flops, bytes, collectives) follows under the plan
  picked on the Strategy page;
* a row picked in the named dims or conflicts table draws that node with a gold border (even
  when the filters would leave it out).

Large programs are drawn collapsed (identical layers as one node, conflicts as one box per kind
or per layer group); "Show one group in full" draws one collapsed group as its own graph: every
layer's named dim, the tensors holding them, their conflicts with every option.
"""

from __future__ import annotations

from functools import partial

import streamlit as st

import toast_core as tc
from app import cached, charts, plan_views, ui
from app.dim_names import DimNamer, op_title, public_text

NO_OP = -1
NO_GROUP = ""
#: Layers drawn by the detail of a group: enough to see the pattern, few enough to read.
DETAIL_LAYERS = 12


@st.cache_resource(show_spinner=False, max_entries=16)
def _op_groups(key: str, _ana: tc.Analysis) -> tuple[tuple[int, ...], ...]:
    return tuple(charts.op_groups(_ana))


def op_groups(loaded: cached.Loaded) -> tuple[tuple[int, ...], ...]:
    """`charts.op_groups`, once per model (a pass over 31,000 ops on llama3-70b)."""
    return _op_groups(loaded.key, loaded.ana)


def _label(prog, group: tuple[int, ...]) -> str:
    many = f" (×{len(group)}: repeated layers, forward and backward)" if len(group) > 1 else ""
    return op_title(prog, group[0]) + many


def op_options(loaded: cached.Loaded) -> tuple[list[int], dict[int, str]]:
    """(the ops offered: none, then one per group, plus an op sent from elsewhere; their labels)."""
    prog = loaded.ana.program
    groups = op_groups(loaded)
    labels = {NO_OP: "(none)"} | {g[0]: _label(prog, g) for g in groups}
    picked = st.session_state.get("graph_op", NO_OP)
    if not isinstance(picked, int) or not NO_OP <= picked < len(prog.ops):
        st.session_state.pop("graph_op", None)
    elif picked not in labels:  # sent by "Show this op in the graph" (Strategy page)
        labels[picked] = op_title(prog, picked)
    return list(labels), labels


def _op_picked_in_table(reps: list[int]) -> None:
    event = st.session_state.get(_op_table_key())
    rows = event.selection.rows if event else []
    if not rows:
        st.session_state["graph_op"] = NO_OP  # a row unpicked: nothing highlighted
    elif rows[0] < len(reps):
        st.session_state["graph_op"] = reps[rows[0]]


def _op_table_key() -> str:
    return f"op_table_{st.session_state.get('op_table_version', 0)}"


def _table_follows_op(reps: list[int]) -> list[int]:
    """The ops table's row of the highlighted op ([] for none, or an op of no row). When the
    table shows another selection (the op was picked in the box, or sent from the Strategy
    page), the table gets a new key so that it is drawn anew with that row selected: a
    dataframe's selection is set only by `selection_default`, on its first draw."""
    picked = st.session_state.get("graph_op", NO_OP)
    row = {op: i for i, op in enumerate(reps)}.get(picked)
    want = [] if row is None else [row]
    if selected_rows(_op_table_key()) != want:
        st.session_state["op_table_version"] = st.session_state.get("op_table_version", 0) + 1
    return want


def op_picker(loaded: cached.Loaded, where) -> int:
    """The "Highlight an op" select box (in container `where`); the picked op or NO_OP."""
    options, labels = op_options(loaded)
    where.selectbox(
        "Highlight an op",
        options,
        format_func=labels.__getitem__,
        key="graph_op",
        help="Draws the op in the graph (gold box) linked to the named dims it holds, and shows "
        "its per-op view below. Or pick a row of the ops table at the bottom of the page. "
        f"{len(options) - 1} ops: where a named dim reduces or is gathered, conflict sites, "
        "matmuls, convolutions, gathers..., the same op of repeated layers once.",
    )
    return int(st.session_state.get("graph_op", NO_OP))


def op_table(loaded: cached.Loaded) -> None:
    """Every op of the picker as a table; picking a row highlights it in the graph."""
    prog = loaded.ana.program
    groups = op_groups(loaded)
    reps = [g[0] for g in groups]
    row = _table_follows_op(reps)
    st.subheader(
        "Ops",
        help="The ops of the graph picker: pick a row to draw the op in the graph and show its "
        "per-op view (the same op of repeated layers is one row). The op highlighted in the "
        "box above is this table's selected row.",
    )
    st.dataframe(
        [
            {
                "op": op_title(prog, g[0]),
                "count": len(g),
                "primitive": prog.ops[g[0]].primitive,
                "where": public_text(prog.ops[g[0]].where()),
                "first": f"#{g[0]}",
            }
            for g in groups
        ],
        hide_index=True,
        width="stretch",
        height=min(420, 38 + 35 * len(groups)),
        key=_op_table_key(),
        on_select=partial(_op_picked_in_table, reps),
        selection_mode="single-row",
        selection_default={"selection": {"rows": row}} if row else None,
        column_config={
            "count": st.column_config.NumberColumn(
                help="Ops alike (same primitive, source line, shapes, inputs): one per repeated "
                "layer, and again in the backward pass"
            )
        },
    )


def op_view(loaded: cached.Loaded, op: int) -> None:
    """The per-op view of the highlighted op under the plan picked for the Strategy page."""
    with st.container(border=True):
        st.markdown("**Per-op view** of the highlighted op, under the plan:")
        _, strategy, report = ui.picked_strategy_report(loaded)
        plan_views.op_detail(loaded, strategy, report, op, key="graph_")


def selected_rows(key: str) -> list[int]:
    """Rows picked in the selectable table `key` (from the last interaction)."""
    event = st.session_state.get(key)
    try:
        return list(event.selection.rows) if event else []
    except AttributeError:
        return []


# -- the detail of one collapsed group ------------------------------------------------------


def group_options(ana: tc.Analysis, nodes: list[charts.DimNode]) -> dict[str, str]:
    """Collapsed groups that can be drawn in full: key (`N3`, `K2`) -> label."""
    namer = DimNamer.of(ana)
    out = {NO_GROUP: "(none: the overview only)"}
    for node in nodes:
        if len(node.members) > 1:
            nd = ana.named_dims[node.rep]
            out[nd.name] = f"{nd.name} ×{len(node.members)} layers · {namer.describe(nd)}"
    seen: set[int] = set()
    for c in ana.conflicts:
        if c.id in seen:
            continue
        members = ana.group_of_conflict.get(c.id, (c.id,))
        seen.update(members)
        many = f" ×{len(members)} layers" if len(members) > 1 else ""
        out[c.name] = f"{c.name}{many} · {c.kind} · {public_text(c.description)[:70]}"
    return out


def detail_filter(ana: tc.Analysis, key: str, nodes, base: charts.GraphFilter):
    """(the GraphFilter drawing group `key` in full, a caption saying what is drawn)."""
    if key.startswith("K"):
        c = ana.conflict(key)
        members = ana.group_of_conflict.get(c.id, (c.id,))
        shown = members[:DETAIL_LAYERS]
        dims = tuple(sorted({d for k in shown for d in ana.conflicts[k].named_dims}))
        conflicts = tuple(shown)
        what = f"conflict {c.name}" + (
            f" and its {len(members) - 1} twins" if len(members) > 1 else ""
        )
    else:
        rep = ana.named_dim(key).id
        node = next(n for n in nodes if n.rep == rep)
        members = node.members
        dims = tuple(members[:DETAIL_LAYERS])
        conflicts = tuple(
            sorted({k for k, c in enumerate(ana.conflicts) if set(c.named_dims) & set(dims)})
        )
        what = f"named dim {key} in each of its {len(members)} layers"
    cut = (
        f" (the first {DETAIL_LAYERS} of {len(members)}: the layers are alike)"
        if len(members) > DETAIL_LAYERS
        else ""
    )
    flt = charts.GraphFilter(
        collapse=False,
        tensor_roles=("input", "parameter", "state", "output"),
        merge_state=base.merge_state,
        show_conflicts=True,
        show_sites=True,
        conflict_detail=True,
        only_dims=dims,
        only_conflicts=conflicts,
        op=base.op,
        highlight_dims=base.highlight_dims,
    )
    return (
        flt,
        f"Drawn in full: {what}{cut}, the tensors holding them, every option of each conflict.",
    )


def group_detail(ana: tc.Analysis, key: str, nodes, base: charts.GraphFilter) -> None:
    if key == NO_GROUP:
        return
    flt, caption = detail_filter(ana, key, nodes, base)
    with st.expander(f"Detail: {key}", expanded=True):
        st.caption(caption)
        st.graphviz_chart(charts.named_dim_graph(ana, flt), width="stretch")


# -- the named dims table -----------------------------------------------------------------


def _where(prog, op_ids, fallback: bool) -> str:
    """`3 ops: dot_general at gpt.py:95; ...` (distinct places first)."""
    if not op_ids:
        return "yes" if fallback else ""
    places = list(dict.fromkeys(prog.ops[i].where() for i in op_ids))
    return f"{len(op_ids)} ops: " + "; ".join(places[:3]) + (" ..." if len(places) > 3 else "")


@st.cache_resource(show_spinner=False, max_entries=16)
def _dim_rows(key: str, collapse: bool, _ana: tc.Analysis) -> tuple[dict, ...]:
    ana, prog = _ana, _ana.program
    namer = DimNamer.of(ana)
    in_conflict = charts.conflict_dims(ana)
    rows = []
    for node in charts.dim_nodes(ana, collapse):
        nd = ana.named_dims[node.rep]
        members = ", ".join(
            dict.fromkeys(
                f"{charts.collapse_layers(prog.values[v].name) if collapse else prog.values[v].name}.{d}"
                for v, d, _ in nd.members
                if prog.values[v].role != "intermediate" or prog.values[v].is_output
            )
        )
        many = len(node.members) > 1
        rows.append(
            {
                "named dim": f"{nd.name} (×{len(node.members)})" if many else nd.name,
                "size": nd.size,
                "is": namer.describe(nd),
                "bytes_covered": node.bytes_covered,
                "holds": charts.dim_kind(nd),
                "members": len(nd.members),
                "input/output dims": members[:300],
                "reduces at": _where(prog, nd.reduction_ops, nd.has_reduction),
                "needs replication at": _where(prog, nd.replication_ops, False),
                "conflicts": ", ".join(
                    f"K{k}" for m in node.members for k in in_conflict.get(m, [])
                ),
                "layers": ", ".join(f"N{m}" for m in node.members) if many else "",
            }
        )
    return tuple(rows)


def dim_rows(loaded: cached.Loaded, collapse: bool) -> tuple[dict, ...]:
    """The named dims table, one row per graph node (`charts.dim_nodes`), bytes covered in
    `bytes_covered`; once per model (it walks every atom: ~a second on llama3-70b)."""
    return _dim_rows(loaded.key, collapse, loaded.ana)


_warmed: set[str] = set()


def warm(loaded: cached.Loaded) -> None:
    """Computes what the Named dims page needs first (the ops of the picker, the named dims
    table, every named dim's name: ~1.5 s on llama3-70b) in the background, once per model,
    while the user reads the Model page."""
    if loaded.key in _warmed:
        return
    _warmed.add(loaded.key)

    def run() -> None:
        op_groups(loaded)
        dim_rows(loaded, True)
        namer = DimNamer.of(loaded.ana)
        for nd in loaded.ana.named_dims:
            namer.describe(nd)

    cached.in_background("named-dims", run)
