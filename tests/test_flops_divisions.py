"""Divisions XLA's simplifier rewrites into more work (`toast_core.cost.divisions`): predicted
per-device flops against XLA's `cost_analysis()` under the data-parallel baseline on 2 devices."""

import jax
import jax.numpy as jnp
import pytest
from xla_flops import predicted_and_compiled

import toast_core as tc
from toast_core.cost.divisions import divided_divisions
from toast_core.cost.simplify import constant_values

F32 = jnp.float32
X = jax.ShapeDtypeStruct((16, 32), F32)
ARGS = ({"a": X, "b": X, "c": X},)


def _fuzz_div(v):
    """The fuzzer's `div` op (fuzz/programs.py): `v / (1 + v * v)`."""
    return v / (1.0 + v * v)


CASES = [
    (
        "(a / b) / c, a / b read again",
        lambda d: ((d["a"] / d["b"]) / d["c"], (d["a"] / d["b"]) ** 2),
    ),
    ("a / (b / c), b / c read again", lambda d: (d["a"] / (d["b"] / d["c"]), d["b"] / d["c"] + 1)),
    (
        "a division divided (fuzz seed 19 #1708)",
        lambda d: _fuzz_div(d["a"] / (1.0 + d["b"] * d["b"])),
    ),
    ("a / exp(b)", lambda d: d["a"] / jnp.exp(d["b"])),
    ("(a / b) / c alone: the inner division is dead", lambda d: (d["a"] / d["b"]) / d["c"]),
    (
        "(a / b) / 2: a scaling, not a division",
        lambda d: ((d["a"] / d["b"]) / 2.0, d["a"] / d["b"]),
    ),
]


@pytest.mark.parametrize("name, fn", CASES, ids=[c[0] for c in CASES])
def test_divided_divisions_match_xla(name, fn):
    """The model counted each division once (0.75-0.91 of XLA's flops where the inner division
    stays or an exp is negated); XLA's `HandleDivide` adds a multiply or a negate."""
    predicted, compiled = predicted_and_compiled(fn, ARGS, {"data": 2})
    assert predicted / compiled == pytest.approx(1.0, abs=0.02), (name, predicted, compiled)


def test_only_kept_inner_divisions_add_work():
    """`(a / b) / c` adds nothing when `a / b` has no other reader, one multiply when it has."""
    alone = tc.trace(lambda d: (d["a"] / d["b"]) / d["c"], *ARGS)

    def shared_fn(d):
        q = d["a"] / d["b"]
        return q / d["c"], q

    shared = tc.trace(shared_fn, *ARGS)
    assert divided_divisions(alone, constant_values(alone)) == {}
    assert list(divided_divisions(shared, constant_values(shared)).values()) == [1]
