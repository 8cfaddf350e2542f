"""Predicted flops of layout and update ops (gathers and scatters sharing an index, concatenates,
stacks, expand_dims) against XLA's `cost_analysis()` (issue 14, fuzz seed 17's layout misses)."""

import jax
import jax.numpy as jnp
import pytest
from xla_flops import predicted_and_compiled, unsharded_flops

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


def sgd_on(loss):
    def step(p, x):
        return p - 0.1 * jax.grad(loss)(p, x)

    return step


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss",
    [
        lambda p, x: jnp.mean(jnp.concatenate([p * x, x], 0)),  # the cotangent split
        lambda p, x: jnp.mean(jnp.concatenate([x, p * x, x], 1)),
        lambda p, x: jnp.mean(jnp.stack([p * x, x])),
    ],
)
def test_a_split_of_a_constant_cotangent_scales_like_its_scalar(loss):
    """The gradient of a concatenate or stack under a mean loss is a split of the loss's
    broadcast cotangent: each piece is still a broadcast of one scalar to XLA
    (`simplify._constant_splat`). A plain `jax.jit` folds `0.1 * (c * x)` into one multiply
    (128 flops on [8, 8]); `tc.shard` constrains the piece `c`, which then scales `x` from the
    left, and XLA keeps both multiplies (`simplify._scaled_operand`: 192, as validated)."""
    args = (jax.ShapeDtypeStruct((8, 8), F32), jax.ShapeDtypeStruct((8, 8), F32))
    predicted, compiled = predicted_and_compiled(sgd_on(loss), args, {"data": 1})
    assert predicted == compiled


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss",
    [
        lambda p, x: jnp.mean(p[2:]),  # the cotangent padded back to [8, 8]
        lambda p, x: jnp.mean(p[::2]),  # padded with interior zeros
        lambda p, x: jnp.mean(jnp.pad(p, ((1, 2), (0, 3)))),  # a slice of it: folded
        lambda p, x: jnp.mean(jnp.pad(p, ((1, 2), (0, 3)), mode="edge")),  # folded
    ],
)
def test_a_padded_constant_cotangent_is_computed(loss):
    """XLA's constant folder skips a pad of a broadcast: the gradient of `mean(p[2:])` pads the
    mean's broadcast cotangent, so `0.1 * g` runs on the pad's [8] core (`simplify.
    _padded_broadcast`: 72 flops on [8, 8], not 64). A pad that only slices, or one of a
    reduction of the broadcast (an edge pad of every dim), still folds."""
    args = (jax.ShapeDtypeStruct((8, 8), F32), jax.ShapeDtypeStruct((8, 8), F32))
    predicted, compiled = unsharded_flops(sgd_on(loss), *args)
    assert predicted == compiled
