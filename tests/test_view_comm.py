"""The scalar pricing of a restricted view against the evaluator's NumPy pricing: the same
arrays bit for bit (dtype, shape, every float), on every view a random walk re-prices."""

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
from toast_core.cost.view_comm import scalar_view
from toast_core.search.env import Environment
from toast_core.search.types import Stop
from toast_core.strategy import constrain, space_of

HW = tc.hardware("tpu-v5e")
MESHES = {
    "2x4": tc.MeshSpec({"data": 2, "model": 4}),
    "2x2x2": tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2}),
}


@functools.cache
def _env(model: str, mesh: str):
    w = MODEL_ZOO[model](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    space = space_of(ana, MESHES[mesh])
    return Environment(space, constrain(space)), evaluator(ana, MESHES[mesh], HW)


def _compare(inc: Incremental, masks: np.ndarray, parent: np.ndarray) -> int:
    """Price the view of the step parent -> masks both ways; 1 when the scalar path priced it."""
    changed = np.flatnonzero(parent != masks)
    if not len(changed):
        return 0
    limit = inc.tab.full_limit
    inc.tab.full_limit = float("inf")  # a view for every step, however many values it prices
    try:
        plan = inc._plan(changed)
    finally:
        inc.tab.full_limit = limit
    if plan is None or plan.view is None:
        return 0
    fast = scalar_view(plan.view)
    if fast is None:
        return 0
    value_local = inc.ev._local(masks)[1]
    got = fast.price(masks, value_local)
    if got is None:
        return 0  # an odd reshard: the NumPy path prices it
    want = inc._price_view(plan.view, masks, value_local)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    return 1


@settings(max_examples=20)
@given(
    model=st.sampled_from(["gpt", "mlp", "llama", "moe", "unet"]),
    mesh=st.sampled_from(sorted(MESHES)),
    data=st.data(),
)
def test_scalar_view_prices_bit_for_bit_like_numpy(model, mesh, data):
    env, ev = _env(model, mesh)
    inc = Incremental(ev)
    state = env.root
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
        if not actions:
            break
        parent, state = state, env.apply(state, data.draw(st.sampled_from(actions), label="a"))
        _compare(inc, state.masks, parent.masks)


def test_scalar_view_covers_gpt_steps_and_matches():
    """Every first shard of GPT, from the root and from one FSDP-like step on: most views are
    priced by the scalar path (so the comparison above is not vacuous) and all match."""
    env, ev = _env("gpt", "2x4")
    inc = Incremental(ev)
    priced = 0
    for first in env.shard_actions(env.root):
        child = env.apply(env.root, first)
        priced += _compare(inc, child.masks, env.root.masks)
        for second in env.shard_actions(child)[:4]:
            priced += _compare(inc, env.apply(child, second).masks, child.masks)
    assert priced >= 20


def _reshards_both_ways(ev, masks, monkeypatch):
    import toast_core.cost.model as model

    got = ev._compute_reshards(masks)
    ext = np.append(masks, 0)
    vm, um = (np.bitwise_or.reduce(ext[f], axis=-1) for f in (ev.site_vf, ev.site_uf))
    cand = np.flatnonzero(np.bitwise_or.reduce((vm ^ um) & ev.real_axes, axis=-1))
    scalar = ev._scalar_reshards(cand, vm[cand].tolist(), um[cand].tolist()) is not None
    with monkeypatch.context() as m:
        m.setattr(model, "SCALAR_SITES", 0)
        want = ev._compute_reshards(masks)
    for name in want.__dataclass_fields__:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
    return len(want.value) if scalar else 0


@pytest.mark.parametrize("model", ["gpt", "llama", "unet"])
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_scalar_reshards_equal_numpy_reshards(model, mesh, monkeypatch):
    """`Evaluator._compute_reshards` with its Python tail (few candidate sites) and without it:
    the same `_Reshards` byte for byte, on the states of a seeded random walk."""
    env, ev = _env(model, mesh)
    rng = np.random.default_rng(0)
    state, resharded = env.root, 0
    for _ in range(12):
        actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
        if not actions:
            break
        state = env.apply(state, actions[int(rng.integers(len(actions)))])
        resharded += _reshards_both_ways(ev, state.masks, monkeypatch)
    assert resharded > 0  # reshards priced by the Python tail were compared
