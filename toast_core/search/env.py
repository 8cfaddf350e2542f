"""The search environment: legal actions and transitions over a `StrategySpace` under pins.

States are `StrategySpace` states (conflict options + a mesh-axis mask per fine class); the
environment adds the user's `Constraints` (pinned units leave the decision, forbidden axes and
options are masked) and is the one place that says which actions are legal and what they do:

* `Resolve(g, o)` resolves every conflict of decision group g with option o; cuts only split named
  dims, whose parts inherit their mesh axes, so it never makes a state illegal;
* `Shard(u, a)` adds mesh axis a to every fine class of unit u, if `legality.why_illegal_shard`
  allows it;
* `Remat(g, p)` gives remat group g policy p (`dots`, `full`, `dots_no_batch`), once per group,
  unless a pin fixes the group or a forbid excludes the policy; it changes only the price
  (recompute flops, shorter activation lifetimes), never legality;
* `Stop()` ends the episode.

Both the tree (which lists every legal action) and the rollout (which samples a few candidates
and checks them one at a time, much cheaper than listing) go through the same checks.
"""

from __future__ import annotations

import math

import numpy as np

from toast_core.search.types import Action, Remat, Resolve, Shard, Stop
from toast_core.strategy import (
    POLICIES,
    Constraints,
    State,
    Strategy,
    StrategySpace,
    Unit,
    legality,
)

#: Rollout weight of a conflict resolution, against log(1 + bytes covered) for a shard.
RESOLVE_WEIGHT = 8.0
#: Rollout weight of a remat decision (a bit above a conflict: memory often binds).
REMAT_WEIGHT = 10.0
#: Candidates a rollout step samples before it gives up.
ROLLOUT_TRIES = 12
#: Units tuples whose rollout weights the environment remembers.
WEIGHTS_KEPT = 1024


