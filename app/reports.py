"""Text the explorer shows or exports: decision tables, strategy diffs, a PartitionSpec snippet and
a self-contained Markdown report. Pure functions over engine objects (no Streamlit)."""

from __future__ import annotations

import datetime as _dt
import math

from jax.sharding import PartitionSpec

import toast_core as tc
from app.dim_names import DimNamer
from app.fmt import fmt_axes, fmt_bytes, fmt_s


def dim_label(ana: tc.Analysis, dim_name: str) -> str:
    """What a named dim is (`16 batch (batch.x.0)`, see `dim_names`), or a part of one after
    cuts (`N3.1` -> part 1 of it)."""
    base, _, part = dim_name.partition(".")
    try:
        nd = ana.named_dim(tc.parent_name(dim_name))
    except tc.ToastError:
        return ""
    label = f"{nd.size} {DimNamer.of(ana).describe(nd)}"
    return f"{label}, part {part}" if part else label


def decision_rows(ana: tc.Analysis, strategy: tc.Strategy, pins=()) -> list[dict]:
    """One row per decision of a strategy: sharded named dims, chosen conflict options, then
    remat policies."""
    pinned = {p.strip() for p in pins}
    rows = []
    for names, axes in _grouped_shardings(strategy):
        name = names[0]
        pin = tc.dim_pin(name, axes)
        parent = tc.parent_name(name)
        many = len(names) > 2  # the parts of one named dim after cuts, all on the same axes
        rows.append(
            {
                "decision": f"{names[0]} ... {names[-1]}@{fmt_axes(axes)}" if many else pin,
                "named dim": f"{parent} ({len(names)} parts)" if many else name,
                "what": dim_label(ana, parent if many else name),
                "mesh axes": fmt_axes(axes),
                "pinned": "yes" if pin in pinned or tc.dim_pin(parent, axes) in pinned else "",
            }
        )
    for k, o in strategy.options:
        c = ana.conflict(k)
        desc = c.options[o].description if o < len(c.options) else ""
        pin = tc.option_pin(k, o)
        rows.append(
            {
                "decision": pin,
                "named dim": ", ".join(f"N{d}" for d in c.named_dims),
                "what": f"{c.kind} conflict: option {o}: {desc}",
                "mesh axes": "",
                "pinned": "yes" if pin in pinned else "",
            }
        )
    for group, policy in strategy.remat:
        pin = tc.remat_pin(group, policy)
        rows.append(
            {
                "decision": pin,
                "named dim": "",
                "what": f"remat: layer group {group} recomputed in the backward "
                f"({REMAT_KEEPS.get(policy, policy)})",
                "mesh axes": "",
                "pinned": "yes" if pin in pinned else "",
            }
        )
    rows.sort(key=lambda r: r["pinned"] != "yes")  # pinned decisions first (stable otherwise)
    return rows


#: What each remat policy keeps from the forward for the backward.
REMAT_KEEPS = {"dots": "keeps the matmul outputs", "full": "keeps only the layer inputs"}


#: How the tables write the parts of a named dim after a conflict's cut.
PART_NOTE = (
    "`N0.3` is part 3 of named dim N0: cutting a conflict splits a named dim into parts that may "
    "be sharded differently (one per side of each cut). `N0.0 ... N0.20@data (21 parts)` is one "
    "decision: all 21 parts of N0 on `data`."
)


def has_parts(strategy: tc.Strategy) -> bool:
    return any("." in name for name, _ in strategy.shardings)


