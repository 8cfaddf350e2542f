"""Figure and graph builders: pure functions from engine results to plotly figures and DOT graphs.

Nothing here touches Streamlit or session state, so every builder is testable on its own.

The dimension-equivalence graph (`named_dim_graph`) draws named dims as coloured ellipses linked
to the tensors whose dims they hold (edge label: which dim), and conflicts as red octagons linked
to the named dims they involve, with their resolution options listed. Real models have hundreds
of named dims, so a `GraphFilter` keeps it readable: by kind, by bytes covered, top N, and by
collapsing repeated layers (a decision group `N1, N2` of identical layers is one node `N1 x2`,
and `blocks[0].mlp.w_fc`, `blocks[1].mlp.w_fc` are one tensor node `blocks[*].mlp.w_fc`).
"""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict
from dataclasses import dataclass

import graphviz
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.dim_names import DimNamer, op_title, public_text
from app.fmt import binary_unit, fmt_bytes, fmt_s

#: (fill, border) pairs; named dim i gets PALETTE[i % len(PALETTE)].
PALETTE = (
    ("#cfe3ff", "#2f6fd0"),
    ("#d4f2dc", "#2d8a4e"),
    ("#fde7c8", "#c7791a"),
    ("#e9dcfb", "#7b4fc9"),
    ("#d2f1f4", "#1f8c99"),
    ("#fbd9ea", "#b8447c"),
    ("#eef2c7", "#86911c"),
    ("#dfe3e8", "#56606b"),
    ("#ffe1d6", "#c0532b"),
    ("#d9ecd0", "#4f7f35"),
    ("#d8dcfb", "#4650b8"),
    ("#f6e7c1", "#9a7416"),
)
BASELINE_COLOURS = ("#9c9c9c", "#f58518", "#54a24b", "#b279a2", "#72b7b2", "#9d755d", "#e45756")
CONFLICT_FILL, CONFLICT_LINE, CONFLICT_TEXT = "#ffe3e3", "#d62728", "#8b0000"
HIGHLIGHT_FILL, HIGHLIGHT_LINE = "#fff3bf", "#e8a400"  # what the user selected
CONFLICT_KIND_TEXT = {
    "axis_clash": "a parameter dim meets the batch: sharing a mesh axis needs a cut",
    "self": "a named dim appears twice in one tensor: at most one copy can be sharded",
    "reshape": "a reshape splits or merges dims so that they cannot keep one mesh axis",
}
#: Graph text sizes (points). Streamlit's CSS draws every label of `st.graphviz_chart` at
#: 9.6 px (`twoSm * 0.8`), whatever DOT's fontsize says; a layout made for larger text has
#: nodes too wide for their labels, and the SVG scaled to the page width drew them at ~8 px on
#: llama3-70b. Laid out for the size it is drawn at, the graph is narrower and scales up
#: (labels >= 12 px at a 1280 px window).
FONT_PT, EDGE_FONT_PT = "9.6", "9.6"
CONFLICT_WRAP = 30  # characters per line in a conflict box
LINE_CHARS = 26  # per line in the other nodes: the graph's natural width fits the page
ROLE_FILL = {
    "input": "#eaf6ec",
    "parameter": "#eef3fd",
    "state": "#fdf6e3",
    "output": "#f5ecfb",
    "intermediate": "#f4f4f4",
}
TENSOR_ROLES = ("input", "parameter", "state", "output")
DIM_KINDS = ("parameter", "data", "other")  # what a named dim holds
KIND_COLOURS = {
    "compute": "#4c78a8",
    "all-reduce": "#e45756",
    "all-gather": "#f58518",
    "reduce-scatter": "#72b7b2",
    "all-to-all": "#b279a2",
    "collective-permute": "#9d755d",
}
_LAYER_INDEX = re.compile(r"\[\d+\]")
#: Draw the capacity line only when it is within this factor of the peak (else it flattens the
#: chart of a tiny model to nothing); the title gives the share instead.
CAPACITY_IN_VIEW = 4.0


def colour_of(named_dim_id: int) -> tuple[str, str]:
    return PALETTE[named_dim_id % len(PALETTE)]


def collapse_layers(name: str) -> str:
    """`params.blocks[3].mlp.w_fc` -> `params.blocks[*].mlp.w_fc`."""
    return _LAYER_INDEX.sub("[*]", name)


def dim_kind(nd) -> str:
    """ "parameter" (holds a parameter or optimizer-state dim), "data" (a data input's) or "other"."""
    if nd.is_persistent:
        return "parameter"
    if nd.is_input:
        return "data"
    return "other"


# -- the dimension-equivalence graph ---------------------------------------------------------


