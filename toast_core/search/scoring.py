"""Scoring states with the cost model, and keeping the best state ever scored.

The environment is deterministic, so the best state seen is the answer: memory-feasible states
always beat infeasible ones, then lower step time (`better`). Scores are memoized per state key.
"""

from __future__ import annotations

from toast_core.cost import Evaluator, Score
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
    """Scores states through one evaluator and remembers the best one."""

    def __init__(self, ev: Evaluator) -> None:
        self.ev = ev
        self.scores: dict[tuple, Score] = {}
        self.evaluations = 0
        self.best_state: State | None = None
        self.best_score: Score | None = None

    def score(self, state: State) -> Score:
        key = state.key
        s = self.scores.get(key)
        if s is None:
            s = self.ev.score(state.masks, state.remat)
            self.scores[key] = s
            self.evaluations += 1
            if self.best_score is None or better(s, self.best_score):
                self.best_score, self.best_state = s, state
        return s
