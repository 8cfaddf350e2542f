"""Predicted per-device flops of a dropout that two dots read through layout copies of different
groupings, one of them on a device's slice, against XLA's `cost_analysis()`: XLA:CPU computes
the mask chain in each copy fusion (`validate._copied_in_several_groupings`)."""

import json

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.strategy.strategy import SCHEMA_VERSION


def dropout(x, key, rate=0.1):
    """The fuzz programs' dropout (`fuzz/programs.py`): a Bernoulli mask from a raw key."""
    keep = jax.random.bernoulli(jax.random.fold_in(key, 1), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def two_dots(params, batch):
    """Fuzz seed 19 #219: the dropout read by `einsum('abc,deb->acde')` and by
    `einsum('abc,bz->acz')`."""
    x = batch["x"]
    v = dropout(x, batch["key"])
    return jnp.einsum("abc,deb->acde", v, x) ** 2, jnp.einsum("abc,bz->acz", v, params["w"])


def test_a_dropout_copied_for_a_sliced_dot_and_a_whole_one_is_computed_in_each_copy():
    """On 2x3 with the first dot's `a` cut 3 ways (the search's plan for #219), that dot
    copies its device's slice of the dropout into [16, 16] (`copy_bitcast_fusion.2`, a
    dynamic slice of the chain) and the other copies it whole into [48, 16]
    (`copy_bitcast_fusion`): the mask chain, 6,912 flops, is in both. Counted once, 0.916 of
    XLA's 82,282 flops."""
    args = (
        {"w": jax.ShapeDtypeStruct((16, 8), jnp.float32)},
        {
            "x": jax.ShapeDtypeStruct((3, 16, 16), jnp.float32),
            "key": jax.ShapeDtypeStruct((2,), jnp.uint32),
        },
    )
    ana = tc.analyze(tc.trace(two_dots, *args))
    doc = {
        "schema": SCHEMA_VERSION,
        "name": "seed19-219",
        "options": [{"conflict": "K1", "option": 0}],
        "shardings": {"N1": ["data"], "N3.1": ["model"]},
    }

    strategy = tc.Strategy.from_json(json.dumps(doc), ana)
    mesh = tc.MeshSpec({"data": 2, "model": 3})
    rep = tc.validate(two_dots, args, ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"))
    assert rep.numerics_ok
    assert rep.predicted_flops == pytest.approx(rep.compiled_flops, rel=0.02)
