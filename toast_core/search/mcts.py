"""Monte Carlo Tree Search over the named-dim decision space.

Single-player MCTS in a deterministic environment (after mctx's split of selection, expansion,
simulation and backup):

* **Selection** walks from the root by UCT, `Q/N + c * sqrt(ln N_parent / N)`, over children in a
  **transposition table** keyed by the canonical state (decisions commute, so the tree is a DAG).
* **Expansion** adds one untried action, in prior order: the decision units that cover the most
  bytes first, then conflict resolutions, then stop.
* **Simulation**: a random rollout of legal actions biased to large units, ending at `stop`. Every
  state is a complete strategy, so the new node and the rollout's end are both scored by the cost
  model; the better one is the reward.
* **Backup** adds the reward along the path.
* The **best state ever scored** is kept (the environment is deterministic): memory-feasible
  states always beat infeasible ones, then lower step time.

Reward: a feasible state with step time t scores `0.1 + 0.9 * ref / (ref + t)` (0.55 at the best
baseline's time `ref`); an infeasible one `0.1 * min(1, capacity / peak)`, so the search climbs
towards feasibility. Before the tree search the baselines that honour the pins are scored (the
search never returns worse than them) and a greedy descent by the cost model from the root and
from the best baseline gives a strong anytime answer.

Budgets are in simulations and/or seconds; with `num_simulations` set and `budget_s=None` the
search is deterministic for a seed.
"""

from __future__ import annotations

import math
import time
import warnings as _warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from toast_core.analysis import Analysis
from toast_core.cost import CostReport, Score, evaluator
from toast_core.errors import ToastError, bad_value
from toast_core.mesh import HardwareSpec, MeshSpec
from toast_core.search.baselines import all_baselines
from toast_core.search.space import DecisionSpace, State
from toast_core.strategy import Strategy

UCT_C = 0.7
STOP_PROBABILITY = 0.25


@dataclass(frozen=True)
class SearchEvent:
    iteration: int
    elapsed_s: float
    best_step_time_s: float
    best_peak_bytes: float
    best_fits: bool
    best_strategy: Strategy
    tree_size: int
    evaluations: int
    evals_per_s: float
    done: bool = False


@dataclass(frozen=True)
class SearchResult:
    best: Strategy
    report: CostReport
    feasible: bool
    iterations: int
    evaluations: int
    elapsed_s: float
    history: tuple[tuple[int, float, float], ...] = ()  # (iteration, elapsed_s, best step time)
    baselines: dict = field(default_factory=dict)  # name -> step time (feasible) or None
    warnings: tuple[str, ...] = ()
    time_to_best_baseline_s: float | None = None


class _Node:
    __slots__ = ("state", "visits", "value", "children", "untried", "terminal")

    def __init__(self, state: State, actions: list[tuple]) -> None:
        self.state = state
        self.visits = 0
        self.value = 0.0
        self.children: dict[tuple, tuple] = {}
        self.untried = actions
        self.terminal = len(actions) <= 1


