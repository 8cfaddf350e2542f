"""A transpose that moves elements never writes its result over the operand it reads last
(`buffers.moves_elements`): XLA emits it as a copy into another layout, not elementwise on its
operand, so that operand stays a temporary beside the output the transpose makes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import toast_core as tc

MESH_8 = tc.MeshSpec({"data": 8})


def _einsum_transposed(params, batch):
    """Fuzz seed 19 #560: the einsum contracts the batch dim (a partial on each device under
    data parallel, all-reduced into a new buffer), read by a bias add and by a transpose, both
    outputs (in this order: the model follows the program's, the transpose the last reader)."""
    v3 = jnp.einsum("abcd,az->bcdz", batch["x1"], params["w2"])
    v4 = jnp.swapaxes(v3, 3, 2)
    v6 = v3 + params["w5"]
    v7 = jax.nn.silu(batch["x1"])
    return v6, v7, jnp.transpose(v4, (1, 2, 3, 0))


def test_a_transposed_all_reduce_result_stays_in_the_block():
    """XLA: the all-reduced [8, 8, 8, 8] result (16,384 bytes) is the whole temporary block
    (53,336 bytes in all); the model had written the transpose over it (36,952, 0.69)."""
    f32 = jnp.float32
    params = {"w2": jax.ShapeDtypeStruct((8, 8), f32), "w5": jax.ShapeDtypeStruct((8,), f32)}
    batch = {"x1": jax.ShapeDtypeStruct((8, 8, 8, 8), f32)}
    ana = tc.analyze(tc.trace(_einsum_transposed, params, batch))
    check = tc.validate(
        _einsum_transposed, (params, batch), ana, tc.baselines.data_parallel(ana, MESH_8),
        tc.jax_mesh(MESH_8), "tpu-v5e", check_numerics=False,
    )  # fmt: skip
    assert check.compiled_memory_bytes == 53336
    assert check.predicted_memory_bytes == check.compiled_memory_bytes
