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
from operator import attrgetter
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
        self.split: list[int] = []  # the factors `split_class` gave children, in order

    @classmethod
    def from_arrays(cls, size: np.ndarray, kind: list[str], owner: np.ndarray) -> _FactorForest:
        """A forest of unlinked factors, as `new` would make them one by one."""
        forest = cls()
        n = len(size)
        forest.size = size.tolist()
        forest.kind = list(kind)
        forest.owner = owner.tolist()
        forest.children = [None] * n
        forest.parent = list(range(n))
        forest.weight = [1] * n
        forest.next = list(range(n))
        return forest

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
        parent = self.parent
        ra = parent[a]
        if parent[ra] != ra:
            ra = self.find(a)
        rb = parent[b]
        if parent[rb] != rb:
            rb = self.find(b)
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
        """Splits every factor of f's class into (major, size // major) sub-factors (`new`
        inlined: most classes split here are single factors, and this runs per refinement)."""
        size, kind, owner, children = self.size, self.kind, self.owner, self.children
        minor = size[f] // major
        firsts, seconds = [], []
        for m in self.members(f):
            a = len(size)
            k, o = kind[m], owner[m]
            size += (major, minor)
            kind += (k, k)
            owner += (o, o)
            children += (None, None)
            self.parent += (a, a + 1)
            self.weight += (1, 1)
            self.next += (a, a + 1)
            children[m] = (a, a + 1)
            self.split.append(m)
            firsts.append(a)
            seconds.append(a + 1)
        for group in (firsts, seconds):
            for x in group[1:]:
                self.union(group[0], x)

    def align(self, seq_a, seq_b) -> bool:
        """Links two factorizations of one dim leaf by leaf, refining as needed. False if the
        factorizations have no common refinement (nothing is changed then)."""
        size, children = self.size, self.children
        if len(seq_a) == 1 and len(seq_b) == 1:
            a, b = seq_a[0], seq_b[0]
            if children[a] is None and children[b] is None and size[a] == size[b]:
                self.union(a, b)
                return True
        while True:
            la, lb = self.leaves(seq_a), self.leaves(seq_b)
            sizes_a, sizes_b = [size[f] for f in la], [size[f] for f in lb]
            if sizes_a == sizes_b:  # leaves already line up: no refinement to check or make
                for x, y in zip(la, lb):
                    self.union(x, y)
                return True
            if refine(sizes_a, sizes_b) is None:
                return False
            i = j = 0
            restarted = False
            while i < len(la) and j < len(lb):
                sa, sb = sizes_a[i], sizes_b[j]
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
    """Raw output of the NDA pass (wrapped by `Analysis`).

    Atoms are kept as flat tables (numpy, one row per leaf atom in value / use / op order) with
    offsets; the nested views (`value_atoms`, `use_atoms`, `op_atoms`, `medges`) are built from
    them when first asked for."""

    atom_size: np.ndarray
    atom_kind: tuple[str, ...]
    atom_owner: np.ndarray
    # Value atoms, [k, 4] (value, dim, sub-factor, atom) in that order; the atoms of value v dim
    # d are rows value_dim_atoms[value_dims[v] + d] : value_dim_atoms[value_dims[v] + d + 1].
    value_slots: np.ndarray
    value_dims: np.ndarray  # [values + 1] first dim entry of each value
    value_dim_atoms: np.ndarray  # [value dims + 1] first row of each dim entry
    # Uses (operand `position` of `op`, in op order) and their atoms, laid out the same way.
    use_op: np.ndarray
    use_position: np.ndarray
    use_value: np.ndarray  # the value each use reads
    use_dims: np.ndarray  # [uses + 1]
    use_dim_atoms: np.ndarray  # [use dims + 1]
    use_atom: np.ndarray  # [k] atoms of every use dim, in order
    op_atom_start: np.ndarray  # [ops + 1]
    op_atom: np.ndarray  # [k] every op's leaf atoms (each once), in op order
    # [M-edge, 8] int64, one column per `MEdge` field (id, value, op, position, dim, sub,
    # value_atom, use_atom): the graph work is vectorized over columns of this table.
    medge_table: np.ndarray
    reshape_sites: tuple[tuple[int, int, int, int], ...]  # (value, op, position, dim)
    diagnostics: tuple[str, ...]
    fallback_ops: tuple[int, ...] = field(default=())
    # op -> its rule (one number per distinct primitive, params, operand and result shapes)
    op_rule: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # The values each op defines, in op order: op k's are result_value[result_start[k] :
    # result_start[k + 1]] (with `use_*`, the def-use graph as arrays, for `layers.py`).
    result_value: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    result_start: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))

    def value_dim(self, value: int, dim: int) -> tuple[int, ...]:
        """The leaf atoms of one value dim, major to minor."""
        e = int(self.value_dims[value]) + dim
        lo, hi = int(self.value_dim_atoms[e]), int(self.value_dim_atoms[e + 1])
        return tuple(self.value_slots[lo:hi, 3].tolist())

    def value_rank(self, value: int) -> int:
        return int(self.value_dims[value + 1] - self.value_dims[value])

    def use_dim(self, op: int, position: int, dim: int) -> tuple[int, ...]:
        """The leaf atoms of one dim of one use (operand `position` of `op`)."""
        u = int(self._use_index[(op, position)])
        e = int(self.use_dims[u]) + dim
        lo, hi = int(self.use_dim_atoms[e]), int(self.use_dim_atoms[e + 1])
        return tuple(self.use_atom[lo:hi].tolist())

    @cached_property
    def _use_index(self) -> dict[tuple[int, int], int]:
        return {k: i for i, k in enumerate(zip(self.use_op.tolist(), self.use_position.tolist()))}

    @cached_property
    def value_atoms(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Value -> dim -> leaf atoms."""
        dims = _split(self.value_slots[:, 3].tolist(), self.value_dim_atoms)
        return tuple(_split(dims, self.value_dims))

    @cached_property
    def use_atoms(self) -> dict:
        """(op, position) -> dim -> leaf atoms."""
        dims = _split(self.use_atom.tolist(), self.use_dim_atoms)
        keys = zip(self.use_op.tolist(), self.use_position.tolist())
        return dict(zip(keys, _split(dims, self.use_dims)))

    @cached_property
    def op_atoms(self) -> tuple[tuple[int, ...], ...]:
        """Op -> all its leaf atoms (each once)."""
        return tuple(_split(self.op_atom.tolist(), self.op_atom_start))

    @cached_property
    def medges(self) -> tuple[MEdge, ...]:
        """The M-edges as records, built from `medge_table` when first asked for."""
        return tuple(map(MEdge._make, self.medge_table.tolist()))


def _split(items: list, starts: np.ndarray) -> list[tuple]:
    """`items` cut into tuples at `starts` ([n + 1] offsets)."""
    bounds = starts.tolist()
    return [tuple(items[a:b]) for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class _Template:
    """One op rule flattened for gathering: every op with the same rule reuses it."""

    sizes: tuple[int, ...]
    kinds: tuple[str, ...]
    use_dims: tuple[tuple[int, int, int], ...]  # (position, dim, factors) per operand dim
    use_factors: tuple[int, ...]  # local factor ids, in (position, dim, sub) order
    result_dims: tuple[tuple[int, int, int], ...]  # (result, dim, factors) per result dim
    result_factors: tuple[int, ...]
    n_operands: int
    is_fallback: bool

    @classmethod
    def of(cls, rule) -> _Template:
        def flat(groups):
            dims = tuple((i, d, len(fs)) for i, g in enumerate(groups) for d, fs in enumerate(g))
            return dims, tuple(f for g in groups for fs in g for f in fs)

        use_dims, use_factors = flat(rule.operands)
        result_dims, result_factors = flat(rule.results)
        return cls(
            rule.sizes,
            rule.kinds,
            use_dims,
            use_factors,
            result_dims,
            result_factors,
            len(rule.operands),
            rule.is_fallback,
        )


def _gather(per_op: np.ndarray, lens: np.ndarray, starts: np.ndarray):
    """(owner op, row in the concatenated template table) of each entry when every op takes its
    template's rows `starts[t] : starts[t] + lens[t]`."""
    n = lens[per_op]
    owner = np.repeat(np.arange(len(per_op)), n)
    row = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(starts[per_op], n)
    return owner, row


def _table(templates: list[_Template], attr: str, width: int):
    rows = [getattr(t, attr) for t in templates]
    lens = np.array([len(r) for r in rows], dtype=np.int64)
    flat = np.array([x for r in rows for x in r], dtype=np.int64).reshape(-1, width)
    if width == 1:
        flat = flat[:, 0]
    return flat, lens, np.cumsum(lens) - lens


def _ranges(start: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, index) of every element of the ranges `start[i] : start[i] + count[i]`."""
    owner = np.repeat(np.arange(len(count)), count)
    index = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return owner, index + start[owner]


def _offsets(count: np.ndarray) -> np.ndarray:
    out = np.zeros(len(count) + 1, dtype=np.int64)
    np.cumsum(count, out=out[1:])
    return out


def run_nda(program: Program) -> NdaResult:
    """Builds atoms and M-edges for the whole program (see the module essay).

    Vectorized: each op's factors come from its rule's template (gathered for all ops at once),
    the links that need no refinement (most of them) become M-edges directly, and only the
    factor components that a reshape refines are replayed link by link through `_FactorForest`,
    in program order, so atom ids are exactly those of a link-by-link pass."""
    values, ops = program.values, program.ops
    n_values, n_ops = len(values), len(ops)
    shape_of = [v.shape for v in values].__getitem__
    operands = list(map(attrgetter("operands"), ops))
    results = list(map(attrgetter("results"), ops))
    templates: list[_Template] = []
    index: dict = {}
    template_of_op = []
    for op, op_operands, op_results in zip(ops, operands, results):
        key = (
            op.primitive,
            op.params,
            tuple(map(shape_of, op_operands)),
            tuple(map(shape_of, op_results)),
        )
        t = index.get(key)
        if t is None:
            rule = factors_of(op, list(key[2]), list(key[3]))
            t = index[key] = len(templates)
            templates.append(_Template.of(rule))
        template_of_op.append(t)
    op_template = np.array(template_of_op, dtype=np.int64).reshape(n_ops)
    diagnostics, fallback_ops = _fallback_diagnostics(ops, templates, op_template)

    # Operands and results of every op, flattened.
    n_operands = np.fromiter(map(len, operands), dtype=np.int64, count=n_ops)
    operand_value = np.fromiter(chain.from_iterable(operands), dtype=np.int64)
    operand_start = np.cumsum(n_operands) - n_operands
    n_results = np.fromiter(map(len, results), dtype=np.int64, count=n_ops)
    result_value = np.fromiter(chain.from_iterable(results), dtype=np.int64)
    result_start = np.cumsum(n_results) - n_results

    # Factors: inputs' first (one per dim of size > 1, in value order), then each op's.
    is_input = np.ones(n_values, dtype=bool)
    is_input[result_value] = False
    input_dims = [(v.id, d, s) for v in values if is_input[v.id] for d, s in enumerate(v.shape)]
    in_value = np.array([x[0] for x in input_dims], dtype=np.int64)
    in_dim = np.array([x[1] for x in input_dims], dtype=np.int64)
    in_size = np.array([x[2] for x in input_dims], dtype=np.int64)
    in_count = (in_size > 1).astype(np.int64)
    n_in = int(in_count.sum())
    in_factor = np.arange(n_in, dtype=np.int64)

    t_sizes, t_size_lens, t_size_starts = _table(templates, "sizes", 1)
    owner, row = _gather(op_template, t_size_lens, t_size_starts)
    n_factors_of_op = t_size_lens[op_template]
    base = n_in + np.cumsum(n_factors_of_op) - n_factors_of_op
    size = np.concatenate([in_size[in_count > 0], t_sizes[row]]).astype(np.int64)
    kinds = ["pass"] * n_in
    kinds.extend(chain.from_iterable(templates[t].kinds for t in op_template.tolist()))
    factor_owner = np.concatenate([np.full(n_in, -1, dtype=np.int64), owner])

    # Use dims and their factors, in (op, position, dim, sub) order.
    t_ud, t_ud_lens, t_ud_starts = _table(templates, "use_dims", 3)
    ud_op, row = _gather(op_template, t_ud_lens, t_ud_starts)
    ud_pos, ud_dim, ud_count = t_ud[row, 0], t_ud[row, 1], t_ud[row, 2]
    t_uf, t_uf_lens, t_uf_starts = _table(templates, "use_factors", 1)
    uf_op, row = _gather(op_template, t_uf_lens, t_uf_starts)
    use_factor = t_uf[row] + base[uf_op]
    ud_start = np.cumsum(ud_count) - ud_count

    # Value dims: inputs' and results', sorted by (value, dim).
    t_rd, t_rd_lens, t_rd_starts = _table(templates, "result_dims", 3)
    rd_op, row = _gather(op_template, t_rd_lens, t_rd_starts)
    rd_value = result_value[result_start[rd_op] + t_rd[row, 0]]
    rd_dim, rd_count = t_rd[row, 1], t_rd[row, 2]
    t_rf, t_rf_lens, t_rf_starts = _table(templates, "result_factors", 1)
    rf_op, row = _gather(op_template, t_rf_lens, t_rf_starts)
    result_factor = t_rf[row] + base[rf_op]
    pool = np.concatenate([in_factor, result_factor])
    vd_value = np.concatenate([in_value, rd_value])
    vd_dim = np.concatenate([in_dim, rd_dim])
    vd_count = np.concatenate([in_count, rd_count])
    pool_start = np.concatenate(
        [np.cumsum(in_count) - in_count, n_in + np.cumsum(rd_count) - rd_count]
    )
    order = np.lexsort((vd_dim, vd_value))
    vd_value, vd_dim, vd_count = vd_value[order], vd_dim[order], vd_count[order]
    _, pick = _ranges(pool_start[order], vd_count)
    value_factor = pool[pick]
    vd_start = np.cumsum(vd_count) - vd_count
    value_dims = _offsets(np.bincount(vd_value, minlength=n_values))

    # Links: every use dim with a factor on either side, in program order.
    ud_value = operand_value[operand_start[ud_op] + ud_pos]
    ud_vd = value_dims[ud_value] + ud_dim
    is_link = (vd_count[ud_vd] > 0) | (ud_count > 0)
    links = _Links(
        ud_value[is_link],
        ud_op[is_link],
        ud_pos[is_link],
        ud_dim[is_link],
        vd_start[ud_vd[is_link]],
        vd_count[ud_vd[is_link]],
        ud_start[is_link],
        ud_count[is_link],
    )
    plain = (links.v_count == 1) & (links.u_count == 1)
    # First factor of each side (-1 past the end when a side has none: never read then).
    first_v = np.append(value_factor, -1)[links.v_start]
    first_u = np.append(use_factor, -1)[links.u_start]
    plain &= size[first_v] == size[first_u]
    dirty = _dirty_links(links, plain, first_v, first_u, value_factor, use_factor, len(size))

    forest = _FactorForest.from_arrays(size, kinds, factor_owner)
    failed: set[tuple[int, int, int, int]] = set()
    value_list, use_list = value_factor.tolist(), use_factor.tolist()
    align, union, children, factor_size = forest.align, forest.union, forest.children, forest.size
    replay = np.flatnonzero(dirty)
    for i, a, na, b, nb in zip(
        replay.tolist(),
        links.v_start[replay].tolist(),
        links.v_count[replay].tolist(),
        links.u_start[replay].tolist(),
        links.u_count[replay].tolist(),
    ):
        if na == 1 and nb == 1:  # `align`'s first case, inlined: most replayed links are plain
            fa, fb = value_list[a], use_list[b]
            if children[fa] is None and children[fb] is None and factor_size[fa] == factor_size[fb]:
                union(fa, fb)
                continue
        if not align(value_list[a : a + na], use_list[b : b + nb]):
            failed.add(links.key(i))

    # Leaf atoms of every slot (a factor split by refinement becomes its leaves).
    n_initial = len(size)
    leaves_of = {f: forest.leaves((f,)) for f in sorted(forest.split) if f < n_initial}
    v_atom, v_dim_count = _expand(value_factor, _owner_of(vd_count), len(vd_count), leaves_of)
    u_atom, u_dim_count = _expand(use_factor, _owner_of(ud_count), len(ud_count), leaves_of)
    op_factor = np.arange(n_in, n_initial, dtype=np.int64)
    o_atom, o_count = _expand(op_factor, factor_owner[n_in:], n_ops, leaves_of)
    value_dim_atoms = _offsets(v_dim_count)
    use_dim_atoms = _offsets(u_dim_count)
    v_entry = _owner_of(v_dim_count)
    value_slots = np.stack(
        [
            vd_value[v_entry],
            vd_dim[v_entry],
            np.arange(len(v_atom)) - value_dim_atoms[v_entry],
            v_atom,
        ],
        axis=1,
    )
    n_uses = len(operand_value)
    use_op = np.repeat(np.arange(n_ops), n_operands)
    use_position = np.arange(n_uses) - np.repeat(operand_start, n_operands)
    use_index = operand_start[ud_op] + ud_pos
    use_dims = _offsets(np.bincount(use_index, minlength=n_uses))

    # Refinement only appends factors: the first `n_initial` are the arrays the forest began with.
    atom_size = np.concatenate([size, np.array(forest.size[n_initial:], dtype=np.int64)])
    atom_owner = np.concatenate([factor_owner, np.array(forest.owner[n_initial:], dtype=np.int64)])
    table = _medge_table(
        links,
        failed,
        value_dim_atoms,
        ud_vd[is_link],
        use_dim_atoms,
        np.flatnonzero(is_link),
        v_atom,
        u_atom,
        atom_size,
    )
    return NdaResult(
        atom_size=atom_size,
        atom_kind=tuple(forest.kind),
        atom_owner=atom_owner,
        value_slots=value_slots.astype(np.int64).reshape(-1, 4),
        value_dims=value_dims,
        value_dim_atoms=value_dim_atoms,
        use_op=use_op,
        use_position=use_position,
        use_value=operand_value,
        use_dims=use_dims,
        use_dim_atoms=use_dim_atoms,
        use_atom=u_atom,
        op_atom_start=_offsets(o_count),
        op_atom=o_atom,
        medge_table=table,
        reshape_sites=tuple(sorted(failed)),
        diagnostics=tuple(diagnostics),
        fallback_ops=tuple(fallback_ops),
        op_rule=op_template,
        result_value=result_value,
        result_start=_offsets(n_results),
    )


def _owner_of(count: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(count)), count)


def _expand(factor: np.ndarray, owner: np.ndarray, n_owners: int, leaves_of: dict):
    """(atoms, atoms per owner): each factor replaced by its leaves (itself if never split)."""
    if not leaves_of:
        return factor.astype(np.int64), np.bincount(owner, minlength=n_owners)
    split = np.zeros(max(leaves_of) + 1, dtype=bool)
    split[list(leaves_of)] = True
    is_split = split[np.minimum(factor, len(split) - 1)] & (factor < len(split))
    count = np.ones(len(factor), dtype=np.int64)
    where = np.flatnonzero(is_split)
    found = [leaves_of[f] for f in factor[where].tolist()]
    count[where] = [len(x) for x in found]
    start = np.cumsum(count) - count
    atoms = np.repeat(factor, count)
    _, rows = _ranges(start[where], count[where])
    atoms[rows] = np.fromiter(chain.from_iterable(found), dtype=np.int64, count=len(rows))
    return atoms, np.bincount(owner, weights=count, minlength=n_owners).astype(np.int64)


def _fallback_diagnostics(ops, templates, op_template):
    diagnostics: list[str] = []
    fallback_ops: list[int] = []
    unknown: dict[str, int] = {}
    is_fallback = np.array([t.is_fallback for t in templates], dtype=bool)
    for k in np.flatnonzero(is_fallback[op_template]).tolist():
        op = ops[k]
        fallback_ops.append(op.index)
        unknown[op.primitive] = unknown.get(op.primitive, 0) + 1
        if unknown[op.primitive] == 1:
            diagnostics.append(
                f"unknown primitive `{op.primitive}` at {op.source or '?'}: no factor rule, so "
                "no named dim crosses it and it is priced pessimistically (every dim is its "
                "own replicate factor: sharded operands are gathered, its work undivided)"
            )
    for prim, count in unknown.items():
        if count > 1:
            diagnostics.append(f"unknown primitive `{prim}` appears {count} times")
    return diagnostics, fallback_ops


@dataclass(frozen=True)
class _Links:
    """Every (use, dim) that links a value dim to an operand dim, in program order (op, operand
    position, dim), with the slot ranges of both factor sequences as the op rules made them
    (before refinement)."""

    value: np.ndarray
    op: np.ndarray
    position: np.ndarray
    dim: np.ndarray
    v_start: np.ndarray
    v_count: np.ndarray
    u_start: np.ndarray
    u_count: np.ndarray

    def key(self, i: int) -> tuple[int, int, int, int]:
        return (int(self.value[i]), int(self.op[i]), int(self.position[i]), int(self.dim[i]))


def _dirty_links(links: _Links, plain, first_v, first_u, value_factor, use_factor, n_factors):
    """Which links need the sequential refinement pass, as a bool per link.

    Most links join one factor to one factor of the same size: a plain union that can never
    split anything. Refinement (class-wide splits) starts only at a link whose two factor
    sequences differ, and spreads only through links of the same connected component of the
    factor graph. So the links of components without such a link are skipped by the sequential
    pass (their M-edges are their factors, unchanged), and the others are replayed in program
    order, exactly as a pass over every link would do them: atom ids and reshape conflicts come
    out the same, at a fraction of the Python work."""
    special = np.flatnonzero(~plain)
    v_owner, v_slot = _ranges(links.v_start[special], links.v_count[special])
    u_owner, u_slot = _ranges(links.u_start[special], links.u_count[special])
    anchor = np.where(links.v_count[special] > 0, first_v[special], first_u[special])
    rows = np.concatenate([first_v[plain], anchor[v_owner], anchor[u_owner]])
    cols = np.concatenate([first_u[plain], value_factor[v_slot], use_factor[u_slot]])
    graph = sp.csr_matrix(
        (np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n_factors, n_factors)
    )
    _, label = csgraph.connected_components(graph, directed=False)
    dirty_label = np.zeros(int(label.max(initial=-1)) + 1, dtype=bool)
    dirty_label[label[anchor]] = True
    return dirty_label[label[np.where(links.v_count > 0, first_v, first_u)]]


def _medge_table(
    links, failed, value_dim_atoms, link_vd, use_dim_atoms, link_ud, v_atom, u_atom, size
):
    """The M-edges of every link that did not fail, in program order: one per leaf pair of
    the refined value dim and use dim."""
    keep = np.ones(len(links.value), dtype=bool)
    if failed:
        keys = list(
            zip(
                links.value.tolist(), links.op.tolist(), links.position.tolist(), links.dim.tolist()
            )
        )
        keep = np.array([k not in failed for k in keys], dtype=bool)
    v_lo, v_n = value_dim_atoms[link_vd], np.diff(value_dim_atoms)[link_vd]
    u_lo, u_n = use_dim_atoms[link_ud], np.diff(use_dim_atoms)[link_ud]
    keep &= (v_n > 0) & (u_n > 0)  # a dim a rule left unshardable (no factors): nothing to link
    assert (v_n[keep] == u_n[keep]).all(), "a link's refined dims differ in length"
    count = np.where(keep, v_n, 0)
    owner, v_rows = _ranges(v_lo, count)
    _, u_rows = _ranges(u_lo, count)
    table = np.empty((len(owner), 8), dtype=np.int64)
    table[:, 0] = np.arange(len(owner))
    table[:, 1] = links.value[owner]
    table[:, 2] = links.op[owner]
    table[:, 3] = links.position[owner]
    table[:, 4] = links.dim[owner]
    table[:, 5] = v_rows - v_lo[owner]
    table[:, 6] = v_atom[v_rows]
    table[:, 7] = u_atom[u_rows]
    assert (size[table[:, 6]] == size[table[:, 7]]).all(), "an M-edge joins atoms of two sizes"
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