def why_replicated(baselines: dict) -> str:
    """Why leaving everything replicated wins, with the numbers: the compute that the fastest
    sharded baseline saves against the communication it adds. `baselines`: name -> (Strategy,
    CostReport) or (None, reason), as `cached.baseline_reports` returns them."""
    rep = baselines.get("replicated", (None, None))[1]
    sharded = [
        (name, r)
        for name, (s, r) in baselines.items()
        if s is not None and name != "replicated" and r.fits
    ]
    if rep is None or isinstance(rep, str) or not sharded:
        return "Everything replicated: no sharded baseline applies and fits on this mesh."
    name, r = min(sharded, key=lambda nr: nr[1].step_time_s)
    n_coll = sum(c.count for c in r.collectives)
    saved = rep.compute_s - r.compute_s
    return (
        f"Everything replicated, because sharding does not pay at this size: replicated takes "
        f"{fmt_s(rep.step_time_s)} per step; the fastest sharded baseline, {name}, takes "
        f"{fmt_s(r.step_time_s)}, of which {fmt_s(r.comm_s)} is communication ({n_coll} "
        f"collectives, each paying its latency). Sharding saves {fmt_s(saved)} of compute but "
        f"adds {fmt_s(r.comm_s)} of communication. Try a larger size or batch, or a slower chip."
    )


def _grouped_shardings(strategy: tc.Strategy) -> list[tuple[list[str], tuple[str, ...]]]:
    """Shardings with the parts of one named dim on the same mesh axes gathered (N0.0 ... N0.18
    all on `data` is one row, not nineteen); order of first appearance kept."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for name, axes in strategy.shardings:
        key = (tc.parent_name(name), tuple(axes))
        groups.setdefault(key, []).append(name)

    def part(name: str) -> int:
        return int(name.rsplit(".", 1)[1]) if "." in name else -1

    return [(sorted(names, key=part), axes) for (_, axes), names in groups.items()]


def decisions_as_pins(strategy: tc.Strategy) -> list[str]:
    """The strategy's decisions written as pins (`K2=0`, `N3@data+model`)."""
    return tc.strategy_pins(strategy)


def frozen_pins(ana: tc.Analysis, strategy: tc.Strategy) -> list[str]:
    """Pins that fix every decision of a strategy (`tc.frozen_pins`)."""
    return tc.frozen_pins(ana, strategy)


def strategy_diff(old: tc.Strategy, new: tc.Strategy) -> list[dict]:
    """Decisions that differ between two strategies (named dims by name, conflicts by id). The
    parts of one named dim after cuts that change the same way are one row (`N0.0 ... N0.25`,
    "21 parts"), not one row each."""
    rows = []
    old_sh, new_sh = dict(old.shardings), dict(new.shardings)
    groups: dict[tuple, list[str]] = {}
    for name in sorted(set(old_sh) | set(new_sh), key=_natural):
        a, b = old_sh.get(name, ()), new_sh.get(name, ())
        if a != b:
            groups.setdefault((tc.parent_name(name), a, b), []).append(name)
    for (parent, a, b), names in groups.items():
        many = len(names) > 2
        rows.append(
            {
                "decision": f"{names[0]} ... {names[-1]} ({len(names)} parts of {parent})"
                if many
                else ", ".join(names),
                "before": fmt_axes(a),
                "after": fmt_axes(b),
            }
        )
    old_op, new_op = dict(old.options), dict(new.options)
    for k in sorted(set(old_op) | set(new_op)):
        a, b = old_op.get(k), new_op.get(k)
        if a != b:
            rows.append(
                {
                    "decision": f"K{k}",
                    "before": "unresolved" if a is None else f"option {a}",
                    "after": "unresolved" if b is None else f"option {b}",
                }
            )
    return rows


def _natural(name: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in name.replace("N", "").split("."))


def io_roles(ana: tc.Analysis) -> dict[int, str]:
    """Value id -> role ("input", "parameter", "state", "output") of the program's inputs and
    outputs, in program order."""
    prog = ana.program
    inputs, outputs = set(prog.inputs), set(prog.outputs)  # tuples: `in` would be quadratic
    return {
        vid: "output" if vid in outputs and vid not in inputs else prog.values[vid].role
        for vid in dict.fromkeys(prog.inputs + prog.outputs)
    }


