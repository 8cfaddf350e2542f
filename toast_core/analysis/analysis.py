"""`analyze(program)`: named dims, conflicts with options, co-occurrence, decision groups.

This assembles the NDA pass (`nda.py`) and the conflict finder (`conflicts.py`) into one frozen
`Analysis`, the object the cost model, the search, the explorer and the CLI all read.

Decision groups: named dims (and conflicts) that repeat across identical layers share a structural
signature (`layers.py`: the same ops, shapes and roles around them, whatever the layers are
named), so a 96-layer model offers one decision per kind of dim, not 96.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from toast_core.analysis.arrays import unique
from toast_core.analysis.conflicts import (
    ClassGraph,
    Conflict,
    ConflictOption,
    Site,
    cut_options_many,
    describe_cut,
    edge_to_forbid,
    links_sides,
    nearest_cuts,
    ranked,
)
from toast_core.analysis.layers import layer_groups, value_signatures
from toast_core.analysis.nda import (
    MEdge,
    NamedDim,
    NdaResult,
    components,
    first_seen_order,
    run_nda,
)
from toast_core.analysis.value_facts import value_facts
from toast_core.errors import ToastError, bad_value
from toast_core.gcpause import gc_paused
from toast_core.ir.program import Program

_ROLE_RANK = {
    "input": 0,
    "parameter": 1,
    "state": 2,
    "constant": 4,
    "literal": 5,
    "intermediate": 3,
}
_PERSISTENT = {"parameter": 1, "state": 1}


@dataclass(frozen=True, eq=False)
class Analysis:
    """The result of Named Dimension Analysis on one program."""

    program: Program
    named_dims: tuple[NamedDim, ...]
    conflicts: tuple[Conflict, ...]
    diagnostics: tuple[str, ...]
    nda: NdaResult = field(repr=False)
    atom_dim: np.ndarray = field(repr=False)  # atom -> named dim id (-1: not a leaf atom)
    cooccurrence: frozenset[tuple[int, int]] = field(repr=False)
    dim_groups: tuple[tuple[int, ...], ...] = ()
    conflict_groups: tuple[tuple[int, ...], ...] = ()
    # [rounds + 1, values] structural labels (`layers.value_signatures`): the groups above and
    # the search's fine-class groups are both built from them, computed once.
    value_signatures: np.ndarray = field(default=None, repr=False)

    # -- lookups ------------------------------------------------------------------------------

    def named_dim(self, key: int | str) -> NamedDim:
        """By id (3), name ("N3") or label prefix ("1024 (tokens.1)")."""
        if isinstance(key, int | np.integer) and 0 <= int(key) < len(self.named_dims):
            return self.named_dims[int(key)]
        if isinstance(key, str):
            if re.fullmatch(r"N\d+", key) and int(key[1:]) < len(self.named_dims):
                return self.named_dims[int(key[1:])]
            for nd in self.named_dims:
                if nd.label == key:
                    return nd
        raise ToastError(
            bad_value("named_dim", key, f"a named dim id N0..N{len(self.named_dims) - 1}")
        )

    def conflict(self, key: int | str) -> Conflict:
        if isinstance(key, str) and re.fullmatch(r"K\d+", key):
            key = int(key[1:])
        if isinstance(key, int) and 0 <= key < len(self.conflicts):
            return self.conflicts[key]
        raise ToastError(
            bad_value("conflict", key, f"a conflict id K0..K{len(self.conflicts) - 1}")
        )

    def value_named_dims(self, value_id: int) -> tuple[tuple[int, ...], ...]:
        """Named dim ids of each dim of a value (major to minor sub-factors)."""
        return tuple(
            tuple(int(self.atom_dim[a]) for a in atoms) for atoms in self.nda.value_atoms[value_id]
        )

    @property
    def medges(self) -> tuple[MEdge, ...]:
        return self.nda.medges

    @property
    def n_tensor_dims(self) -> int:
        return self.program.n_tensor_dims

    @cached_property
    def group_of_dim(self) -> dict[int, tuple[int, ...]]:
        return {d: g for g in self.dim_groups for d in g}

    @cached_property
    def group_of_conflict(self) -> dict[int, tuple[int, ...]]:
        return {c: g for g in self.conflict_groups for c in g}

    # -- fine classes: the finest partition any choice of options can reach ------------------

    @cached_property
    def candidate_edges(self) -> np.ndarray:
        """Ids of the M-edges that some conflict option may cut."""
        ids = sorted({e for c in self.conflicts for o in c.options for e in o.cuts})
        return np.asarray(ids, dtype=np.int64)

    @cached_property
    def fine_of_atom(self) -> np.ndarray:
        """Atom -> fine class (components without any candidate edge); -1 for non-leaf atoms.

        Every strategy's named dims are unions of fine classes, so the cost model works on fine
        classes once and for all.
        """
        keep = np.ones(len(self.nda.medge_table), dtype=bool)
        keep[self.candidate_edges] = False
        labels = components(len(self.atom_dim), self.medge_ends[keep])
        out = np.full(len(self.atom_dim), -1, dtype=np.int64)
        leaf = self.atom_dim >= 0
        _, dense = np.unique(labels[leaf], return_inverse=True)
        out[leaf] = dense
        return out

    @cached_property
    def medge_ends(self) -> np.ndarray:
        """[M-edge, 2]: value atom and use atom of every M-edge."""
        return self.nda.medge_table[:, 6:]

    @cached_property
    def n_fine(self) -> int:
        return int(self.fine_of_atom.max()) + 1 if len(self.fine_of_atom) else 0

    @cached_property
    def fine_dim(self) -> np.ndarray:
        """Fine class -> the named dim containing it."""
        out = np.zeros(self.n_fine, dtype=np.int64)
        leaf = self.atom_dim >= 0
        out[self.fine_of_atom[leaf]] = self.atom_dim[leaf]
        return out

    @cached_property
    def fine_size(self) -> np.ndarray:
        out = np.zeros(self.n_fine, dtype=np.int64)
        leaf = self.atom_dim >= 0
        out[self.fine_of_atom[leaf]] = self.nda.atom_size[leaf]
        return out

    def summary(self) -> dict:
        kinds = defaultdict(int)
        for c in self.conflicts:
            kinds[c.kind] += 1
        return {
            "program": self.program.name,
            "ops": len(self.program.ops),
            "values": len(self.program.values),
            "tensor_dims": self.n_tensor_dims,
            "named_dims": len(self.named_dims),
            "dim_groups": len(self.dim_groups),
            "conflicts": len(self.conflicts),
            "conflict_groups": len(self.conflict_groups),
            "conflicts_by_kind": dict(kinds),
            "diagnostics": len(self.diagnostics),
        }


def analyze(program: Program) -> Analysis:
    """Runs Named Dimension Analysis and finds conflicts with their resolution options."""
    if not isinstance(program, Program):
        raise ToastError(bad_value("program", type(program).__name__, "a Program from tc.trace"))
    with gc_paused():
        return _analyze(program)


def _analyze(program: Program) -> Analysis:
    nda = run_nda(program)
    slots = _slots(nda)
    atom_dim, n_dims = _atom_dims(nda, slots)
    facts = value_facts(program)
    named = _named_dims(program, nda, slots, atom_dim, n_dims, facts)
    cooc = _cooccurrence(slots, atom_dim, n_dims, len(program.values))
    conflicts = _find_conflicts(program, nda, slots, atom_dim, named, cooc, facts)
    value_sig = value_signatures(program, nda, facts)
    dim_groups, conflict_groups = layer_groups(
        value_sig, slots.value, slots.dim, slots.sub, atom_dim[slots.atom], named, conflicts
    )
    diagnostics = tuple(program.diagnostics) + nda.diagnostics
    return Analysis(
        program,
        named,
        conflicts,
        diagnostics,
        nda,
        atom_dim,
        cooc,
        dim_groups,
        conflict_groups,
        value_sig,
    )


@dataclass(frozen=True)
class _Slots:
    """The leaf atoms of every value (in value, dim, sub-factor order) and of every op, flattened
    into parallel arrays, so that per-atom bookkeeping over a whole program runs in numpy rather
    than in nested Python loops over every atom."""

    value: np.ndarray  # value-atom entry -> value id
    dim: np.ndarray  # -> dim of that value
    sub: np.ndarray  # -> sub-factor within the dim
    atom: np.ndarray  # -> atom
    op: np.ndarray  # op-atom entry -> op index
    op_atom: np.ndarray  # -> atom


def _slots(nda: NdaResult) -> _Slots:
    n_ops = len(nda.op_atom_start) - 1
    op = np.repeat(np.arange(n_ops, dtype=np.int64), np.diff(nda.op_atom_start))
    table = nda.value_slots
    return _Slots(table[:, 0], table[:, 1], table[:, 2], table[:, 3], op, nda.op_atom)


def _group_by(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds): the entries with key k are `order[bounds[k]:bounds[k + 1]]`, in their
    original order."""
    order = np.argsort(keys, kind="stable")
    return order, np.searchsorted(keys[order], np.arange(n + 1))


