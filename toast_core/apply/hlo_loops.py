"""Loops in a compiled program: how often each computation runs per step.

XLA writes a `while` loop once in the optimized HLO, and both the text and `cost_analysis()` count
its body once whatever its trip count (measured here: a `fori_loop` of 1, 4 or 16 matmuls reports
the same flops). A judge that compares the compiled program with a cost model counting a gradient
accumulation loop's microbatches (or a `scan` over layers) at their trip count must count them
alike, so this module reads the loops back:

    %while.5 = (s32[], f32[64,64]{1,0}) while(%tuple), condition=%region_1.3, body=%region_0.2,
        backend_config={..."known_trip_count":{"n":"16"}}

* `while_loops` lists each loop: the computation holding it, its body and its trip count (XLA's
  `known_trip_count`; a loop without one, a data-dependent `while_loop`, counts once: nothing in
  the program says how often it runs).
* `computation_counts` gives how many times each computation runs per step: the entry once, a loop
  body its holder's count times its trip count (nested loops multiply), any other called
  computation its callers' counts summed.
* `loop_scaled_cost` corrects `cost_analysis()` with XLA's own cost analysis of each loop body (the
  module re-parsed with the body as its entry): `total = cost(entry) + sum over loops of
  count(holder) * (trip count - 1) * cost(body)`. XLA prices every instruction; we only say how often
  each body runs.

Worked example: an entry E holding loop b1 (trip 4) whose body holds loop b2 (trip 3): XLA's
`cost(E)` counts b1 and b2 once, so the total is `cost(E) + 3 * cost(b1) + 8 * cost(b2)`, i.e.
every instruction of b2 runs 12 times and the rest of b1 4 times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toast_core.errors import ToastError, bad_value

_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(.*\{\s*$")
_WHILE = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=.*?\swhile\(")
_BODY = re.compile(r"\bbody=%?(?P<body>[\w.\-]+)")
_CONDITION = re.compile(r"\bcondition=%?(?P<cond>[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(?P<n>\d+)"')
# Attributes that name called computations (a fusion's `calls=` included: it inherits the count).
_CALLEES = re.compile(
    r"\b(?:to_apply|calls|condition|body|true_computation|false_computation)=%?([\w.\-]+)"
    r"|\bbranch_computations=\{(?P<branches>[^}]*)\}"
)


@dataclass(frozen=True, slots=True)
class WhileLoop:
    """One `while` instruction: where it is, what it runs and how often (1 if XLA knows not)."""

    name: str
    holder: str
    body: str
    condition: str
    trip_count: int
    has_known_trip_count: bool


def _computations(hlo_text: str) -> tuple[str | None, dict[str, list[str]]]:
    """(entry name, computation name -> its instruction lines)."""
    entry, lines_of, current = None, {}, None
    for line in hlo_text.splitlines():
        if line.startswith("}"):
            current = None
            continue
        header = _HEADER.match(line)
        if header is not None and current is None:
            current = header.group("name")
            lines_of[current] = []
            if header.group("entry"):
                entry = current
            continue
        if current is not None:
            lines_of[current].append(line)
    return entry, lines_of


def while_loops(hlo_text: str) -> tuple[WhileLoop, ...]:
    """Every `while` instruction of an HLO module text, in text order."""
    if not isinstance(hlo_text, str):
        raise ToastError(bad_value("hlo_text", hlo_text, "HLO module text (compiled.as_text())"))
    out = []
    for holder, lines in _computations(hlo_text)[1].items():
        for line in lines:
            match = _WHILE.match(line)
            body = _BODY.search(line) if match else None
            if body is None:
                continue
            trip = _TRIP.search(line)
            cond = _CONDITION.search(line)
            out.append(
                WhileLoop(
                    match.group("name"),
                    holder,
                    body.group("body"),
                    cond.group("cond") if cond else "",
                    int(trip.group("n")) if trip else 1,
                    trip is not None,
                )
            )
    return tuple(out)


def computation_counts(hlo_text: str) -> dict[str, int]:
    """How many times each computation of the module runs per step (module essay); computations
    no one calls (dead ones) run 0 times."""
    entry, lines_of = _computations(hlo_text)
    if entry is None:
        return {}
    trips = {(w.holder, w.body): w.trip_count for w in while_loops(hlo_text)}
    calls: dict[str, list[tuple[str, int]]] = {name: [] for name in lines_of}
    for caller, lines in lines_of.items():
        for line in lines:
            for match in _CALLEES.finditer(line):
                names = (
                    re.findall(r"%?([\w.\-]+)", match.group("branches"))
                    if match.group("branches") is not None
                    else [match.group(1)]
                )
                for callee in names:
                    if callee in lines_of:
                        calls[caller].append((callee, trips.get((caller, callee), 1)))
    counts = dict.fromkeys(lines_of, 0)
    # Callers precede callees nowhere in particular in the text: walk from the entry (HLO has no
    # recursion), adding each call site's count times the caller's.
    order, seen = [], set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for callee, _ in calls[name]:
            visit(callee)
        order.append(name)

    visit(entry)
    counts[entry] = 1
    for caller in reversed(order):  # reverse post order: every caller before its callees
        for callee, times in calls[caller]:
            counts[callee] += counts[caller] * times
    return counts


def _with_entry(hlo_text: str, name: str) -> str:
    """The module text with computation `name` as its entry."""
    lines = hlo_text.splitlines()
    for i, line in enumerate(lines):
        header = _HEADER.match(line)
        if header is None:
            continue
        if header.group("entry"):
            lines[i] = line.replace("ENTRY ", "", 1)
        if header.group("name") == name:
            lines[i] = "ENTRY " + lines[i]
    return "\n".join(lines)


def computation_cost(hlo_text: str, name: str) -> dict[str, float]:
    """XLA's cost analysis of one computation (with what it calls, loops once), run on the module
    re-parsed with that computation as its entry."""
    from toast_core.ir.trace import xla_hlo_cost_analysis

    return xla_hlo_cost_analysis(_with_entry(hlo_text, name))


COST_KEYS = ("flops", "transcendentals", "bytes accessed")


def loop_scaled_cost(hlo_text: str, cost: dict) -> dict[str, float]:
    """`cost_analysis()` totals (`COST_KEYS`) with every loop body counted as often as it runs
    (module essay). A module without loops with a known trip count gives `cost` back."""
    out = {key: float(cost.get(key, 0.0)) for key in COST_KEYS}
    loops = [w for w in while_loops(hlo_text) if w.trip_count > 1]
    if not loops:
        return out
    counts = computation_counts(hlo_text)
    for loop in loops:
        extra = counts.get(loop.holder, 0) * (loop.trip_count - 1)
        if extra <= 0:
            continue
        body = computation_cost(hlo_text, loop.body)
        for key in COST_KEYS:
            out[key] += extra * float(body.get(key, 0.0))
    return out
