"""Incremental evaluation against the full evaluator: the same numbers after any sequence of
legal search steps, whichever cached state a delta starts from."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.cost import evaluator
from toast_core.cost.incremental import Incremental
from toast_core.search.env import Environment
from toast_core.search.types import Stop
from toast_core.strategy import constrain, space_of

HW = tc.hardware("tpu-v5e")
MESHES = {
    "2x4": tc.MeshSpec({"data": 2, "model": 4}),
    "2x2x2": tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2}),
}
FIELDS = ("step_time_s", "compute_s", "comm_s", "peak_bytes")


@functools.cache
def _env(model: str, mesh: str):
    w = MODEL_ZOO[model](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    space = space_of(ana, MESHES[mesh])
    return Environment(space, constrain(space)), evaluator(ana, MESHES[mesh], HW)


def _same(got, want) -> None:
    for f in FIELDS:
        a, b = getattr(got, f), getattr(want, f)
        assert a == pytest.approx(b, rel=1e-12, abs=1e-300), f
    assert got.fits == want.fits


@settings(max_examples=30)
@given(
    model=st.sampled_from(["gpt", "mlp", "unet", "gns", "moe", "llama", "grad-accum"]),
    mesh=st.sampled_from(sorted(MESHES)),
    data=st.data(),
)
def test_incremental_scores_equal_full_scores(model, mesh, data):
    """Walk random legal actions; score each state from its parent (as the tree does), from the
    nearest cached state (as a rollout's end is), and with every fallback to a full evaluation
    disabled, and compare each with `Evaluator.score`."""
    env, ev = _env(model, mesh)
    from_parent, nearest, no_full = Incremental(ev), Incremental(ev, cache_size=3), Incremental(ev)
    no_full_limit = no_full.tab.full_limit
    state = env.root
    for inc in (from_parent, nearest, no_full):
        _same(inc.score(state.masks), ev.score(state.masks))
    for _ in range(data.draw(st.integers(1, 14), label="steps")):
        actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
        if not actions:
            break
        parent, state = state, env.apply(state, data.draw(st.sampled_from(actions), label="a"))
        want = ev.score(state.masks)
        _same(from_parent.score(state.masks, parent.masks), want)
        if data.draw(st.booleans(), label="score nearest now"):
            _same(nearest.score(state.masks), want)
        no_full.tab.full_limit = float("inf")
        try:
            _same(no_full.score(state.masks, parent.masks), want)
        finally:
            no_full.tab.full_limit = no_full_limit
    assert no_full.full_evaluations == 1  # the root only: every later state was a delta


def test_a_state_far_from_every_cached_one_is_evaluated_in_full():
    env, ev = _env("gpt", "2x4")
    inc = Incremental(ev)
    inc.score(env.root.masks)
    far = env.root.masks.copy()
    far[:] = 1  # every fine class on mesh axis 0: most values re-priced
    _same(inc.score(far), ev.score(far))
    assert inc.full_evaluations == 2 and inc.delta_evaluations == 0


def test_the_cache_is_bounded_and_a_hit_is_not_re_evaluated():
    env, ev = _env("mlp", "2x4")
    inc = Incremental(ev, cache_size=2)
    masks = [env.root.masks.copy() for _ in range(4)]
    for i, m in enumerate(masks[1:], 1):
        m[i % len(m)] = 1
    for m in masks:
        inc.score(m)
    assert len(inc._cache) == 2
    n = inc.full_evaluations + inc.delta_evaluations
    inc.score(masks[-1])
    assert inc.full_evaluations + inc.delta_evaluations == n
    assert np.array_equal(inc._cache[masks[-1].tobytes()].masks, masks[-1])


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_memoized_communication_gives_full_scores(model):
    """Shard a unit u, then shard another unit w whose step leaves what u's communication reads
    alone, then u again: the second time u's communication comes from the memo (keyed by the
    masks it reads), and the score still equals a full evaluation."""
    env, ev = _env(model, "2x4")
    inc = Incremental(ev)
    root = env.root
    inc.score(root.masks)
    shards = env.shard_actions(root)
    hits = 0
    for first in shards:
        child = env.apply(root, first)
        _same(inc.score(child.masks, root.masks), ev.score(child.masks))
        changed = np.flatnonzero(child.masks != root.masks)
        plan = inc._plan(changed)
        if plan is None or plan.view is None:
            continue
        for other in shards:
            side = env.apply(root, other)
            moved = np.flatnonzero(side.masks != root.masks)
            if np.isin(moved, plan.view.fines).any():
                continue  # that step changes what the first one's communication reads
            if env.why_illegal_shard(side, env.units(side)[first.unit], first.axis) is not None:
                continue
            both = env.apply(side, first)
            inc.score(side.masks, root.masks)
            before = inc.comm_hits
            _same(inc.score(both.masks, side.masks), ev.score(both.masks))
            hits += inc.comm_hits - before
    assert hits > 0


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_fsdp_reached_one_fine_class_at_a_time_prices_the_gathered_reads(model):
    """Walking from replicated to FSDP one fine class at a time (every step a delta), the ops
    reading all-gathered weights must be re-priced as their gathers appear and grow: compute
    time and peak equal `Evaluator.score`'s bit for bit (communication sums its values in
    another order, to rounding), and so do the per-op times and read bytes."""
    env, ev = _env(model, "2x4")
    target = tc.baselines.all(ev.ana, MESHES["2x4"])["fsdp"][0].fine_masks(ev.ana, ev.mesh)
    inc = Incremental(ev)
    inc.tab.full_limit = float("inf")
    masks = env.root.masks.copy()
    inc.score(masks)
    for f in np.flatnonzero(target != masks):
        parent = masks.copy()
        masks[f] = target[f]
        got, want = inc.score(masks, parent), ev.score(masks)
        _same(got, want)
        assert (got.compute_s, got.peak_bytes) == (want.compute_s, want.peak_bytes)
    assert inc.full_evaluations == 1
    _, value_local, op_logdeg = ev._local(masks)
    extra = ev._read_extra(masks, value_local)
    assert extra.sum() > 0  # FSDP gathers weights, and their readers read them gathered
    cached = inc._cache[masks.tobytes()]
    assert np.array_equal(cached.read_extra, extra)
    assert np.array_equal(cached.t, ev._compute(value_local, op_logdeg, extra)[3])


@settings(max_examples=20)
@given(
    model=st.sampled_from(["gpt", "mlp", "llama", "moe", "grad-accum"]),
    mesh=st.sampled_from(sorted(MESHES)),
    data=st.data(),
)
def test_remat_scores_on_the_incremental_path_equal_full_scores(model, mesh, data):
    """Walk random legal actions (remat choices among them, and their relaxations); price each
    state's remat policies on top of its sharding's cached evaluation and compare with
    `Evaluator.score(masks, remat)`: recomputed work, collectives run again, split lifetimes."""
    env, ev = _env(model, mesh)
    inc = Incremental(ev)
    state = env.root
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
        nexts = [env.apply(state, a) for a in actions] + env.remat_relaxations(state)
        if not nexts:
            break
        parent, state = state, data.draw(st.sampled_from(nexts), label="next")
        _same(inc.score_remat(state.masks, state.remat, parent.masks), ev.score(*_key(state)))
    if state.remat:  # every group on the last state's policies, from the root's sharding
        _same(inc.score_remat(state.masks, state.remat), ev.score(*_key(state)))


def _key(state):
    return state.masks, state.remat


def test_remat_on_the_incremental_path_reaches_every_policy():
    """Every remat group on every policy, on the FSDP plan (its all-gathered copies split
    between a remat'd block and the backward): the same numbers as `Evaluator.score`."""
    env, ev = _env("gpt", "2x2x2")
    masks = tc.baselines.all(ev.ana, MESHES["2x2x2"])["fsdp"][0].fine_masks(ev.ana, ev.mesh)
    inc = Incremental(ev)
    groups = range(len(ev.remat.groups))
    assert len(groups) >= 2
    changed = 0
    for policy in range(1, 4):
        for g in groups:
            remat = ((g, policy),)
            got, want = inc.score_remat(masks, remat), ev.score(masks, remat)
            _same(got, want)
            changed += want != ev.score(masks)
        every = tuple((g, policy) for g in groups)
        _same(inc.score_remat(masks, every), ev.score(masks, every))
    assert changed > 0
