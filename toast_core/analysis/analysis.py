"""`analyze(program)`: named dims, conflicts with options, co-occurrence, decision groups.

This assembles the NDA pass (`nda.py`) and the conflict finder (`conflicts.py`) into one frozen
`Analysis`, the object the cost model, the search, the explorer and the CLI all read.

Decision groups: named dims (and conflicts) that repeat across identical layers share a signature
(size plus the layer-free paths of the parameters and inputs they touch, e.g.
`params.blocks[*].mlp.w_fc.1`), so a 96-layer model offers one decision per kind of dim, not 96.
"""

from __future__ import annotations

import gc
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from toast_core.analysis.conflicts import (
    ClassGraph,
    Conflict,
    ConflictOption,
    Site,
    cut_options,
    describe_cut,
)
from toast_core.analysis.nda import MEdge, NamedDim, NdaResult, components, run_nda
from toast_core.errors import ToastError, bad_value
from toast_core.ir.program import Program

_ROLE_RANK = {
    "input": 0,
    "parameter": 1,
    "state": 2,
    "constant": 4,
    "literal": 5,
    "intermediate": 3,
}
_LAYER_INDEX = re.compile(r"\[\d+\]")


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
    cache: dict = field(default_factory=dict, repr=False, compare=False)

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
        keep = np.ones(len(self.nda.medges), dtype=bool)
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
        return np.array(
            [(e.value_atom, e.use_atom) for e in self.nda.medges], dtype=np.int64
        ).reshape(-1, 2)

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
    # The analysis allocates many small objects and frees none of them early: pausing the cyclic
    # garbage collector meanwhile saves a fifth of the time and changes nothing else.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _analyze(program)
    finally:
        if was_enabled:
            gc.enable()


def _analyze(program: Program) -> Analysis:
    nda = run_nda(program)
    n_atoms = len(nda.atom_size)
    edges = np.array([(e.value_atom, e.use_atom) for e in nda.medges], dtype=np.int64).reshape(
        -1, 2
    )
    labels = components(n_atoms, edges)
    is_leaf = np.zeros(n_atoms, dtype=bool)
    for dims in nda.value_atoms:
        for atoms in dims:
            is_leaf[list(atoms)] = True
    for atoms in nda.op_atoms:
        is_leaf[list(atoms)] = True
    # Renumber classes densely over leaf atoms, in order of their first atom.
    remap: dict[int, int] = {}
    atom_dim = np.full(n_atoms, -1, dtype=np.int64)
    for a in np.flatnonzero(is_leaf).tolist():
        atom_dim[a] = remap.setdefault(int(labels[a]), len(remap))
    named = _named_dims(program, nda, atom_dim, len(remap))
    cooc = _cooccurrence(nda, atom_dim)
    conflicts = _find_conflicts(program, nda, atom_dim, named, cooc)
    dim_groups, conflict_groups = _groups(program, named, conflicts)
    diagnostics = tuple(program.diagnostics) + nda.diagnostics
    return Analysis(
        program, named, conflicts, diagnostics, nda, atom_dim, cooc, dim_groups, conflict_groups
    )


def _named_dims(program: Program, nda: NdaResult, atom_dim: np.ndarray, n: int):
    atoms: list[list[int]] = [[] for _ in range(n)]
    for a in np.flatnonzero(atom_dim >= 0).tolist():
        atoms[atom_dim[a]].append(a)
    members: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    covered = [0] * n
    nbytes = [v.nbytes for v in program.values]
    dim_of = atom_dim.tolist()
    for vid, dims in enumerate(nda.value_atoms):
        seen = set()
        for d, leaves in enumerate(dims):
            for sub, a in enumerate(leaves):
                c = dim_of[a]
                members[c].append((vid, d, sub))
                if c not in seen:
                    covered[c] += nbytes[vid]
                    seen.add(c)
    red: list[set[int]] = [set() for _ in range(n)]
    repl: list[set[int]] = [set() for _ in range(n)]
    for a in np.flatnonzero(atom_dim >= 0).tolist():
        kind = nda.atom_kind[a]
        if kind == "reduction":
            red[atom_dim[a]].add(int(nda.atom_owner[a]))
        elif kind == "replicate":
            repl[atom_dim[a]].add(int(nda.atom_owner[a]))
    out = []
    for c in range(n):
        size = int(nda.atom_size[atoms[c][0]])
        assert all(int(nda.atom_size[a]) == size for a in atoms[c]), f"named dim {c} sizes differ"
        ms = members[c]
        vals = [program.values[v] for v, _, _ in ms]
        if ms:
            best = min(
                range(len(ms)),
                key=lambda i: (_ROLE_RANK.get(vals[i].role, 9), -nbytes[ms[i][0]], ms[i]),
            )
            v, d, sub = ms[best]
            suffix = f":{sub}" if len(nda.value_atoms[v][d]) > 1 else ""
            label = f"{size} ({program.values[v].name}.{d}{suffix})"
        else:
            label = f"{size} (op-internal)"
        out.append(
            NamedDim(
                id=c,
                size=size,
                label=label,
                atoms=tuple(atoms[c]),
                members=tuple(ms),
                bytes_covered=covered[c],
                has_reduction=bool(red[c]),
                reduction_ops=tuple(sorted(red[c])),
                replication_ops=tuple(sorted(repl[c])),
                is_persistent=any(x.is_persistent for x in vals),
                is_input=any(x.role == "input" for x in vals),
            )
        )
    return tuple(out)


