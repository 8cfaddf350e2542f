"""Predicted flops of layout and update ops (gathers and scatters sharing an index, concatenates,
stacks, expand_dims) against XLA's `cost_analysis()` (issue 14, fuzz seed 17's layout misses)."""

import jax
import jax.numpy as jnp
import pytest
from xla_flops import predicted_and_compiled

F32 = jnp.float32


def update_read_at_its_index(x, i):  # fuzz seed 17 #870
    return x.at[:, i].add(jnp.tanh(x[:, i]))


def set_at_an_affine_index(x, i):
    j = i * 2 + 1
    return x.at[:, j].set(jnp.tanh(x[:, j]))


def gather_and_zero_at(x, i):
    return jnp.tanh(x[:, i]), x.at[:, i].set(0.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fn", [update_read_at_its_index, set_at_an_affine_index, gather_and_zero_at]
)
def test_an_index_read_by_a_gather_and_a_scatter_is_computed_for_each(fn):
    """XLA fuses the cheap ops making a gather's index (jax's `where(i < 0, i + n, i)`, and any
    arithmetic before it) into the gather's fusion, and computes them again for the scatter
    reading the same index (`gather_fusion._own_fusion`): 30 flops, not 21, for seed 17 #870."""
    args = (jax.ShapeDtypeStruct((4, 8), F32), jax.ShapeDtypeStruct((3,), jnp.int32))
    predicted, compiled = predicted_and_compiled(fn, args, {"data": 1})
    assert predicted == compiled
