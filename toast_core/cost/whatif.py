"""Why this plan: every decision of a strategy against each of its alternatives.

A plan is a handful of decisions (named dim -> mesh axes, conflict -> option). For each one,
`explain` changes that decision alone to every alternative the mesh allows, prices the result
with the same cost model, and says what changes: step time, communication, peak memory, whether it
still fits, and which collectives appear or vanish. Sorted by consequence, the table answers "why
is N3 on `model`?" with "because on `data` it would cost 2.1 ms more: an all-gather of params.w_fc
over data appears in every layer".

    table = tc.explain(ana, strategy, mesh, hw)
    for row in table.rows[:5]: print(row.decision, row.alternative, row.delta_step_s, row.appear)

Parts of one named dim after cuts that share their mesh axes are one decision (`N3.0..N3.5`);
each alternative comes with the pins that force it, so a user can pin it and search again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import combinations

from toast_core.analysis import Analysis
from toast_core.cost.model import CostOptions, CostReport, evaluator
from toast_core.mesh import HardwareSpec, MeshSpec, hardware
from toast_core.strategy import Strategy, dim_pin, option_pin, parent_name, space_of

#: Alternatives whose collectives are itemized (the rest carry numbers only).
DETAILED_ROWS = 40


@dataclass(frozen=True)
class WhatIf:
    """One decision changed to one alternative, everything else kept."""

    decision: str  # "N3", "N3.0..N3.5" or "K2"
    what: str  # the named dim's label or the conflict's description
    current: str  # "data+model", "-" (replicated), "option 0", "unresolved"
    alternative: str
    pins: tuple[str, ...]  # pins that force the alternative
    legal: bool
    why_illegal: str = ""
    step_time_s: float = float("nan")
    delta_step_s: float = float("nan")  # alternative - current
    comm_s: float = float("nan")
    peak_bytes: float = float("nan")
    fits: bool = False
    appear: tuple[str, ...] = ()  # collectives the alternative adds ("all-gather over data x12")
    vanish: tuple[str, ...] = ()  # collectives it removes

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Explanation:
    strategy: Strategy
    report: CostReport
    rows: tuple[WhatIf, ...]  # legal alternatives by consequence, then the illegal ones

    def best_alternative(self) -> WhatIf | None:
        """The legal alternative that would be fastest while fitting (None: the plan is a local
        optimum under single changes)."""
        better = [r for r in self.rows if r.legal and r.fits and r.delta_step_s < 0]
        return min(better, key=lambda r: r.delta_step_s) if better else None


def explain(
    ana: Analysis,
    strategy: Strategy,
    mesh: MeshSpec,
    hw: HardwareSpec | str,
    options: CostOptions | None = None,
) -> Explanation:
    """What-if table of `strategy`: each decision changed to each alternative (see module doc)."""
    hw = hardware(hw)
    ev = evaluator(ana, mesh, hw, options)
    base = ev.report(strategy)
    base_colls = _collective_counts(base)
    space = space_of(ana, mesh)
    base_step = ev.score(space.masks_of(strategy.shardings, strategy.options)).step_time_s
    rows: list[tuple[WhatIf, Strategy]] = []
    for decision, names, axes in _dim_decisions(ana, strategy):
        label = ana.named_dim(parent_name(names[0])).label
        for alt in _axis_sets(space.axes.names):
            if alt == axes:
                continue
            shardings = dict(strategy.shardings)
            for n in names:
                if alt:
                    shardings[n] = alt
                else:
                    shardings.pop(n, None)
            pins = _dim_pins(ana, strategy, names, alt)
            rows.append(
                _priced(
                    ev,
                    space,
                    base_step,
                    shardings,
                    strategy.options,
                    decision,
                    label,
                    _axes_text(axes),
                    _axes_text(alt),
                    pins,
                )
            )
    chosen = dict(strategy.options)
    for c in ana.conflicts:
        if not c.options:
            continue
        current = chosen.get(c.id)
        for o in range(len(c.options)):
            if o == current:
                continue
            opts = dict(chosen)
            opts[c.id] = o
            shardings = _shardings_under(ana, strategy, tuple(sorted(opts.items())))
            rows.append(
                _priced(
                    ev,
                    space,
                    base_step,
                    shardings,
                    tuple(sorted(opts.items())),
                    c.name,
                    f"{c.kind} conflict: {c.options[o].description}",
                    _option_text(current),
                    _option_text(o),
                    (option_pin(c.id, o),),
                )
            )
    legal = sorted(
        (r for r in rows if r[0].legal), key=lambda r: (not r[0].fits, -abs(r[0].delta_step_s))
    )
    detailed = [
        _with_collective_changes(ev, base_colls, row, alt) if i < DETAILED_ROWS else row
        for i, (row, alt) in enumerate(legal)
    ]
    illegal = [row for row, _ in rows if not row.legal]
    return Explanation(strategy, base, tuple(detailed + illegal))


# -- decisions and alternatives ----------------------------------------------------------------


def _dim_decisions(ana: Analysis, strategy: Strategy):
    """(decision text, part names, mesh axes) for every named dim of size > 1 after the cuts,
    the parts of one named dim on the same mesh axes taken together."""
    res = strategy.resolution(ana)
    sharded = dict(strategy.shardings)
    groups: dict[tuple[int, tuple[str, ...]], list[str]] = {}
    for d in res.dims:
        if d.size > 1:
            groups.setdefault((d.parent, sharded.get(d.name, ())), []).append(d.name)
    for (_, axes), names in groups.items():
        text = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
        yield text, tuple(names), tuple(axes)


def _axis_sets(names: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every set of mesh axes in mesh order, replicated first."""
    return [c for r in range(len(names) + 1) for c in combinations(names, r)]