def _cooccurrence(nda: NdaResult, atom_dim: np.ndarray) -> frozenset[tuple[int, int]]:
    pairs: set[tuple[int, int]] = set()
    slots = [tuple(a for d in dims for a in d) for dims in nda.value_atoms] + list(nda.op_atoms)
    for atoms in slots:
        classes = sorted({int(atom_dim[a]) for a in atoms})
        for i, x in enumerate(classes):
            for y in classes[i + 1 :]:
                pairs.add((x, y))
    return frozenset(pairs)


def _class_graphs(program: Program, nda: NdaResult, atom_dim: np.ndarray):
    """M-edges grouped by named dim (as slices of sorted arrays), and bytes per M-edge."""
    ends = np.array([(e.value_atom, e.use_atom) for e in nda.medges], dtype=np.int64).reshape(-1, 2)
    nbytes = np.array([v.nbytes for v in program.values], dtype=np.float64)
    capacity = nbytes[np.array([e.value for e in nda.medges], dtype=np.int64)]
    cls = atom_dim[ends[:, 0]] if len(ends) else np.zeros(0, dtype=np.int64)
    order = np.argsort(cls, kind="stable")
    bounds = np.searchsorted(cls[order], np.arange(int(atom_dim.max(initial=-1)) + 2))
    by_class = {c: order[bounds[c] : bounds[c + 1]] for c in range(len(bounds) - 1)}
    unit = max(float(capacity.max(initial=1.0)) / (1 << 16), 1.0)
    return by_class, ends, capacity, unit


def _find_conflicts(program, nda, atom_dim, named, cooc) -> tuple[Conflict, ...]:
    by_class, ends, capacity, unit = _class_graphs(program, nda, atom_dim)
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
                describe_cut(program, nda.medges, cut),
            )
            for i, cut in enumerate(cuts_list)
        )
        conflicts.append(
            Conflict(len(conflicts), kind, tuple(dims), tuple(sites), options, description)
        )

    # 1. self-conflicts: values holding one named dim twice, grouped through the ops linking them.
    clash: dict[int, tuple[int, int, int]] = {}  # value -> (class, atom a, atom b)
    for v in program.values:
        first: dict[int, int] = {}
        for atoms in nda.value_atoms[v.id]:
            for a in atoms:
                c = int(atom_dim[a])
                if c in first and v.id not in clash:
                    clash[v.id] = (c, first[c], a)
                first.setdefault(c, a)
    parent = {v: v for v in clash}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for op in program.ops:
        linked = [v for v in list(op.operands) + list(op.results) if v in clash]
        for v in linked[1:]:
            if clash[v][0] == clash[linked[0]][0]:
                parent[find(v)] = find(linked[0])
    groups: dict[int, list[int]] = defaultdict(list)
    for v in sorted(clash):
        groups[find(v)].append(v)
    for root in sorted(groups, key=lambda r: groups[r][0]):
        values = groups[root]
        c = clash[values[0]][0]
        g = graph(c)
        _, a0, b0 = clash[values[0]]
        da, db = g.distances(a0), g.distances(b0)
        sources, sinks = set(), set()
        for v in values:
            _, a, b = clash[v]
            flip = da(b) + db(a) < da(a) + db(b)
            sources.add(b if flip else a)
            sinks.add(a if flip else b)
        sites = [_site(program, v) for v in values]
        nd = named[c]
        add(
            "self",
            [c],
            sites,
            cut_options(g, sources, sinks),
            f"{nd.name} {nd.label} appears twice in {program.values[values[0]].display()}",
        )

    # 2. axis clashes: an updated parameter named dim co-occurring with data named dims.
    value_classes = [{int(atom_dim[a]) for d in dims for a in d} for dims in nda.value_atoms]
    op_classes = [{int(atom_dim[a]) for a in atoms} for atoms in nda.op_atoms]
    data_dims = {nd.id for nd in named if nd.is_input and not nd.is_persistent}
    partners: dict[int, set[int]] = defaultdict(set)
    for x, y in cooc:
        if y in data_dims:
            partners[x].add(y)
        if x in data_dims:
            partners[y].add(x)
    values_of: dict[int, list[int]] = defaultdict(list)
    for vid, classes in enumerate(value_classes):
        for c in classes:
            values_of[c].append(vid)
    ops_of: dict[int, list[int]] = defaultdict(list)
    for opi, classes in enumerate(op_classes):
        if classes & data_dims:
            for c in classes:
                ops_of[c].append(opi)
    clash_specs = []
    for c1 in sorted(partners):
        n1 = named[c1]
        if not n1.is_persistent or c1 in data_dims:
            continue
        sources, sinks, sites = set(), set(), []
        updated = False
        for vid in values_of[c1]:
            v = program.values[vid]
            atoms = [a for d in nda.value_atoms[vid] for a in d if atom_dim[a] == c1]
            if value_classes[vid] & data_dims:
                sinks.update(atoms)
                if len(sites) < 4:
                    sites.append(_site(program, vid))
            elif v.is_persistent or v.is_output:
                sources.update(atoms)
                updated = updated or v.is_output
        for opi in ops_of[c1]:
            sinks.update(a for a in nda.op_atoms[opi] if atom_dim[a] == c1)
        # Only parameters the program updates (a train step) are worth keeping sharded apart
        # from the data; in a forward pass, replicated or tensor-parallel weights are the choice.
        if not updated or sources & sinks:
            continue
        clash_specs.append((c1, sources, sinks, sites))
    # Each axis clash lives in its own named dim, and named dims are disjoint atom graphs, so
    # one max-flow over their union yields every clash's nearest cuts at once.
    nearest = _batched_nearest_cuts(clash_specs, by_class, ends, capacity, unit, atom_dim)
    for c1, sources, sinks, sites in clash_specs:
        cuts = cut_options(graph(c1), sources, sinks, nearest.get(c1))
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
            {int(atom_dim[a]) for a in nda.value_atoms[vid][d]}
            | {int(atom_dim[a]) for a in nda.use_atoms[(opi, pos)][d]}
        )
        add(
            "reshape",
            dims,
            [Site(opi, vid, f"{v.display()} dim {d} at {op.where()}")],
            [],
            f"{v.display()} dim {d} is split incompatibly at {op.where()}: resharded there",
        )
    return tuple(conflicts)


