"""`StrategySpace`: the decision space of one analysis on one mesh, owned in one place.

A **state** is a set of chosen conflict options plus a mesh-axis bitmask per fine class (see
`resolve.py` for fine classes and `axes.py` for masks); every state is a complete strategy (what
is not sharded is replicated), so anything can be scored at any time. The space knows

* the **units** of decision under a set of options: named dims (after cuts) with the same
  structural signature, such as the same dim of every repeated layer, decided together so that a
  96-layer model is not 96 times harder;
* **legality** (`legality.py`): whole strategies and single steps, by the same rules;
* **conversion** between states and `Strategy` records, and the scaling-book notation of values.

Spaces are memoized per (analysis, mesh) by `space_of`; everything they cache is a pure function
of its key, bounded, and locked, so one space is safe to share between threads (two browser
sessions searching the same model). Pins are not part of a space: `pins.constrain` turns them
into a `Constraints` record that the search applies on top.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from toast_core.analysis import Analysis
from toast_core.analysis.layers import fine_signatures
from toast_core.analysis.xla_limits import CONV_SPATIAL_MULTI_AXIS
from toast_core.errors import StrategyError
from toast_core.mesh import MeshSpec
from toast_core.strategy import legality
from toast_core.strategy.axes import mesh_axes
from toast_core.strategy.layout import layout
from toast_core.strategy.memo import per_analysis
from toast_core.strategy.remat import remat_space
from toast_core.strategy.resolve import Resolution, resolve

_CACHE_SIZE = 4096


@dataclass(frozen=True)
class State:
    """Chosen conflict options (sorted (conflict, option) pairs), a mask per fine class, and
    remat policies (sorted (remat group, policy index) pairs, see `remat.py`)."""

    options: tuple[tuple[int, int], ...]
    masks: np.ndarray
    remat: tuple[tuple[int, int], ...] = ()

    @property
    def key(self) -> tuple:
        return (self.options, self.masks.tobytes(), self.remat)


@dataclass(frozen=True, slots=True)
class Unit:
    """Named dims (after cuts) decided together: the same dim of repeated layers."""

    dims: tuple[str, ...]
    fines: tuple[int, ...]
    size: int
    bytes_covered: float


class _Lru:
    """A bounded, locked mapping for values that are pure functions of their keys."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self.size, self.data, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, key, make):
        with self.lock:
            hit = self.data.get(key)
        if hit is None:
            hit = make()
            with self.lock:
                self.data[key] = hit
                if len(self.data) > self.size:
                    self.data.popitem(last=False)
        return hit


