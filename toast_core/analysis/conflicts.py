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

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from toast_core.ir.program import Program

MAX_OPTIONS = 4


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
    """The atom graph of one named dim: atoms as nodes, M-edges as cuttable edges.

    Max-flow runs in scipy's Dinic implementation on integer capacities (bytes in units of
    `unit_bytes`, at least 1), so option finding stays fast on the large named dims of real models.
    """

    BIG = 1 << 28

    def __init__(self, eids, ends, capacity: np.ndarray, unit_bytes: float) -> None:
        """`eids`: the class's M-edge ids; `ends`: their [value atom, use atom] rows;
        `capacity`: bytes per M-edge id (the whole program's array)."""
        self.nodes = np.unique(ends)
        self.n = len(self.nodes)
        self.eu = np.searchsorted(self.nodes, ends[:, 0])
        self.ev = np.searchsorted(self.nodes, ends[:, 1])
        self.eid = np.asarray(eids, dtype=np.int64)
        caps = capacity[self.eid]
        self.cap = np.clip(np.ceil(caps / unit_bytes), 1, 1 << 16).astype(np.int64)
        self.capacity = capacity

    def _node(self, atoms) -> np.ndarray:
        return np.searchsorted(self.nodes, np.fromiter(atoms, dtype=np.int64))

    def distances(self, start: int):
        """Hop distances from an atom: a function atom -> distance (large if unreachable)."""
        graph = sp.csr_matrix(
            (np.ones(2 * len(self.eu)), (np.r_[self.eu, self.ev], np.r_[self.ev, self.eu])),
            shape=(self.n, self.n),
        )
        dist = csgraph.shortest_path(graph, unweighted=True, indices=int(self._node([start])[0]))
        dist = np.where(np.isfinite(dist), dist, 1e9)

        def at(atom: int) -> float:
            i = int(np.searchsorted(self.nodes, atom))
            return float(dist[i]) if i < self.n and self.nodes[i] == atom else 1e9

        return at

    def min_cuts(self, sources: set[int], sinks: set[int], blocked: frozenset[int] = frozenset()):
        """Max-flow between atom sets; returns (value, cut near sources, cut near sinks) as
        frozensets of M-edge ids, or None when the sides cannot be separated."""
        if sources & sinks or not sources or not sinks:
            return None
        n = self.n + 2
        s, t = n - 2, n - 1
        src = self._node(sources)
        snk = self._node(sinks)
        cap = self.cap.copy()
        if blocked:
            cap[np.isin(self.eid, list(blocked))] = self.BIG
        rows = np.r_[self.eu, self.ev, np.full(len(src), s), snk]
        cols = np.r_[self.ev, self.eu, src, np.full(len(snk), t)]
        data = np.r_[cap, cap, np.full(len(src), self.BIG), np.full(len(snk), self.BIG)]
        graph = sp.csr_matrix((data.astype(np.int32), (rows, cols)), shape=(n, n))
        result = csgraph.maximum_flow(graph, s, t, method="dinic")
        if result.flow_value >= self.BIG:
            return None
        residual = (graph - result.flow).tocsr()
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        near_sources = np.zeros(n, dtype=bool)
        near_sources[csgraph.breadth_first_order(residual, s, return_predecessors=False)] = True
        near_sinks = np.zeros(n, dtype=bool)
        near_sinks[
            csgraph.breadth_first_order(residual.T.tocsr(), t, return_predecessors=False)
        ] = True
        return result.flow_value, self._crossing(near_sources), self._crossing(near_sinks)

    def _crossing(self, side: np.ndarray) -> frozenset[int]:
        return frozenset(self.eid[side[self.eu] != side[self.ev]].tolist())


def cut_options(
    graph: ClassGraph, sources: set[int], sinks: set[int], first=None
) -> list[frozenset[int]]:
    """Distinct small cuts separating sources from sinks, cheapest first: the minimum cuts nearest
    each side and, when those coincide, the ones found when the first cut's most expensive edge
    may not be cut (so there are two choices wherever the graph allows it). `first` may give
    the nearest cuts already computed (see `analysis._batched_nearest_cuts`)."""
    if first is None:
        first = graph.min_cuts(sources, sinks)
    if first is None:
        return []
    found: dict[frozenset[int], float] = {}

    def add(cuts) -> None:
        for cut in cuts:
            if cut and cut not in found and len(found) < MAX_OPTIONS:
                found[cut] = sum(graph.capacity[e] for e in cut)

    add(first[1:])
    if len(found) == 1:
        only = next(iter(found))
        worst = max(only, key=lambda e: (graph.capacity[e], e))
        alt = graph.min_cuts(sources, sinks, frozenset({worst}))
        if alt is not None:
            add(alt[1:])
    return sorted(found, key=lambda c: (found[c], sorted(c)))


def describe_cut(program: Program, medges, cut: frozenset[int], limit: int = 3) -> str:
    """ "reshard k[8, 32, 64] at dot_general at model.py:42; ..." (one phrase per cut use)."""
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
