"""Named Dimension Analysis: group tensor dims that must be sharded alike into named dims.

Following TOAST's formalism, every op's factor rule gives its operand-use dims and result dims
op-local factors (identities inside the op: **I-edges**, realised as shared factors), and every use
of a value links the value's dims to the use's dims (**M-edges**, definition to use). Union-find over
all M-edges gives the equivalence classes: the **named dims**. Cutting an M-edge means resharding
that value at that use; it is how conflicts are resolved.

Worked example, `relu(x @ w1) @ w2` with x[B, D], w1[D, F], w2[F, O]:

* op 1 `dot_general(x, w1)` has factors b, d (reduction), f; op 3 `dot_general(h, w2)` has b', f'
  (reduction), o;
* M-edges link x.0~b, x.1~d, w1.0~d, w1.1~f, h.0~b', h.1~f', w2.0~f', w2.1~o (through relu);
* union-find yields 4 named dims: {x.0, h.0, y.0}, {x.1, w1.0}, {w1.1, h.1, w2.0}, {w2.1, y.1}.

**Refinement.** A reshape splits a dim into sub-factors (`[B, S, D] -> [B, S, H, Dh]`). When a use
splits a value dim differently from its definition, both are refined to the common ordered
factorization: the factor of the coarser side is split, and so is every factor in its class (they
are the same slice of data, so they split alike). When no common factorization exists (mixed-radix
strides do not nest), the M-edge is dropped and a *reshape* conflict is recorded. Refinement only
ever splits, so the analysis is linear in program size up to the (small) number of splits.

The atoms of the analysis are the leaf factors; a value's atoms are its producer's result factors
and a use's atoms are its consumer's operand factors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from toast_core.analysis.factors import refine
from toast_core.analysis.rules import factors_of
from toast_core.ir.program import Program


class MEdge(NamedTuple):
    """A definition-to-use link of one leaf factor: value `value` dim `dim` (sub-factor `sub`) is
    read by operand `position` of op `op`. Cutting it reshards the value at that use.

    A named tuple rather than a frozen dataclass: a program has several M-edges per equation, and
    a tuple is built several times faster (and its fields flatten straight into `medge_table`)."""

    id: int
    value: int
    op: int
    position: int
    dim: int
    sub: int
    value_atom: int
    use_atom: int


@dataclass(frozen=True, slots=True)
class NamedDim:
    """An equivalence class of atoms that must be sharded identically."""

    id: int
    size: int
    label: str
    atoms: tuple[int, ...]
    members: tuple[tuple[int, int, int], ...]  # (value id, dim, sub-factor) of value atoms
    bytes_covered: int
    has_reduction: bool
    reduction_ops: tuple[int, ...]  # ops where it is reduced (partial results if sharded)
    replication_ops: tuple[int, ...]
    is_persistent: bool  # holds a parameter or optimizer-state dim
    is_input: bool  # holds a dim of a data input

    @property
    def name(self) -> str:
        return f"N{self.id}"


class _FactorForest:
    """Global factors with union-find and class-wide splitting (the refinement step)."""

    def __init__(self) -> None:
        self.size: list[int] = []
        self.kind: list[str] = []
        self.owner: list[int] = []
        self.children: list[tuple[int, ...] | None] = []
        self.parent: list[int] = []
        self.weight: list[int] = []  # class size, valid at roots (union by size)
        self.next: list[int] = []  # circular list of each class's members: O(1) union

    def new(self, size: int, kind: str, owner: int) -> int:
        f = len(self.size)
        self.size.append(size)
        self.kind.append(kind)
        self.owner.append(owner)
        self.children.append(None)
        self.parent.append(f)
        self.weight.append(1)
        self.next.append(f)
        return f

    def new_many(self, sizes, kinds, owner: int) -> range:
        """Factors for one op at once (the hot path of the pass)."""
        base, n = len(self.size), len(sizes)
        ids = range(base, base + n)
        self.size.extend(sizes)
        self.kind.extend(kinds)
        self.owner.extend([owner] * n)
        self.children.extend([None] * n)
        self.parent.extend(ids)
        self.weight.extend([1] * n)
        self.next.extend(ids)
        return ids

    def find(self, f: int) -> int:
        parent = self.parent
        root = f
        while parent[root] != root:
            root = parent[root]
        while parent[f] != root:
            parent[f], f = root, parent[f]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.weight[ra] < self.weight[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.weight[ra] += self.weight[rb]
        self.next[ra], self.next[rb] = self.next[rb], self.next[ra]  # splice the two cycles

    def members(self, f: int) -> list[int]:
        out = [f]
        g = self.next[f]
        while g != f:
            out.append(g)
            g = self.next[g]
        return out

    def leaves(self, seq) -> tuple[int, ...]:
        """The leaf factors of a factor sequence, major to minor (a tuple: atoms are stored as
        built here, with no second copy)."""
        children = self.children
        for f in seq:
            if children[f] is not None:
                break
        else:  # no split factor: the common case
            return tuple(seq)
        out: list[int] = []
        stack = list(reversed(seq))
        while stack:
            f = stack.pop()
            kids = self.children[f]
            if kids is None:
                out.append(f)
            else:
                stack.extend(reversed(kids))
        return tuple(out)

    def split_class(self, f: int, major: int) -> None:
        """Splits every factor of f's class into (major, size // major) sub-factors."""
        minor = self.size[f] // major
        firsts, seconds = [], []
        for m in self.members(f):
            a = self.new(major, self.kind[m], self.owner[m])
            b = self.new(minor, self.kind[m], self.owner[m])
            self.children[m] = (a, b)
            firsts.append(a)
            seconds.append(b)
        for group in (firsts, seconds):
            for x in group[1:]:
                self.union(group[0], x)

    def align(self, seq_a, seq_b) -> bool:
        """Links two factorizations of one dim leaf by leaf, refining as needed. False if the
        factorizations have no common refinement (nothing is changed then)."""
        if len(seq_a) == 1 and len(seq_b) == 1:
            a, b = seq_a[0], seq_b[0]
            if (
                self.children[a] is None
                and self.children[b] is None
                and self.size[a] == self.size[b]
            ):
                self.union(a, b)
                return True
        while True:
            la, lb = self.leaves(seq_a), self.leaves(seq_b)
            if refine([self.size[f] for f in la], [self.size[f] for f in lb]) is None:
                return False
            i = j = 0
            restarted = False
            while i < len(la) and j < len(lb):
                sa, sb = self.size[la[i]], self.size[lb[j]]
                if sa == sb:
                    self.union(la[i], lb[j])
                    i += 1
                    j += 1
                    continue
                if sa > sb:
                    self.split_class(la[i], sb)
                else:
                    self.split_class(lb[j], sa)
                restarted = True
                break
            if not restarted:
                return True


