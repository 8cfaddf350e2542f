"""Flops of values that one dot reads as they are and another through XLA:CPU's layout copy:
the cheap ops making them are computed in both fusions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xla_flops import replicated_ratio

import toast_core as tc
from toast_core.apply.validate import _cpu_copied_operands
from toast_core.cost.fusion import _copied_and_read_directly, _fusible_ops


def _gelu_grads(p, x):
    """Gradients of a two-layer gelu: the gelu gradient's output is read by the input-gradient
    dot as it is ([2, 4, 4] contracted over its last dim) and by the weight-gradient dot
    through a copy (contracted over (0, 1))."""

    def loss(p):
        h = jnp.einsum("abc,cz->abz", x, p["w2"])
        return jnp.mean(jax.nn.gelu(h @ p["w4"]))

    return jax.grad(loss)(p)


def _args():
    rng = np.random.default_rng(0)
    p = {
        "w2": jnp.asarray(rng.normal(0, 0.02, (4, 2)), jnp.float32),
        "w4": jnp.asarray(rng.normal(0, 0.02, (2, 4)), jnp.float32),
    }
    return p, jnp.asarray(rng.normal(0, 0.02, (2, 4, 4)), jnp.float32)


def test_value_read_directly_and_through_a_copy_is_found():
    prog = tc.trace(_gelu_grads, *_args())
    copied = _cpu_copied_operands(prog)
    fuses = _fusible_ops(prog)
    both = [op.index for op in prog.ops if _copied_and_read_directly(prog, op, copied, fuses)]
    assert len(both) == 1
    (r,) = prog.ops[both[0]].results
    readers = {prog.ops[o].primitive for o, _ in prog.uses()[r]}
    assert readers == {"dot_general"}


@pytest.mark.slow
def test_chain_is_computed_again_in_the_copy():
    """XLA:CPU: `add_bitcast_fusion` (for the input-gradient dot) and `copy_bitcast_fusion` (for
    the weight-gradient dot) both hold the gelu gradient's chain: 1,810 flops; counted once, the
    model said 1,298 (0.71)."""
    assert replicated_ratio(_gelu_grads, _args()) == pytest.approx(1.0, abs=0.05)


def _gathered_sgd(w, x, i):
    """An SGD step on `mean(take_along_axis(tile(x), i, axis=0) @ w)`: the gathered value
    [1, 2, 32, 32] is read by the forward dot (free dims (0, 1, 2)) and by the weight-gradient
    dot (contracted over (0, 1, 2)), both as one [64, 32] bitcast."""
    loss = lambda w: jnp.mean(jnp.take_along_axis(jnp.tile(x, (2, 1, 1, 1)), i, axis=0) @ w)  # noqa: E731
    value, g = jax.value_and_grad(loss)(w)
    return w - 0.1 * g, value


def test_dots_reading_one_bitcast_share_its_gather_mask():
    """XLA:CPU computes the gather and its fill mask once, in the `select_bitcast_fusion` both
    dots read (fuzz seed 19 #241); counted once per dot, the model said 1.43 of XLA's flops."""
    rng = np.random.default_rng(0)
    args = (
        jnp.asarray(rng.normal(0, 0.02, (32, 4)), jnp.float32),
        jnp.asarray(rng.normal(0, 0.02, (1, 2, 32, 32)), jnp.float32),
        jnp.asarray(rng.integers(0, 2, (1, 2, 32, 32)), jnp.int32),
    )
    assert replicated_ratio(_gathered_sgd, args) == pytest.approx(1.0, abs=0.05)