@dataclass(frozen=True)
class GraphFilter:
    """What the named dims page shows."""

    kinds: tuple[str, ...] = DIM_KINDS
    min_bytes: float = 0.0
    top_n: int = 40
    conflicts_only: bool = False
    collapse: bool = True
    tensor_roles: tuple[str, ...] = ("input", "parameter")
    show_conflicts: bool = True
    show_sites: bool = True
    merge_state: bool = True  # draw optimizer state and updated parameters with their parameter
    conflict_detail: bool = True  # one box per conflict (layer group); False: one per kind
    #: Drawn with a thick gold border (and drawn even when the filter would leave them out):
    #: what the user selected in a table.
    highlight_dims: tuple[int, ...] = ()
    highlight_conflicts: tuple[int, ...] = ()
    #: An op (index in the program) drawn as a gold box linked to the named dims of its operands
    #: and results; -1: none.
    op: int = -1
    #: A detail view: exactly these named dims (and only these conflicts), whatever the filters.
    only_dims: tuple[int, ...] | None = None
    only_conflicts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class DimNode:
    """One node of the graph: a named dim, or a group of identical-layer named dims."""

    rep: int  # representative named dim id
    members: tuple[int, ...]
    bytes_covered: int


def _signature(nd) -> tuple:
    """What a named dim looks like with layer indices and value ids blanked out: named dims of
    repeated layers that the analysis did not group (intermediates only) share it."""
    label = re.sub(r"#\d+", "#*", collapse_layers(nd.label))
    return (nd.size, label, dim_kind(nd), nd.has_reduction)


def dim_nodes(ana, collapse: bool) -> list[DimNode]:
    """Named dims, merged by decision group (and by signature among the ungrouped ones) when
    collapsing; largest bytes first."""
    groups = ana.group_of_dim if collapse else {}
    merged: dict[object, list[int]] = {}
    for nd in ana.named_dims:
        if nd.id in groups:
            key = ("group", groups[nd.id][0])
        elif collapse:
            key = ("signature", _signature(nd))
        else:
            key = ("dim", nd.id)
        merged.setdefault(key, []).append(nd.id)
    out = []
    for members in merged.values():
        total = sum(ana.named_dims[m].bytes_covered for m in members)
        out.append(DimNode(members[0], tuple(members), total))
    out.sort(key=lambda n: (-n.bytes_covered, n.rep))
    return out


def conflict_dims(ana) -> dict[int, list[int]]:
    """Named dim id -> ids of the conflicts involving it."""
    out: dict[int, list[int]] = defaultdict(list)
    for c in ana.conflicts:
        for d in c.named_dims:
            out[d].append(c.id)
    return out


def conflict_kinds(ana) -> dict[int, set[str]]:
    """Named dim id -> kinds of the conflicts involving it."""
    out: dict[int, set[str]] = defaultdict(set)
    for c in ana.conflicts:
        for d in c.named_dims:
            out[d].add(c.kind)
    return out


#: Ops offered for the per-op view besides those where a named dim reduces or is gathered: the
#: ones that do the work or move data across dims.
NOTABLE_OPS = frozenset(
    {"dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add", "scatter_add",
     "concatenate", "sort", "cumsum", "argmax", "argmin", "transpose", "reshape"}
)  # fmt: skip


def op_groups(ana) -> list[tuple[int, ...]]:
    """The ops worth picking in the graph, the same op of repeated layers as one group: ops
    where a named dim reduces or must be replicated, conflict sites, and NOTABLE_OPS. Ops group
    by primitive, source line, call path (digits dropped), shapes and the names of the inputs
    they read with layer indices blanked; in program order of their first member."""
    prog = ana.program
    wanted = {s.op for c in ana.conflicts for s in c.sites if s.op >= 0}
    for nd in ana.named_dims:
        wanted.update(nd.reduction_ops)
        wanted.update(nd.replication_ops)
    groups: dict[tuple, list[int]] = {}
    for o in prog.ops:
        if o.index not in wanted and o.primitive not in NOTABLE_OPS:
            continue
        key = (
            o.primitive,
            o.source,
            re.sub(r"\d+", "#", "/".join(o.call_path)),
            tuple(
                (prog.values[v].shape, collapse_layers(prog.values[v].name))
                if prog.values[v].role != "intermediate"
                else (prog.values[v].shape, "")
                for v in o.operands
            ),
            tuple(prog.values[r].shape for r in o.results),
        )
        groups.setdefault(key, []).append(o.index)
    return [tuple(g) for g in groups.values()]