class _Search:
    def __init__(self, ana, mesh, hw, *, seed, pins, forbids, memory_headroom, overlap):
        self.ev = evaluator(ana, mesh, hw, overlap=overlap, memory_headroom=memory_headroom)
        self.space = DecisionSpace(ana, mesh, self.ev, pins, forbids)
        self.rng = np.random.default_rng(seed)
        self.scores: dict[tuple, Score] = {}
        self.table: dict[tuple, _Node] = {}
        self.evaluations = 0
        self.best_state: State | None = None
        self.best_score: Score | None = None
        self.ref = None
        self.baseline_times: dict[str, float | None] = {}
        self.best_baseline_time: float | None = None

    # -- scoring -------------------------------------------------------------------------------

    def score(self, state: State) -> Score:
        key = state.key
        s = self.scores.get(key)
        if s is None:
            s = self.ev.score(state.masks)
            self.scores[key] = s
            self.evaluations += 1
            if self.best_score is None or _better(s, self.best_score):
                self.best_score, self.best_state = s, state
        return s

    def reward(self, s: Score) -> float:
        if not s.fits:
            return 0.1 * min(1.0, self.ev.capacity_bytes / max(s.peak_bytes, 1.0))
        return 0.1 + 0.9 * self.ref / (self.ref + s.step_time_s)

    # -- seeding -------------------------------------------------------------------------------

    def seed_baselines(self) -> None:
        """Scores the root and every baseline that honours the pins."""
        space = self.space
        self.score(space.root)
        for name, (strategy, _) in all_baselines(space.ana, space.mesh).items():
            if strategy is None:
                self.baseline_times[name] = None
                continue
            state = space.from_strategy(strategy)
            if not space.admits(state):
                self.baseline_times[name] = None
                continue
            s = self.score(state)
            self.baseline_times[name] = s.step_time_s if s.fits else None
        feasible = [t for t in self.baseline_times.values() if t is not None]
        self.best_baseline_time = min(feasible) if feasible else None
        self.ref = self.best_baseline_time or self.best_score.step_time_s or 1.0

    def descend(self, deadline: float | None = None) -> None:
        """Greedy descents by the cost model: a strong anytime answer before the tree search."""
        space = self.space
        # Descend first from the best baseline (usually close to a good plan), then from scratch.
        starts = (
            [self.best_state, space.root] if self.best_state.key != space.root.key else [space.root]
        )
        for start in starts:
            self.greedy(start, deadline=deadline)

    def greedy(self, state: State, max_steps: int = 64, deadline: float | None = None) -> State:
        """Steepest descent by the cost model over single actions.

        Resolving a conflict changes no cost by itself (parts inherit their mesh axes); its value
        shows only once a part is sharded differently. So a resolution is scored together with
        the best way to shard one of the parts it creates (a two-step look-ahead).
        """
        current, cur = state, self.score(state)
        for _ in range(max_steps):
            if deadline is not None and time.perf_counter() > deadline:
                break
            best_next, best_s = None, cur
            for a in self.space.actions(current):
                if a[0] == "stop":
                    continue
                nxt = self.space.apply(current, a)
                candidates = [nxt] if a[0] == "shard" else self._follow_ups(nxt, a)
                for cand in candidates:
                    s = self.score(cand)
                    if _better(s, best_s):
                        best_next, best_s = cand, s
            if best_next is None:
                break
            current, cur = best_next, best_s
        return current

    def _follow_ups(self, state: State, resolve_action: tuple) -> list[State]:
        """States that shard one part of the named dims a resolution just split."""
        space = self.space
        parents = {
            d
            for k in space.conflict_groups[resolve_action[1]]
            for d in space.ana.conflicts[k].named_dims
        }
        res_dims = {d.name: d.parent for d in space.resolution(state.options).dims}
        counts = space._axis_counts(state.masks)
        out = []
        for u, unit in enumerate(space.units(state.options)):
            if not any(res_dims.get(n) in parents for n in unit.dims):
                continue
            for a in range(space.n_axes):
                if space.why_illegal_shard(state, unit, a, counts) is None:
                    out.append(space.apply(state, ("shard", u, a)))
        return out

    # -- tree search ---------------------------------------------------------------------------

    def node(self, state: State) -> _Node:
        n = self.table.get(state.key)
        if n is None:
            n = _Node(state, self._ordered_actions(state))
            self.table[state.key] = n
        return n

    def _ordered_actions(self, state: State) -> list[tuple]:
        acts = self.space.actions(state)
        # Pop from the end: stop expands last, large units first.
        shard = [a for a in acts if a[0] == "shard"]
        resolve = [a for a in acts if a[0] == "resolve"]
        stop = [a for a in acts if a[0] == "stop"]
        return stop + list(reversed(resolve)) + list(reversed(shard))

    def iterate(self) -> None:
        root = self.node(self.space.root)
        path = [root]
        node = root
        while not node.terminal and not node.untried and node.children:
            node = self._select(node)
            path.append(node)
        if not node.terminal and node.untried:
            action = node.untried.pop()
            child_state = self.space.apply(node.state, action)
            if action[0] == "stop":
                child = _Node(child_state, [])
            else:
                child = self.node(child_state)
            node.children[action] = (child_state.key, child)
            path.append(child)
            node = child
        r = max(self.reward(self.score(node.state)), self.reward(self.rollout(node.state)))
        for n in path:
            n.visits += 1
            n.value += r

    def _select(self, node: _Node) -> _Node:
        log_n = math.log(max(node.visits, 1))
        best, best_u = None, -1.0
        for _, (_, child) in sorted(node.children.items()):
            if child.visits == 0:
                return child
            u = child.value / child.visits + UCT_C * math.sqrt(log_n / child.visits)
            if u > best_u:
                best, best_u = child, u
        return best

    def rollout(self, state: State, max_steps: int = 24) -> Score:
        """Random legal actions until stop; candidates are sampled (large units more often) and
        checked one at a time, which is much cheaper than listing every legal action."""
        space = self.space
        for _ in range(max_steps):
            if self.rng.random() < STOP_PROBABILITY:
                break
            units = space.units(state.options)
            resolved = {k for k, _ in state.options}
            groups = [
                g
                for g, grp in enumerate(space.conflict_groups)
                if not any(k in resolved or k in space.fixed_conflicts for k in grp)
            ]
            n_shard = len(units) * space.n_axes
            weights = np.array(
                [math.log1p(u.bytes_covered) for u in units for _ in range(space.n_axes)]
                + [8.0] * len(groups)
            )
            if not len(weights):
                break
            counts = space._axis_counts(state.masks)
            nxt = None
            for _ in range(12):
                i = int(self.rng.choice(len(weights), p=weights / weights.sum()))
                if i < n_shard:
                    u, a = divmod(i, space.n_axes)
                    if space.why_illegal_shard(state, units[u], a, counts) is None:
                        nxt = space.apply(state, ("shard", u, a))
                        break
                else:
                    g = groups[i - n_shard]
                    n = min(len(space.ana.conflicts[k].options) for k in space.conflict_groups[g])
                    o = int(self.rng.integers(n))
                    if not any((k, o) in space.forbidden_options for k in space.conflict_groups[g]):
                        nxt = space.apply(state, ("resolve", g, o))
                        break
            if nxt is None:
                break
            state = nxt
        return self.score(state)


