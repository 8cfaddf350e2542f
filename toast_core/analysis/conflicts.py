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

    **Local search.** The sequence dim of a transformer spans every layer, and each layer's
    attention has a self-conflict in it: a max-flow or a breadth-first search over the whole
    named dim per conflict would grow with the square of the depth. Both work on the
    neighbourhood of the conflict instead, and fall back to the whole graph when it does not
    provably suffice:

    * `hops` takes the distances within `HOPS` M-edges (scipy's search explores only that ball),
      and searches the whole graph only if an atom asked for lies farther.
    * `min_cuts` takes the ball of radius `RADIUS` around the sources and sinks, and runs the
      max-flow on the M-edges inside it. A flow inside the ball is a flow of the whole graph.
      The cut nearest the sources is the set of atoms the sources still reach in the residual
      graph (the same set for every maximum flow), and likewise for the sinks. If neither set
      holds an atom of the ball's rim (at distance exactly the radius: the only atoms with
      M-edges leaving the ball), no residual path leaves the ball, so the flow is maximum in the
      whole graph and both cuts are exactly those a max-flow over all of it finds. Otherwise the
      radius doubles, until the ball holds half the graph; then the whole graph is used.
    """

    BIG = 1 << 28
    #: First radius of the ball `min_cuts` tries (in M-edges from a source or sink).
    RADIUS = 8
    #: Radius within which `hops` looks for the atoms first.
    HOPS = 16

    def __init__(self, eids, ends, capacity: np.ndarray, unit_bytes: float) -> None:
        """`eids`: the class's M-edge ids; `ends`: their [value atom, use atom] rows;
        `capacity`: bytes per M-edge id (the whole program's array)."""
        self.nodes, (self.eu, self.ev) = _relabel(np.asarray(ends, dtype=np.int64).reshape(-1, 2).T)
        self.n = len(self.nodes)
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

    def _distances(self, roots, limit: float) -> np.ndarray:
        """[root, node] hop distances up to `limit` (inf beyond): scipy's search explores only
        the ball of that radius."""
        return csgraph.dijkstra(
            self._adjacency, directed=True, indices=roots, unweighted=True, limit=limit
        )

    def hops(self, starts: list[int], atoms: list[int]) -> np.ndarray:
        """[start, atom] hop distances between atoms (1e9 if unreachable or not in the graph),
        searched within `HOPS` first and in the whole graph if some atom lies farther."""
        at = self._node(atoms).clip(max=self.n - 1)
        found = self.nodes[at] == np.asarray(atoms)
        roots = self._node(starts)
        dist = self._distances(roots, self.HOPS)[:, at[found]]
        if np.isinf(dist).any():
            dist = self._distances(roots, np.inf)[:, at[found]]
        out = np.full((len(starts), len(atoms)), 1e9)
        out[:, found] = np.where(np.isinf(dist), 1e9, dist)
        return out

    def min_cuts(self, sources: set[int], sinks: set[int], blocked: frozenset[int] = frozenset()):
        """Max-flow between atom sets; returns (value, cut near sources, cut near sinks) as
        frozensets of M-edge ids, or None when the sides cannot be separated."""
        if sources & sinks or not sources or not sinks:
            return None
        return self._min_cuts_from(self._node(sources), self._node(sinks), blocked, self.RADIUS)

    def _min_cuts_from(self, src, snk, blocked, radius: int):
        """`min_cuts` on balls of `radius` and more (see the class essay)."""
        while True:
            part = self._ball_part(src, snk, blocked, radius)
            if part is None:
                return _solve([self._part(np.arange(self.n), src, snk, blocked)])[0]
            result = _solve([part])[0]
            if result is not _RIM:
                return result
            radius *= 2

    def _ball_part(self, src, snk, blocked, radius: int) -> _Part | None:
        """The max-flow problem on the ball of `radius` around the terminals, or None when that
        ball (or the terminals alone) would hold half the graph: the whole graph is as cheap."""
        if 2 * (len(src) + len(snk)) > self.n:
            return None
        dist = csgraph.dijkstra(
            self._adjacency,
            directed=True,
            indices=np.r_[src, snk],
            unweighted=True,
            limit=radius,
            min_only=True,
        )
        ball = np.flatnonzero(dist <= radius)
        if 2 * len(ball) > self.n:
            return None
        return self._part(ball, src, snk, blocked, dist[ball] == radius)

    def _part(self, nodes, src, snk, blocked, rim=None) -> _Part:
        """The max-flow problem on the M-edges among `nodes` (sorted graph nodes)."""
        whole = len(nodes) == self.n
        if whole:
            edges = np.arange(len(self.eu))
            eu, ev = self.eu, self.ev
        else:
            local = np.full(self.n, -1, dtype=np.int64)
            local[nodes] = np.arange(len(nodes))
            edges = np.flatnonzero((local[self.eu] >= 0) & (local[self.ev] >= 0))
            eu, ev, src, snk = local[self.eu[edges]], local[self.ev[edges]], local[src], local[snk]
        cap = self.cap[edges]
        if blocked:
            cap[np.isin(self.eid[edges], list(blocked))] = self.BIG
        return _Part(len(nodes), eu, ev, cap, self.eid[edges], src, snk, rim)


def _relabel(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ids sorted, `ids` as indices into them): by a bitmap over the id range when
    that is not much larger than `ids` (atoms are numbered densely), else by sorting."""
    top = int(ids.max(initial=-1)) + 1
    if top <= 8 * ids.size + 1024:
        seen = np.zeros(top, dtype=bool)
        seen[ids] = True
        return np.flatnonzero(seen), (np.cumsum(seen) - 1)[ids]
    distinct = unique(ids)
    return distinct, np.searchsorted(distinct, ids)


@dataclass(frozen=True, slots=True)
class _Part:
    """One max-flow problem in local node numbering: M-edges `eu`-`ev` with capacities `cap`
    (and their ids `eid`), sources `src`, sinks `snk`; `rim` (a bool per node, or None for a
    whole graph) marks the atoms the nearest cuts must not reach (`ClassGraph`'s essay)."""

    n: int
    eu: np.ndarray
    ev: np.ndarray
    cap: np.ndarray
    eid: np.ndarray
    src: np.ndarray
    snk: np.ndarray
    rim: np.ndarray | None

    @property
    def bound(self) -> int:
        """An upper bound of the max-flow value: all M-edges cut (no source is a sink)."""
        return int(self.cap.sum())


#: `_solve`: a ball's nearest cuts reach its rim, so a larger ball is needed.
_RIM = object()
#: Flow values `_solve` may add up in scipy's int32 arithmetic.
_FLOW_LIMIT = 1 << 30


def _solve(parts: list[_Part]) -> list:
    """`min_cuts` results of several problems (or `_RIM`) from one max-flow over their disjoint
    union, with one super-source and one super-sink. A maximum flow of the union is one of each
    part, and no residual path passes from one part to another (through the super-source it
    would reach the sink, through the super-sink it would leave it), so each part's nearest
    cuts are its own. Callers keep the summed flow bounds within `_FLOW_LIMIT`."""
    sizes = np.array([p.n for p in parts], dtype=np.int64)
    base = np.cumsum(sizes) - sizes
    n = int(sizes.sum()) + 2
    s, t = n - 2, n - 1
    eu = np.concatenate([p.eu + b for p, b in zip(parts, base)])
    ev = np.concatenate([p.ev + b for p, b in zip(parts, base)])
    cap = np.concatenate([p.cap for p in parts])
    src = np.concatenate([p.src + b for p, b in zip(parts, base)])
    snk = np.concatenate([p.snk + b for p, b in zip(parts, base)])
    big = ClassGraph.BIG
    rows = np.r_[eu, ev, np.full(len(src), s), snk]
    cols = np.r_[ev, eu, src, np.full(len(snk), t)]
    data = np.r_[cap, cap, np.full(len(src), big), np.full(len(snk), big)]
    graph = sp.csr_matrix((data.astype(np.int32), (rows, cols)), shape=(n, n))
    result = csgraph.maximum_flow(graph, s, t, method="dinic")
    flow = result.flow.tocsr()
    if len(parts) == 1:
        values = [result.flow_value]
    else:
        lo, hi = flow.indptr[s], flow.indptr[s + 1]
        to, amount = flow.indices[lo:hi], flow.data[lo:hi]
        part_of = np.repeat(np.arange(len(parts)), sizes)
        values = np.bincount(
            part_of[to[to < s]], weights=amount[to < s], minlength=len(parts)
        ).astype(np.int64)
    residual = (graph - flow).tocsr()
    residual.data = (residual.data > 0).astype(np.int8)
    residual.eliminate_zeros()
    near_sources = np.zeros(n, dtype=bool)
    near_sources[csgraph.breadth_first_order(residual, s, return_predecessors=False)] = True
    near_sinks = np.zeros(n, dtype=bool)
    near_sinks[csgraph.breadth_first_order(residual.T.tocsr(), t, return_predecessors=False)] = True
    out: list = []
    for p, b, value in zip(parts, base.tolist(), values):
        if value >= big:
            out.append(None)  # a ball's flow is one of the whole graph's: uncuttable there too
            continue
        ns, nt = near_sources[b : b + p.n], near_sinks[b : b + p.n]
        if p.rim is not None and (ns[p.rim].any() or nt[p.rim].any()):
            out.append(_RIM)
            continue
        out.append(
            (
                value,
                frozenset(p.eid[ns[p.eu] != ns[p.ev]].tolist()),
                frozenset(p.eid[nt[p.eu] != nt[p.ev]].tolist()),
            )
        )
    return out


def min_cuts_many(problems) -> list:
    """`ClassGraph.min_cuts` of many (graph, sources, sinks, blocked) problems: the balls around
    their terminals solved together by a few max-flows (`_solve`), and only the problems whose
    ball was too small or too large solved one by one."""
    out: list = [None] * len(problems)
    batch: list[tuple[int, _Part]] = []
    for i, (graph, sources, sinks, blocked) in enumerate(problems):
        if sources & sinks or not sources or not sinks:
            continue
        src, snk = graph._node(sources), graph._node(sinks)
        part = graph._ball_part(src, snk, blocked, graph.RADIUS)
        if part is None or part.bound >= _FLOW_LIMIT:
            out[i] = graph._min_cuts_from(src, snk, blocked, graph.RADIUS)
        else:
            batch.append((i, part))
    chunk: list[tuple[int, _Part]] = []
    total = 0
    for k, (i, part) in enumerate(batch):
        chunk.append((i, part))
        total += part.bound
        if k + 1 == len(batch) or total + batch[k + 1][1].bound >= _FLOW_LIMIT:
            for (j, _), result in zip(chunk, _solve([p for _, p in chunk])):
                out[j] = result
            chunk, total = [], 0
    for i, result in enumerate(out):
        if result is _RIM:
            graph, sources, sinks, blocked = problems[i]
            out[i] = graph._min_cuts_from(
                graph._node(sources), graph._node(sinks), blocked, 2 * graph.RADIUS
            )
    return out


def cut_options_many(problems) -> list[list[frozenset[int]]]:
    """`cut_options` of many (graph, sources, sinks) problems, with batched max-flows."""
    first = min_cuts_many([(g, s, t, frozenset()) for g, s, t in problems])
    cuts = [nearest_cuts(r) for r in first]
    again = []
    for i, (g, sources, sinks) in enumerate(problems):
        worst = edge_to_forbid(cuts[i], g.capacity)
        if worst is not None and not links_sides(g.edge_atoms(worst), sources, sinks):
            again.append((i, worst))
    second = min_cuts_many([(*problems[i][:3], frozenset({w})) for i, w in again])
    for (i, _), result in zip(again, second):
        cuts[i] += nearest_cuts(result)
    return [ranked(c, g.capacity) for c, (g, _, _) in zip(cuts, problems)]


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
    rows = medge_table[np.array(sorted(cut), dtype=np.int64).reshape(-1), 1:3].tolist()
    uses = dict.fromkeys(map(tuple, rows))  # (value, op) of each cut use, first seen first
    parts = []
    for vid, opi in list(uses)[:limit]:
        v, op = program.values[vid], program.ops[opi]
        parts.append(f"reshard {v.display()} before {op.where()}")
    more = len(uses) - limit
    if more > 0:
        parts.append(f"+{more} more")
    return "; ".join(parts)