def _atom_dims(nda: NdaResult, slots: _Slots) -> tuple[np.ndarray, int]:
    """Atom -> named dim id (-1 for atoms split into sub-factors), and the number of named dims.
    Named dims are the M-edge components of leaf atoms, numbered in order of their first atom."""
    n_atoms = len(nda.atom_size)
    labels = components(n_atoms, nda.medge_table[:, 6:])
    is_leaf = np.zeros(n_atoms, dtype=bool)
    is_leaf[slots.atom] = True
    is_leaf[slots.op_atom] = True
    leaves = np.flatnonzero(is_leaf)
    atom_dim = np.full(n_atoms, -1, dtype=np.int64)
    atom_dim[leaves] = first_seen_order(labels[leaves])
    return atom_dim, int(atom_dim.max(initial=-1)) + 1


def _named_dims(program: Program, nda: NdaResult, slots: _Slots, atom_dim, n: int, facts):
    """The `NamedDim` records, gathered for all named dims at once by sorting atoms by dim."""
    values = program.values
    nbytes = facts.nbytes
    leaves = np.flatnonzero(atom_dim >= 0)
    order, bounds = _group_by(atom_dim[leaves], n)
    atoms = leaves[order].tolist()
    size = nda.atom_size[leaves[order[bounds[:-1]]]] if n else np.zeros(0, dtype=np.int64)
    assert (nda.atom_size[leaves] == size[atom_dim[leaves]]).all(), "a named dim's sizes differ"
    # Members: the value atoms of each named dim, in (value, dim, sub) order.
    cls = atom_dim[slots.atom]
    m_order, m_bounds = _group_by(cls, n)
    members = list(
        zip(
            slots.value[m_order].tolist(),
            slots.dim[m_order].tolist(),
            slots.sub[m_order].tolist(),
        )
    )
    # Label: the member of the best-ranked role, then of the largest value, then the first; this
    # stable sort is ordered by named dim like `m_order`, so each group's first entry is its best.
    rank = facts.role_table(_ROLE_RANK, 9)
    best = np.lexsort((-nbytes[slots.value], rank[slots.value], cls))
    covered = _bytes_covered(slots.value, cls, nbytes, n)
    persistent = _dims_holding(facts.role_table(_PERSISTENT, 0), slots.value, cls, n)
    is_input = _dims_holding(facts.role_table({"input": 1}, 0), slots.value, cls, n)
    reduction_ops = _ops_by_dim(nda, atom_dim, leaves, "reduction", n)
    replication_ops = _ops_by_dim(nda, atom_dim, leaves, "replicate", n)
    out = []
    for c in range(n):
        lo, hi = int(m_bounds[c]), int(m_bounds[c + 1])
        if hi > lo:
            e = int(best[lo])
            v, d, sub = int(slots.value[e]), int(slots.dim[e]), int(slots.sub[e])
            suffix = f":{sub}" if len(nda.value_dim(v, d)) > 1 else ""
            label = f"{int(size[c])} ({values[v].name}.{d}{suffix})"
        else:
            label = f"{int(size[c])} (op-internal)"
        out.append(
            NamedDim(
                id=c,
                size=int(size[c]),
                label=label,
                atoms=tuple(atoms[bounds[c] : bounds[c + 1]]),
                members=tuple(members[lo:hi]),
                bytes_covered=int(covered[c]),
                has_reduction=bool(reduction_ops[c]),
                reduction_ops=reduction_ops[c],
                replication_ops=replication_ops[c],
                is_persistent=bool(persistent[c]),
                is_input=bool(is_input[c]),
            )
        )
    return tuple(out)