def _better(a: Score, b: Score) -> bool:
    if a.fits != b.fits:
        return a.fits
    if not a.fits:
        return a.peak_bytes < b.peak_bytes
    return a.step_time_s < b.step_time_s - 1e-15


def search_iter(
    ana: Analysis,
    mesh: MeshSpec,
    hw: HardwareSpec,
    *,
    budget_s: float | None = 10.0,
    num_simulations: int | None = None,
    seed: int = 0,
    pins=(),
    forbids=(),
    memory_headroom: float = 0.1,
    overlap: float = 0.0,
    report_every_s: float = 0.2,
) -> Iterator[SearchEvent]:
    """Runs the search, yielding progress events; stop iterating at any time to keep the best.

    The last event has `done=True`. Budgets: seconds (`budget_s`) and/or simulations
    (`num_simulations`); at least one must be given.
    """
    if budget_s is None and num_simulations is None:
        raise ToastError(bad_value("budget_s", None, "a time budget when num_simulations is None"))
    if budget_s is not None and not budget_s > 0:
        raise ToastError(bad_value("budget_s", budget_s, "a positive number of seconds"))
    if num_simulations is not None and (
        not isinstance(num_simulations, int) or num_simulations < 0
    ):
        raise ToastError(bad_value("num_simulations", num_simulations, "a non-negative int"))
    start = time.perf_counter()
    s = _Search(
        ana,
        mesh,
        hw,
        seed=seed,
        pins=pins,
        forbids=forbids,
        memory_headroom=memory_headroom,
        overlap=overlap,
    )
    # Time budgets: half for seeding (baselines, greedy descents), the rest for the tree, and a
    # final polish allowed to overrun by a tenth of the budget. No deadlines in simulation mode,
    # so that a seeded run is deterministic.
    seed_deadline = start + 0.5 * budget_s if budget_s is not None else None
    polish_deadline = start + 1.1 * budget_s if budget_s is not None else None

    def event(i: int, done: bool) -> SearchEvent:
        elapsed = time.perf_counter() - start
        return SearchEvent(
            iteration=i,
            elapsed_s=elapsed,
            best_step_time_s=s.best_score.step_time_s,
            best_peak_bytes=s.best_score.peak_bytes,
            best_fits=s.best_score.fits,
            best_strategy=s.space.to_strategy(s.best_state, "search"),
            tree_size=len(s.table),
            evaluations=s.evaluations,
            evals_per_s=s.evaluations / elapsed if elapsed > 0 else 0.0,
            done=done,
        )

    s.seed_baselines()
    yield event(0, False)  # the best baseline, at once
    s.descend(seed_deadline)
    yield event(0, False)
    last = time.perf_counter()
    i = 0
    root = s.node(s.space.root)
    while True:
        if num_simulations is not None and i >= num_simulations:
            break
        if budget_s is not None and time.perf_counter() - start >= budget_s:
            break
        if root.terminal or (not root.untried and _exhausted(root)):
            break
        s.iterate()
        i += 1
        if time.perf_counter() - last >= report_every_s:
            last = time.perf_counter()
            yield event(i, False)
    # Polish the best state found with a greedy descent.
    s.greedy(s.best_state, deadline=polish_deadline)
    yield event(i, True)


