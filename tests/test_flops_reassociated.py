"""Products of scalings of one element, which XLA's simplifier reassociates (`(A * c1) * (B *
c2)` is `(A * B) * (c1 * c2)`, `simplify._reassociated_product`), and scalar ops, whose scalar
operands XLA's effectively-unary test counts (`fusion._more_than_unary`), against XLA's
`cost_analysis()`. Fuzz seed 19 #1020: `gelu(mean(x, keepdims=True))` read by three loops,
46 of XLA's 52 flops."""

import jax
import jax.numpy as jnp
import pytest
from xla_flops import unsharded_flops

F32 = jnp.float32


def _read_thrice(v):
    return v, jax.lax.erf(v), jnp.sin(v)


def both_scaled(x, y):
    return _read_thrice((x * 0.25) * ((1 + y) * 0.5))


def divided_and_scaled(x, y):
    return _read_thrice((x / 3) * (0.5 * (1 + y)))


def one_scaled(x, y):
    return _read_thrice(x * ((1 + y) * 0.5))


def scaled_read_elsewhere(x, y):
    p = x * 0.25
    return (*_read_thrice(p * ((1 + y) * 0.5)), p)


def both_scaled_read_once(x, y):
    return (x * 0.25) * ((1 + y) * 0.5)


CASES = {
    # the add and both multiplies in each of the three loops: 9 (4 once before)
    ("both_scaled", (1,)): (both_scaled, 9),
    ("both_scaled", (1, 1)): (both_scaled, 9),
    ("both_scaled", ()): (both_scaled, 9),
    ("divided_and_scaled", (1,)): (divided_and_scaled, 9),
    # `x * c1` kept for its other reader: 1 + 9
    ("scaled_read_elsewhere", (1,)): (scaled_read_elsewhere, 10),
    # read by one loop: the two multiplies and the add, once (4 before)
    ("both_scaled_read_once", (1,)): (both_scaled_read_once, 3),
    # the constant splat of a larger array is a broadcast: no rewrite, four ops once
    ("both_scaled", (16,)): (both_scaled, 64),
    # no rewrite: a product of two arrays, stored once (on scalars the model counted 9)
    ("one_scaled", (1,)): (one_scaled, 3),
    ("one_scaled", ()): (one_scaled, 3),
}


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def test_products_of_one_element_count_as_xla_counts_them(case):
    fn, xla = CASES[case]
    arg = jax.ShapeDtypeStruct(case[1], F32)
    predicted, compiled = unsharded_flops(fn, arg, arg)
    assert compiled == xla
    assert predicted == compiled


def test_gelu_of_a_kept_dims_mean_counts_as_xla_counts_it():
    """Fuzz seed 19 #1020's tail: gelu's `x * cdf` on a [1] mean is `(sum * 0.25) * (0.5 * (1 +
    tanh))`, computed in the output's, the erf's and the sine's loops."""

    def fn(x):
        return _read_thrice(jax.nn.gelu(jnp.mean(x, axis=0, keepdims=True)))

    predicted, compiled = unsharded_flops(fn, jax.ShapeDtypeStruct((4,), F32))
    assert compiled == 18
    assert predicted == compiled