class Environment:
    def __init__(self, space: StrategySpace, constraints: Constraints) -> None:
        self.space, self.constraints = space, constraints
        self.ana, self.mesh = space.ana, space.mesh
        self.n_axes = space.axes.n
        self.root = constraints.root
        self.groups = space.conflict_groups
        # (id(units), picked units or None) -> (units, `legality.UnitTable`)
        self._unit_tables: dict[tuple, tuple] = {}
        # id(units) -> (units, rollout weights, cumulative weights by (resolutions, remats))
        self._shard_weights: dict[int, tuple] = {}
        self._open_groups: dict[tuple, list[int]] = {}  # options -> `open_groups`
        self._resolves: dict[tuple, list[Resolve]] = {}  # options -> their legal resolutions
        self._remats: dict[tuple, tuple[Remat, ...]] = {}  # remat -> `remat_actions`
        self._units: dict[tuple, tuple[Unit, ...]] = {}  # options -> `units`
        # id(units) -> (units, their `legality.ShardCheck`s and forbidden mesh axes)
        self._unit_checks: dict[int, tuple] = {}
        self._shards: list[Shard] = []  # `_shard_objects`
        self._n_options = [
            min(len(self.ana.conflicts[k].options) for k in grp) for grp in self.groups
        ]

    # -- units and groups ----------------------------------------------------------------------

    def units(self, state: State) -> tuple[Unit, ...]:
        """The units of decision of `state` under the pins (`StrategySpace.units`), looked up
        per resolution here first (every step of the search asks, the space's cache locks)."""
        hit = self._units.get(state.options)
        if hit is None:
            if len(self._units) >= WEIGHTS_KEPT:
                self._units.clear()
            hit = self.space.units(state.options, self.constraints.pinned_fines)
            self._units[state.options] = hit
        return hit

    def _checks(self, state: State) -> tuple[tuple, list[int]]:
        """The `legality.ShardCheck` of each unit of `state` (its fine classes as an index
        array, which `apply` sets) and the mesh axes the pins forbid on it."""
        units = self.units(state)
        hit = self._unit_checks.get(id(units))
        if hit is None or hit[0] is not units:
            if len(self._unit_checks) >= WEIGHTS_KEPT:
                self._unit_checks.clear()
            checks = self.space.unit_checks(state.options, self.constraints.pinned_fines)
            forbidden = [self.constraints.forbidden_bits(u.fines) for u in units]
            hit = self._unit_checks[id(units)] = (units, checks, forbidden)
        return hit[1], hit[2]

    def units_of_parts(self, state: State, group: int) -> tuple[int, ...]:
        """Indices of the units of `state` holding a part of a named dim that conflict group
        `group` splits (the greedy descent's follow-ups of a resolution; memoized by the
        space: a descent asks again at every step)."""
        return self.space.units_of_parts(state.options, self.constraints.pinned_fines, group)

    def open_groups(self, state: State) -> list[int]:
        """Decision groups with no conflict resolved yet (by the state or a pin)."""
        return list(self._open(state))

    def _open(self, state: State) -> list[int]:
        """`open_groups`, memoized per resolution (the tree and the rollouts ask again at every
        step); not to be changed."""
        hit = self._open_groups.get(state.options)
        if hit is None:
            done = {k for k, _ in state.options} | self.constraints.fixed_conflicts
            hit = [g for g, grp in enumerate(self.groups) if not any(k in done for k in grp)]
            if len(self._open_groups) >= WEIGHTS_KEPT:
                self._open_groups.clear()
            self._open_groups[state.options] = hit
        return hit

    def n_options(self, g: int) -> int:
        return self._n_options[g]

    def may_resolve(self, g: int, o: int) -> bool:
        forbidden = self.constraints.forbidden_options
        return not any((k, o) in forbidden for k in self.groups[g])

    def open_remat(self, state: State) -> list[int]:
        """Remat groups with no policy chosen yet (by the state or a pin)."""
        done = {g for g, _ in state.remat} | self.constraints.fixed_remat
        return [g for g in range(len(self.space.remat.groups)) if g not in done]

    def may_remat(self, g: int, p: int) -> bool:
        return (g, p) not in self.constraints.forbidden_remat

    def remat_actions(self, state: State) -> list[Remat]:
        return list(self._remat_actions(state))

    def _remat_actions(self, state: State) -> tuple[Remat, ...]:
        """`remat_actions`, memoized per remat policies (the rollouts ask at every step)."""
        hit = self._remats.get(state.remat)
        if hit is None:
            hit = tuple(
                Remat(g, p)
                for g in self.open_remat(state)
                for p in range(1, len(POLICIES))
                if self.may_remat(g, p)
            )
            if len(self._remats) >= WEIGHTS_KEPT:
                self._remats.clear()
            self._remats[state.remat] = hit
        return hit

    def remat_relaxations(self, state: State) -> list[State]:
        """States that choose another policy for one remat group (none included): the greedy
        descent's way back once memory no longer binds (full -> dots_no_batch -> dots -> none),
        or over to a policy that recomputes less and still fits."""
        out = []
        for g, p in state.remat:
            if g in self.constraints.fixed_remat:
                continue
            for q in range(len(POLICIES)):
                if q != p and self.may_remat(g, q):
                    rest = tuple(x for x in state.remat if x[0] != g)
                    remat = tuple(sorted(rest + (((g, q),) if q else ())))
                    out.append(State(state.options, state.masks, remat))
        return out

    def why_illegal_shard(self, state: State, unit: Unit, a: int) -> str | None:
        forbidden = self.constraints.forbidden_bits(unit.fines)
        return self.space.why_illegal_shard(state, unit, a, forbidden)

    # -- actions -------------------------------------------------------------------------------

    def legal_actions(self, state: State) -> list[Action]:
        """Every legal action from `state`: resolutions, shards, remat choices, then stop."""
        out: list[Action] = list(self._resolve_actions(state))
        out += self.shard_actions(state)
        out += self._remat_actions(state)
        out.append(Stop())
        return out

    def _resolve_actions(self, state: State) -> list[Resolve]:
        """The legal resolutions of `state`, memoized per resolution."""
        hit = self._resolves.get(state.options)
        if hit is None:
            hit = [
                Resolve(g, o)
                for g in self._open(state)
                for o in range(self.n_options(g))
                if self.may_resolve(g, o)
            ]
            if len(self._resolves) >= WEIGHTS_KEPT:
                self._resolves.clear()
            self._resolves[state.options] = hit
        return hit

    def shard_actions(self, state: State, units=None) -> list[Shard]:
        """Legal shards of `units` (indices; all by default): only those units are checked (a
        greedy step asks for the few parts a resolution creates)."""
        all_units = self.units(state)
        picked = None if units is None else tuple(units)
        table = self._unit_table(state, all_units, picked)
        legal = np.flatnonzero(legality.legal_shards(self.space, state.masks, table)).tolist()
        if not legal:
            return []
        shards = self._shard_objects(len(all_units))
        if picked is None:
            return [shards[i] for i in legal]
        n = self.n_axes
        return [shards[picked[i // n] * n + i % n] for i in legal]

    def _shard_objects(self, n_units: int) -> list[Shard]:
        """`Shard(u, a)` at index `u * n_axes + a`, for units 0 to `n_units` - 1 at least (made
        once: a search lists thousands)."""
        have = len(self._shards) // self.n_axes
        if have < n_units:
            self._shards += [Shard(u, a) for u in range(have, n_units) for a in range(self.n_axes)]
        return self._shards

    def _unit_table(
        self, state: State, units: tuple[Unit, ...], picked: tuple[int, ...] | None
    ) -> legality.UnitTable:
        """`legality.UnitTable` of the state's units (`units`; those at indices `picked`, if
        given) under the pins: looked up per units tuple, made once per resolution and pins by
        the space (every search on it)."""
        key = (id(units), picked)
        hit = self._unit_tables.get(key)
        if hit is None or hit[0] is not units:
            if len(self._unit_tables) >= WEIGHTS_KEPT:
                self._unit_tables.clear()
            chosen = units if picked is None else [units[u] for u in picked]
            forbidden = tuple(self.constraints.forbidden_bits(u.fines) for u in chosen)
            pinned = self.constraints.pinned_fines
            hit = (units, self.space.unit_table(state.options, pinned, forbidden, picked))
            self._unit_tables[key] = hit
        return hit[1]

    def apply(self, state: State, action: Action) -> State:
        if isinstance(action, Shard):  # the common case (greedy steps, rollouts) first
            masks = state.masks.copy()
            fines = self._checks(state)[0][action.unit].fines
            # Not `masks[fines] |= bit`: NumPy's in-place fancy update is 3x slower.
            masks[fines] = masks[fines] | (1 << action.axis)
            return State(state.options, masks, state.remat)
        if isinstance(action, Resolve):
            chosen = {(k, action.option) for k in self.groups[action.group]}
            return State(tuple(sorted(set(state.options) | chosen)), state.masks, state.remat)
        if isinstance(action, Remat):
            rest = tuple(x for x in state.remat if x[0] != action.group)
            return State(
                state.options, state.masks, tuple(sorted(rest + ((action.group, action.policy),)))
            )
        return state

    def random_action(self, state: State, rng: np.random.Generator) -> Action | None:
        """A random legal action for rollouts (large units more often), or None when a few
        sampled candidates were all illegal."""
        units = self.units(state)
        groups = self._open(state)
        remats = self._remat_actions(state)
        n_shard = len(units) * self.n_axes
        cdf = self._rollout_cdf(units, len(groups), len(remats))
        if not len(cdf):
            return None
        checks, forbidden = self._checks(state)
        for _ in range(ROLLOUT_TRIES):
            # `rng.choice(len(w), p=w / w.sum())` as numpy computes it (the same draw of the
            # same stream), with the cumulative weights computed once per kind of state.
            i = int(cdf.searchsorted(rng.random(), side="right"))
            if i < n_shard:
                u, a = divmod(i, self.n_axes)
                why = legality.why_illegal_check(
                    self.space, state.masks, checks[u], units[u].size, a, forbidden[u]
                )
                if why is None:
                    return Shard(u, a)
            elif i < n_shard + len(groups):
                g = groups[i - n_shard]
                o = int(rng.integers(self.n_options(g)))
                if self.may_resolve(g, o):
                    return Resolve(g, o)
            else:
                return remats[i - n_shard - len(groups)]
        return None

    def _rollout_cdf(self, units: tuple[Unit, ...], n_groups: int, n_remats: int) -> np.ndarray:
        """Normalized cumulative rollout weights of the shards of `units`, then `n_groups`
        resolutions, then `n_remats` remat choices (as `Generator.choice` builds them from the
        probabilities); memoized with the units' weights."""
        self._unit_weights(units)
        by_counts = self._shard_weights[id(units)][2]
        cdf = by_counts.get((n_groups, n_remats))
        if cdf is None:
            weights = np.concatenate(
                (
                    self._unit_weights(units),
                    np.full(n_groups, RESOLVE_WEIGHT),
                    np.full(n_remats, REMAT_WEIGHT / 2),
                )
            )
            if len(weights):
                cdf = (weights / weights.sum()).cumsum()
                cdf /= cdf[-1]
            else:
                cdf = weights
            by_counts[(n_groups, n_remats)] = cdf
        return cdf

    def _unit_weights(self, units: tuple[Unit, ...]) -> np.ndarray:
        """Rollout weights of the shards of `units` (log(1 + bytes covered), per mesh axis);
        memoized per units tuple (the space hands out one tuple per resolution)."""
        hit = self._shard_weights.get(id(units))
        if hit is None or hit[0] is not units:
            if len(self._shard_weights) >= WEIGHTS_KEPT:
                self._shard_weights.clear()
            w = np.array([math.log1p(u.bytes_covered) for u in units for _ in range(self.n_axes)])
            hit = self._shard_weights[id(units)] = (units, w, {})
        return hit[1]

    def describe(self, state: State, action: Action) -> str:
        """An action in words: `shard N3, N7 on model`, `resolve K2, K5 with option 1`, `stop`."""
        if isinstance(action, Resolve):
            ks = ", ".join(f"K{k}" for k in self.groups[action.group])
            return f"resolve {ks} with option {action.option}"
        if isinstance(action, Shard):
            dims = self.units(state)[action.unit].dims
            shown = ", ".join(dims[:3]) + (f" (+{len(dims) - 3})" if len(dims) > 3 else "")
            return f"shard {shown} on {self.space.axes.names[action.axis]}"
        return "stop"

    # -- conversion ----------------------------------------------------------------------------

    def admits(self, state: State) -> bool:
        return self.constraints.admits(state)

    def to_strategy(self, state: State, name: str = "") -> Strategy:
        return Strategy.from_state(self.space, state, name)

    def from_strategy(self, strategy: Strategy) -> State:
        return strategy.to_state(self.space)
