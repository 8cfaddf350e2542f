"""XLA in the loop: the search's best plans, judged by the compiled program.

The search is an adversary of its cost model: wherever the model is blind, it finds a "better"
plan. So with `verify=k` the k best distinct plans that fit are compiled at their real size
(abstract shapes, nothing allocated) and priced from the compiled program alone
(`toast_core.apply.judge`); the search returns the best as XLA judges it. The baselines that fit
(and honour the pins) are compiled too, after those k, fastest predicted first: a searched plan is
returned as better than a textbook one only when the compiled programs say so, not because the
model's blind spot favours it. Compiles run while the verification budget lasts: the first
compile's time is guessed from the program's size, later ones from the last compile, and a compile
that would not fit is not started.
"""

from __future__ import annotations

import math
import time

from toast_core.search import baselines
from toast_core.search.types import Verified


def candidate_plans(env, scorer, k: int) -> list:
    """(strategy, name) to compile: the search's k best distinct states that fit, then every
    admitted baseline that fits and is not among them, fastest predicted first."""
    out, seen = [], set()
    for state in scorer.top()[:k]:
        strategy = env.to_strategy(state, "search")
        seen.add(_plan_key(strategy))
        out.append(strategy)
    textbook = []
    for name in baselines.BUILDERS:
        strategy, _ = baselines.one(env.ana, env.mesh, name)
        if strategy is None:
            continue
        state = env.from_strategy(strategy)
        if not env.admits(state):
            continue
        score = scorer.score(state)
        key = _plan_key(strategy)
        if score.fits and key not in seen:
            seen.add(key)
            textbook.append((score.step_time_s, len(textbook), strategy))
    return out + [strategy for _, _, strategy in sorted(textbook, key=lambda t: t[:2])]


def _plan_key(strategy) -> tuple:
    """What makes two plans the same program (their names aside)."""
    return (strategy.shardings, strategy.options, strategy.remat)


def verify_plans(env, scorer, hw, k: int, budget_s: float | None, cost_options):
    """(verified plans, fastest compiled first; a note when fewer than asked were judged)."""
    from toast_core.apply.judge import COMPILE_S_PER_OP, can_judge, judge

    why = can_judge(env.mesh)
    if why:
        return (), why
    plans = candidate_plans(env, scorer, k)
    if not plans:
        return (), "not verified with XLA: no plan that fits was found"
    deadline = time.perf_counter() + (math.inf if budget_s is None else budget_s)
    guess = COMPILE_S_PER_OP * len(env.ana.program.ops)
    out: list[Verified] = []
    for strategy in plans:
        if time.perf_counter() + guess > deadline:
            break
        j = judge(env.ana, strategy, env.mesh, hw, cost_options)
        if not j.reused:  # a reused compile says nothing of the next one's time
            guess = j.compile_s
        out.append(Verified(strategy, j.predicted_step_time_s, j.compiled_step_time_s, j.compile_s))
    note = ""
    if len(out) < len(plans):
        note = (
            f"verified {len(out)} of {len(plans)} plans (the search's best and the baselines) "
            f"with XLA within the verification budget (a compile takes about {guess:.1f} s)"
        )
    return tuple(sorted(out, key=lambda v: v.compiled_step_time_s)), note
