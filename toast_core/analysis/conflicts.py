"""Conflicts: where the grouping into named dims cannot be honoured as is, and how to resolve it.

Three kinds, all returned as data with sites:

1. **self**: a named dim holds two atoms of one value. In attention, `q` and `k` both inherit the
   sequence dim S of `x`, so `scores[B, H, S, S]` holds S twice: sharding S on `model` would shard
   `scores` twice on one mesh axis. `y = x @ x.T` is the minimal case. Clashing values that feed
   each other (scores -> softmax -> probs, and their gradients) form one conflict.
2. **axis_clash**: a named dim of parameters (C1) co-occurs with a named dim of the data (C2) in
   some value, so they cannot take the same mesh axis. FSDP puts a weight's D on `data` while the
   batch is on `data`: legal only after cutting the weight's uses (all-gathers) and the gradient's
   link to the update (a reduce-scatter).
3. **reshape**: a value dim split incompatibly by its definition and a use; that M-edge is always
   cut.

**Resolution options** are sets of M-edges to cut, found as minimum cuts (capacity = bytes of the
value resharded at that use) between the two sides of the clash in the named dim's atom graph:
the cut closest to each side, then alternatives found by forbidding one edge of a known cut. For
attention this yields "reshard K (and V) before the scores" and "reshard the Q side". Leaving the
named dim unsharded is always possible and needs no option.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from toast_core.ir.program import Program

MAX_OPTIONS = 6
INF = float("inf")


@dataclass(frozen=True, slots=True)
class Site:
    """Where a conflict shows: an op or value, with its source line."""

    op: int
    value: int
    text: str


@dataclass(frozen=True, slots=True)
class ConflictOption:
    """One way to resolve a conflict: cut these M-edges (reshard those values at those uses)."""

    index: int
    cuts: frozenset[int]
    bytes: int
    description: str


@dataclass(frozen=True, slots=True)
class Conflict:
    id: int
    kind: str  # "self" | "axis_clash" | "reshape"
    named_dims: tuple[int, ...]
    sites: tuple[Site, ...]
    options: tuple[ConflictOption, ...]
    description: str

    @property
    def name(self) -> str:
        return f"K{self.id}"


class ClassGraph:
    """The atom graph of one named dim: atoms as nodes, M-edges as cuttable edges."""

    def __init__(self, edges: list, capacity: dict[int, float]) -> None:
        self.adj: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.capacity = capacity
        for e in edges:
            self.adj[e.value_atom].append((e.use_atom, e.id))
            self.adj[e.use_atom].append((e.value_atom, e.id))

    def distances(self, start: int) -> dict[int, int]:
        dist = {start: 0}
        queue = deque([start])
        while queue:
            x = queue.popleft()
            for y, _ in self.adj[x]:
                if y not in dist:
                    dist[y] = dist[x] + 1
                    queue.append(y)
        return dist

    def min_cuts(self, sources: set[int], sinks: set[int], blocked: frozenset[int] = frozenset()):
        """Max-flow (Edmonds-Karp) between atom sets; returns (value, cut near sources, cut near
        sinks) as frozensets of M-edge ids, or None when the sides cannot be separated."""
        if sources & sinks or not sources or not sinks:
            return None
        flow: dict[tuple[int, int], float] = defaultdict(float)  # (edge id, direction)

        def residual(x: int, y: int, eid: int) -> float:
            cap = INF if eid in blocked else self.capacity[eid]
            d = 0 if x < y else 1
            return cap - flow[(eid, d)] + flow[(eid, 1 - d)]

        total = 0.0
        while True:
            parent: dict[int, tuple[int, int] | None] = {s: None for s in sources}
            queue = deque(sources)
            end = None
            while queue and end is None:
                x = queue.popleft()
                for y, eid in self.adj[x]:
                    if y not in parent and residual(x, y, eid) > 0:
                        parent[y] = (x, eid)
                        if y in sinks:
                            end = y
                            break
                        queue.append(y)
            if end is None:
                break
            path = []
            y = end
            while parent[y] is not None:
                x, eid = parent[y]
                path.append((x, y, eid))
                y = x
            push = min(residual(x, y, eid) for x, y, eid in path)
            if push == INF:
                return None
            for x, y, eid in path:
                d = 0 if x < y else 1
                back = flow[(eid, 1 - d)]
                cancel = min(back, push)
                flow[(eid, 1 - d)] = back - cancel
                flow[(eid, d)] += push - cancel
            total += push
        near_sources = self._reachable(sources, residual, forward=True)
        near_sinks = self._reachable(sinks, residual, forward=False)
        cut_a = self._crossing(near_sources)
        cut_b = self._crossing(near_sinks)
        return total, cut_a, cut_b

    def _reachable(self, start: set[int], residual, forward: bool) -> set[int]:
        seen = set(start)
        queue = deque(start)
        while queue:
            x = queue.popleft()
            for y, eid in self.adj[x]:
                cap = residual(x, y, eid) if forward else residual(y, x, eid)
                if y not in seen and cap > 0:
                    seen.add(y)
                    queue.append(y)
        return seen

    def _crossing(self, side: set[int]) -> frozenset[int]:
        return frozenset(
            eid for x in side for y, eid in self.adj[x] if y not in side
        )


def cut_options(graph: ClassGraph, sources: set[int], sinks: set[int]) -> list[frozenset[int]]:
    """Up to MAX_OPTIONS distinct small cuts separating sources from sinks, cheapest first."""
    first = graph.min_cuts(sources, sinks)
    if first is None:
        return []
    found: dict[frozenset[int], float] = {}
    _, a, b = first
    queue = [a, b]
    tried: set[frozenset[int]] = set()
    while queue and len(found) < MAX_OPTIONS:
        cut = queue.pop(0)
        if not cut or cut in found:
            continue
        found[cut] = sum(graph.capacity[e] for e in cut)
        # Alternatives: forbid cutting the most expensive edge of this cut.
        worst = max(cut, key=lambda e: (graph.capacity[e], e))
        blocked = frozenset({worst})
        if blocked in tried:
            continue
        tried.add(blocked)
        alt = graph.min_cuts(sources, sinks, blocked)
        if alt is not None:
            queue.extend([alt[1], alt[2]])
    return sorted(found, key=lambda c: (found[c], sorted(c)))


def describe_cut(program: Program, medges, cut: frozenset[int], limit: int = 3) -> str:
    """"reshard k[8, 32, 64] at dot_general at model.py:42; ..." (one phrase per cut use)."""
    uses: dict[tuple[int, int], int] = {}
    for eid in sorted(cut):
        e = medges[eid]
        uses.setdefault((e.value, e.op), e.position)
    parts = []
    for (vid, opi), _ in list(uses.items())[:limit]:
        v, op = program.values[vid], program.ops[opi]
        parts.append(f"reshard {v.display()} before {op.where()}")
    more = len(uses) - limit
    if more > 0:
        parts.append(f"+{more} more")
    return "; ".join(parts)
