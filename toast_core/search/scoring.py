"""Scoring states with the cost model, and keeping the best state ever scored.

The environment is deterministic, so the best state seen is the answer: memory-feasible states
always beat infeasible ones, then lower step time (`better`). Scores are memoized per state key.

States are priced incrementally (`cost.incremental`): from the cached evaluation of the state they
were reached from (`parent`), or the nearest recently scored one, re-pricing only what changed;
a state's remat policies are priced on top of its sharding's cached evaluation
(`Incremental.score_remat`), so a remat decision costs no full evaluation either.
"""

from __future__ import annotations

import heapq

from toast_core.cost import Evaluator, Score
from toast_core.cost.incremental import Incremental
from toast_core.strategy import State


def better(a: Score, b: Score) -> bool:
    """Whether `a` beats `b`: fits before not; then lower step time (or lower peak memory
    between two that do not fit)."""
    if a.fits != b.fits:
        return a.fits
    if not a.fits:
        return a.peak_bytes < b.peak_bytes
    return a.step_time_s < b.step_time_s - 1e-15


class Scorer:
    """Scores states through one evaluator and remembers the best one (and, with `keep` > 0,
    the `keep` best distinct states that fit, for XLA to judge)."""

    def __init__(self, ev: Evaluator, keep: int = 0) -> None:
        self.ev = ev
        self.incremental = Incremental(ev)
        self.scores: dict[tuple, Score] = {}
        self.evaluations = 0
        self.best_state: State | None = None
        self.best_score: Score | None = None
        self.keep = keep
        self._top: list[tuple[float, int, State]] = []  # max-heap by step time (negated)
        # Keys of states whose every greedy candidate is scored and none is better (scores are
        # memoized for good, so a descent from one ends there at once: `seeding.greedy`).
        self.settled: set[tuple] = set()

    def score(self, state: State, parent: State | None = None) -> Score:
        """The score of `state`; `parent`, a state scored just before that differs from it in a
        few fine classes, makes it cheaper."""
        key = state.key
        s = self.scores.get(key)
        if s is None:
            parent_masks = None if parent is None else parent.masks
            s = self.incremental.score_remat(state.masks, state.remat, parent_masks)
            self.scores[key] = s
            self.evaluations += 1
            if self.best_score is None or better(s, self.best_score):
                self.best_score, self.best_state = s, state
            if self.keep and s.fits:
                self._remember(s.step_time_s, state)
        return s

    def _remember(self, step_time_s: float, state: State) -> None:
        entry = (-step_time_s, self.evaluations, state)
        if len(self._top) < self.keep:
            heapq.heappush(self._top, entry)
        elif step_time_s < -self._top[0][0]:
            heapq.heapreplace(self._top, entry)

    def top(self) -> list[State]:
        """The best distinct states that fit, fastest first (at most `keep`)."""
        return [state for _, _, state in sorted(self._top, key=lambda e: (-e[0], e[1]))]