def _dim_pins(ana, strategy, names, alt) -> tuple[str, ...]:
    parent = parent_name(names[0])
    all_parts = [d.name for d in strategy.resolution(ana).dims if parent_name(d.name) == parent]
    if sorted(all_parts) == sorted(names):
        return (dim_pin(parent, alt),)
    return tuple(dim_pin(n, alt) for n in names)


def _shardings_under(ana: Analysis, strategy: Strategy, options) -> dict:
    """The strategy's mesh axes carried over to the named dims of another option set: a named
    dim keeps the axes of the part that held its first fine class."""
    old_res = strategy.resolution(ana)
    sharded = dict(strategy.shardings)
    out = {}
    for d in Strategy(options=options).resolution(ana).dims:
        old = old_res.dims[int(old_res.fine_to_dim[d.fine[0]])].name
        if sharded.get(old):
            out[d.name] = sharded[old]
    return out


def _priced(ev, space, base_step, shardings, options, decision, what, current, alt, pins):
    """(row, alternative strategy): the alternative priced, or why it is illegal."""
    items = tuple(sorted(shardings.items()))
    problems = space.problems(items, options)
    alternative = Strategy(items, tuple(options))
    if problems:
        return WhatIf(decision, what, current, alt, pins, False, problems[0]), alternative
    s = ev.score(space.masks_of(items, options))
    row = WhatIf(
        decision,
        what,
        current,
        alt,
        pins,
        True,
        "",
        s.step_time_s,
        s.step_time_s - base_step,
        s.comm_s,
        s.peak_bytes,
        s.fits,
    )
    return row, alternative


def _with_collective_changes(ev, base_colls: Counter, row: WhatIf, alt: Strategy) -> WhatIf:
    """The row with the collectives that appear or vanish, from the alternative's full report."""
    colls = _collective_counts(ev.report(alt))
    appear = tuple(_coll_text(k, n) for k, n in sorted((colls - base_colls).items()))
    vanish = tuple(_coll_text(k, n) for k, n in sorted((base_colls - colls).items()))
    return WhatIf(**{**row.to_dict(), "appear": appear, "vanish": vanish})


def _collective_counts(report: CostReport) -> Counter:
    """(kind, mesh axes) -> executions per step."""
    out: Counter = Counter()
    for c in report.collectives:
        out[(c.kind, c.mesh_axes)] += c.count
    return out


def _coll_text(key, n: int) -> str:
    kind, axes = key
    return f"{kind} over {'+'.join(axes)} x{n}"


def _axes_text(axes) -> str:
    return "+".join(axes) if axes else "-"


def _option_text(o) -> str:
    return "unresolved" if o is None else f"option {o}"
