"""Repeated layers found by structure (`toast_core.analysis.layers`), whatever the names."""

from __future__ import annotations

from functools import cache

import layer_models
import numpy as np
import pytest

import toast_core as tc
from toast_core.analysis.layers import balanced_refinement, fine_signatures
from toast_core.strategy import space_of

MESH = tc.MeshSpec({"data": 2, "model": 4})


@cache
def _decisions(style: str, n_layers: int) -> tuple[int, int, int, int]:
    """(units at the root, units with every conflict resolved by option 0, conflict decision
    groups, named dim groups) of one style's train step."""
    fn, args = layer_models.STYLES[style](n_layers)
    ana = tc.analyze(tc.trace(fn, *args, param_argnums=(0, 1)))
    space = space_of(ana, MESH)
    resolved = tuple(sorted((c.id, 0) for c in ana.conflicts if c.options))
    return (
        len(space.units(())),
        len(space.units(resolved)),
        len(space.conflict_groups),
        len(ana.dim_groups),
    )


@pytest.mark.parametrize("style", sorted(layer_models.STYLES))
def test_decisions_do_not_grow_with_depth(style):
    """Flax linen (auto and explicit names), NNX, Equinox and plain dicts: 2 and 4 layers offer
    the same decisions, because every layer's dims and conflicts are decided together."""
    two, four = _decisions(style, 2), _decisions(style, 4)
    assert two == four
    assert four[3] > 0


def test_layer_names_do_not_matter():
    """Explicit Flax names that share no index pattern group like auto-named `Block_i`."""
    assert _decisions("flax_linen_explicit", 4) == _decisions("flax_linen", 4)


def test_layers_keep_roles_apart():
    """The q, k and v kernels of a Flax block go through the same library matmul: their
    param-side dims still get three signatures (one per role), each shared by all layers."""
    fn, args = layer_models.flax_linen(4)
    ana = tc.analyze(tc.trace(fn, *args, param_argnums=(0, 1)))
    sig = fine_signatures(ana)
    fine = ana.fine_of_atom
    by_role: dict[str, set[int]] = {}
    for v in ana.program.values:
        if v.role == "parameter" and v.name.endswith("kernel") and "Block" in v.name:
            layer, dense = v.name.split(".")[-3:-1]
            role = f"{dense}.in"
            by_role.setdefault(role, set()).add(int(sig[fine[ana.nda.value_atoms[v.id][0][0]]]))
    assert len(by_role) == 6  # q, k, v, o, up, down
    assert all(len(s) == 1 for s in by_role.values())  # each role: one signature for 4 layers
    qkv = {next(iter(by_role[f"Dense_{i}.in"])) for i in range(3)}
    assert len(qkv) == 3


def test_balanced_refinement():
    """A split into roles of repeated layers is kept; peeling one layer off is not."""
    # Six classes: roles a, a, a, b, b, b at round 0 all alike; round 1 tells a from b; round 2
    # also tells the first `a` apart (a neighbouring layer): kept whole.
    r0 = np.zeros(6, dtype=np.uint64)
    r1 = np.array([1, 1, 1, 2, 2, 2], dtype=np.uint64)
    r2 = np.array([7, 8, 8, 9, 9, 9], dtype=np.uint64)
    out = balanced_refinement(np.stack([r0, r1, r2]))
    assert len(set(out[:3].tolist())) == 1 and len(set(out[3:].tolist())) == 1
    assert out[0] != out[3]
    # Two repeated parts plus a unique one (a final norm after the layers' norms): split.
    out = balanced_refinement(np.stack([r0[:5], np.array([1, 1, 2, 2, 3], dtype=np.uint64)]))
    assert len(set(out.tolist())) == 3
    # Two singletons (two layers, or a first and a last layer): kept whole.
    out = balanced_refinement(np.stack([r0[:2], np.array([1, 2], dtype=np.uint64)]))
    assert out[0] == out[1]