def value_rows(ana: tc.Analysis, strategy: tc.Strategy, mesh: tc.MeshSpec, vids=None) -> list[dict]:
    """Per-tensor shardings of the program's inputs and outputs (or of `vids`) in scaling-book
    notation. Pages ask for the rows they show: llama3-70b has 2,900."""
    prog = ana.program
    roles = io_roles(ana)
    rows = []
    sizes = dict(mesh.axes)
    vids = list(roles if vids is None else vids)
    for vid, (axes, notation) in zip(vids, strategy.value_layouts(ana, mesh, vids)):
        v = prog.values[vid]
        local = [
            n // math.prod(sizes[a] for a in dim_axes) if dim_axes else n
            for n, dim_axes in zip(v.shape, axes)
        ]
        ways = math.prod(sizes[a] for dim_axes in axes for a in dim_axes)
        rows.append(
            {
                "tensor": v.name,
                "role": roles.get(vid, v.role),
                "sharding": notation,
                "shape": str(list(v.shape)),
                "per-device shape": str(local),
                "per-device bytes": fmt_bytes(v.nbytes / ways),
            }
        )
    return rows


def collective_rows(ana: tc.Analysis, report: tc.CostReport, limit: int = 300) -> list[dict]:
    """Collectives of a cost report, most expensive first, with the op and value causing them."""
    prog = ana.program
    rows = []
    for c in sorted(report.collectives, key=lambda c: -c.time_s * c.count)[:limit]:
        rows.append(
            {
                "kind": c.kind,
                "mesh axes": fmt_axes(c.mesh_axes),
                "time": fmt_s(c.time_s * c.count),
                "bytes (full)": fmt_bytes(c.bytes),
                "per-device result": fmt_bytes(c.result_bytes),
                "count": c.count,
                "direction": c.direction,
                "value": prog.values[c.value].display() if c.value >= 0 else "",
                "op": prog.ops[c.op].where() if c.op >= 0 else "",
                "cause": c.cause,
            }
        )
    return rows


def _spec_code(spec: PartitionSpec) -> str:
    return "P(" + ", ".join(repr(e) for e in tuple(spec)) + ")"


def _inline_code(tree) -> str:
    if isinstance(tree, PartitionSpec):
        return _spec_code(tree)
    if isinstance(tree, dict):
        return "{" + ", ".join(f"{k!r}: {_inline_code(v)}" for k, v in tree.items()) + "}"
    if isinstance(tree, list):
        return "[" + ", ".join(_inline_code(v) for v in tree) + "]"
    if isinstance(tree, tuple):
        inner = ", ".join(_inline_code(v) for v in tree)
        return f"({inner},)" if len(tree) == 1 else f"({inner})"
    return repr(tree)


def pytree_code(tree, indent: int = 0, width: int = 96, prefix: int = 0) -> str:
    """Python source for a pytree of PartitionSpecs (dicts, lists, tuples, None leaves), nested
    like `black` would: a node that fits on the rest of its line stays on one line. `prefix` is
    the width already used on the node's first line (`'key': `)."""
    flat = _inline_code(tree)
    if indent + prefix + len(flat) <= width or not isinstance(tree, dict | list | tuple):
        return flat
    pad, inner = " " * indent, " " * (indent + 4)
    if isinstance(tree, dict):
        items = [
            f"{inner}{k!r}: {pytree_code(v, indent + 4, width, len(repr(k)) + 2)},"
            for k, v in tree.items()
        ]
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    open_, close = ("[", "]") if isinstance(tree, list) else ("(", ")")
    items = [f"{inner}{pytree_code(v, indent + 4, width)}," for v in tree]
    return open_ + "\n" + "\n".join(items) + f"\n{pad}{close}"


