"""Monte Carlo Tree Search over the named-dim decision space.

Single-player MCTS in a deterministic environment, after mctx's split: `types.py` (actions,
settings, events), `env.py` (legal actions and transitions under pins), `tree.py` (nodes, the
transposition table, backup), `selection.py` (UCT), `seeding.py` (baselines, greedy descents),
`scoring.py` (the cost model and the best state); this module is the loop:

* **Selection** walks from the root by UCT, `Q/N + c * sqrt(ln N_parent / N)`, over children in a
  **transposition table** keyed by the canonical state (decisions commute, so the tree is a DAG).
* **Expansion** adds one untried action, in prior order: the decision units that cover the most
  bytes first, then conflict resolutions, then stop.
* **Simulation**: a random rollout of legal actions biased to large units, ending at `stop`. Every
  state is a complete strategy, so the new node and the rollout's end are both scored by the cost
  model; the better one is the reward.
* **Backup** adds the reward along the path.
* The loop ends at the budget, or at once when the root has nothing left to decide.
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

import time
import warnings as _warnings
from collections.abc import Iterator

import numpy as np

from toast_core.analysis import Analysis
from toast_core.cost import Score, evaluator
from toast_core.fmt import fmt_bytes, fmt_s
from toast_core.gcpause import gc_paused
from toast_core.mesh import HardwareSpec, MeshSpec
from toast_core.search import parallel, seeding
from toast_core.search.env import Environment
from toast_core.search.scoring import Scorer
from toast_core.search.selection import uct
from toast_core.search.tree import Tree, backup
from toast_core.search.types import (
    SearchEvent,
    SearchResult,
    SearchSettings,
    TreeEdge,
    settings_of,
)
from toast_core.search.verify import verify_plans
from toast_core.strategy import State, Strategy, constrain, space_of

STOP_PROBABILITY = 0.25
ROLLOUT_STEPS = 24


class _Run:
    """One search: the environment, the scorer, the tree and the reward scale."""

    def __init__(self, ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, st: SearchSettings):
        space = space_of(ana, mesh)
        self.env = Environment(space, constrain(space, st.pins, st.forbids))
        self.scorer = Scorer(evaluator(ana, mesh, hw, st.cost_options), keep=st.verify)
        self.tree = Tree(self.env.legal_actions)
        self.rng = np.random.default_rng(st.seed)
        self.ref = 1.0
        self.baselines: dict = {}
        self._shown: tuple | None = None  # (state, its strategy) last shown in an event

    def strategy_of(self, state: State) -> Strategy:
        """The strategy of `state` named `search` (the last one is kept: every event shows
        the best state, which seldom changes between two)."""
        if self._shown is None or self._shown[0] is not state:
            self._shown = (state, self.env.to_strategy(state, "search"))
        return self._shown[1]

    def seed(self, deadline: float | None = None, until: float | None = None) -> None:
        self.baselines, admitted = seeding.score_baselines(self.scorer, self.env, deadline, until)
        feasible = [t for t in admitted.values() if t is not None]
        self.ref = min(feasible) if feasible else (self.scorer.best_score.step_time_s or 1.0)

    def reward(self, s: Score) -> float:
        if not s.fits:
            return 0.1 * min(1.0, self.scorer.ev.capacity_bytes / max(s.peak_bytes, 1.0))
        total = self.ref + s.step_time_s  # 0 for a program with no work (an identity transpose)
        return 0.1 + 0.9 * (self.ref / total if total > 0 else 1.0)

    def iterate(self) -> None:
        """One simulation: select, expand, roll out, back up."""
        node = self.tree.node(self.env.root)
        path = [node]
        while not node.terminal and not node.untried and node.children:
            node = uct(node)
            path.append(node)
        parent = node.state
        if not node.terminal and node.untried:
            node = self.tree.expand(node, self.env.apply)
            path.append(node)
        score = self.scorer.score(node.state, parent)
        r = max(self.reward(score), self.reward(self.rollout(node.state)))
        backup(path, r)

    def rollout(self, state: State) -> Score:
        """Random legal actions until stop."""
        start = state
        for _ in range(ROLLOUT_STEPS):
            if self.rng.random() < STOP_PROBABILITY:
                break
            action = self.env.random_action(state, self.rng)
            if action is None:
                break
            state = self.env.apply(state, action)
        return self.scorer.score(state, start)

    def tree_top(self, width: int = 6) -> tuple[TreeEdge, ...]:
        """The `width` most visited children of the root and of each of those (for teaching)."""
        out: list[TreeEdge] = []
        root = self.tree.table.get(self.env.root.key)
        if root is None:
            return ()

        def edges(node, depth, parent):
            kids = sorted(node.children.items(), key=lambda kv: -kv[1].visits)[:width]
            for action, child in kids:
                if child.visits == 0:
                    continue
                out.append(
                    TreeEdge(
                        depth,
                        parent,
                        self.env.describe(node.state, action),
                        child.visits,
                        child.value / child.visits,
                    )
                )
                if depth == 1:
                    edges(child, 2, len(out) - 1)

        edges(root, 1, -1)
        return tuple(out)

    def finished(self) -> bool:
        root = self.tree.node(self.env.root)
        return root.terminal or root.is_exhausted()


#: When each phase of a timed search must end, as fractions of the time left once the search is
#: set up (the evaluator and the decision space, built once per analysis and mesh): the
#: baselines, the greedy descents, the tree, the final polish; the rest is left for the
#: result's report.
PHASE_ENDS = {"baselines": 0.25, "descents": 0.5, "tree": 0.9, "polish": 0.97}


#: CPU seconds per op of what follows the polish: the last event and the result's report (one
#: record per op): measured 4.5 us per op at GPT-3 175B (40k ops), 3 at Llama-3 70B.
EPILOGUE_CPU_S_PER_OP = 4.5e-6


def _epilogue_start(start: float, cpu0: float, budget_s: float, n_ops: int) -> float:
    """When the tree and the polish must have ended for the search to return within its
    budget: its end less the epilogue's CPU time (`EPILOGUE_CPU_S_PER_OP`) at the slowdown seen
    so far (wall time over this process's CPU time since `start`, `cpu0`: on a shared machine
    fixed CPU work takes several times as long; measured +15% on Llama-3 70B at 7x)."""
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
    return start + budget_s - epilogue_reserve(wall_s, cpu_s, n_ops)


def epilogue_reserve(wall_s: float, cpu_s: float, n_ops: int) -> float:
    """Seconds kept for the epilogue of a program of `n_ops` ops when `wall_s` of wall time
    took `cpu_s` of this process's CPU time: `EPILOGUE_CPU_S_PER_OP` per op times that
    slowdown, never less than one (a CPU time under a millisecond counts as one)."""
    slowdown = wall_s / max(cpu_s, 1e-3)
    return EPILOGUE_CPU_S_PER_OP * n_ops * max(slowdown, 1.0)


def _deadlines(start: float, ready: float, budget_s: float | None) -> dict[str, float | None]:
    """Absolute deadlines of the phases of a search started at `start` and set up at `ready`
    (None everywhere in simulation mode, so that a seeded run is deterministic)."""
    if budget_s is None:
        return dict.fromkeys(PHASE_ENDS)
    left = max(start + budget_s - ready, 0.0)
    return {name: ready + end * left for name, end in PHASE_ENDS.items()}


def search_iter(
    ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, **settings
) -> Iterator[SearchEvent]:
    """Runs the search, yielding progress events; stop iterating at any time to keep the best.

    Keywords are the fields of `SearchSettings`: `budget_s` (seconds) and/or `num_simulations`
    (at least one), `seed`, `pins` (forbids, starting with `!`, may be among them), `forbids`,
    `cost_options` (a `tc.CostOptions`), `report_every_s`. The last event has `done=True`.
    """
    st = settings_of(settings)
    if st.workers > 1:
        yield _parallel(ana, mesh, hw, st)[0]
        return
    with gc_paused():
        yield from _search(ana, mesh, hw, st)


def _search(ana, mesh, hw, st: SearchSettings, teach: bool = True) -> Iterator[SearchEvent]:
    """The single-process search (`search_iter`); without `teach` the events leave out the
    top of the tree (`search` keeps none of it)."""
    start, cpu0 = time.perf_counter(), time.process_time()
    run = _Run(ana, mesh, hw, st)
    phase = _deadlines(start, time.perf_counter(), st.budget_s)
    n_ops = len(ana.program.ops)

    def epilogue() -> float | None:
        if st.budget_s is None:
            return None
        return _epilogue_start(start, cpu0, st.budget_s, n_ops)

    notes: list[str] = []

    def event(i: int, done: bool, verified=()) -> SearchEvent:
        elapsed = time.perf_counter() - start
        best, best_state = run.scorer.best_score, run.scorer.best_state
        if verified:  # the best plan as XLA judges it
            best_state = verified[0].strategy.to_state(run.env.space)
            best = run.scorer.score(best_state)
        return SearchEvent(
            iteration=i,
            elapsed_s=elapsed,
            best_step_time_s=best.step_time_s,
            best_peak_bytes=best.peak_bytes,
            best_fits=best.fits,
            best_strategy=run.strategy_of(best_state),
            tree_size=len(run.tree),
            evaluations=run.scorer.evaluations,
            evals_per_s=run.scorer.evaluations / elapsed if elapsed > 0 else 0.0,
            done=done,
            baselines=dict(run.baselines),
            tree_top=run.tree_top() if teach else (),
            verified=tuple(verified),
            notes=tuple(notes),
        )

    run.seed(phase["baselines"], phase["descents"])
    yield event(0, False)  # the best baseline, at once
    seeding.descend(run.scorer, run.env, phase["descents"])
    yield event(0, False)
    last = time.perf_counter()
    # Without a time budget the run is deterministic, its events too: one every tenth of it.
    every = max(1, (st.num_simulations or 0) // 10) if st.budget_s is None else 0
    i = 0
    while not run.finished():
        if st.num_simulations is not None and i >= st.num_simulations:
            break
        # The tree always runs at least once: its share is never taken by the seeding.
        if i > 0 and (seeding.past(phase["tree"]) or seeding.past(epilogue())):
            break
        run.iterate()
        i += 1
        if (i % every == 0) if every else time.perf_counter() - last >= st.report_every_s:
            last = time.perf_counter()
            yield event(i, False)
    polish_end = phase["polish"] if st.budget_s is None else min(phase["polish"], epilogue())
    seeding.greedy(run.scorer, run.env, run.scorer.best_state, deadline=polish_end)
    verified = ()
    if st.verify:
        yield event(i, False)  # the model's best, before the compiles
        budget_v = st.verify_budget_s if st.verify_budget_s is not None else st.budget_s
        verified, note = verify_plans(run.env, run.scorer, hw, st.verify, budget_v, st.cost_options)
        notes += [note] if note else []
    yield event(i, True, verified)


def _parallel(ana, mesh, hw, st: SearchSettings) -> tuple[SearchEvent, list]:
    """The one event of a multi-process search (its merged result, `parallel.run_workers`) and
    the merged history of best step times."""
    merged = parallel.run_workers(ana, mesh, hw, st)
    s = evaluator(ana, mesh, hw, st.cost_options).report(merged["best"])
    notes = ("verify applies to single-process searches: not verified with XLA",) * bool(st.verify)
    event = SearchEvent(
        iteration=merged["iterations"],
        elapsed_s=merged["elapsed_s"],
        best_step_time_s=s.step_time_s,
        best_peak_bytes=s.peak_bytes,
        best_fits=s.fits,
        best_strategy=merged["best"],
        tree_size=0,
        evaluations=merged["evaluations"],
        evals_per_s=merged["evaluations"] / max(merged["elapsed_s"], 1e-9),
        done=True,
        baselines=dict(merged["baselines"]),
        notes=notes,
    )
    return event, list(merged["history"])


def search(ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, **settings) -> SearchResult:
    """Finds a low step-time strategy that fits memory; the keywords are `search_iter`'s."""
    # The final report allocates an object per op: with the collector back on it would run the
    # full collection owed by the whole pipeline inside the budget (a second on GPT-3 175B).
    with gc_paused():
        return _search_result(ana, mesh, hw, settings)


