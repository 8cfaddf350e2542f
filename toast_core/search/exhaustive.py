"""Exhaustive enumeration of the decision space, for tiny programs: the optimality reference.

Walks every state reachable from the root (with pins applied) through the same actions the MCTS
uses, deduplicated by canonical state, and scores each with the cost model. The best feasible state
is the optimum of the decision space under the cost model, against which the search's gap is
measured (bench/search_quality.py).
"""

from __future__ import annotations

from toast_core.analysis import Analysis
from toast_core.cost import CostOptions, evaluator
from toast_core.errors import ToastError
from toast_core.mesh import HardwareSpec, MeshSpec
from toast_core.search.env import Environment
from toast_core.search.scoring import better
from toast_core.search.types import Stop
from toast_core.strategy import Strategy, constrain, space_of


def exhaustive_search(
    ana: Analysis,
    mesh: MeshSpec,
    hw: HardwareSpec,
    *,
    pins=(),
    forbids=(),
    max_states: int = 20000,
    cost_options: CostOptions | None = None,
) -> tuple[Strategy, float, int]:
    """(best strategy, its step time, states enumerated). Raises if the space exceeds max_states."""
    ev = evaluator(ana, mesh, hw, cost_options)
    space = space_of(ana, mesh)
    env = Environment(space, constrain(space, pins, forbids))
    seen = {env.root.key}
    frontier = [env.root]
    best_state, best = env.root, ev.score(env.root.masks, env.root.remat)
    while frontier:
        state = frontier.pop()
        for action in env.legal_actions(state):
            if isinstance(action, Stop):
                continue
            nxt = env.apply(state, action)
            if nxt.key in seen:
                continue
            seen.add(nxt.key)
            if len(seen) > max_states:
                raise ToastError(
                    f"the decision space has more than max_states={max_states} states: "
                    "exhaustive search is for tiny programs"
                )
            s = ev.score(nxt.masks, nxt.remat)
            if better(s, best):
                best_state, best = nxt, s
            frontier.append(nxt)
    return env.to_strategy(best_state, "exhaustive"), best.step_time_s, len(seen)
