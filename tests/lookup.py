"""Shared test helpers: find values and named dims of an analysis by name."""

from __future__ import annotations

import functools

import toast_core as tc


def value_id(ana: tc.Analysis, name: str) -> int:
    """Id of the value with this pytree-path or output name."""
    for v in ana.program.values:
        if v.name == name or v.output_name == name:
            return v.id
    raise AssertionError(f"no value {name}")


def dim_name(ana: tc.Analysis, value: str, dim: int) -> str:
    """Name of the (uncut) named dim holding dim `dim` of `value`."""
    (d,) = ana.value_named_dims(value_id(ana, value))[dim]
    return f"N{d}"


def random_legal_strategy(data, ana, mesh, steps=(0, 8), name: str = "random"):
    """A legal strategy drawn by walking the search environment's own legal actions from the
    root (shards and conflict cuts), `steps` (min, max) of them."""
    from hypothesis import strategies as st

    from toast_core.search.env import Environment
    from toast_core.search.types import Stop
    from toast_core.strategy import constrain, space_of

    space = space_of(ana, mesh)
    env = Environment(space, constrain(space))
    state = env.root
    for _ in range(data.draw(st.integers(*steps), label="steps")):
        actions = [a for a in env.legal_actions(state) if not isinstance(a, Stop)]
        if not actions:
            break
        state = env.apply(state, data.draw(st.sampled_from(actions), label="action"))
    return env.to_strategy(state, name)


@functools.cache
def zoo_analysis(model: str = "mlp", size: str = "tiny", train: bool = True) -> tc.Analysis:
    """The analysis of a zoo model (cached across a test module)."""
    from demos import MODEL_ZOO

    w = MODEL_ZOO[model](size=size, train=train)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