def _exhausted(root: _Node) -> bool:
    return all(child.terminal and not child.untried for _, child in root.children.values())


def search(
    ana: Analysis,
    mesh: MeshSpec,
    hw: HardwareSpec,
    *,
    budget_s: float | None = 10.0,
    num_simulations: int | None = None,
    seed: int = 0,
    pins=(),
    forbids=(),
    memory_headroom: float = 0.1,
    overlap: float = 0.0,
) -> SearchResult:
    """Finds a low step-time strategy that fits memory; see `search_iter` for the arguments."""
    history = []
    last = None
    best_base = None
    t_reach = None
    for ev in search_iter(
        ana,
        mesh,
        hw,
        budget_s=budget_s,
        num_simulations=num_simulations,
        seed=seed,
        pins=pins,
        forbids=forbids,
        memory_headroom=memory_headroom,
        overlap=overlap,
    ):
        history.append((ev.iteration, ev.elapsed_s, ev.best_step_time_s))
        last = ev
    base = all_baselines(ana, mesh)
    report_kw = dict(overlap=overlap, memory_headroom=memory_headroom)
    ev_ = evaluator(ana, mesh, hw, **report_kw)
    times = {}
    for name, (strategy, _) in base.items():
        if strategy is None:
            times[name] = None
            continue
        sc = ev_.score(strategy._masks(ana, mesh))
        times[name] = sc.step_time_s if sc.fits else None
    feasible_times = [t for t in times.values() if t is not None]
    if feasible_times:
        best_base = min(feasible_times)
        for _, t_s, best in history:
            if best <= best_base * (1 + 1e-9):
                t_reach = t_s
                break
    report = ev_.report(last.best_strategy)
    warnings = ()
    if not report.fits:
        warnings = (
            "NO MEMORY-FEASIBLE STRATEGY FOUND: the least infeasible one needs "
            f"{_fmt_bytes(report.peak_bytes)} per device, over the "
            f"{_fmt_bytes(report.capacity_bytes)} allowed",
        )
        _warnings.warn(warnings[0], RuntimeWarning, stacklevel=2)
    return SearchResult(
        best=last.best_strategy,
        report=report,
        feasible=report.fits,
        iterations=last.iteration,
        evaluations=last.evaluations,
        elapsed_s=last.elapsed_s,
        history=tuple(history),
        baselines=times,
        warnings=warnings,
        time_to_best_baseline_s=t_reach,
    )


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
