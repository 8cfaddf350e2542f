"""The decision space the search walks: states, actions, legality, and pins applied at the root.

A **state** is a set of chosen conflict options plus a mesh-axis bitmask per fine class (see
`toast_core.strategy.resolve`); every state is a complete, legal strategy (what is not sharded is
replicated), so the search can score any node. **Actions**:

* `("resolve", g, o)`: resolve every conflict of decision group g with option o (cuts only split
  named dims, which inherit their mesh axes, so this never makes a state illegal);
* `("shard", u, a)`: add mesh axis a to decision unit u: a group of named dims (after cuts) with the
  same structural signature - the same dim of every repeated layer - so a 96-layer model is not 96
  times harder;
* `("stop",)`.

Illegal actions are masked, and `why_illegal` says why (divisibility, a value or op that would hold
a mesh axis twice, a strided split, a pin or a forbid). Decisions commute, so states are keyed
canonically for the transposition table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toast_core.analysis import Analysis
from toast_core.analysis.layers import fine_signatures
from toast_core.cost import Evaluator
from toast_core.errors import PinError, StrategyError
from toast_core.mesh import MeshSpec
from toast_core.search.pins import Pin, parse_pins, reference_fines
from toast_core.strategy import Strategy, resolve
from toast_core.strategy.layout import layout


@dataclass(frozen=True)
class State:
    options: tuple[tuple[int, int], ...]
    masks: np.ndarray

    @property
    def key(self) -> tuple:
        return (self.options, self.masks.tobytes())


@dataclass(frozen=True, slots=True)
class Unit:
    """Named dims (after cuts) decided together: the same dim of repeated layers."""

    dims: tuple[str, ...]
    fines: tuple[int, ...]
    size: int
    bytes_covered: float


class DecisionSpace:
    def __init__(self, ana: Analysis, mesh: MeshSpec, evaluator: Evaluator, pins=(), forbids=()):
        self.ana, self.mesh, self.ev = ana, mesh, evaluator
        self.lay = layout(ana)
        self.n_axes = len(mesh.axis_names)
        self.axis_sizes = np.asarray(mesh.axis_sizes, dtype=np.int64)
        self.ways = np.ones(1 << self.n_axes, dtype=np.int64)
        for m in range(1 << self.n_axes):
            for i in range(self.n_axes):
                if m >> i & 1:
                    self.ways[m] *= self.axis_sizes[i]
        self.fine_sig = fine_signatures(ana)
        self.fine_bytes = self._fine_bytes()
        self.value_cols = self.lay.value_fine.tocsc()
        self.use_cols = self.lay.use_fine.tocsc()
        self.splits_of_fine: dict[int, list[tuple[int, ...]]] = {}
        for _, _, fines in self.lay.split_dims:
            for f in fines:
                self.splits_of_fine.setdefault(f, []).append(fines)
        groups = [tuple(g) for g in ana.conflict_groups]
        grouped = {c for g in groups for c in g}
        groups += [(c.id,) for c in ana.conflicts if c.id not in grouped and c.options]
        self.conflict_groups = sorted(groups)
        self._units_cache: dict = {}
        self._touch_cache: dict = {}
        self._info_cache: dict = {}
        self._apply_pins(parse_pins(pins), parse_pins(forbids))

    # -- signatures for grouping ---------------------------------------------------------------

    def _fine_bytes(self) -> np.ndarray:
        nbytes = np.array([v.nbytes for v in self.ana.program.values], dtype=np.float64)
        return np.asarray(self.lay.value_fine.T @ nbytes).ravel()

    # -- units ---------------------------------------------------------------------------------

    def resolution(self, options: tuple[tuple[int, int], ...]):
        return resolve(self.ana, options)

    def units(self, options: tuple[tuple[int, int], ...]) -> tuple[Unit, ...]:
        if options in self._units_cache:
            return self._units_cache[options]
        res = resolve(self.ana, options)
        # Signature of each resolved dim: its size and the sorted signatures of its fine classes.
        order = np.lexsort((self.fine_sig, res.fine_to_dim))
        dim_sorted = res.fine_to_dim[order]
        bounds = np.searchsorted(dim_sorted, np.arange(len(res.dims) + 1))
        sig_sorted = self.fine_sig[order]
        by_sig: dict[tuple, list] = {}
        for i, d in enumerate(res.dims):
            if d.size == 1 or not self.pinned_fines.isdisjoint(d.fine):
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
        self._units_cache[options] = tuple(units)
        return self._units_cache[options]

    # -- pins ----------------------------------------------------------------------------------

    def _apply_pins(self, pins: tuple[Pin, ...], forbids: tuple[Pin, ...]) -> None:
        ana = self.ana
        for p in pins:
            if p.forbid:
                raise PinError(f"`{p.text}` is a forbid: pass it in forbids, not pins")
        for f in forbids:
            if not f.forbid:
                raise PinError(f"`{f.text}` is a pin: pass it in pins (forbids start with !)")
        self.pins, self.forbids = pins, forbids
        # Conflict options first: they decide which named dims exist.
        chosen: dict[int, tuple[int | None, Pin]] = {}
        for p in pins:
            if p.kind != "option":
                continue
            c = ana.conflict(p.conflict) if p.conflict < len(ana.conflicts) else None
            if c is None:
                raise PinError(f"pin `{p.text}` names conflict K{p.conflict}, which does not exist")
            if p.option is not None and p.option >= len(c.options):
                raise PinError(f"pin `{p.text}`: conflict {c.name} has {len(c.options)} options")
            if c.id in chosen and chosen[c.id][0] != p.option:
                raise PinError(f"contradictory pins `{chosen[c.id][1].text}` and `{p.text}`")
            chosen[c.id] = (p.option, p)
        self.forbidden_options = set()
        for f in forbids:
            if f.kind == "option":
                if f.conflict >= len(ana.conflicts):
                    raise PinError(
                        f"forbid `{f.text}` names conflict K{f.conflict}, which does not exist"
                    )
                if f.option >= len(ana.conflicts[f.conflict].options):
                    n = len(ana.conflicts[f.conflict].options)
                    raise PinError(f"forbid `{f.text}`: conflict K{f.conflict} has {n} options")
                if f.conflict in chosen and chosen[f.conflict][0] == f.option:
                    raise PinError(
                        f"pin `{chosen[f.conflict][1].text}` contradicts forbid `{f.text}`"
                    )
                self.forbidden_options.add((f.conflict, f.option))
        self.fixed_conflicts = set(chosen)
        root_options = tuple(sorted((k, o) for k, (o, _) in chosen.items() if o is not None))
        masks = np.zeros(ana.n_fine, dtype=np.int64)
        self.pinned_fines: set[int] = set()
        owner: dict[int, Pin] = {}
        index = {a: i for i, a in enumerate(self.mesh.axis_names)}
        for p in pins:
            if p.kind != "dim":
                continue
            for a in p.axes:
                if a not in index:
                    raise PinError(f"pin `{p.text}`: {a!r} is not a mesh axis of {self.mesh}")
            m = 0
            for a in p.axes:
                m |= 1 << index[a]
            fines = reference_fines(ana, p.ref, root_options, p.text)
            for f in fines:
                if f in owner and int(masks[f]) != m:
                    raise PinError(f"contradictory pins `{owner[f].text}` and `{p.text}`")
                owner[f] = p
                masks[f] = m
                self.pinned_fines.add(f)
        self.forbidden_axes: dict[int, int] = {}
        for fb in forbids:
            if fb.kind != "dim":
                continue
            if fb.axes[0] not in index:
                raise PinError(
                    f"forbid `{fb.text}`: {fb.axes[0]!r} is not a mesh axis of {self.mesh}"
                )
            bit = 1 << index[fb.axes[0]]
            for f in reference_fines(ana, fb.ref, root_options, fb.text):
                if f in owner and int(masks[f]) & bit:
                    raise PinError(f"pin `{owner[f].text}` contradicts forbid `{fb.text}`")
                self.forbidden_axes[f] = self.forbidden_axes.get(f, 0) | bit
        self.root = State(root_options, masks)
        try:
            self.to_strategy(self.root).validate(ana, self.mesh)
        except StrategyError as exc:
            texts = ", ".join(f"`{p.text}`" for p in pins)
            raise PinError(f"pins {texts} are impossible together: {exc}") from None

    # -- actions -------------------------------------------------------------------------------

    def admits(self, state: State) -> bool:
        """Whether a state (e.g. a baseline's) honours every pin and forbid."""
        if any(
            k in self.fixed_conflicts for k, _ in state.options if (k, _) not in self.root.options
        ):
            return False
        if any(opt in self.forbidden_options for opt in state.options):
            return False
        for k, o in self.root.options:
            if (k, o) not in state.options:
                return False
        for f in self.pinned_fines:
            if state.masks[f] != self.root.masks[f]:
                return False
        return all(not (int(state.masks[f]) & bits) for f, bits in self.forbidden_axes.items())

    def actions(self, state: State) -> list[tuple]:
        """Every legal action from `state` (stop last)."""
        out: list[tuple] = []
        resolved = {k for k, _ in state.options}
        for g, group in enumerate(self.conflict_groups):
            if any(k in resolved or k in self.fixed_conflicts for k in group):
                continue
            n = min(len(self.ana.conflicts[k].options) for k in group)
            for o in range(n):
                if not any((k, o) in self.forbidden_options for k in group):
                    out.append(("resolve", g, o))
        counts = self._axis_counts(state.masks)
        for u, unit in enumerate(self.units(state.options)):
            for a in range(self.n_axes):
                if self.why_illegal_shard(state, unit, a, counts) is None:
                    out.append(("shard", u, a))
        out.append(("stop",))
        return out

    def _axis_counts(self, masks: np.ndarray):
        bits = ((masks[None, :] >> np.arange(self.n_axes)[:, None]) & 1).astype(np.float64)
        return (self.lay.value_fine @ bits.T, self.lay.use_fine @ bits.T)

    def why_illegal_shard(self, state: State, unit: Unit, a: int, counts=None) -> str | None:
        """None if adding mesh axis `a` to `unit` is legal, else the reason."""
        bit = 1 << a
        m = int(state.masks[unit.fines[0]])
        if m & bit:
            return "already on that mesh axis"
        forbidden, splits = self._unit_info(unit.fines)
        if forbidden & bit:
            return "forbidden by the user"
        if unit.size % int(self.ways[m | bit]):
            return f"size {unit.size} is not divisible by {int(self.ways[m | bit])} shards"
        if counts is None:
            counts = self._axis_counts(state.masks)
        for (rows, add), cnt in zip(self._touch(unit.fines), (counts[0][:, a], counts[1][:, a])):
            if np.any(cnt[rows] + add > 1.5):
                return "a value or op would hold that mesh axis twice"
        fine_set = set(unit.fines)
        for split in splits:
            masks = state.masks[list(split)].copy()
            for k, g in enumerate(split):
                if g in fine_set:
                    masks[k] |= bit
            for k in range(1, len(split)):
                if masks[k] and any(
                    self.ways[masks[j]] != self.ana.fine_size[split[j]] for j in range(k)
                ):
                    return "it would shard a minor sub-factor of a split dim (strided)"
        return None

    def _unit_info(self, fines: tuple[int, ...]):
        """(forbidden axis bits, distinct split dims touching the unit), cached per unit."""
        hit = self._info_cache.get(fines)
        if hit is None:
            forbidden = 0
            for f in fines:
                forbidden |= self.forbidden_axes.get(f, 0)
            splits = {split for f in fines for split in self.splits_of_fine.get(f, ())}
            hit = self._info_cache[fines] = (forbidden, sorted(splits))
        return hit

    def _touch(self, fines: tuple[int, ...]):
        """Rows (values, ops) holding these fine classes, with how many atoms each holds."""
        hit = self._touch_cache.get(fines)
        if hit is None:
            hit = []
            for cols in (self.value_cols, self.use_cols):
                add = np.asarray(cols[:, list(fines)].sum(axis=1)).ravel()
                rows = np.flatnonzero(add)
                hit.append((rows, add[rows]))
            self._touch_cache[fines] = hit
        return hit

    def apply(self, state: State, action: tuple) -> State:
        if action[0] == "resolve":
            _, g, o = action
            opts = tuple(sorted(set(state.options) | {(k, o) for k in self.conflict_groups[g]}))
            return State(opts, state.masks)
        if action[0] == "shard":
            _, u, a = action
            unit = self.units(state.options)[u]
            masks = state.masks.copy()
            masks[list(unit.fines)] |= 1 << a
            return State(state.options, masks)
        return state

    def action_text(self, state: State, action: tuple) -> str:
        if action[0] == "resolve":
            _, g, o = action
            ks = ", ".join(f"K{k}" for k in self.conflict_groups[g])
            return f"resolve {ks} with option {o}"
        if action[0] == "shard":
            _, u, a = action
            unit = self.units(state.options)[u]
            return f"shard {'+'.join(unit.dims)} on {self.mesh.axis_names[a]}"
        return "stop"

    # -- conversion ----------------------------------------------------------------------------

    def to_strategy(self, state: State, name: str = "") -> Strategy:
        res = resolve(self.ana, state.options)
        shardings = {}
        for d in res.dims:
            m = int(state.masks[d.fine[0]])
            if m:
                shardings[d.name] = tuple(
                    a for i, a in enumerate(self.mesh.axis_names) if m >> i & 1
                )
        return Strategy.make(self.ana, shardings, state.options, name)

    def from_strategy(self, strategy: Strategy) -> State:
        return State(tuple(strategy.options), strategy._masks(self.ana, self.mesh))


def check_pins(ana: Analysis, mesh: MeshSpec, pins=(), forbids=()) -> Strategy:
    """Checks pins and forbids without searching; returns the pinned starting strategy.

    Raises `PinError` naming the pin when one cannot be parsed, names nothing, or contradicts
    another pin, a forbid, or the mesh (divisibility, a mesh axis held twice).
    """
    space = DecisionSpace(ana, mesh, None, pins, forbids)
    return space.to_strategy(space.root, "pins")
