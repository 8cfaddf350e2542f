"""Exhaustive enumeration of the decision space, for tiny programs: the optimality reference.

Walks every state reachable from the root (with pins applied) through the same actions the MCTS
uses, deduplicated by canonical state, and scores each with the cost model. The best feasible state
is the optimum of the decision space under the cost model, against which the search's gap is
measured (bench/search_quality.py).
"""

from __future__ import annotations

from toast_core.analysis import Analysis
from toast_core.cost import evaluator
from toast_core.errors import ToastError
from toast_core.mesh import HardwareSpec, MeshSpec
from toast_core.search.mcts import _better
from toast_core.search.space import DecisionSpace
from toast_core.strategy import Strategy


def exhaustive_search(
    ana: Analysis,
    mesh: MeshSpec,
    hw: HardwareSpec,
    *,
    pins=(),
    forbids=(),
    max_states: int = 20000,
    memory_headroom: float = 0.1,
) -> tuple[Strategy, float, int]:
    """(best strategy, its step time, states enumerated). Raises if the space exceeds max_states."""
    ev = evaluator(ana, mesh, hw, overlap=0.0, memory_headroom=memory_headroom)
    space = DecisionSpace(ana, mesh, ev, pins, forbids)
    seen = {space.root.key}
    frontier = [space.root]
    best_state, best = space.root, ev.score(space.root.masks)
    while frontier:
        state = frontier.pop()
        for action in space.actions(state):
            if action[0] == "stop":
                continue
            nxt = space.apply(state, action)
            if nxt.key in seen:
                continue
            seen.add(nxt.key)
            if len(seen) > max_states:
                raise ToastError(
                    f"the decision space has more than max_states={max_states} states: "
                    "exhaustive search is for tiny programs"
                )
            s = ev.score(nxt.masks)
            if _better(s, best):
                best_state, best = nxt, s
            frontier.append(nxt)
    return space.to_strategy(best_state, "exhaustive"), best.step_time_s, len(seen)
