"""The search's hot path computes some sums in leaner ways than the obvious code; they must give
the same floats (the incremental evaluator, the fingerprint and seeded plans depend on the
bits): `Evaluator.latency_s` against summing the latencies of `_groups`' first members in
listing order, and `_added` (the timeline's deltas in one `np.bincount`) against `np.add.at`
one list after another."""

from __future__ import annotations

import functools

import numpy as np

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.cost import evaluator
from toast_core.cost.incremental import Incremental
from toast_core.cost.model import _added
from toast_core.search.env import Environment
from toast_core.strategy import constrain, space_of

MESH = tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2})


@functools.cache
def _ev():
    w = MODEL_ZOO["gpt"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    ev = evaluator(ana, MESH, tc.hardware("tpu-v5p"))
    ev._combine_setup()
    space = space_of(ana, MESH)
    return Environment(space, constrain(space)), ev


def _legal_masks(env, rng, n: int) -> list[np.ndarray]:
    """The masks of `n` states along random legal walks from the root."""
    out, state = [], env.root
    while len(out) < n:
        action = env.random_action(state, rng)
        if action is None or rng.random() < 0.1:
            state = env.root
            continue
        state = env.apply(state, action)
        out.append(state.masks)
    return out


def _latency_by_groups(ev, kinds, ms, vs, ops, sites) -> float:
    """The latency as `latency_s` once computed it: every listed collective's latency, those
    leading a combined op kept, summed in listing order."""
    if not len(kinds):
        return 0.0
    group = ev._groups(kinds, ms, vs, ops, sites)
    first = group == np.arange(len(group))
    return float((ev.c0[kinds, ms] * ev.site_trip[sites])[first].sum())


def test_latency_matches_the_groups_first_members_bit_for_bit():
    env, ev = _ev()
    rng = np.random.default_rng(0)
    checked = 0
    for masks in _legal_masks(env, rng, 40):
        _, value_local, _ = ev._local(masks)
        kinds, ms, vs, ops, _, sites = ev._collective_arrays(masks, value_local)
        # The listing order differs between the evaluator and its deltas: shuffle it too.
        for order in (np.arange(len(kinds)), rng.permutation(len(kinds))):
            args = (kinds[order], ms[order], vs[order], ops[order], sites[order])
            want = _latency_by_groups(ev, *args)
            assert ev.latency_s(*args) == want  # a memo miss
            assert ev.latency_s(*args) == want  # and a hit
            checked += len(kinds) > 1
    assert checked > 20


def test_timeline_deltas_in_one_bincount_equal_add_at_in_turn():
    rng = np.random.default_rng(1)
    for n in (1, 7, 300):
        at = [rng.integers(0, n, k) for k in (0, 5, 50, 3)]
        add = [rng.normal(size=len(a)) * 10.0 ** rng.integers(-3, 9) for a in at]
        add[2][:3] = -0.0  # signed zeros go through as np.add.at takes them
        want = np.zeros(n)
        for a, w in zip(at, add):
            np.add.at(want, a, w)
        assert _added(n, at, add).tobytes() == want.tobytes()


def test_a_full_evaluation_keeps_its_timeline_bits():
    """`Incremental`'s full evaluation builds its timeline deltas with `_added`; the peak it
    reports is the evaluator's own (`Evaluator.score`, whose `_memory` does too, checked
    against `np.add.at` above)."""
    env, ev = _ev()
    for masks in _legal_masks(env, np.random.default_rng(2), 8):
        got = Incremental(ev).score(masks)
        assert got.peak_bytes == ev.score(masks).peak_bytes