class StrategySpace:
    """The decision space of `ana` on `mesh` (get one with `space_of(ana, mesh)`)."""

    def __init__(self, ana: Analysis, mesh: MeshSpec) -> None:
        self.ana, self.mesh = ana, mesh
        self.axes = mesh_axes(mesh)
        self.layout = layout(ana)
        self.fine_size_ext = np.append(ana.fine_size, 1)
        self.fine_sig = fine_signatures(ana)  # equal for the same dim of repeated layers
        nbytes = np.array([v.nbytes for v in ana.program.values], dtype=np.float64)
        self.fine_bytes = np.asarray(self.layout.value_fine.T @ nbytes).ravel()
        self._value_cols = self.layout.value_fine.tocsc()
        self._use_cols = self.layout.use_fine.tocsc()
        self._splits_of_fine: dict[int, list[int]] = {}
        for i, (_, _, fines) in enumerate(self.layout.split_dims):
            for f in fines:
                self._splits_of_fine.setdefault(f, []).append(i)
        groups = [tuple(g) for g in ana.conflict_groups]
        grouped = {c for g in groups for c in g}
        groups += [(c.id,) for c in ana.conflicts if c.id not in grouped]
        # A group can be resolved only with an option every member has.
        self.conflict_groups = tuple(
            sorted(g for g in groups if min(len(ana.conflicts[k].options) for k in g) > 0)
        )
        self.blocked = _blocked_fines(ana, self.axes)
        self.remat = remat_space(ana)
        self._units, self._touch, self._splits = _Lru(), _Lru(), _Lru()
        self._checks, self._parts, self._unit_checks = _Lru(), _Lru(), _Lru()
        self._tables = _Lru(256)  # each a few arrays of the units' size
        self._valid = _Lru()

    # -- resolutions and masks -----------------------------------------------------------------

    def resolution(self, options) -> Resolution:
        return resolve(self.ana, options)

    def masks_of(self, shardings, options) -> np.ndarray:
        """Mask per fine class of (named dim name, mesh axes) pairs under `options` (names
        checked, legality not: see `problems`)."""
        res = self.resolution(options)
        masks = np.zeros(self.ana.n_fine, dtype=np.int64)
        for dim_name, axes in shardings:
            masks[list(res.by_name(dim_name).fine)] = self.axes.mask(axes)
        return masks

    def shardings_of(self, state: State) -> dict[str, tuple[str, ...]]:
        """Named dim name -> mesh axes of a state (replicated dims left out)."""
        out = {}
        for d in self.resolution(state.options).dims:
            m = int(state.masks[d.fine[0]])
            if m:
                out[d.name] = self.axes.names_of(m)
        return out

    # -- legality ------------------------------------------------------------------------------

    def problems(self, shardings, options, name: str = "") -> list[str]:
        """Every legality problem of a strategy (see `legality.py`); memoized per strategy."""
        key = (tuple(shardings), tuple(options))
        return self._valid.get(
            key, lambda: tuple(legality.strategy_problems(self, shardings, options, name))
        )

    def touch(self, fines: tuple[int, ...]):
        """Rows (values, uses) holding these fine classes, with how many atoms each holds."""

        def make():
            out = []
            for cols in (self._value_cols, self._use_cols):
                add = np.asarray(cols[:, list(fines)].sum(axis=1)).ravel()
                rows = np.flatnonzero(add)
                out.append((rows, add[rows]))
            return out

        return self._touch.get(fines, make)

    def splits_touching(self, fines: tuple[int, ...]) -> np.ndarray:
        """Rows of `layout.split_fines` (dims split into sub-factors) holding these classes."""

        def make():
            rows = sorted({i for f in fines for i in self._splits_of_fine.get(f, ())})
            return np.array(rows, dtype=np.int64)

        return self._splits.get(fines, make)

    def shard_check(self, fines: tuple[int, ...]) -> legality.ShardCheck:
        """The state-independent part of `why_illegal_shard` for a unit (memoized)."""
        return self._checks.get(fines, lambda: legality.ShardCheck(self, fines))

    def why_illegal_shard(self, state: State, unit: Unit, a: int, forbidden: int = 0):
        """None if adding mesh axis `a` to `unit` is legal in `state`, else the reason."""
        return legality.why_illegal_shard(self, state.masks, unit, a, forbidden)

    def unit_checks(self, options, exclude: frozenset) -> tuple[legality.ShardCheck, ...]:
        """The `shard_check` of each of `units(options, exclude)` (memoized)."""
        return self._unit_checks.get(
            (tuple(options), exclude),
            lambda: tuple(self.shard_check(u.fines) for u in self.units(options, exclude)),
        )

    def unit_table(
        self, options, exclude: frozenset, forbidden: tuple, picked: tuple | None = None
    ) -> legality.UnitTable:
        """`legality.UnitTable` of `units(options, exclude)` (of those at indices `picked`
        only, if given), with the mesh axes `forbidden` on each (memoized: the search lists
        legal shards under the same resolutions again)."""

        def make():
            units = self.units(options, exclude)
            if picked is not None:
                units = [units[u] for u in picked]
            return legality.UnitTable(self, units, list(forbidden))

        return self._tables.get((tuple(options), exclude, forbidden, picked), make)

    # -- units ---------------------------------------------------------------------------------

    def units(self, options, exclude: frozenset = frozenset()) -> tuple[Unit, ...]:
        """The units of decision under `options`, largest bytes covered first; named dims of
        size 1 and those holding a fine class of `exclude` (pinned) are left out."""
        return self._units.get(
            (tuple(options), exclude), lambda: self._make_units(options, exclude)
        )

    def units_of_parts(self, options, exclude: frozenset, group: int) -> tuple[int, ...]:
        """Indices of `units(options, exclude)` holding a part of a named dim that conflict
        group `group` (of `conflict_groups`) splits (memoized)."""

        def make():
            parents = {
                d for k in self.conflict_groups[group] for d in self.ana.conflicts[k].named_dims
            }
            res_dims = {d.name: d.parent for d in self.resolution(options).dims}
            return tuple(
                u
                for u, unit in enumerate(self.units(options, exclude))
                if any(res_dims.get(n) in parents for n in unit.dims)
            )

        return self._parts.get((tuple(options), exclude, group), make)

    def _make_units(self, options, exclude: frozenset) -> tuple[Unit, ...]:
        res = self.resolution(options)
        # Signature of each resolved dim: its size and the sorted signatures of its fine classes.
        order = np.lexsort((self.fine_sig, res.fine_to_dim))
        dim_sorted = res.fine_to_dim[order]
        bounds = np.searchsorted(dim_sorted, np.arange(len(res.dims) + 1))
        sig_sorted = self.fine_sig[order]
        by_sig: dict[tuple, list] = {}
        for i, d in enumerate(res.dims):
            if d.size == 1 or not exclude.isdisjoint(d.fine):
                continue
            key = (d.size, sig_sorted[bounds[i] : bounds[i + 1]].tobytes())
            by_sig.setdefault(key, []).append(d)
        units = []
        for (size, _), dims in by_sig.items():
            fines = tuple(f for d in dims for f in d.fine)
            units.append(
                Unit(
                    tuple(d.name for d in dims),
                    fines,
                    size,
                    float(self.fine_bytes[list(fines)].sum()),
                )
            )
        units.sort(key=lambda u: (-u.bytes_covered, u.dims))
        return tuple(units)

    # -- presentation --------------------------------------------------------------------------

    def value_axes(self, masks: np.ndarray, value_id: int) -> tuple[tuple[str, ...], ...]:
        """Mesh axes of each dim of a value (major sub-factors first)."""
        dims = self.layout.value_dim_fine[value_id]
        return tuple(self.axes.names_of_masks(masks[list(fines)].tolist()) for fines in dims)

    def use_axes(self, masks: np.ndarray, op: int, pos: int) -> tuple[tuple[str, ...], ...]:
        """Mesh axes of each dim of an operand use (differs from its value's at a cut)."""
        dims = self.layout.use_dim_fine[(op, pos)]
        return tuple(self.axes.names_of_masks(masks[list(fines)].tolist()) for fines in dims)

    def notation(self, masks: np.ndarray, res: Resolution, value_id: int) -> str:
        """`params.w1[N0, N1_model]`: named dims with their mesh axes as subscripts."""
        v = self.ana.program.values[value_id]
        parts = []
        for fines, size in zip(self.layout.value_dim_fine[value_id], v.shape):
            if not fines:
                parts.append(str(size))
                continue
            sub = []
            for f in fines:
                axes = self.axes.names_of(int(masks[f]))
                nm = res.dims[int(res.fine_to_dim[f])].name
                sub.append(nm + ("_" + "_".join(axes) if axes else ""))
            parts.append("*".join(sub))
        return f"{v.name}[{', '.join(parts)}]"


