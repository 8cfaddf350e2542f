"""The operand an op with a replicate factor reads whole is gathered into a new buffer
(`cost/replicate_buffers.py`; issue 14, fuzz seed 17 #1021: a softmax's `top_k` over the batch
dim sharded 4 ways, 0.52 of XLA's bytes without it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import toast_core as tc
from toast_core.apply.validate import CPU_BUFFER_ALIGN_BYTES
from toast_core.cost import CostOptions
from toast_core.cost.buffers import allocated_memory
from toast_core.cost.model import evaluator
from toast_core.cost.replicate_buffers import replicate_gather_buffers

HW = tc.hardware("tpu-v5e")
MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})


def _route(params, batch):
    """Fuzz seed 17 #1021: top-k routing of x[4, 1, 64, 16] (its `top_k` reads dim 0 whole)."""
    x = batch["x1"]
    gates = jax.nn.softmax(x, axis=-1)
    _, idx = lax.top_k(gates, 3)
    mask = jnp.sum(jax.nn.one_hot(idx, x.shape[-1], dtype=gates.dtype), axis=-2)
    return (jnp.abs(gates * mask),)


def _args():
    return {}, {"x1": jax.ShapeDtypeStruct((4, 1, 64, 16), jnp.float32)}


def _data_parallel(ana):
    return tc.baselines.all(ana, MESH_2X4)["data_parallel"][0]


def test_the_gathered_operand_is_a_buffer_at_the_top_k():
    ana = tc.analyze(tc.trace(_route, *_args()))
    strategy = _data_parallel(ana)
    ev = evaluator(ana, MESH_2X4, HW, CostOptions(donate_outputs=False))
    masks = strategy.fine_masks(ana, MESH_2X4)
    _, local, _ = ev._local(masks)
    size, start, end = replicate_gather_buffers(ev, masks, local)
    (top_k,) = [op.index for op in ana.program.ops if op.primitive == "top_k"]
    # The whole f32[4, 1, 64, 16] operand, live at the op alone.
    assert size.tolist() == [4 * 64 * 16 * 4.0]
    assert start.tolist() == [top_k] and end.tolist() == [top_k + 1]
    # ... and the CPU view's temporaries hold it there, beside the operand's shard.
    _, _, block = allocated_memory(ev, strategy, CPU_BUFFER_ALIGN_BYTES, cpu=True)
    assert block[top_k] >= 16384 + 4096


def test_nothing_is_gathered_when_the_dim_is_whole():
    """Replicated, the replicate rows stay (on no mesh axis) but gather nothing (fuzz seed 17
    #950: a replicated `sort` had been given its operand twice, 2.6 of XLA's bytes)."""
    ana = tc.analyze(tc.trace(_route, *_args()))
    strategy = tc.baselines.all(ana, MESH_2X4)["replicated"][0]
    ev = evaluator(ana, MESH_2X4, HW, CostOptions(donate_outputs=False))
    masks = strategy.fine_masks(ana, MESH_2X4)
    _, local, _ = ev._local(masks)
    assert len(ev.rep) and not len(replicate_gather_buffers(ev, masks, local)[0])


@pytest.mark.slow
def test_gathered_top_k_memory_matches_xla():
    args = _args()
    ana = tc.analyze(tc.trace(_route, *args))
    check = tc.validate(
        _route, args, ana, _data_parallel(ana), tc.jax_mesh(MESH_2X4), HW, check_numerics=False
    )
    assert abs(check.predicted_memory_bytes / check.compiled_memory_bytes - 1) <= 0.1, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )
