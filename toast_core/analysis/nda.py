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
from itertools import chain
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
    medges: tuple[MEdge, ...]
    reshape_sites: tuple[tuple[int, int, int, int], ...]  # (value, op, position, dim)
    diagnostics: tuple[str, ...]
    fallback_ops: tuple[int, ...] = field(default=())

    @cached_property
    def medge_table(self) -> np.ndarray:
        """[M-edge, 8] int64, one column per `MEdge` field (id, value, op, position, dim, sub,
        value_atom, use_atom): the graph work is vectorized over columns of this table."""
        flat = chain.from_iterable(self.medges)
        return np.fromiter(flat, dtype=np.int64, count=8 * len(self.medges)).reshape(-1, 8)


def run_nda(program: Program) -> NdaResult:
    """Builds atoms and M-edges for the whole program in one pass (see the module essay)."""
    forest = _FactorForest()
    value_dims: list[list[list[int]] | None] = [None] * len(program.values)
    use_dims: dict[tuple[int, int], list[list[int]]] = {}
    op_factors: list[list[int]] = []
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
                    "no named dim crosses it and it is priced pessimistically (every dim is its "
                    "own replicate factor: sharded operands are gathered, its work undivided)"
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

    failed: set[tuple[int, int, int, int]] = set()
    for op in program.ops:
        for pos, vid in enumerate(op.operands):
            udims = use_dims[(op.index, pos)]
            for d, vdim in enumerate(value_dims[vid]):
                if (vdim or udims[d]) and not forest.align(vdim, udims[d]):
                    failed.add((vid, op.index, pos, d))

    leaves = forest.leaves
    value_atoms = tuple(tuple(map(leaves, dims)) for dims in value_dims)  # type: ignore[arg-type]
    use_atoms = {key: tuple(map(leaves, dims)) for key, dims in use_dims.items()}
    # An op's factors are distinct, so are their leaves.
    op_atoms = tuple(map(leaves, op_factors))
    medges: list[MEdge] = []
    size = forest.size
    for op in program.ops:
        opi = op.index
        for pos, vid in enumerate(op.operands):
            for d, (vleaves, uleaves) in enumerate(zip(value_atoms[vid], use_atoms[(opi, pos)])):
                if failed and (vid, opi, pos, d) in failed:
                    continue
                if not vleaves or not uleaves:
                    continue  # a dim a rule left unshardable (no factors): nothing to link
                assert len(vleaves) == len(uleaves), (vid, opi, pos, d)
                for sub, (a, b) in enumerate(zip(vleaves, uleaves)):
                    assert size[a] == size[b]
                    medges.append(MEdge(len(medges), vid, opi, pos, d, sub, a, b))
    return NdaResult(
        atom_size=np.asarray(forest.size, dtype=np.int64),
        atom_kind=tuple(forest.kind),
        atom_owner=np.asarray(forest.owner, dtype=np.int64),
        value_atoms=value_atoms,
        use_atoms=use_atoms,
        op_atoms=op_atoms,
        medges=tuple(medges),
        reshape_sites=tuple(sorted(failed)),
        diagnostics=tuple(diagnostics),
        fallback_ops=tuple(fallback_ops),
    )


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