def op_dims(ana, op: int) -> dict[int, list[str]]:
    """Named dim id -> where op `op` holds it (`in0.1`: dim 1 of operand 0, `out.2`)."""
    prog = ana.program
    if not 0 <= op < len(prog.ops):
        return {}
    o = prog.ops[op]
    out: dict[int, list[str]] = defaultdict(list)
    tags = [(f"in{p}", v) for p, v in enumerate(o.operands)] + [
        ("out" if len(o.results) == 1 else f"out{r}", v) for r, v in enumerate(o.results)
    ]
    for tag, vid in tags:
        for d, dims in enumerate(ana.value_named_dims(vid)):
            for c in dims:
                if c >= 0 and f"{tag}.{d}" not in out[c]:
                    out[c].append(f"{tag}.{d}")
    return dict(out)


def _forced_dims(ana, flt: GraphFilter) -> set[int]:
    """Named dims drawn whatever the filters: the selected ones and the selected op's."""
    forced = set(flt.highlight_dims) | set(op_dims(ana, flt.op))
    for k in flt.highlight_conflicts:
        if 0 <= k < len(ana.conflicts):
            forced.update(ana.conflicts[k].named_dims)
    return forced


def select_dims(ana, flt: GraphFilter) -> list[DimNode]:
    """The dim nodes passing the filter, largest first, at most `top_n`, then the nodes of the
    selected named dims, conflicts and op (a selection always shows in the graph)."""
    if flt.only_dims is not None:
        wanted = set(flt.only_dims) | _forced_dims(ana, flt)
        return [n for n in dim_nodes(ana, flt.collapse) if wanted & set(n.members)]
    out = _filtered_dims(ana, flt)
    forced = _forced_dims(ana, flt)
    if forced:
        shown = {m for n in out for m in n.members}
        out += [
            n
            for n in dim_nodes(ana, flt.collapse)
            if forced & set(n.members) and not shown & set(n.members)
        ]
    return out


def _filtered_dims(ana, flt: GraphFilter) -> list[DimNode]:
    in_conflict = conflict_dims(ana)
    out = []
    for node in dim_nodes(ana, flt.collapse):
        nd = ana.named_dims[node.rep]
        if dim_kind(nd) not in flt.kinds:
            continue
        if node.bytes_covered < flt.min_bytes:
            continue
        if flt.conflicts_only and not any(m in in_conflict for m in node.members):
            continue
        out.append(node)
    return out[: max(int(flt.top_n), 0)]


