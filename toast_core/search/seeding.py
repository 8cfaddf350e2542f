"""Seeding the search: the baselines, and greedy descents by the cost model.

Before the tree search, every baseline that honours the pins is scored, as is and with every
remat group on `dots` and on `full` (so the search never returns worse than them) and greedy descents from the best baseline and from the root give a
strong anytime answer; after it, a greedy descent polishes the best state found.
"""

from __future__ import annotations

import time

from toast_core.search import baselines
from toast_core.search.env import Environment
from toast_core.search.scoring import Scorer, better
from toast_core.search.types import Resolve, Stop
from toast_core.strategy import State


def score_baselines(
    scorer: Scorer,
    env: Environment,
    deadline: float | None = None,
    until: float | None = None,
) -> tuple[dict, dict]:
    """Scores the root and every baseline, built one at a time until `deadline` (those not
    reached by then count as not applying), or, while none fits yet, until `until`: on a large
    program under load the window can close before the baseline that fits (GPT-3 175B: the
    sixth, fsdp_megatron), and a search seeded by no feasible plan rarely finds one. Returns
    (step time of each baseline that fits, None otherwise; the same restricted to baselines
    that honour the pins). Only those that honour the pins count as states the search found."""
    scorer.score(env.root)
    every, admitted = {}, {}
    for name in baselines.BUILDERS:
        fits = any(t is not None for t in every.values())
        if past(deadline) and (fits or until is None or past(until)):
            every[name] = admitted[name] = None
            continue
        strategy, _ = baselines.one(env.ana, env.mesh, name)
        if strategy is None:
            every[name] = admitted[name] = None
            continue
        state = env.from_strategy(strategy)
        if env.admits(state):
            s = scorer.score(state)
            admitted[name] = s.step_time_s if s.fits else None
            score_with_remat(scorer, env, state)
        else:
            s = scorer.ev.score(state.masks, state.remat)
            admitted[name] = None
        every[name] = s.step_time_s if s.fits else None
    return every, admitted


def past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def score_with_remat(scorer: Scorer, env: Environment, state: State) -> None:
    """Scores `state` with every remat group on `dots`, then on `full` (where the pins allow):
    textbook plans with remat, from which the greedy descent starts when memory binds."""
    n = len(env.space.remat.groups)
    for policy in (1, 2):
        remat = tuple((g, policy) for g in range(n))
        if remat and remat != state.remat:
            cand = State(state.options, state.masks, remat)
            if env.admits(cand):
                scorer.score(cand)


def descend(scorer: Scorer, env: Environment, deadline: float | None = None) -> None:
    """Greedy descents from the best state so far (usually the best baseline), then the root."""
    starts = [scorer.best_state]
    if scorer.best_state.key != env.root.key:
        starts.append(env.root)
    for start in starts:
        if past(deadline):
            break
        greedy(scorer, env, start, deadline=deadline)


def greedy(
    scorer: Scorer,
    env: Environment,
    state: State,
    max_steps: int = 64,
    deadline: float | None = None,
) -> State:
    """Steepest descent by the cost model over single actions.

    Resolving a conflict changes no cost by itself (parts inherit their mesh axes); its value
    shows only once a part is sharded differently. So a resolution is scored together with the
    best way to shard one of the parts it creates (a two-step look-ahead). Remat actions are
    single steps like shards (they trade step time for memory, so they win only while memory
    binds); relaxing a remat policy is a step too, so a descent that sharded its way back under
    the memory cap stops recomputing what it no longer needs to.

    The deadline is checked before every candidate: at the deadline the best step found so far
    is taken and the descent ends. A state from which a whole step found nothing better is
    remembered (`Scorer.settled`): a later descent from it (the polish, from the best state,
    often one a descent ended at) would score the same candidates from the memo and stop.
    """
    current, cur = state, scorer.score(state)
    for _ in range(max_steps):
        if past(deadline) or current.key in scorer.settled:
            break
        best_next, best_s = None, cur
        for cand in _candidates(env, current):
            if past(deadline):
                break
            s = scorer.score(cand, current)
            if better(s, best_s):
                best_next, best_s = cand, s
        else:
            if best_next is None:
                scorer.settled.add(current.key)
        if best_next is None:
            break
        current, cur = best_next, best_s
    return current


def _candidates(env: Environment, state: State):
    """The states one greedy step considers, lazily (so that a deadline cuts the look-ahead)."""
    for a in env.legal_actions(state):
        if isinstance(a, Stop):
            continue
        nxt = env.apply(state, a)
        if isinstance(a, Resolve):
            yield from follow_ups(env, nxt, a)
        else:  # a shard or a remat choice: one step
            yield nxt
    yield from env.remat_relaxations(state)


def follow_ups(env: Environment, state: State, resolve: Resolve) -> list[State]:
    """States that shard one part of the named dims a resolution just split."""
    picked = env.units_of_parts(state, resolve.group)
    return [env.apply(state, a) for a in env.shard_actions(state, picked)]
