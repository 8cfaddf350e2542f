"""A dot XLA makes in its canonical shape is not written over by the reader that makes an output
(`cost/reshaped_dots.py`; issue 14, fuzz seed 17 #1395: `x[8, 16, 2, 8] @ w + b`, 0.66 of XLA's
bytes with the dot's result in the output's allocation)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.apply.validate import CPU_BUFFER_ALIGN_BYTES
from toast_core.cost import CostOptions
from toast_core.cost.buffers import allocated_memory, local_dot_shapes
from toast_core.cost.cpu_buffers import tree_reduced_operands
from toast_core.cost.fusion import materialized
from toast_core.cost.model import evaluator
from toast_core.cost.reshaped_dots import reshaped_dot_results

HW = tc.hardware("tpu-v5e")
MESH_8 = tc.MeshSpec({"data": 8})


def _dense(params, batch):
    return (batch["x1"] @ params["w2"] + params["w4"],)


def _args(x_shape):
    params = {
        "w2": jax.ShapeDtypeStruct((8, 12), jnp.float32),
        "w4": jax.ShapeDtypeStruct((12,), jnp.float32),
    }
    return params, {"x1": jax.ShapeDtypeStruct(x_shape, jnp.float32)}


def _setup(x_shape):
    ana = tc.analyze(tc.trace(_dense, *_args(x_shape)))
    strategy = tc.baselines.all(ana, MESH_8)["data_parallel"][0]
    ev = evaluator(ana, MESH_8, HW, CostOptions(donate_outputs=False))
    return ana, strategy, ev


def test_a_merged_free_side_is_reshaped_and_a_plain_matrix_is_not():
    for x_shape, reshaped in (((8, 16, 2, 8), True), ((64, 8), False)):
        ana, strategy, ev = _setup(x_shape)
        masks = strategy.fine_masks(ana, MESH_8)
        (dot,) = [op for op in ana.program.ops if op.primitive == "dot_general"]
        got = reshaped_dot_results(ana.program, local_dot_shapes(ev, masks))
        assert got == ([dot.results[0]] if reshaped else []), x_shape


def test_the_reshaped_dot_stays_beside_the_output():
    ana, strategy, ev = _setup((8, 16, 2, 8))
    _, outputs, block = allocated_memory(ev, strategy, CPU_BUFFER_ALIGN_BYTES, cpu=True)
    # The output f32[1, 16, 2, 12] in its allocation, the dot's f32[32, 12] in the block.
    assert outputs == 1536 and block.max() == 1536


@pytest.mark.slow
def test_reshaped_dot_memory_matches_xla():
    args = _args((8, 16, 2, 8))
    ana, strategy, _ = _setup((8, 16, 2, 8))
    check = tc.validate(_dense, args, ana, strategy, tc.jax_mesh(MESH_8), HW, check_numerics=False)
    assert check.predicted_memory_bytes == check.compiled_memory_bytes == 4528


def test_a_mean_of_a_reshaped_dot_reduces_its_canonical_dims():
    """Fuzz seed 17 #73: the mean of `abs(x[8, 24, 1] @ w[1, 6])` reduces XLA's f32[192, 6] (a
    dim over 32: a tree reduction, which stores its operand), not [8, 24, 6]."""

    def loss(params, batch):
        return jnp.mean(jnp.abs(batch["x2"] @ params["w3"]))

    args = (
        {"w3": jax.ShapeDtypeStruct((1, 6), jnp.float32)},
        {"x2": jax.ShapeDtypeStruct((8, 24, 1), jnp.float32)},
    )
    prog = tc.analyze(tc.trace(loss, *args)).program
    (reduce,) = [op for op in prog.ops if op.primitive == "reduce_sum"]
    rows = tree_reduced_operands(prog, materialized(prog))
    assert [(v, lo, scale) for v, lo, _, scale, _, _ in rows] == [
        (reduce.operands[0], reduce.index, 1.0),
        (reduce.operands[0], reduce.index, 6 / (192 * 6)),  # XLA: f32[6, 1] of windows
    ]
