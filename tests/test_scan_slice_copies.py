"""A scan's per-iteration slice read by a dot in another layout is one buffer, the dot's copy
(`cpu_buffers._is_scan_slice`): XLA fuses the slice's `dynamic-slice` into the copy. Fuzz seed
17 #1155 (gradient accumulation over x1 [2, 4, 8, 32], 8 devices): 1.30x XLA's bytes when the
slice and its copy were both counted; exact with one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from xla_memory import ALIGN_SLACK, replicated_memory

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost.cpu_buffers import dot_operand_copies
from toast_core.ir import primitives as prim

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 8})


def _accumulate(params, batch):
    def loss(p, x):
        return jnp.mean(jnp.einsum("abc,az->bcz", x, p["w2"]))

    def body(acc, micro):
        return jax.tree.map(jnp.add, acc, jax.grad(loss)(params, micro)), None

    grads = lax.scan(body, jax.tree.map(jnp.zeros_like, params), batch["x1"])[0]
    return jax.tree.map(lambda p, g: p - 0.1 * g / 2, params, grads)


def _args():
    return {"w2": jax.ShapeDtypeStruct((4, 1), jnp.float32)}, {
        "x1": jax.ShapeDtypeStruct((2, 4, 8, 32), jnp.float32)
    }


def _analysis():
    return tc.analyze(tc.trace(_accumulate, *_args()))


def test_a_scan_slice_read_by_a_dot_is_its_copy():
    prog = _analysis().program
    start = next(op for op in prog.ops if op.primitive == prim.SCAN_START)
    params = dict(start.params)
    (xs,) = start.results[int(params["num_consts"]) + int(params["num_carry"]) :]
    assert prog.values[xs].shape == (4, 8, 32)
    copied = dot_operand_copies(prog, [True] * len(prog.values))[0]
    assert xs not in np.asarray(copied).tolist()


def test_a_scan_slice_copy_memory():
    ana = _analysis()
    # XLA (measured, replicated on 8 devices): 8,208 of arguments, 16 of output, a 5,252-byte
    # block (table, the 4,096-byte copy, the broadcast, counter copy, counter): 13,476. The
    # model ends its block at its smallest buffer, the 16-byte slice of w (`buffers.
    # top_padding`; the loop's state, whose pieces' sizes it does not know, is never the top)
    assert predicted_cpu_memory_bytes(ana, tc.Strategy(name="replicated"), MESH, HW) == 13488.0


@pytest.mark.slow
def test_a_scan_slice_copy_matches_xla():
    predicted, compiled = replicated_memory(_accumulate, _args(), MESH)
    assert 0 <= predicted - compiled < ALIGN_SLACK
