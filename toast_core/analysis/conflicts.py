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
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from toast_core.analysis.arrays import unique
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
        self.nodes = unique(ends)
        self.n = len(self.nodes)
        self.eu = np.searchsorted(self.nodes, ends[:, 0])
        self.ev = np.searchsorted(self.nodes, ends[:, 1])
        self.eid = np.asarray(eids, dtype=np.int64)
        caps = capacity[self.eid]
        self.cap = np.clip(np.ceil(caps / unit_bytes), 1, 1 << 16).astype(np.int64)
        self.capacity = capacity

    def edge_atoms(self, edge: int) -> tuple[int, int]:
        """The value atom and use atom of one of the graph's M-edges."""
        i = int(np.flatnonzero(self.eid == edge)[0])
        return int(self.nodes[self.eu[i]]), int(self.nodes[self.ev[i]])

    def _node(self, atoms) -> np.ndarray:
        return np.searchsorted(self.nodes, np.fromiter(atoms, dtype=np.int64))

    @cached_property
    def _adjacency(self) -> sp.csr_matrix:
        """Undirected hop graph over the nodes, built once: a named dim's conflicts share it."""
        both = (np.r_[self.eu, self.ev], np.r_[self.ev, self.eu])
        return sp.csr_matrix((np.ones(2 * len(self.eu)), both), shape=(self.n, self.n))

    def hops(self, starts: list[int], atoms: list[int]) -> np.ndarray:
        """[start, atom] hop distances between atoms (1e9 if unreachable or not in the graph).

        Depths in a breadth-first tree: scipy's search order is cheap even on the sequence dim
        that spans every layer, where its all-distances routine would cost a copy of the graph
        per call (and a conflict per layer)."""
        at = self._node(atoms).clip(max=self.n - 1)
        found = self.nodes[at] == np.asarray(atoms)
        out = np.full((len(starts), len(atoms)), 1e9)
        for i, root in enumerate(self._node(starts).tolist()):
            _, pred = csgraph.breadth_first_order(self._adjacency, root, directed=True)
            out[i, found] = _tree_depth(pred, root, at[found])
        return out

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


def _tree_depth(pred: np.ndarray, root: int, nodes: np.ndarray) -> np.ndarray:
    """Depths of `nodes` in the tree given by predecessors (1e9 for nodes outside the tree),
    walking all nodes up one level at a time."""
    depth = np.zeros(len(nodes))
    node = nodes.copy()
    live = node != root
    while live.any():
        node[live] = pred[node[live]]
        depth[live] += 1
        outside = live & (node < 0)
        depth[outside] = 1e9
        live &= (node != root) & ~outside
    return depth


def cut_options(graph: ClassGraph, sources: set[int], sinks: set[int]) -> list[frozenset[int]]:
    """Distinct small cuts separating sources from sinks, cheapest first: the minimum cuts nearest
    each side and, when those coincide, the ones found when the first cut's most expensive edge
    may not be cut (so there are two choices wherever the graph allows it). `analysis` batches
    the same steps over many named dims at once."""
    cuts = nearest_cuts(graph.min_cuts(sources, sinks))
    worst = edge_to_forbid(cuts, graph.capacity)
    if worst is not None and not links_sides(graph.edge_atoms(worst), sources, sinks):
        cuts += nearest_cuts(graph.min_cuts(sources, sinks, frozenset({worst})))
    return ranked(cuts, graph.capacity)


def nearest_cuts(result) -> list[frozenset[int]]:
    """The distinct non-empty cuts of a `min_cuts` result (none if the sides cannot be cut)."""
    if result is None:
        return []
    return [cut for cut in dict.fromkeys(result[1:]) if cut]


def edge_to_forbid(cuts: list[frozenset[int]], capacity: np.ndarray) -> int | None:
    """When the nearest cuts coincide, the edge whose cut is forbidden to find a second option:
    the most expensive one of the only cut."""
    if len(cuts) != 1:
        return None
    return max(cuts[0], key=lambda e: (capacity[e], e))


def links_sides(atoms, sources: set[int], sinks: set[int]) -> bool:
    """Whether an M-edge's two atoms are a source and a sink: every cut then holds that edge, so
    forbidding it leaves no alternative (its max-flow would only confirm that)."""
    a, b = atoms
    return (a in sources and b in sinks) or (a in sinks and b in sources)


def ranked(cuts: list[frozenset[int]], capacity: np.ndarray) -> list[frozenset[int]]:
    """The first `MAX_OPTIONS` distinct cuts, cheapest first (ties by their edge ids)."""
    found = {cut: sum(capacity[e] for e in cut) for cut in list(dict.fromkeys(cuts))[:MAX_OPTIONS]}
    return sorted(found, key=lambda c: (found[c], sorted(c)))


def describe_cut(program: Program, medge_table, cut: frozenset[int], limit: int = 3) -> str:
    """ "reshard k[8, 32, 64] at dot_general at model.py:42; ..." (one phrase per cut use);
    `medge_table` is `NdaResult.medge_table`."""
    uses: dict[tuple[int, int], int] = {}
    for eid in sorted(cut):
        _, value, op, position = medge_table[eid, :4].tolist()
        uses.setdefault((value, op), position)
    parts = []
    for (vid, opi), _ in list(uses.items())[:limit]:
        v, op = program.values[vid], program.ops[opi]
        parts.append(f"reshard {v.display()} before {op.where()}")
    more = len(uses) - limit
    if more > 0:
        parts.append(f"+{more} more")
    return "; ".join(parts)
