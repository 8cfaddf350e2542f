"""The search's incremental legality against the whole form: along random walks of search
steps, every shard `why_illegal_shard` allows leads to a strategy `Strategy.validate` accepts,
every one it refuses to one with a problem, and the tree's listing of every legal shard (for
all units, or for a few) agrees with the one-by-one check."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.search.env import Environment
from toast_core.search.types import Shard, Stop
from toast_core.strategy import constrain, space_of

MESHES = {
    "2x4": tc.MeshSpec({"data": 2, "model": 4}),
    "2x2x2": tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2}),
}


@functools.cache
def _env(model: str, mesh: str) -> Environment:
    w = MODEL_ZOO[model](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    space = space_of(ana, MESHES[mesh])
    return Environment(space, constrain(space))


def _problems(env: Environment, state) -> list[str]:
    strategy = env.to_strategy(state)
    return env.space.problems(tuple(strategy.shardings), tuple(state.options))


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["gpt", "mlp", "unet", "moe", "llama"]),
    mesh=st.sampled_from(sorted(MESHES)),
    data=st.data(),
)
def test_incremental_legality_matches_whole_strategy_check(model, mesh, data):
    env = _env(model, mesh)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    state = env.root
    for _ in range(data.draw(st.integers(1, 10), label="steps")):
        units = env.units(state)
        # Every legal shard of the state at once (the tree's listing) = one check per shard.
        listed = {(s.unit, s.axis) for s in env.shard_actions(state)}
        one_by_one = {
            (u, a)
            for u in range(len(units))
            for a in range(env.n_axes)
            if env.why_illegal_shard(state, units[u], a) is None
        }
        assert listed == one_by_one
        if units:  # a few units only, in the order asked (a greedy step's follow-ups)
            picked = rng.permutation(len(units))[: max(1, len(units) // 3)].tolist()
            assert env.shard_actions(state, picked) == [
                Shard(u, a) for u in picked for a in range(env.n_axes) if (u, a) in one_by_one
            ]
        if units:  # one shard at random, legal or not, against the whole check
            u, a = int(rng.integers(len(units))), int(rng.integers(env.n_axes))
            legal = env.why_illegal_shard(state, units[u], a) is None
            if not (int(state.masks[units[u].fines[0]]) >> a) & 1:
                child = env.apply(state, Shard(u, a))
                assert legal == (not _problems(env, child)), (u, a)
        action = env.random_action(state, rng)
        if action is None or isinstance(action, Stop):
            break
        state = env.apply(state, action)
        assert not _problems(env, state)


def test_listing_honours_forbidden_mesh_axes():
    """A forbid (`!N3@model`) removes exactly that unit's mesh axis from the listing, which
    still agrees with the one-by-one check."""
    free = _env("gpt", "2x4")
    space = free.space
    model = space.axes.index("model")
    root_units = free.units(free.root)
    u = next(s.unit for s in free.shard_actions(free.root) if s.axis == model)
    env = Environment(space, constrain(space, forbids=[f"!{root_units[u].dims[0]}@model"]))
    listed = env.shard_actions(env.root)
    units = env.units(env.root)
    assert {(s.unit, s.axis) for s in listed} == {
        (i, a)
        for i in range(len(units))
        for a in range(env.n_axes)
        if env.why_illegal_shard(env.root, units[i], a) is None
    }
    assert units == root_units  # a forbid pins nothing: the same units
    assert set(free.shard_actions(free.root)) - set(listed) == {Shard(u, model)}