@dataclass(frozen=True)
class NdaResult:
    """Raw output of the NDA pass (wrapped by `Analysis`)."""

    atom_size: np.ndarray
    atom_kind: tuple[str, ...]
    atom_owner: np.ndarray
    value_atoms: tuple[tuple[tuple[int, ...], ...], ...]  # value -> dim -> leaf atoms
    use_atoms: dict  # (op, position) -> dim -> leaf atoms
    op_atoms: tuple[tuple[int, ...], ...]  # op -> all its leaf atoms (each once)
    # [M-edge, 8] int64, one column per `MEdge` field (id, value, op, position, dim, sub,
    # value_atom, use_atom): the graph work is vectorized over columns of this table.
    medge_table: np.ndarray
    reshape_sites: tuple[tuple[int, int, int, int], ...]  # (value, op, position, dim)
    diagnostics: tuple[str, ...]
    fallback_ops: tuple[int, ...] = field(default=())

    @cached_property
    def medges(self) -> tuple[MEdge, ...]:
        """The M-edges as records, built from `medge_table` when first asked for."""
        return tuple(map(MEdge._make, self.medge_table.tolist()))


def run_nda(program: Program) -> NdaResult:
    """Builds atoms and M-edges for the whole program in one pass (see the module essay)."""
    forest = _FactorForest()
    value_dims: list[list[list[int]] | None] = [None] * len(program.values)
    use_dims: dict[tuple[int, int], list[list[int]]] = {}
    op_factors: list[range] = []
    diagnostics: list[str] = []
    fallback_ops: list[int] = []
    produced = {vid for op in program.ops for vid in op.results}
    for v in program.values:
        if v.id not in produced:
            value_dims[v.id] = [[forest.new(s, "pass", -1)] if s > 1 else [] for s in v.shape]
    unknown: dict[str, int] = {}
    rule_cache: dict = {}
    shape_of = [v.shape for v in program.values].__getitem__
    for op in program.ops:
        operand_shapes = tuple(map(shape_of, op.operands))
        result_shapes = tuple(map(shape_of, op.results))
        key = (op.primitive, op.params, operand_shapes, result_shapes)
        rule = rule_cache.get(key)
        if rule is None:
            rule = rule_cache[key] = factors_of(op, list(operand_shapes), list(result_shapes))
        if rule.is_fallback:
            fallback_ops.append(op.index)
            unknown[op.primitive] = unknown.get(op.primitive, 0) + 1
            if unknown[op.primitive] == 1:
                diagnostics.append(
                    f"unknown primitive `{op.primitive}` at {op.source or '?'}: no factor rule, so "
                    "no named dim crosses it (every dim is its own factor)"
                )
        ids = forest.new_many(rule.sizes, rule.kinds, op.index)
        op_factors.append(ids)
        for pos, dims in enumerate(rule.operands):
            use_dims[(op.index, pos)] = [[ids[f] for f in d] for d in dims]
        for vid, dims in zip(op.results, rule.results):
            value_dims[vid] = [[ids[f] for f in d] for d in dims]
    for prim, count in unknown.items():
        if count > 1:
            diagnostics.append(f"unknown primitive `{prim}` appears {count} times")

    links = _links(program, value_dims, use_dims)
    dirty = _dirty_links(links, forest.size)
    failed: set[tuple[int, int, int, int]] = set()
    align = forest.align
    for i in np.flatnonzero(dirty).tolist():
        vdim, udim = links.value_dims[i], links.use_dims[i]
        if not align(vdim, udim):
            failed.add(links.key(i))

    leaves = forest.leaves
    value_atoms = tuple(tuple(map(leaves, dims)) for dims in value_dims)  # type: ignore[arg-type]
    use_atoms = {key: tuple(map(leaves, dims)) for key, dims in use_dims.items()}
    # An op's factors are distinct, so are their leaves.
    op_atoms = tuple(map(leaves, op_factors))
    return NdaResult(
        atom_size=np.asarray(forest.size, dtype=np.int64),
        atom_kind=tuple(forest.kind),
        atom_owner=np.asarray(forest.owner, dtype=np.int64),
        value_atoms=value_atoms,
        use_atoms=use_atoms,
        op_atoms=op_atoms,
        medge_table=_medge_table(links, dirty, failed, value_atoms, use_atoms, forest.size),
        reshape_sites=tuple(sorted(failed)),
        diagnostics=tuple(diagnostics),
        fallback_ops=tuple(fallback_ops),
    )