def _bytes_covered(value: np.ndarray, cls: np.ndarray, nbytes: np.ndarray, n: int) -> np.ndarray:
    """Named dim -> total bytes of the values holding it (each value counted once)."""
    n_values = len(nbytes)
    pairs = unique(cls * n_values + value)
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, pairs // n_values, nbytes[pairs % n_values])
    return out


def _dims_holding(flag, value: np.ndarray, cls: np.ndarray, n: int) -> np.ndarray:
    """Named dim -> whether some value with `flag` (one bool per value) holds it."""
    out = np.zeros(n, dtype=bool)
    out[cls[np.asarray(flag, dtype=bool)[value]]] = True
    return out


def _ops_by_dim(nda: NdaResult, atom_dim, leaves, kind: str, n: int) -> list[tuple[int, ...]]:
    """Named dim -> sorted ids of the ops that own one of its atoms of factor kind `kind`."""
    kinds = nda.atom_kind
    atoms = np.array([a for a in leaves.tolist() if kinds[a] == kind], dtype=np.int64)
    # Encode (named dim, owner + 1) in one integer; the base must exceed every owner + 1. Owners
    # are op ids, which can outnumber atoms (a program of mostly scalar ops has few atoms).
    n_owners = int(np.max(nda.atom_owner, initial=-1)) + 2
    pairs = unique(atom_dim[atoms] * n_owners + nda.atom_owner[atoms] + 1)
    out: list[list[int]] = [[] for _ in range(n)]
    for c, owner in zip((pairs // n_owners).tolist(), (pairs % n_owners - 1).tolist()):
        out[c].append(owner)
    return [tuple(x) for x in out]


def _cooccurrence(slots: _Slots, atom_dim, n: int, n_values: int) -> frozenset[tuple[int, int]]:
    """Pairs (x < y) of named dims held by one value or one op."""
    if n == 0:
        return frozenset()
    holder = np.r_[slots.value, slots.op + n_values]
    held = unique(holder * n + atom_dim[np.r_[slots.atom, slots.op_atom]])
    holder, cls = held // n, held % n
    # Sorted by holder then named dim: each holder's dims are a run, and entries `gap` apart in
    # one run are the pairs of its dims at that distance.
    pairs = [np.zeros(0, dtype=np.int64)]
    for gap in range(1, len(held)):
        same = holder[:-gap] == holder[gap:]
        if not same.any():
            break
        pairs.append(cls[:-gap][same] * n + cls[gap:][same])
    codes = unique(np.concatenate(pairs))
    return frozenset(zip((codes // n).tolist(), (codes % n).tolist()))


def _class_graphs(nda: NdaResult, atom_dim, nbytes):
    """M-edges grouped by named dim (as slices of sorted arrays), and bytes per M-edge."""
    ends = nda.medge_table[:, 6:]
    capacity = nbytes[nda.medge_table[:, 1]].astype(np.float64)
    order, bounds = _group_by(atom_dim[ends[:, 0]], int(atom_dim.max(initial=-1)) + 1)
    by_class = {c: order[bounds[c] : bounds[c + 1]] for c in range(len(bounds) - 1)}
    unit = max(float(capacity.max(initial=1.0)) / (1 << 16), 1.0)
    return by_class, ends, capacity, unit


def _find_conflicts(program, nda, slots, atom_dim, named, cooc, facts) -> tuple[Conflict, ...]:
    by_class, ends, capacity, unit = _class_graphs(nda, atom_dim, facts.nbytes)
    graphs: dict[int, ClassGraph] = {}

    def graph(c: int) -> ClassGraph:
        if c not in graphs:
            eids = by_class[c]
            graphs[c] = ClassGraph(eids, ends[eids], capacity, unit)
        return graphs[c]

    conflicts: list[Conflict] = []

    def add(kind, dims, sites, cuts_list, description):
        options = tuple(
            ConflictOption(
                i,
                cut,
                int(sum(capacity[e] for e in cut)),
                describe_cut(program, nda.medge_table, cut),
            )
            for i, cut in enumerate(cuts_list)
        )
        conflicts.append(
            Conflict(len(conflicts), kind, tuple(dims), tuple(sites), options, description)
        )

    # 1. self-conflicts: values holding one named dim twice, grouped through the ops linking them.
    clash = _self_clashes(nda, slots, atom_dim, len(named))
    found = []  # (named dim, sites, description, graph, sources, sinks) of each self-conflict
    for values in _linked_clashes(program, clash):
        c = clash[values[0]][0]
        g = graph(c)
        _, a0, b0 = clash[values[0]]
        a_side = [clash[v][1] for v in values]
        b_side = [clash[v][2] for v in values]
        # Orient each clash like the first one: its `a` atom on the side of the first `a`.
        da, db = g.hops([a0, b0], a_side + b_side)
        k = len(values)
        flip = (da[k:] + db[:k] < da[:k] + db[k:]).tolist()
        sources = {b if f else a for a, b, f in zip(a_side, b_side, flip)}
        sinks = {a if f else b for a, b, f in zip(a_side, b_side, flip)}
        sites = [_site(program, v) for v in values]
        nd = named[c]
        text = f"{nd.name} {nd.label} appears twice in {program.values[values[0]].display()}"
        found.append((c, sites, text, g, sources, sinks))
    # One self-conflict per layer, all in the sequence dim: their max-flows run together.
    options = cut_options_many([(g, sources, sinks) for *_, g, sources, sinks in found])
    for (c, sites, text, *_), cuts in zip(found, options):
        add("self", [c], sites, cuts, text)

    # 2. axis clashes: an updated parameter named dim co-occurring with data named dims.
    data_dims = {nd.id for nd in named if nd.is_input and not nd.is_persistent}
    partners: dict[int, set[int]] = defaultdict(set)
    for x, y in cooc:
        if y in data_dims:
            partners[x].add(y)
        if x in data_dims:
            partners[y].add(x)
    candidates = [c for c in sorted(partners) if named[c].is_persistent and c not in data_dims]
    clash_specs = _axis_clash_specs(program, slots, atom_dim, data_dims, candidates, facts)
    batch = _Batch(by_class, ends, capacity, unit, atom_dim)
    options = _axis_clash_options(clash_specs, graph, batch)
    for c1, _, _, sites in clash_specs:
        cuts = options[c1]
        if not cuts:
            continue
        n1 = named[c1]
        others = sorted(partners[c1])
        names = ", ".join(named[c].name for c in others)
        add(
            "axis_clash",
            [c1, *others],
            sites,
            cuts,
            f"{n1.name} {n1.label} of parameters meets data dims {names}: to share their mesh "
            "axes, cut the parameter side off (gather weights at use, reduce-scatter gradients)",
        )

    # 3. reshape conflicts: the M-edge could not be formed; that use is always resharded.
    for vid, opi, pos, d in nda.reshape_sites:
        v, op = program.values[vid], program.ops[opi]
        dims = sorted(
            {int(atom_dim[a]) for a in nda.value_dim(vid, d)}
            | {int(atom_dim[a]) for a in nda.use_dim(opi, pos, d)}
        )
        add(
            "reshape",
            dims,
            [Site(opi, vid, f"{v.display()} dim {d} at {op.where()}")],
            [],
            f"{v.display()} dim {d} is split incompatibly at {op.where()}: resharded there",
        )
    return tuple(conflicts)


def _self_clashes(nda: NdaResult, slots: _Slots, atom_dim, n: int) -> dict:
    """Value -> (named dim, first atom, atom repeating it) for values holding a named dim twice."""
    cls = atom_dim[slots.atom]
    held = np.sort(slots.value * max(n, 1) + cls)
    repeated = unique(held[1:][held[1:] == held[:-1]] // max(n, 1))
    clash: dict[int, tuple[int, int, int]] = {}
    # The value atoms of those values, in (value, dim, sub) order: each value's atoms in turn.
    rows = np.flatnonzero(np.isin(slots.value, repeated))
    first: dict[int, int] = {}
    current = -1
    for vid, a, c in zip(slots.value[rows].tolist(), slots.atom[rows].tolist(), cls[rows].tolist()):
        if vid != current:
            first, current = {}, vid
        if c in first and vid not in clash:
            clash[vid] = (c, first[c], a)
        first.setdefault(c, a)
    return clash


def _linked_clashes(program: Program, clash: dict) -> list[list[int]]:
    """Clashing values of one named dim joined through the ops that link them (an attention
    block's scores, probs and their gradients), each group sorted, groups by first value."""
    parent = {v: v for v in clash}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    # Only the ops defining or reading a clashing value (in program order, as a walk over all
    # ops would meet them).
    producers, uses = program.producers(), program.uses()
    touching = {producers[v] for v in clash if producers[v] is not None}
    touching.update(opi for v in clash for opi, _ in uses[v])
    for opi in sorted(touching):
        op = program.ops[opi]
        linked = [v for v in op.operands + op.results if v in clash]
        for v in linked[1:]:
            if clash[v][0] == clash[linked[0]][0]:
                parent[find(v)] = find(linked[0])
    groups: dict[int, list[int]] = defaultdict(list)
    for v in sorted(clash):
        groups[find(v)].append(v)
    return sorted(groups.values(), key=lambda g: g[0])


def _axis_clash_specs(program: Program, slots: _Slots, atom_dim, data_dims, candidates, facts):
    """(named dim, source atoms, sink atoms, sites) of each candidate parameter dim that the
    program updates: sources are its atoms in persistent or output values free of data dims,
    sinks its atoms in values and ops that also hold a data dim."""
    values = program.values
    is_data = np.zeros(int(atom_dim.max(initial=-1)) + 1, dtype=bool)
    is_data[list(data_dims)] = True
    cls, op_cls = atom_dim[slots.atom], atom_dim[slots.op_atom]
    value_has_data = np.zeros(len(values), dtype=bool)
    value_has_data[slots.value[is_data[cls]]] = True
    op_has_data = np.zeros(len(program.ops), dtype=bool)
    op_has_data[slots.op[is_data[op_cls]]] = True
    is_output = facts.is_output
    keeps = is_output | facts.role_table(_PERSISTENT, 0).astype(bool)
    n = len(is_data)
    # Every named dim's value atoms at once, in (named dim, value, dim, sub) order, split below
    # into the parts each clash needs: one pass over the program, not one per candidate.
    order, _ = _group_by(cls, n)
    vids, atoms, of_dim = slots.value[order], slots.atom[order], cls[order]
    data = value_has_data[vids]
    # Only parameters the program updates (a train step) are worth keeping sharded apart from
    # the data; in a forward pass, replicated or tensor-parallel weights are the choice.
    updated = np.zeros(n, dtype=bool)
    updated[of_dim[is_output[vids] & ~data]] = True
    source_atoms, source_bounds = _by_dim(atoms, of_dim, ~data & keeps[vids], n)
    data_atoms, data_bounds = _by_dim(atoms, of_dim, data, n)
    data_vids, _ = _by_dim(vids, of_dim, data, n)
    op_order, _ = _group_by(op_cls, n)
    op_data = op_has_data[slots.op[op_order]]
    op_atoms, op_bounds = _by_dim(slots.op_atom[op_order], op_cls[op_order], op_data, n)
    specs = []
    for c1 in candidates:
        if not updated[c1]:
            continue
        sources = set(source_atoms[source_bounds[c1] : source_bounds[c1 + 1]])
        lo, hi = data_bounds[c1], data_bounds[c1 + 1]
        sinks = set(data_atoms[lo:hi]) | set(op_atoms[op_bounds[c1] : op_bounds[c1 + 1]])
        if sources & sinks:
            continue
        sites = [_site(program, v) for v in sorted(set(data_vids[lo:hi]))[:4]]
        specs.append((c1, sources, sinks, sites))
    return specs


def _by_dim(items: np.ndarray, of_dim: np.ndarray, keep: np.ndarray, n: int):
    """(the kept items as a list, bounds): named dim c's are `items[bounds[c] : bounds[c + 1]]`,
    in their order; `of_dim` is sorted."""
    kept = of_dim[keep]
    return items[keep].tolist(), np.searchsorted(kept, np.arange(n + 1)).tolist()


def _axis_clash_options(specs, graph, batch: _Batch) -> dict[int, list[frozenset[int]]]:
    """Named dim -> `cut_options` of its axis clash, for all clashes with two max-flows in all.

    Each axis clash lives in its own named dim, and named dims are disjoint atom graphs, so one
    max-flow over their union yields every clash's nearest cuts at once, and a second one the
    alternatives of the clashes whose nearest cuts coincide; a named dim's own max-flow is the
    fallback if a batch cannot be cut."""
    nearest = batch.min_cuts(specs)
    cuts = {
        c1: nearest_cuts(nearest[c1] if c1 in nearest else graph(c1).min_cuts(sources, sinks))
        for c1, sources, sinks, _ in specs
    }
    forbid = {}
    for c1, sources, sinks, _ in specs:
        worst = edge_to_forbid(cuts[c1], batch.capacity)
        if worst is not None and not links_sides(batch.ends[worst].tolist(), sources, sinks):
            forbid[c1] = worst
    again = [spec for spec in specs if spec[0] in forbid]
    alternative = batch.min_cuts(again, frozenset(forbid.values()))
    for c1, sources, sinks, _ in again:
        if c1 not in alternative:
            alternative[c1] = graph(c1).min_cuts(sources, sinks, frozenset({forbid[c1]}))
        cuts[c1] += nearest_cuts(alternative[c1])
    return {c1: ranked(found, batch.capacity) for c1, found in cuts.items()}


@dataclass(frozen=True)
class _Batch:
    """Max-flows of many named dims at once, over the union of their disjoint atom graphs."""

    by_class: dict
    ends: np.ndarray
    capacity: np.ndarray
    unit: float
    atom_dim: np.ndarray

    def min_cuts(self, specs, blocked: frozenset[int] = frozenset()) -> dict:
        """Named dim -> (value, cut near sources, cut near sinks) for each (named dim, sources,
        sinks, ...) spec; the minimum cut of the union splits per named dim. Empty if the union
        cannot be cut (then each named dim needs its own max-flow)."""
        if not specs:
            return {}
        eids = np.concatenate([self.by_class[c1] for c1, *_ in specs])
        union = ClassGraph(eids, self.ends[eids], self.capacity, self.unit)
        sources = set().union(*(s for _, s, _, _ in specs))
        sinks = set().union(*(t for _, _, t, _ in specs))
        result = union.min_cuts(sources, sinks, blocked)
        if result is None:
            return {}
        sides = []
        for cut in result[1:]:
            edges = list(cut)
            dims = self.atom_dim[self.ends[np.asarray(edges, dtype=np.int64), 0]].tolist()
            by_dim: dict[int, set[int]] = defaultdict(set)
            for e, d in zip(edges, dims):
                by_dim[d].add(e)
            sides.append(by_dim)
        return {
            c1: (0.0, frozenset(sides[0].get(c1, ())), frozenset(sides[1].get(c1, ())))
            for c1, *_ in specs
        }


def _site(program: Program, vid: int) -> Site:
    producers = program.producers()
    opi = producers[vid]
    where = program.ops[opi].where() if opi is not None else "input"
    return Site(
        opi if opi is not None else -1, vid, f"{program.values[vid].display()} from {where}"
    )
