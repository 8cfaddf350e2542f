"""XLA in the loop: the search's best plans, judged by the compiled program.

The search is an adversary of its cost model: wherever the model is blind, it finds a "better"
plan. So with `verify=k` the k best distinct plans that fit are compiled at their real size
(abstract shapes, nothing allocated) and priced from the compiled program alone
(`toast_core.apply.judge`); the search returns the best as XLA judges it. Compiles run while the
verification budget lasts: the first compile's time is guessed from the program's size, later ones
from the last compile, and a compile that would not fit is not started.
"""

from __future__ import annotations

import math
import time

from toast_core.search.types import Verified


def verify_plans(env, scorer, hw, k: int, budget_s: float | None, cost_options):
    """(verified plans, fastest compiled first; a note when fewer than asked were judged)."""
    from toast_core.apply.judge import COMPILE_S_PER_OP, can_judge, judge

    why = can_judge(env.mesh)
    if why:
        return (), why
    states = scorer.top()[:k]
    if not states:
        return (), "not verified with XLA: no plan that fits was found"
    deadline = time.perf_counter() + (math.inf if budget_s is None else budget_s)
    guess = COMPILE_S_PER_OP * len(env.ana.program.ops)
    out: list[Verified] = []
    for state in states:
        if time.perf_counter() + guess > deadline:
            break
        strategy = env.to_strategy(state, "search")
        j = judge(env.ana, strategy, env.mesh, hw, cost_options)
        guess = j.compile_s
        out.append(Verified(strategy, j.predicted_step_time_s, j.compiled_step_time_s, j.compile_s))
    note = ""
    if len(out) < len(states):
        note = (
            f"verified {len(out)} of {len(states)} plans with XLA within the verification budget "
            f"(a compile takes about {guess:.1f} s)"
        )
    return tuple(sorted(out, key=lambda v: v.compiled_step_time_s)), note
