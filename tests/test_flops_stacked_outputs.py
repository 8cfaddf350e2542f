"""A scan step's stacked output (a ys slot) computed by an op of several arrays, against XLA's
`cost_analysis()`: XLA writes it with a dynamic-update-slice, a loop fusion, so when every
other reader fuses too, the all-paths exemption of `InstructionFusion::ComputeGloballyUnfusible`
holds and the op is computed in each fusion (`fusion._stacked_and_fused_on_all_paths`). Fuzz
seed 19 #382: the backward scan of `c = 0.5 * c + x; ys = sin(c)` computes `add_any = g + ct *
cos(c)` in the update-slice's fusion and in the carry's `* 0.5` fusion."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from xla_flops import unsharded_flops

F32 = jnp.float32


def stacked_and_carried(xs):
    def cell(c, x):
        a = c * x  # two arrays: not effectively unary
        return a * 0.5, a

    return lax.scan(cell, jnp.ones_like(xs[0]), xs)


def stacked_twice(xs):
    def cell(c, x):
        a = c + x
        return a * 0.5, (a, jnp.sin(a))

    return lax.scan(cell, jnp.ones_like(xs[0]), xs)


def stacked_and_summed(xs):
    def cell(c, x):
        a = c * x  # read by a reduction into the carry: computed in both fusions
        return c + jnp.sum(a), a

    return lax.scan(cell, jnp.ones(()), xs)


CASES = {
    # the multiply in the ys write's fusion and in the carry's: 2 + 1 + 2 control (4 before)
    ("stacked_and_carried", (4,)): (stacked_and_carried, 5),
    ("stacked_and_carried", (4, 3)): (stacked_and_carried, 11),
    # the add in both ys writes' fusions and in the carry's: 3 + 1 + 2 (4 and 8 before)
    ("stacked_twice", (4,)): (stacked_twice, 6),
    ("stacked_twice", (4, 3)): (stacked_twice, 14),
    ("stacked_and_summed", (4, 3)): (stacked_and_summed, 11),
}


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def test_a_stacked_output_of_several_arrays_is_computed_in_each_fusion(case):
    fn, xla = CASES[case]
    predicted, compiled = unsharded_flops(fn, jax.ShapeDtypeStruct(case[1], F32))
    assert compiled == xla
    assert predicted == compiled
