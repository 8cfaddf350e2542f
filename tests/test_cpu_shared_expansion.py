"""The CPU view stores an expanded special function's expensive parts when several fusions read
its value (`cpu_buffers.shared_expansion_parts`): XLA duplicates the cheap root over the parts
into each reading fusion and never duplicates an expensive part, so each part is a fusion of
its own. Before the rule the model stored the value once: `digamma(x * x + 1)` of f32[64] read
by a matmul and a min was 0.72 of XLA's bytes, read by two mins 0.51; fuzz seed 19 #178 0.32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as sp
import pytest
from xla_memory import replicated_memory

import toast_core as tc
from toast_core.cost.cpu_buffers import shared_expansion_parts
from toast_core.cost.fusion import materialized

MESH = tc.MeshSpec({"data": 1})
N = 64
FUNCTIONS = {"digamma": sp.digamma, "erfc": jax.lax.erfc, "lgamma": jax.lax.lgamma}
X = jax.ShapeDtypeStruct((N,), jnp.float32)
W = jax.ShapeDtypeStruct((N, 8), jnp.float32)


def _matmul_and_min(f):
    def step(x, w):
        y = f(x * x + 1.0)
        return y @ w, jnp.minimum(y, 0.3)

    return step


def _two_loops(f):
    def step(x):
        y = f(x * x + 1.0)
        return jnp.minimum(y, 0.3), jnp.maximum(y, 0.1) * 2.0

    return step


def _parts(step, *args) -> list[int]:
    prog = tc.analyze(tc.trace(step, *args)).program
    return [row[4] for row in shared_expansion_parts(prog, materialized(prog))]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_the_parts_are_stored_beside_a_matmuls_operand(name):
    # XLA's block: digamma's 4 (erfc's 3) parts and the matmul's reshaped operand
    step = _matmul_and_min(FUNCTIONS[name])
    assert _parts(step, X, W) == [{"erfc": 3}.get(name, 4)]
    predicted, compiled = replicated_memory(step, (X, W), MESH)
    assert predicted == pytest.approx(compiled, rel=0.01)


@pytest.mark.slow
def test_the_parts_replace_a_value_only_loops_read():
    step = _two_loops(sp.digamma)
    assert _parts(step, X) == [3]  # 4 parts in XLA's block, the value in none
    predicted, compiled = replicated_memory(step, (X,), MESH)
    assert predicted == pytest.approx(compiled, rel=0.01)


@pytest.mark.slow
def test_a_chain_over_the_function_is_duplicated_too():
    # the stored product, read by a matmul and a min: XLA recomputes it from the parts
    def step(x, v, w):
        y = sp.digamma(x * x + 1.0) * v
        return y @ w, jnp.minimum(y, 0.3)

    assert _parts(step, X, X, W) == [4]
    predicted, compiled = replicated_memory(step, (X, X, W), MESH)
    assert predicted == pytest.approx(compiled, rel=0.01)


def test_one_reader_fuses_the_parts():
    def step(x, w):
        return sp.digamma(x * x + 1.0) @ w

    assert _parts(step, X, W) == []


def test_a_dot_reading_the_value_as_it_is_keeps_it_one_fusion():
    # f32[16, 8] @ w[8, 4] reads digamma's value in its canonical form: XLA stores the value
    # (parts inside) once and the min reads it (measured: one f32[16, 8] in XLA's block)
    def step(x, w):
        y = sp.digamma(x * x + 1.0)
        return y @ w, jnp.minimum(y, 0.3)

    args = jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((8, 4), jnp.float32)
    assert _parts(step, *args) == []


@pytest.mark.slow
def test_a_library_reductions_input_is_stored_as_it_is():
    # the mean of 4,096 elements is a `__ynn_fusion` call reading erfc's value from memory:
    # XLA stores the value (its parts inside) for it and the min (fuzz seed 19 #39)
    def step(x):
        y = jax.lax.erfc(x * x + 1.0)
        return jnp.mean(y), jnp.minimum(y, 0.3)

    args = (jax.ShapeDtypeStruct((64, 64), jnp.float32),)
    assert _parts(step, *args) == []
    predicted, compiled = replicated_memory(step, args, MESH)
    # XLA's 49,172 bytes hold one f32[64, 64] the model lacks (not a part: jit alone stores
    # none, 32,788 bytes); erfc's 2 parts beside the value would be 65,556
    assert predicted <= compiled
