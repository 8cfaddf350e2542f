"""Random bits cost what TPU/GPU run: the unrolled threefry hash fused with its mask.

JAX lowers `threefry2x32` to elementwise integer work on TPU and GPU, fused with the counters
feeding it and the mask reading it; the bits never reach HBM. The cost model used to treat
`random_bits` and `bitcast_convert_type` as opaque ops writing their results to memory, so a
dropout MLP's step was predicted at 0.70 of its XLA-judged compute (after the judge stopped
charging the CPU's rolled loop, 1.13).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.search import baselines

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 8})


def dropout_matmul(key, x, w):
    return jnp.where(jax.random.bernoulli(key, 0.5, x.shape), x, 0.0) @ w


def test_random_bits_and_their_mask_fuse_into_the_select():
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    w = jax.ShapeDtypeStruct((512, 64), jnp.float32)
    ana = tc.analyze(tc.trace(dropout_matmul, jax.random.key(0), x, w))
    report = tc.estimate(ana, baselines.replicated(ana, MESH), MESH, HW)
    by_primitive: dict[str, float] = {}
    for cost in report.op_costs:
        by_primitive[cost.primitive] = by_primitive.get(cost.primitive, 0.0) + cost.bytes
    assert by_primitive["random_bits"] == 8.0  # reads its key, writes nothing
    assert by_primitive["bitcast_convert_type"] == 0.0
    # Outside the dot, only x (and scalars) is read and the masked x written (as the judge
    # re-fuses XLA's program: tests/test_hlo_compute.py).
    rest = sum(b for p, b in by_primitive.items() if p != "dot_general")
    assert rest == pytest.approx(2 * 256 * 512 * 4, rel=1e-3)
