"""argmax / argmin over a sharded dim, priced as XLA partitions them: each shard reduces locally,
then its maxima and their indices are all-gathered and reduced again (no all-reduce)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from lookup import dim_name

import toast_core as tc

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 2, "model": 4})
F32 = S32 = 4


def pick(params, x):
    """The best of 16 columns per row, the columns sharded over `model`."""
    h = jnp.tanh(x @ params["w"])  # [8, 16]
    return jnp.argmax(h, axis=1), jnp.argmin(h.astype(jnp.bfloat16), axis=1)


def _program():
    k = jax.random.split(jax.random.PRNGKey(5), 2)
    params = {"w": jax.random.normal(k[0], (6, 16))}
    x = jax.random.normal(k[1], (8, 6))
    ana = tc.analyze(tc.trace(pick, params, x, param_argnums=(0,)))
    s = tc.Strategy.make(ana, {dim_name(ana, "params.w", 1): "model"})
    return ana, s, (params, x)


def test_an_argmax_over_a_sharded_dim_gathers_the_shards_maxima_and_indices():
    ana, s, _ = _program()
    report = tc.estimate(ana, s, MESH, HW)
    got = sorted(
        (c.kind, c.mesh_axes, ana.program.values[c.value].dtype, c.result_bytes)
        for c in report.collectives
    )
    # [8] results, 4 shards: the maxima [8, 4] in the operand's dtype, the indices [8, 4] s32.
    assert got == [
        ("all-gather", ("model",), "bfloat16", 8 * 4 * 2),
        ("all-gather", ("model",), "float32", 8 * 4 * F32),
        ("all-gather", ("model",), "int32", 8 * 4 * S32),
        ("all-gather", ("model",), "int32", 8 * 4 * S32),
    ]


@pytest.mark.slow
def test_arg_reductions_match_xla():
    ana, s, args = _program()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(pick, args, ana, s, mesh, HW)
    assert check.numerics_ok
    # bf16 maxima are gathered in f32 on CPU: 4 all-gathers of 128 bytes.
    assert check.compiled_collective_bytes["all-gather"] == 4 * 8 * 4 * 4
    assert check.predicted_collective_bytes == pytest.approx(check.compiled_collective_bytes)