@dataclass(frozen=True)
class _Links:
    """Every (use, dim) that links a value dim to an operand dim, in program order (op, operand
    position, dim), with both factor sequences as the op rules made them (before refinement)."""

    value: np.ndarray
    op: np.ndarray
    position: np.ndarray
    dim: np.ndarray
    value_dims: list
    use_dims: list

    def key(self, i: int) -> tuple[int, int, int, int]:
        return (int(self.value[i]), int(self.op[i]), int(self.position[i]), int(self.dim[i]))


def _links(program: Program, value_dims, use_dims) -> _Links:
    value, op, position, dim, vdims, udims = [], [], [], [], [], []
    for o in program.ops:
        opi = o.index
        for pos, vid in enumerate(o.operands):
            vd = value_dims[vid]
            ud = use_dims[(opi, pos)]
            for d in range(len(vd)):
                if vd[d] or ud[d]:
                    value.append(vid)
                    op.append(opi)
                    position.append(pos)
                    dim.append(d)
                    vdims.append(vd[d])
                    udims.append(ud[d])
    return _Links(
        np.asarray(value, dtype=np.int64),
        np.asarray(op, dtype=np.int64),
        np.asarray(position, dtype=np.int64),
        np.asarray(dim, dtype=np.int64),
        vdims,
        udims,
    )


