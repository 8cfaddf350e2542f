"""The temporary block stops at its topmost buffer's own end (`cost/block_top.py`): fuzz seed 17
#1112, a scan accumulating a [1, 8] gradient on 2x2x2, XLA's block is 132 bytes (tuple table at
0, counter at 64, a 4-byte buffer at 128), not the 192 of three aligned buffers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost.block_top import padding, unpadded_block

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2})


def test_the_top_buffer_drops_the_largest_padding_live():
    # three buffers: 24 bytes over ops [0, 3), 4 bytes over [1, 2), 60 bytes over [2, 3)
    size = np.array([64.0, 64.0, 64.0])
    pad = padding([24, 4, 60], 64)
    assert pad.tolist() == [40.0, 60.0, 4.0]
    block = np.array([64.0, 128.0, 128.0])
    got = unpadded_block(block, pad, np.array([0, 1, 2]), np.array([3, 2, 3]))
    assert got.tolist() == [24.0, 68.0, 88.0]
    assert unpadded_block(block, np.zeros(3), [0, 1, 2], [3, 2, 3]).tolist() == block.tolist()
    assert size.sum() == 192.0


def _accumulate(params, batch):
    """Fuzz seed 17 #1112: gradient accumulation over two micro-batches with `lax.scan`."""

    def loss(p, x):
        return jnp.mean(jnp.einsum("a,az->z", x, p["w2"]))

    def body(acc, micro):
        g = jax.grad(loss)(params, micro)
        return jax.tree.map(jnp.add, acc, g), None

    grads = lax.scan(body, jax.tree.map(jnp.zeros_like, params), batch["x1"])[0]
    return jax.tree.map(lambda p, g: p - 0.1 * g / 2, params, grads)


def _args():
    return {"w2": jax.ShapeDtypeStruct((1, 8), jnp.float32)}, {
        "x1": jax.ShapeDtypeStruct((2, 1), jnp.float32)
    }


def _plan(ana):
    return tc.Strategy(name="replicated")


def test_an_accumulation_loop_block_ends_at_its_accumulator():
    ana = tc.analyze(tc.trace(_accumulate, *_args()))
    # XLA (measured, replicated): 40 of arguments + 32 of output + a 132-byte block, three
    # 64-byte aligned buffers of which the top one takes 4 bytes (264 with its padding)
    assert predicted_cpu_memory_bytes(ana, _plan(ana), MESH, HW) == 204.0


@pytest.mark.slow
def test_an_accumulation_loop_matches_xla_to_the_byte():
    args = _args()
    ana = tc.analyze(tc.trace(_accumulate, *args))
    check = tc.validate(
        _accumulate, args, ana, _plan(ana), tc.jax_mesh(MESH), HW, check_numerics=False
    )
    assert check.predicted_memory_bytes == check.compiled_memory_bytes
