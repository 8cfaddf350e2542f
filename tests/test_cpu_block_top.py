"""The CPU view's temporary block as XLA's heap lays it out (issue 14): the block ends where its
top buffer ends, unpadded (`buffers.top_padding`), and an output made from the step's inputs
alone is written at the step's start, its allocation lending nothing to earlier temporaries
(`buffers.made_from_inputs`). Fuzz seed 18 #988 (a `fori_loop` accumulation, 3 devices) was
1.33 of XLA's bytes, #195 (an SGD step on `mean(x @ w)`, data parallel on 8) 0.63."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xla_memory import sgd_of_mean_matvec

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost.buffers import made_from_inputs, top_padding

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 8})


def test_the_smallest_live_buffer_is_the_top():
    # ops 0..5: a 4-byte scalar over ops 1..3 (64 aligned), a 16-byte vector over ops 0..4,
    # a 64-byte buffer (no padding) over op 5; a not allocated buffer (infinite) over all.
    smallest = np.array([4.0, 16.0, 64.0, np.inf])
    pad = np.array([60.0, 48.0, 0.0, 0.0])
    start, end = np.array([1, 0, 5, 0]), np.array([4, 5, 6, 6])
    np.testing.assert_array_equal(
        top_padding(smallest, pad, start, end, 6), [48, 60, 60, 60, 48, 0]
    )


def _args():
    return {"w2": jax.ShapeDtypeStruct((16, 4), jnp.float32)}, {
        "x1": jax.ShapeDtypeStruct((16,), jnp.float32)
    }


def _data_parallel():
    ana = tc.analyze(tc.trace(sgd_of_mean_matvec, *_args()))
    return ana, tc.baselines.all(ana, MESH)["data_parallel"][0]


def test_an_update_made_from_the_inputs_is_made_first():
    ana, _ = _data_parallel()
    prog = ana.program
    new_w, loss = prog.outputs
    forward, grad = (op.results[0] for op in prog.ops if op.primitive == "dot_general")
    # fusion folds the weight gradient (an outer product) and its scalings into the update
    fused = [v.role == "intermediate" and v.id not in (forward, new_w) for v in prog.values]
    assert made_from_inputs(prog, fused, {})[new_w]
    assert not made_from_inputs(prog, fused, {})[loss]  # the forward dot's result is stored
    assert not made_from_inputs(prog, fused, {grad: 0})[new_w]  # all-reduced: made later
    fused[grad] = False  # stored on the way: made before the update
    assert not made_from_inputs(prog, fused, {})[new_w]


def test_the_forward_partial_goes_to_the_block():
    ana, strategy = _data_parallel()
    # XLA (measured, `test_..._matches_xla`): 40 of arguments, the new w's 32 and the loss's 4
    # and the outputs' 16-byte table, an 80-byte block (the dot's partial at 0, the all-reduced
    # copy at 64): 172. Lending w's allocation to the partial, the model had 108.
    assert predicted_cpu_memory_bytes(ana, strategy, MESH, HW) == 172.0


@pytest.mark.slow
def test_the_forward_partial_goes_to_the_block_matches_xla():
    ana, strategy = _data_parallel()
    check = tc.validate(
        sgd_of_mean_matvec, _args(), ana, strategy, tc.jax_mesh(MESH), HW, check_numerics=False
    )
    assert check.predicted_memory_bytes == check.compiled_memory_bytes