def _dot_id(prefix: str, key: str) -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", key)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def wrap_lines(text: str, width: int) -> list[str]:
    """`text` broken at spaces into lines of at most about `width` characters (never cut)."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def _dim_label(namer: DimNamer, ana, node: DimNode) -> str:
    nd = ana.named_dims[node.rep]
    head = nd.name if len(node.members) == 1 else f"{nd.name} ×{len(node.members)} layers"
    what = "\n".join(wrap_lines(namer.describe(nd), LINE_CHARS - 4))
    return f"{head} · size {nd.size}\n{what}\n{fmt_bytes(node.bytes_covered)}"


def named_dim_graph(ana, flt: GraphFilter = GraphFilter()) -> graphviz.Digraph:
    """The dimension-equivalence graph as a graphviz Digraph (rendered client-side by Streamlit)."""
    g = graphviz.Digraph("named_dims")
    g.attr(rankdir="LR", nodesep="0.2", ranksep="0.55", bgcolor="white", fontname="Helvetica")
    g.attr("node", fontname="Helvetica", fontsize=FONT_PT)
    g.attr("edge", fontname="Helvetica", fontsize=EDGE_FONT_PT, arrowsize="0.6")
    namer = DimNamer.of(ana)
    nodes = select_dims(ana, flt)
    rep_of = {m: n.rep for n in nodes for m in n.members}
    kinds = conflict_kinds(ana) if flt.show_conflicts else {}
    highlighted = set(flt.highlight_dims)
    for node in nodes:
        fill, line = colour_of(node.rep)
        hit = set().union(*(kinds.get(m, set()) for m in node.members))
        # A self or reshape conflict breaks the named dim itself: thick red. An axis clash only
        # limits which mesh axes it may share with another named dim: dashed red.
        broken = bool(hit & {"self", "reshape"})
        picked = bool(highlighted & set(node.members))
        g.node(
            f"nd{node.rep}",
            _dim_label(namer, ana, node),
            shape="ellipse",
            style="filled" if broken or not hit or picked else "filled,dashed",
            fillcolor=fill,
            color=HIGHLIGHT_LINE if picked else (CONFLICT_LINE if hit else line),
            penwidth="6" if picked else ("3" if broken else ("1.6" if hit else "1.2")),
            tooltip=public_text(ana.named_dims[node.rep].label),
        )
    _add_tensors(g, ana, flt, rep_of)
    if flt.show_conflicts or flt.highlight_conflicts or flt.only_conflicts:
        _add_conflicts(g, ana, flt, rep_of)
    if flt.op >= 0:
        _add_op(g, ana, flt.op, rep_of)
    return g


def _add_op(g, ana, op: int, rep_of: dict[int, int]) -> None:
    """The selected op: a gold box linked to the named dims it holds (edge label: which dim of
    which operand or result, `in0.1` or `out.2`)."""
    g.node(
        "op",
        "\\l".join(_dot_escape(x) for x in wrap_lines(op_title(ana.program, op), LINE_CHARS + 6))
        + "\\l",
        shape="box",
        style="filled,bold",
        fillcolor=HIGHLIGHT_FILL,
        color=HIGHLIGHT_LINE,
        penwidth="4",
        tooltip=public_text(ana.program.ops[op].where()),
    )
    by_node: dict[int, list[str]] = defaultdict(list)
    for c, tags in op_dims(ana, op).items():
        if c in rep_of:
            by_node[rep_of[c]] += tags
    for rep, tags in by_node.items():
        g.edge(
            "op",
            f"nd{rep}",
            label=" ".join(dict.fromkeys(tags)),
            color=HIGHLIGHT_LINE,
            fontcolor="#8a6d00",
            penwidth="2.5",
            style="dashed",
            arrowhead="none",
        )


def state_owners(ana) -> dict[int, int]:
    """Value id -> the parameter it mirrors: an optimizer moment by pytree path suffix and shape
    (`opt_state.mu.blocks[0].w` -> `params.blocks[0].w`), an output through the input it
    replaces (`Value.updates`, recorded at trace time)."""
    prog = ana.program
    outputs = set(prog.outputs)
    owner: dict[int, int] = {}
    by_tail: dict[tuple[str, tuple[int, ...]], int] = {}
    for vid in dict.fromkeys(prog.inputs + prog.outputs):
        v = prog.values[vid]
        if v.updates is not None and v.updates in owner:
            owner[vid] = owner[v.updates]
            continue
        parts = v.name.split(".")
        match = None
        for i in range(1, len(parts)):
            match = by_tail.get((".".join(parts[i:]), v.shape))
            if match is not None:
                break
        if match is not None and (v.is_persistent or vid in outputs):
            owner[vid] = match
            continue
        owner[vid] = vid
        if v.role == "parameter" and len(parts) > 1:
            by_tail.setdefault((".".join(parts[1:]), v.shape), vid)
    return owner


def _add_tensors(g, ana, flt: GraphFilter, rep_of: dict[int, int]) -> None:
    prog = ana.program
    inputs, outputs = set(prog.inputs), set(prog.outputs)  # 2,900 on llama3-70b: not tuples

    def _tensor_role(prog, vid: int) -> str:
        return "output" if vid in outputs and vid not in inputs else prog.values[vid].role

    wanted = set(flt.tensor_roles)
    owner = state_owners(ana) if flt.merge_state else {}
    tensors: dict[str, dict] = {}
    edges: dict[tuple[str, int], set[str]] = defaultdict(set)
    for vid in dict.fromkeys(prog.inputs + prog.outputs):
        v = prog.values[vid]
        role = _tensor_role(prog, vid)
        if role not in wanted or v.rank == 0:
            continue
        primary = prog.values[owner.get(vid, vid)]
        name = collapse_layers(primary.name) if flt.collapse else primary.name
        t = tensors.setdefault(
            name,
            {
                "role": _tensor_role(prog, primary.id),
                "shape": v.shape,
                "dtype": v.dtype,
                "layers": set(),
                "merged": set(),
            },
        )
        t["layers"].add(primary.name)
        if primary.id != vid:
            t["merged"].add(v.name.split(".")[0] if role != "output" else "out")
        for d, dims in enumerate(ana.value_named_dims(vid)):
            for sub, c in enumerate(dims):
                if c in rep_of:
                    edges[(name, rep_of[c])].add(f"{d}:{sub}" if len(dims) > 1 else str(d))
    linked = {name for name, _ in edges}
    for name, t in tensors.items():
        if name not in linked:
            continue  # a tensor whose dims are all filtered out adds nothing
        layers = len(t["layers"])
        extra = f" ×{layers} layers" if layers > 1 else ""
        if t["merged"]:
            extra += " · + " + ", ".join(sorted(t["merged"]))
        g.node(
            _dot_id("t_", name),
            "\n".join(
                wrap_lines(name.replace(".", ". ").replace("[*]. ", "[*]."), LINE_CHARS)
            ).replace(". ", ".")
            + "\n"
            + "\n".join(wrap_lines(f"{list(t['shape'])} {t['dtype']}{extra}", LINE_CHARS)),
            shape="box",
            style="rounded,filled",
            fillcolor=ROLE_FILL.get(t["role"], "#f4f4f4"),
            color="#8a8f98",
            tooltip=f"{t['role']}: {name}",
        )
    for (name, rep), labels in edges.items():
        g.edge(
            f"nd{rep}",
            _dot_id("t_", name),
            label="dim " + ",".join(sorted(labels)),
            color=colour_of(rep)[1],
            fontcolor="#555555",
        )


def _add_conflicts(g, ana, flt: GraphFilter, rep_of: dict[int, int]) -> None:
    only = None if flt.only_conflicts is None else set(flt.only_conflicts)
    if not flt.show_conflicts:
        only = (only or set()) | set(flt.highlight_conflicts)  # a selection still shows
    picked = set(flt.highlight_conflicts)
    if not flt.conflict_detail and only is None:
        _add_conflict_kinds(g, ana, rep_of, skip=picked)
        if not picked:
            return
        only = picked  # a picked conflict gets its own box beside the kinds' boxes
    groups = ana.group_of_conflict if flt.collapse else {}
    seen: set[int] = set()
    for c in ana.conflicts:
        if c.id in seen or (only is not None and c.id not in only):
            continue
        members = tuple(groups.get(c.id, (c.id,)))
        seen.update(members)
        dims = sorted(
            {rep_of[d] for k in members for d in ana.conflicts[k].named_dims if d in rep_of}
        )
        if not dims:
            continue
        head = c.name if len(members) == 1 else f"{c.name} ×{len(members)} layers"
        lines = [f"{head}: {c.kind}", *wrap_lines(public_text(c.description), CONFLICT_WRAP)]
        if c.options:
            cheapest = min(c.options, key=lambda o: o.bytes)
            lines += wrap_lines(
                f"{len(c.options)} option{'s' if len(c.options) > 1 else ''}; cheapest: option "
                f"{cheapest.index}, {fmt_bytes(cheapest.bytes)} resharded",
                CONFLICT_WRAP,
            )
        else:
            lines.append("no cut option: leave it unsharded")
        if flt.show_sites and c.sites:
            lines += wrap_lines("site: " + public_text(c.sites[0].text), CONFLICT_WRAP)
        if flt.only_conflicts is not None:  # a detail view: every option in full
            for o in c.options:
                lines += wrap_lines(
                    f"option {o.index} ({fmt_bytes(o.bytes)}): {public_text(o.description)}",
                    CONFLICT_WRAP,
                )
        extra = {"color": HIGHLIGHT_LINE, "penwidth": "6"} if picked & set(members) else {}
        _conflict_box(
            g,
            f"k{c.id}",
            lines,
            **extra,
            tooltip="; ".join(
                public_text(f"option {o.index}: {fmt_bytes(o.bytes)}, {o.description}")
                for o in c.options[:6]
            )
            or public_text(c.description),
        )
        for d in dims:
            g.edge(f"k{c.id}", f"nd{d}", color=CONFLICT_LINE, penwidth="1.6", arrowhead="none")


def _conflict_box(g, node_id: str, lines: list[str], **attrs) -> None:
    """A red box of left-aligned text lines: one conflict, or one kind of conflict."""
    style = {"color": CONFLICT_LINE, "penwidth": "2"} | attrs
    g.node(
        node_id,
        "\\l".join(_dot_escape(x) for x in lines) + "\\l",
        shape="box",
        style="filled,bold",
        fillcolor=CONFLICT_FILL,
        fontcolor=CONFLICT_TEXT,
        **style,
    )


def _add_conflict_kinds(g, ana, rep_of: dict[int, int], skip: set[int] = frozenset()) -> None:
    """Large programs: one box per conflict kind (how many, which named dims), the detail in the
    conflict table; a mass of red boxes and edges would bury the named dims. Conflicts in
    `skip` (picked in the table) are drawn on their own instead."""
    by_kind: dict[str, list] = defaultdict(list)
    for c in ana.conflicts:
        if c.id not in skip and any(d in rep_of for d in c.named_dims):
            by_kind[c.kind].append(c)
    for kind, cs in by_kind.items():
        dims = sorted({rep_of[d] for c in cs for d in c.named_dims if d in rep_of})
        names = ", ".join(c.name for c in cs[:6]) + (" ..." if len(cs) > 6 else "")
        lines = [f"{len(cs)} {kind} conflict{'s' if len(cs) > 1 else ''}", names]
        lines += wrap_lines(CONFLICT_KIND_TEXT.get(kind, ""), CONFLICT_WRAP)
        _conflict_box(g, f"kind_{kind}", lines)
        for d in dims:
            g.edge(f"kind_{kind}", f"nd{d}", color=CONFLICT_LINE, penwidth="1.2", arrowhead="none")


def _dot_escape(text: str) -> str:
    """Label text for a `\\l`-joined DOT label (graphviz reads backslashes as escapes)."""
    return text.replace("\\", "\\\\")


def legend_html() -> str:
    """A one-line legend of the graph's shapes and colours (HTML for `st.markdown`)."""

    def chip(fill: str, line: str, text: str, radius: str = "4px", border: str = "solid") -> str:
        return (
            f'<span style="background:{fill};border:2px {border} {line};border-radius:{radius};'
            f'padding:1px 8px;margin-right:10px;white-space:nowrap">{text}</span>'
        )

    fill, line = PALETTE[0]
    return (
        chip(fill, line, "named dim (ellipse, one colour each)", "12px")
        + chip(ROLE_FILL["input"], "#8a8f98", "data input")
        + chip(ROLE_FILL["parameter"], "#8a8f98", "parameter (+ optimizer state)")
        + chip(ROLE_FILL["output"], "#8a8f98", "output")
        + chip(CONFLICT_FILL, CONFLICT_LINE, "conflict with its options")
        + chip(fill, CONFLICT_LINE, "broken by a self / reshape conflict", "12px")
        + chip(fill, CONFLICT_LINE, "axis clash limits its mesh axes", "12px", "dashed")
        + chip(HIGHLIGHT_FILL, HIGHLIGHT_LINE, "selected (op, row of a table)")
    )


