"""The memos that make the incremental evaluator fast return what a fresh computation would:
a full evaluation seen again, a restricted view's reshards keyed by its sites' fine classes,
and the reduce-scatter axes of every reduction row computed in one pass."""

from __future__ import annotations

import functools

import numpy as np

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.cost import evaluator
from toast_core.cost.incremental import Incremental
from toast_core.search.env import Environment
from toast_core.search.types import Stop
from toast_core.strategy import constrain, space_of

MESH = tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2})


@functools.cache
def _env():
    w = MODEL_ZOO["gpt"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    space = space_of(ana, MESH)
    return Environment(space, constrain(space)), evaluator(ana, MESH, tc.hardware("tpu-v5p"))


def _random_masks(ev, rng) -> np.ndarray:
    n_axes = ev.axes.n
    return rng.integers(0, 1 << n_axes, ev.ana.n_fine) * (rng.random(ev.ana.n_fine) < 0.4)


def _scan_by_loop(obj, masks: np.ndarray) -> np.ndarray:
    """Per reduction row of `obj` (an evaluator or a view): the row's mask ANDed with, ORed over
    its chain's values, the axes every use of the value holds on some dim."""
    value_uses, use_fines, fines = obj._use_fine_table()
    out = []
    for row, scan in zip(obj.red_fine.tolist(), obj.red_scan.tolist()):
        axes = 0
        for v in scan:
            if v < 0:
                continue
            common = -1
            for u in range(value_uses[v], value_uses[v + 1]):
                held = 0
                for f in fines[use_fines[u] : use_fines[u + 1]].tolist():
                    held |= int(masks[f])
                common &= held
            axes |= common
        out.append(int(masks[row]) & axes)
    return np.array(out, dtype=np.int64)


def test_reduce_scatter_axes_match_a_loop_on_the_evaluator_and_on_a_view():
    env, ev = _env()
    ev._combine_setup()
    inc = Incremental(ev)
    rng = np.random.default_rng(0)
    values = np.unique(ev.red_value[rng.permutation(len(ev.red_value))[:5]])
    view = inc._view(values)
    assert 0 < len(view.red_fine) < len(ev.red_fine)
    for _ in range(20):
        masks = _random_masks(ev, rng)
        for obj in (ev, view):
            got = masks[obj.red_fine] & obj._scan_common(masks)
            assert np.array_equal(got, _scan_by_loop(obj, masks))


def _walk(env, state, rng, steps: int, allowed=None):
    """`steps` random legal actions from `state`; with `allowed`, only shards of units whose
    fine classes it accepts."""
    for _ in range(steps):
        if allowed is None:
            actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
        else:
            units = env.units(state)
            actions = [a for a in env.shard_actions(state) if allowed(units[a.unit].fines)]
        if not actions:
            break
        state = env.apply(state, actions[int(rng.integers(len(actions)))])
    return state


def test_a_views_reshards_depend_only_on_its_sites_fine_classes():
    env, ev = _env()
    inc = Incremental(ev)
    rng = np.random.default_rng(1)
    seed = env.root
    for _ in range(200):  # a state that reshards somewhere
        if len(ev._compute_reshards(seed.masks).value):
            break
        seed = _walk(env, env.root, rng, 8)
    assert len(ev._compute_reshards(seed.masks).value)
    view = inc._view(np.unique(ev._compute_reshards(seed.masks).value)[:8])
    site_fines = set(view.site_fines.tolist())
    outside = lambda fines: not site_fines.intersection(fines)  # noqa: E731
    moved_any = resharded = 0
    for _ in range(12):
        state = _walk(env, seed, rng, int(rng.integers(0, 3)))
        other = _walk(env, state, rng, 3, outside)
        assert np.array_equal(state.masks[view.site_fines], other.masks[view.site_fines])
        moved_any += not np.array_equal(state.masks, other.masks)
        a, b = view._compute_reshards(state.masks), view._compute_reshards(other.masks)
        resharded += len(a.value)
        for field in ("value", "lo", "hi", "buffer", "kind", "mask", "factor", "of"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert moved_any and resharded


def test_a_full_evaluation_seen_again_is_not_evaluated_again():
    env, ev = _env()
    inc = Incremental(ev, cache_size=1)
    root = env.root.masks
    far = np.ones_like(root)  # every fine class on mesh axis 0: too far for a delta
    first = inc.score(root)
    assert inc.score(far) == ev.score(far)
    assert inc.full_evaluations == 2  # and the root left the one-entry cache
    assert inc.score(root) == first == ev.score(root)
    assert inc.full_evaluations == 2