def _search_result(ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, settings) -> SearchResult:
    st = settings_of(settings)
    history = []
    last = None
    if st.workers > 1:
        last, history = _parallel(ana, mesh, hw, st)
    else:
        for ev in _search(ana, mesh, hw, st, teach=False):  # collector paused by `search`
            history.append((ev.iteration, ev.elapsed_s, ev.best_step_time_s))
            last = ev
    times = last.baselines
    t_reach = None
    feasible_times = [t for t in times.values() if t is not None]
    if feasible_times:
        best_base = min(feasible_times)
        for _, t_s, best in history:
            if best <= best_base * (1 + 1e-9):
                t_reach = t_s
                break
    report = evaluator(ana, mesh, hw, st.cost_options).report(last.best_strategy)
    warnings = tuple(last.notes) + _disagreement(last.verified)
    if not report.fits:
        warnings += (
            "NO MEMORY-FEASIBLE STRATEGY FOUND: the least infeasible one needs "
            f"{fmt_bytes(report.peak_bytes)} per device, over the "
            f"{fmt_bytes(report.capacity_bytes)} allowed",
        )
        _warnings.warn(warnings[-1], RuntimeWarning, stacklevel=3)
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
        verified=last.verified,
    )


def _disagreement(verified) -> tuple[str, ...]:
    """A note when XLA's ranking of the verified plans differs from the model's."""
    if len(verified) < 2:
        return ()
    by_model = min(verified, key=lambda v: v.predicted_step_time_s)
    if by_model is verified[0]:
        return ()
    won = verified[0]
    return (
        "XLA's order differs from the model's: the model's best plan compiles to "
        f"{fmt_s(by_model.compiled_step_time_s)} (predicted {fmt_s(by_model.predicted_step_time_s)}), "
        f"the returned one to {fmt_s(won.compiled_step_time_s)} (predicted "
        f"{fmt_s(won.predicted_step_time_s)})",
    )