# -- plotly figures ----------------------------------------------------------------------------


def _layout(fig: go.Figure, title: str, height: int = 340) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0, "font": {"size": 15}},
        height=height,
        margin={"l": 10, "r": 10, "t": 45, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right", "x": 1},
        template="plotly_white",
    )
    return fig


def progress_figure(
    history,
    baseline_times: dict[str, float | None] | None = None,
    baseline_notes: dict[str, str] | None = None,
) -> go.Figure:
    """Best estimated step time against search iterations.

    `history`: (iteration, elapsed_s, best_step_time_s, fits) tuples; `baseline_times`: name ->
    step time of each memory-feasible baseline (None: does not apply or does not fit);
    `baseline_notes`: name -> why a baseline has no line ("does not fit (17.6 GiB)"), listed
    greyed out in the legend so that no baseline the title promises silently goes missing.
    """
    fig = go.Figure()
    its = [h[0] for h in history]
    best = [h[2] for h in history]
    fits = [bool(h[3]) if len(h) > 3 else True for h in history]
    fig.add_trace(
        go.Scatter(
            x=its,
            y=best,
            mode="lines+markers",
            line={"shape": "hv", "color": "#4c78a8", "width": 2.5},
            marker={"color": ["#4c78a8" if f else CONFLICT_LINE for f in fits], "size": 7},
            name="best found",
            customdata=[[fmt_s(b), f"{h[1]:.1f}"] for b, h in zip(best, history)],
            hovertemplate="iteration %{x}<br>best %{customdata[0]}<br>at %{customdata[1]} s"
            "<extra></extra>",
        )
    )
    x_end = max(its, default=0) or 1
    feasible = sorted((t, name) for name, t in (baseline_times or {}).items() if t is not None)
    for i, (t, name) in enumerate(feasible):
        fig.add_trace(
            go.Scatter(
                x=[0, x_end],
                y=[t, t],
                mode="lines",
                line={
                    "dash": "dot",
                    "width": 1.3,
                    "color": BASELINE_COLOURS[i % len(BASELINE_COLOURS)],
                },
                name=f"{name} {fmt_s(t)}",
                hovertemplate=f"baseline {name}: {fmt_s(t)}<extra></extra>",
            )
        )
    for name, note in (baseline_notes or {}).items():
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                line={"dash": "dot", "width": 1.3, "color": "#c8c8c8"},
                name=f"{name}: {note}",
                visible="legendonly",
                hoverinfo="skip",
            )
        )
    fig.update_xaxes(title="iteration", rangemode="tozero")
    fig.update_yaxes(title="step time (s)", tickformat="~s", ticksuffix="s", rangemode="tozero")
    title = "Best estimated step time vs the baselines (dotted)"
    if baseline_notes:
        title += " that apply and fit"
    _layout(fig, title)
    fig.update_layout(
        legend={"orientation": "v", "yanchor": "top", "y": 1, "x": 1.02, "xanchor": "left"}
    )
    return fig