def _batched_nearest_cuts(specs, by_class, ends, capacity, unit, atom_dim) -> dict:
    """Named dim -> (value, cut near sources, cut near sinks), from one max-flow over the union
    of the named dims' atom graphs (disjoint, so the minimum cut splits per named dim)."""
    if not specs:
        return {}
    eids = np.concatenate([by_class[c1] for c1, *_ in specs])
    union = ClassGraph(eids, ends[eids], capacity, unit)
    sources = set().union(*(s for _, s, _, _ in specs))
    sinks = set().union(*(t for _, _, t, _ in specs))
    result = union.min_cuts(sources, sinks)
    if result is None:
        return {}
    _, near_sources, near_sinks = result
    sides = []
    for cut in (near_sources, near_sinks):
        by_dim: dict[int, set[int]] = defaultdict(set)
        for e in cut:
            by_dim[int(atom_dim[ends[e, 0]])].add(e)
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


def _groups(program: Program, named, conflicts):
    """Decision groups: named dims / conflicts with equal layer-free signatures."""
    sig_dims: dict[tuple, list[int]] = defaultdict(list)
    dim_sig: dict[int, tuple] = {}
    for nd in named:
        paths = sorted(
            {
                (_LAYER_INDEX.sub("[*]", program.values[v].name), d, sub)
                for v, d, sub in nd.members
                if program.values[v].role in ("input", "parameter", "state")
                or program.values[v].is_output
            }
        )
        layered = any("[*]" in p[0] for p in paths)
        sig = (nd.size, tuple(paths)) if paths and layered else ("single", nd.id)
        dim_sig[nd.id] = sig
        sig_dims[sig].append(nd.id)
    dim_groups = tuple(tuple(g) for g in sig_dims.values() if len(g) > 1)
    sig_conf: dict[tuple, list[int]] = defaultdict(list)
    for c in conflicts:
        # An axis clash is characterised by its parameter dim; the data dims are shared by all.
        dims = c.named_dims[:1] if c.kind == "axis_clash" else c.named_dims
        sig = (c.kind, tuple(dim_sig[d] for d in dims), tuple(o.bytes for o in c.options))
        if c.kind == "axis_clash" and dim_sig[dims[0]][0] == "single":
            sig = ("single", c.id)
        sig_conf[sig].append(c.id)
    conflict_groups = tuple(tuple(g) for g in sig_conf.values() if len(g) > 1)
    return dim_groups, conflict_groups
