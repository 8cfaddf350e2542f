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
from toast_core.cost import evaluator, view_comm
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
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(view_comm, "SCALAR_ROWS", 10**6)  # the big views of these steps too
        for _ in range(data.draw(st.integers(1, 12), label="steps")):
            actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
            if not actions:
                break
            parent = state
            state = env.apply(state, data.draw(st.sampled_from(actions), label="a"))
            _compare(inc, state.masks, parent.masks)


def test_scalar_view_covers_gpt_steps_and_matches(monkeypatch):
    """Every first shard of GPT, from the root and from one FSDP-like step on: most views are
    priced by the scalar path (so the comparison above is not vacuous) and all match."""
    monkeypatch.setattr(view_comm, "SCALAR_ROWS", 10**6)
    env, ev = _env("gpt", "2x4")
    inc = Incremental(ev)
    priced = 0
    for first in env.shard_actions(env.root):
        child = env.apply(env.root, first)
        priced += _compare(inc, child.masks, env.root.masks)
        for second in env.shard_actions(child)[:4]:
            priced += _compare(inc, env.apply(child, second).masks, child.masks)
    assert priced >= 20


def _candidates(ev, masks):
    """`Evaluator._compute_reshards`' candidate sites and their layouts, computed here."""
    ext = np.concatenate((masks, [0]))
    vsub, usub = ext[ev.site_vf], ext[ev.site_uf]
    vm, um = (np.bitwise_or.reduce(x, axis=-1) for x in (vsub, usub))
    cand = np.bitwise_or.reduce((vm ^ um) & ev.real_axes, axis=-1).nonzero()[0]
    return cand, vm[cand], um[cand], vsub[cand], usub[cand]


def _same_reshards(got, want) -> None:
    for name in want.__dataclass_fields__:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("model", ["gpt", "llama", "moe", "unet"])
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_scalar_reshards_equal_numpy_reshards(model, mesh):
    """`Evaluator._scalar_reshards` (Python) and `_numpy_reshards` on the same candidate sites,
    and `_compute_reshards` (memoized) too: the same `_Reshards` byte for byte (odd sites'
    permutes included), on the states of a seeded random walk."""
    env, ev = _env(model, mesh)
    rng = np.random.default_rng(0)
    state, resharded = env.root, 0
    for _ in range(12):
        actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
        if not actions:
            break
        state = env.apply(state, actions[int(rng.integers(len(actions)))])
        cand, vm, um, vsub, usub = _candidates(ev, state.masks)
        if not len(cand):
            continue
        want = ev._numpy_reshards(cand, vm, um, vsub, usub)
        _same_reshards(ev._scalar_reshards(cand, vm.tolist(), um.tolist(), vsub, usub), want)
        _same_reshards(ev._compute_reshards(state.masks), want)
        _same_reshards(ev._compute_reshards(state.masks), want)  # from the memo
        resharded += len(want.value)
    assert resharded > 0


@pytest.mark.parametrize("model", ["gpt", "llama", "moe"])
def test_scalar_reshards_give_layout_ids_in_the_numpy_order(model):
    """Odd sites' layout ids are handed out in order of first appearance, and they order the
    reshards: two fresh evaluators walked through the same states, one pricing reshards in
    Python and one in NumPy, end with the same ids, the same reshards at every step."""
    import toast_core.cost.model as cost_model

    env, cached = _env(model, "2x2x2")
    fresh = [
        cost_model.Evaluator(cached.ana, cached.mesh, cached.hw, cached.options) for _ in range(2)
    ]
    rng = np.random.default_rng(1)
    state = env.root
    for _ in range(16):
        actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
        if not actions:
            break
        state = env.apply(state, actions[int(rng.integers(len(actions)))])
        cand, vm, um, vsub, usub = _candidates(cached, state.masks)
        if not len(cand):
            continue
        got = fresh[0]._scalar_reshards(cand, vm.tolist(), um.tolist(), vsub, usub)
        _same_reshards(got, fresh[1]._numpy_reshards(cand, vm, um, vsub, usub))
    assert list(fresh[0]._layout_ids.items()) == list(fresh[1]._layout_ids.items())
    assert fresh[1]._layout_ids  # odd sites were met


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), n_reads=st.integers(0, 40), n_ops=st.integers(1, 12))
def test_python_reread_sums_like_numpy(seed, n_reads, n_ops):
    """`Incremental._reread` (Python floats, few reads) and `_reread_numpy`: the same extra
    bytes per op and the same changed ops, bit for bit, sites repeated and out of order."""
    _, ev = _env("gpt", "2x4")
    inc = Incremental(ev)
    rng = np.random.default_rng(seed)
    n = inc.tab.n_ops
    read_i = np.array(
        [rng.integers(0, n, n_reads), rng.integers(0, 50, n_reads), rng.integers(0, 9, n_reads)]
    ).reshape(3, n_reads)
    read_bytes = rng.random(n_reads) * 10.0 ** rng.integers(0, 9, n_reads)
    base = np.zeros(n)
    base[rng.integers(0, n, 20)] = rng.random(20)
    ops = np.concatenate([read_i[0, : n_reads // 2], rng.integers(0, n, n_ops)])
    got = inc._reread(ops, read_i, read_bytes, base)
    want = inc._reread_numpy(ops, read_i, read_bytes, base)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