def _dirty_links(links: _Links, size: list[int]) -> np.ndarray:
    """Which links need the sequential refinement pass, as a bool per link.

    Most links join one factor to one factor of the same size: a plain union that can never
    split anything. Refinement (class-wide splits) starts only at a link whose two factor
    sequences differ, and spreads only through links of the same connected component of the
    factor graph. So the links of components without such a link are skipped by the sequential
    pass (their M-edges are their factors, unchanged), and the others are replayed in program
    order, exactly as a pass over every link would do them: atom ids and reshape conflicts come
    out the same, at a fraction of the Python work."""
    n = len(links.value_dims)
    n_factors = len(size)
    first_v = [vd[0] if vd else -1 for vd in links.value_dims]
    first_u = [ud[0] if ud else -1 for ud in links.use_dims]
    is_plain = np.fromiter(
        (
            len(vd) == 1 and len(ud) == 1 and size[a] == size[b]
            for vd, ud, a, b in zip(links.value_dims, links.use_dims, first_v, first_u)
        ),
        dtype=bool,
        count=n,
    )
    a = np.asarray(first_v, dtype=np.int64)
    b = np.asarray(first_u, dtype=np.int64)
    rows, cols = [a[is_plain]], [b[is_plain]]
    special = np.flatnonzero(~is_plain).tolist()
    for i in special:
        members = links.value_dims[i] + links.use_dims[i]
        rows.append(np.full(len(members), members[0], dtype=np.int64))
        cols.append(np.asarray(members, dtype=np.int64))
    rows_all, cols_all = np.concatenate(rows), np.concatenate(cols)
    graph = sp.csr_matrix(
        (np.ones(len(rows_all), dtype=np.int8), (rows_all, cols_all)), shape=(n_factors, n_factors)
    )
    _, label = csgraph.connected_components(graph, directed=False)
    dirty_label = np.zeros(label.max(initial=-1) + 1, dtype=bool)
    for i in special:
        dirty_label[label[(links.value_dims[i] + links.use_dims[i])[0]]] = True
    anchor = np.where(a >= 0, a, b)
    return dirty_label[label[anchor]]


def _medge_table(links: _Links, dirty, failed, value_atoms, use_atoms, size) -> np.ndarray:
    """The M-edges of every link in program order: one per leaf pair of the refined dims (a
    plain link is one M-edge between its two factors, which no split ever touched)."""
    n = len(links.value)
    count = np.ones(n, dtype=np.int64)
    pairs: dict[int, list[tuple[int, int]]] = {}
    for i in np.flatnonzero(dirty).tolist():
        key = links.key(i)
        if failed and key in failed:
            count[i] = 0
            continue
        vid, opi, pos, d = key
        vleaves, uleaves = value_atoms[vid][d], use_atoms[(opi, pos)][d]
        assert len(vleaves) == len(uleaves), key
        found = list(zip(vleaves, uleaves))
        for x, y in found:
            assert size[x] == size[y]
        pairs[i] = found
        count[i] = len(found)
    start = np.cumsum(count) - count
    table = np.zeros((int(count.sum()), 8), dtype=np.int64)
    table[:, 0] = np.arange(len(table))
    owner = np.repeat(np.arange(n), count)
    table[:, 1] = links.value[owner]
    table[:, 2] = links.op[owner]
    table[:, 3] = links.position[owner]
    table[:, 4] = links.dim[owner]
    table[:, 5] = np.arange(len(table)) - start[owner]
    plain = ~dirty
    rows = start[plain]
    table[rows, 6] = [vd[0] for vd, p in zip(links.value_dims, plain) if p]
    table[rows, 7] = [ud[0] for ud, p in zip(links.use_dims, plain) if p]
    for i, found in pairs.items():
        table[start[i] : start[i] + len(found), 6:] = found
    return table


def components(n: int, edges: np.ndarray) -> np.ndarray:
    """Connected components of `n` nodes under `edges` ([E, 2]); labels are 0..k-1 in order of
    each component's first (smallest) node."""
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    graph = sp.csr_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    _, labels = csgraph.connected_components(graph, directed=False)
    return first_seen_order(labels)


def first_seen_order(labels: np.ndarray) -> np.ndarray:
    """Relabels to 0..k-1 in order of each label's first occurrence, so numbering follows the
    program rather than whatever order a graph routine happened to produce."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse]
