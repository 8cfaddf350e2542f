"""Two rules of XLA:CPU's temporary block the model missed (fuzz seed 19's memory
under-predictions): the buffers of the first wave of XLA:CPU's breadth-first scheduler (the
instructions reading only parameters and constants) are all live at once when it ends
(`buffers.first_wave`), and a mean of a reshaped outer product stores the product XLA writes in
its canonical shape for its tree reduction (`cpu_buffers.tree_reduced_operands` through
`_reshape_source`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from xla_memory import replicated_memory

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost.cpu_buffers import tree_reduced_operands
from toast_core.cost.fusion import materialized

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 8})
REPLICATED = tc.Strategy(name="replicated")


def _sgd_on(model):
    """An SGD step on `mean(model(x1, w2))`."""

    def step(params, batch):
        def loss(p):
            return jnp.mean(model(batch["x1"], p["w2"]))

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    return step


_sgd = _sgd_on(lambda x, w: x @ w)

_SGD_ARGS = (
    {"w2": jax.ShapeDtypeStruct((2, 64), jnp.float32)},
    {"x1": jax.ShapeDtypeStruct((16, 2), jnp.float32)},
)


def test_a_constant_cotangent_is_broadcast_before_the_forward():
    # XLA (`..._matches_xla`): the mean's cotangent broadcast to [16, 64] (made from a literal
    # alone) and the forward's [16, 64] product, both of the first wave, live together: an
    # 8,192-byte block. The broadcast made after the product's last reader: 5,268 in all.
    ana = tc.analyze(tc.trace(_sgd, *_SGD_ARGS))
    assert predicted_cpu_memory_bytes(ana, REPLICATED, MESH, HW) == 9364.0


@pytest.mark.slow
def test_a_constant_cotangent_is_broadcast_before_the_forward_matches_xla():
    assert replicated_memory(_sgd, _SGD_ARGS, MESH) == (9364.0, 9364.0)


_sgd_of_merged_dot = _sgd_on(lambda x, w: jnp.einsum("abc,cz->abz", x, w))

_MERGED_ARGS = (
    {"w2": jax.ShapeDtypeStruct((8, 8), jnp.float32)},
    {"x1": jax.ShapeDtypeStruct((8, 4, 8), jnp.float32)},
)


def test_a_dot_reading_a_bitcast_is_not_in_the_first_wave():
    """Fuzz seed 19 #89: the forward dot reads x[8, 4, 8] as a [32, 8] bitcast, a wave later,
    and the weight gradient's dot frees the cotangent broadcast before it: XLA's block is one
    1,024-byte buffer, not two (the first wave counted with the dot: 1.40 of XLA's bytes)."""
    ana = tc.analyze(tc.trace(_sgd_of_merged_dot, *_MERGED_ARGS))
    assert predicted_cpu_memory_bytes(ana, REPLICATED, MESH, HW) == 2580.0


@pytest.mark.slow
def test_a_dot_reading_a_bitcast_matches_xla():
    assert replicated_memory(_sgd_of_merged_dot, _MERGED_ARGS, MESH) == (2580.0, 2580.0)


def _mean_of_reshaped_outer(params, batch):
    v = jnp.einsum("abc,az->bcz", batch["x1"], params["w2"])
    return jnp.mean(v.reshape(24, 6, 2, 2))


_OUTER_ARGS = (
    {"w2": jax.ShapeDtypeStruct((1, 4), jnp.float32)},
    {"x1": jax.ShapeDtypeStruct((1, 24, 6), jnp.float32)},
)


def test_a_mean_of_a_reshaped_outer_product_reduces_its_canonical_dims():
    """Fuzz seed 19 #689: XLA writes the outer product as f32[144, 4] and reduces it with a
    tree reduction (a dim over 32), which stores it; [24, 6, 4] has no dim over 32."""
    ana = tc.analyze(tc.trace(_mean_of_reshaped_outer, *_OUTER_ARGS))
    prog = ana.program
    (reduce,) = [op for op in prog.ops if op.primitive == "reduce_sum"]
    rows = tree_reduced_operands(prog, materialized(prog))
    assert [(v, lo, scale) for v, lo, _, scale, _, _ in rows] == [
        (reduce.operands[0], reduce.index, 1.0),
        (reduce.operands[0], reduce.index, 5 / 576),  # XLA: f32[5, 1] of windows
    ]
    # XLA: the product's 2,304 bytes and the windows' 20 in the block (the model had 596).
    assert predicted_cpu_memory_bytes(ana, REPLICATED, MESH, HW) == 2920.0


@pytest.mark.slow
def test_a_mean_of_a_reshaped_outer_product_matches_xla():
    assert replicated_memory(_mean_of_reshaped_outer, _OUTER_ARGS, MESH) == (2920.0, 2920.0)