def strategies_figure(rows: list[dict], capacity_bytes: float) -> go.Figure:
    """Side-by-side strategies: step time (compute + communication) and peak memory per device.

    `rows`: dicts with name, compute_s, comm_s, peak_bytes, fits.
    """
    names = [r["name"] for r in rows]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("Estimated step time", "Peak memory per device"),
        horizontal_spacing=0.18,
    )
    fig.add_trace(
        go.Bar(
            y=names,
            x=[r["compute_s"] for r in rows],
            name="compute",
            orientation="h",
            marker_color=KIND_COLOURS["compute"],
            hovertemplate="%{y}: compute %{x:.3s}s<extra></extra>",
        ),
        1,
        1,
    )
    fig.add_trace(
        go.Bar(
            y=names,
            x=[r["comm_s"] for r in rows],
            name="communication",
            orientation="h",
            marker_color=KIND_COLOURS["all-reduce"],
            hovertemplate="%{y}: communication %{x:.3s}s<extra></extra>",
        ),
        1,
        1,
    )
    peak = max((r["peak_bytes"] for r in rows), default=0.0)
    shows_capacity = capacity_bytes <= CAPACITY_IN_VIEW * max(peak, 1.0)
    scale, unit = binary_unit(max(peak, capacity_bytes if shows_capacity else 0.0))
    fig.add_trace(
        go.Bar(
            y=names,
            x=[r["peak_bytes"] / scale for r in rows],
            name="peak memory",
            orientation="h",
            marker_color=["#54a24b" if r["fits"] else CONFLICT_LINE for r in rows],
            text=[
                fmt_bytes(r["peak_bytes"]) + ("" if r["fits"] else " (does not fit)") for r in rows
            ],
            textposition="auto",
            hovertemplate="%{y}: %{text}<extra></extra>",
            showlegend=False,
        ),
        1,
        2,
    )
    if shows_capacity:
        fig.add_vline(
            x=capacity_bytes / scale,
            line={"color": CONFLICT_LINE, "dash": "dash"},
            annotation_text=f"capacity {fmt_bytes(capacity_bytes)}",
            annotation_font={"size": 10},
            row=1,
            col=2,
        )
    else:
        fig.layout.annotations[1].text = f"Peak memory per device (of {fmt_bytes(capacity_bytes)})"
    fig.update_xaxes(tickformat="~s", ticksuffix="s", row=1, col=1)
    fig.update_xaxes(title=f"{unit} per device", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    _layout(fig, "", height=max(280, 90 + 38 * len(rows)))
    fig.update_layout(
        barmode="stack",
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        legend={"orientation": "h", "yanchor": "top", "y": -0.12, "xanchor": "left", "x": 0},
    )
    return fig


def cost_breakdown_figure(compute_s: float, comm_s_by_kind: dict[str, float]) -> go.Figure:
    """One stacked bar: compute, then communication by collective kind."""
    fig = go.Figure()
    parts = [("compute", compute_s)] + [(k, v) for k, v in comm_s_by_kind.items() if v > 0]
    for kind, t in parts:
        fig.add_trace(
            go.Bar(
                y=["step"],
                x=[t],
                name=f"{kind} {fmt_s(t)}",
                orientation="h",
                marker_color=KIND_COLOURS.get(kind, "#bab0ac"),
                hovertemplate=f"{kind}: {fmt_s(t)}<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack", showlegend=True)
    fig.update_xaxes(tickformat="~s", ticksuffix="s")
    fig.update_yaxes(showticklabels=False)
    return _layout(fig, "Step time: compute and communication by kind", height=200)


#: Points drawn of a memory timeline: llama3-70b has 31,000 ops, and a trace that long takes the
#: browser seconds to draw (the Strategy page must be interactive within 2 s).
TIMELINE_POINTS = 2_000


def envelope(values, points: int = TIMELINE_POINTS) -> tuple[list[int], list[float]]:
    """(x, y) of at most ~2 * `points` points that keep each bucket's minimum and maximum, in
    order: the shape and the peak of a long timeline survive, its size does not."""
    n = len(values)
    if n <= 2 * points:
        return list(range(n)), list(values)
    step = -(-n // points)
    xs, ys = [], []
    for start in range(0, n, step):
        chunk = values[start : start + step]
        lo = min(range(len(chunk)), key=chunk.__getitem__)
        hi = max(range(len(chunk)), key=chunk.__getitem__)
        for i in sorted({lo, hi}):
            xs.append(start + i)
            ys.append(chunk[i])
    return xs, ys


def memory_figure(
    timeline: tuple[float, ...] | list[float],
    capacity_bytes: float,
    persistent_bytes: float,
    peak_op: int = -1,
    peak_label: str = "",
) -> go.Figure:
    """Per-device memory over program order, against the device's capacity."""
    peak = max(timeline, default=0.0)
    shows_capacity = capacity_bytes <= CAPACITY_IN_VIEW * max(peak, 1.0)
    scale, unit = binary_unit(max(peak, capacity_bytes if shows_capacity else 0.0))
    fig = go.Figure()
    xs, ys = envelope(timeline)
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=[b / scale for b in ys],
            mode="lines",
            fill="tozeroy",
            line={"color": "#4c78a8", "width": 1.5},
            name="live bytes per device",
            hovertemplate=f"op %{{x}}: %{{y:.3f}} {unit}<extra></extra>",
        )
    )
    if shows_capacity:
        fig.add_hline(
            y=capacity_bytes / scale,
            line={"color": CONFLICT_LINE, "dash": "dash"},
            annotation_text=f"capacity {fmt_bytes(capacity_bytes)}",
            annotation_position="top left",
        )
    fig.add_hline(
        y=persistent_bytes / scale,
        line={"color": "#888888", "dash": "dot"},
        annotation_text=f"inputs {fmt_bytes(persistent_bytes)}",
        annotation_position="bottom right",
    )
    if 0 <= peak_op < len(timeline):
        fig.add_trace(
            go.Scatter(
                x=[peak_op],
                y=[timeline[peak_op] / scale],
                mode="markers",
                marker={"color": CONFLICT_LINE, "size": 9},
                name=f"peak {fmt_bytes(timeline[peak_op])}",
                hovertemplate=(peak_label or "peak") + "<extra></extra>",
            )
        )
    top = max(peak, capacity_bytes if shows_capacity else 0.0) * 1.08 / scale
    fig.update_yaxes(title=f"{unit} per device", range=[0, top])
    fig.update_xaxes(title="op (program order)")
    title = "Per-device memory over the step"
    if not shows_capacity:
        share = peak / capacity_bytes if capacity_bytes else 0.0
        title += f" (peak is {share:.2%} of the {fmt_bytes(capacity_bytes)} capacity)"
    return _layout(fig, title)


def tree_rows(edges) -> list[dict]:
    """The top of the search tree (`SearchEvent.tree_top`) as table rows: each first-level
    action, then its most visited follow-ups indented under it."""
    rows = []
    for i, e in enumerate(edges):
        rows.append(
            {
                "depth": e.depth,
                "action": ("↳ " if e.depth > 1 else "") + e.action,
                "after": edges[e.parent].action if e.parent >= 0 else "(root)",
                "visits": e.visits,
                "mean reward": round(e.mean_value, 3),
                "edge": i,
            }
        )
    return rows


def tree_figure(edges, height: int = 420) -> go.Figure:
    """Sunburst of the top of the search tree: ring 1 the actions from the root, ring 2 their
    follow-ups; area = visits, colour = mean reward (0.55 = the best baseline's step time),
    scaled to the range shown."""
    ids = ["root"] + [f"e{i}" for i in range(len(edges))]
    parents = [""] + ["root" if e.parent < 0 else f"e{e.parent}" for e in edges]
    labels = ["root"] + [_wrap(e.action, 22) for e in edges]
    # "remainder": a sector is its own value plus its children's, so an action's own value is
    # the visits its shown follow-ups do not account for (a DAG may give them more).
    shown_below = [0] * len(edges)
    for e in edges:
        if e.parent >= 0:
            shown_below[e.parent] += e.visits
    values = [0] + [max(e.visits - below, 0) for e, below in zip(edges, shown_below)]
    means = [e.mean_value for e in edges] or [0.55]
    colours = [sum(means) / len(means)] + means
    fig = go.Figure(
        go.Sunburst(
            ids=ids,
            parents=parents,
            labels=labels,
            values=values,
            branchvalues="remainder",
            marker={
                "colors": colours,
                "colorscale": "RdYlGn",
                "cmin": min(means),
                "cmax": max(max(means), min(means) + 1e-3),
                "colorbar": {"title": "mean<br>reward"},
            },
            customdata=[0] + [e.visits for e in edges],
            hovertemplate="%{label}<br>visits %{customdata}<br>mean reward %{color:.3f}"
            "<extra></extra>",
            insidetextfont={"size": 13},
        )
    )
    fig.update_layout(height=height, margin={"l": 8, "r": 8, "t": 8, "b": 8})
    return fig


def _wrap(text: str, width: int) -> str:
    """Plotly labels do not wrap: break `text` at spaces into lines of about `width` characters."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join(lines + [line])