def partition_spec_snippet(in_specs, out_specs, mesh: tc.MeshSpec, fn_name: str = "step") -> str:
    """A ready-to-paste Python snippet: the mesh, PartitionSpecs for every input and output, and
    the `jax.jit` call that applies them."""
    names = tuple(mesh.axis_names)
    shape = tuple(mesh.axis_sizes)
    return "\n".join(
        [
            "import jax",
            "import numpy as np",
            "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P",
            "",
            f"# {mesh.n_devices} devices as a {' x '.join(map(str, shape))} mesh {names}.",
            f"mesh = Mesh(np.array(jax.devices()[:{mesh.n_devices}]).reshape({shape}), {names})",
            "",
            "# One PartitionSpec per leaf of each positional argument.",
            f"in_specs = {pytree_code(tuple(in_specs), prefix=11)}",
            "",
            f"out_specs = {pytree_code(out_specs, prefix=12)}",
            "",
            "def shardings(specs):",
            "    return jax.tree.map(",
            "        lambda s: NamedSharding(mesh, s), specs,",
            "        is_leaf=lambda x: isinstance(x, P),",
            "    )",
            "",
            f"sharded_{fn_name} = jax.jit(",
            f"    {fn_name}, in_shardings=shardings(in_specs), out_shardings=shardings(out_specs)",
            ")",
            "",
        ]
    )


def markdown_report(
    *,
    title: str,
    description: str,
    summary: dict,
    mesh: tc.MeshSpec,
    hw_name: str,
    strategy: tc.Strategy,
    report: tc.CostReport,
    shardings: list[dict],
    baselines: list[dict],
    strategy_json: str,
    conflicts: list[dict],
) -> str:
    """A self-contained Markdown report of one strategy against the baselines."""
    lines = [
        f"# TOAST sharding report: {title}",
        "",
        f"_{description}_  ",
        f"Mesh `{mesh}` ({mesh.n_devices} devices), hardware `{hw_name}`, strategy "
        f"`{strategy.name or 'unnamed'}`; generated {_dt.datetime.now():%Y-%m-%d %H:%M}.",
        "",
        "## Analysis",
        "",
        f"- {summary['ops']} ops, {summary['values']} values, {summary['tensor_dims']} tensor dims",
        f"- {summary['named_dims']} named dims ({summary['dim_groups']} repeated-layer groups), "
        f"{summary['conflicts']} conflicts {dict(summary.get('conflicts_by_kind', {}))}",
        "",
        "## Estimated cost",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| step time | {fmt_s(report.step_time_s)} |",
        f"| compute | {fmt_s(report.compute_s)} |",
        f"| communication | {fmt_s(report.comm_s)} |",
        f"| ideal (all flops at peak) | {fmt_s(report.ideal_s)} |",
        f"| efficiency | {report.efficiency:.1%} |",
        f"| peak memory per device | {fmt_bytes(report.peak_bytes)} of "
        f"{fmt_bytes(report.capacity_bytes)} ({'fits' if report.fits else 'DOES NOT FIT'}) |",
        "",
        "Communication by kind:",
        "",
        "| kind | time | bytes per device |",
        "|---|---|---|",
    ]
    by_bytes = report.collective_bytes_by_kind()
    for kind, t in report.comm_s_by_kind().items():
        if t or by_bytes.get(kind):
            lines.append(f"| {kind} | {fmt_s(t)} | {fmt_bytes(by_bytes.get(kind, 0.0))} |")
    lines += [
        "",
        "## Baselines",
        "",
        "| strategy | step time | compute | comm | peak memory | fits |",
    ]
    lines.append("|---|---|---|---|---|---|")
    for b in baselines:
        lines.append(
            f"| {b['strategy']} | {b['step time']} | {b['compute']} | {b['communication']} | "
            f"{b['peak memory']} | {b['fits']} |"
        )
    if conflicts:
        lines += [
            "",
            "## Conflicts",
            "",
            "| conflict | kind | description | chosen |",
            "|---|---|---|---|",
        ]
        for c in conflicts:
            lines.append(f"| {c['conflict']} | {c['kind']} | {c['description']} | {c['chosen']} |")
    lines += [
        "",
        "## Shardings (inputs and outputs)",
        "",
        "| tensor | role | sharding | per-device |",
    ]
    lines.append("|---|---|---|---|")
    for r in shardings:
        lines.append(
            f"| `{r['tensor']}` | {r['role']} | `{r['sharding']}` | {r['per-device shape']} |"
        )
    lines += ["", "## Strategy JSON", "", "```json", strategy_json, "```", ""]
    return "\n".join(lines)