def _blocked_fines(ana: Analysis, axes) -> dict[int, str]:
    """Fine class -> why it must stay replicated on this mesh (known XLA limitations that depend
    on the mesh; see `toast_core/analysis/xla_limits.py`)."""
    if bin(axes.real).count("1") < 2:
        return {}
    out: dict[int, str] = {}
    nda, prog = ana.nda, ana.program
    for op in prog.ops:
        if op.primitive != "conv_general_dilated":
            continue
        why = (
            f"it is a spatial dim of the convolution at {op.where()}, which XLA's partitioner "
            f"miscomputes on a mesh with several mesh axes (known XLA limitation "
            f"`{CONV_SPATIAL_MULTI_AXIS}`)"
        )
        dn = dict(op.param("dimension_numbers"))
        atoms = [
            a
            for pos, spec in ((0, dn["lhs_spec"]), (1, dn["rhs_spec"]))
            for d in spec[2:]
            for a in nda.use_atoms[(op.index, pos)][d]
        ]
        atoms += [a for d in dn["out_spec"][2:] for a in nda.value_atoms[op.results[0]][d]]
        for a in atoms:
            f = int(ana.fine_of_atom[a])
            if f >= 0:
                out.setdefault(f, why)
    return out


@per_analysis(max_keys=8)
def space_of(ana: Analysis, mesh: MeshSpec) -> StrategySpace:
    """The decision space of `ana` on `mesh` (memoized; see `memo.py`)."""
    if not isinstance(mesh, MeshSpec):
        raise StrategyError(f"mesh: expected a tc.MeshSpec, got {mesh!r}")
    return StrategySpace(ana, mesh)
