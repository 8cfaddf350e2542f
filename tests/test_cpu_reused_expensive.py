"""The CPU view stores an expensive value (an exp, a special function's expensive parts) that a
fusion reusing its elements reads (`cpu_buffers.reused_expensive_buffers`): XLA:CPU never fuses
an expensive producer into a consumer that reads each of its elements several times. Before
the rule the model fused them away: `exp(x)[:, :, None] * w` was 0.83 of XLA's bytes, the
digamma's gradient (polygamma's 13 parts) 0.28; the fuzz program seed 18 #459 0.22."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as sp
import pytest
from xla_memory import replicated_memory

import toast_core as tc
from toast_core.cost.cpu_buffers import reused_expensive_buffers
from toast_core.cost.fusion import materialized

MESH = tc.MeshSpec({"data": 1})
N, M = 32, 16
FUNCTIONS = {
    "exp": jnp.exp,
    "erfc": jax.lax.erfc,
    "digamma": sp.digamma,
    "polygamma": lambda x: sp.polygamma(1, x),
}


def _outer(f):
    def step(x, w):
        y = f(x * 0.5 + 1.0)
        return (y[:, :, None] * w).reshape(N, -1)

    return step


def _args():
    return jax.ShapeDtypeStruct((N, M), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_an_expensive_value_a_broadcast_reuses_is_stored(name):
    # XLA's temporaries: 1 (exp), 3 (erfc), 4 (digamma), 13 (polygamma) buffers of f's 2 KiB
    predicted, compiled = replicated_memory(_outer(FUNCTIONS[name]), _args(), MESH)
    assert predicted == pytest.approx(compiled, rel=0.01)


@pytest.mark.slow
def test_an_expensive_value_read_once_per_element_is_not():
    def step(x):
        return jnp.sum(sp.digamma(x * 0.5 + 1.0) * 3.0, axis=0)

    args = (jax.ShapeDtypeStruct((N, M), jnp.float32),)
    ana = tc.analyze(tc.trace(step, *args))
    assert reused_expensive_buffers(ana.program, materialized(ana.program)) == []
    predicted, compiled = replicated_memory(step, args, MESH)
    assert predicted == pytest.approx(compiled, rel=0.01)


def test_log_softmax_keeps_its_reduction_buffer():
    # log(sum(exp(x - max))) is fused into the sum's fusion: one buffer, the model's already
    def step(x):
        return jax.nn.log_softmax(x, axis=1)

    ana = tc.analyze(tc.trace(step, jax.ShapeDtypeStruct((4, 8, 4), jnp.float32)))
    assert reused_expensive_buffers(ana.program, materialized(ana.program)) == []


def test_a_constant_divisor_is_a_multiply():
    def step(x, w):
        y = x / 3.0
        return y[:, :, None] * w

    ana = tc.analyze(tc.trace(step, *_args()))
    assert reused_expensive_buffers(ana.program, materialized(ana.program)) == []
