"""One compile per plan and mesh, however many presets judge it (`apply/compile_cache.py`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.apply import compile_cache
from toast_core.apply.judge import judge

MESH = tc.MeshSpec({"data": 2, "model": 4})


def mlp(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def args():
    return ({"w1": jnp.ones((16, 32)), "w2": jnp.ones((32, 8))}, jnp.ones((8, 16)))


@pytest.fixture
def fresh():
    compile_cache.clear()
    yield compile_cache
    compile_cache.clear()


@pytest.mark.slow
def test_a_plan_validated_for_two_presets_compiles_once_and_is_priced_for_each(fresh):
    a = args()
    ana = tc.analyze(tc.trace(mlp, *a))
    plan = tc.baselines.megatron(ana, MESH)
    jm = tc.jax_mesh(MESH)
    tpu = tc.validate(mlp, a, ana, plan, jm, "tpu-v5e")
    gpu = tc.validate(mlp, a, ana, plan, jm, "h100-80gb")
    assert fresh.stats()["compiles"] == 1 and fresh.stats()["hits"] == 1
    assert gpu.hlo_text == tpu.hlo_text and gpu.compiled_flops == tpu.compiled_flops
    assert gpu.compiled_memory_bytes == tpu.compiled_memory_bytes
    assert gpu.numerics_ok and tpu.numerics_ok
    # Same program, other hardware: the XLA-judged time is priced again, not reused.
    assert gpu.compiled_step_time_s != tpu.compiled_step_time_s
    # Another plan is another program.
    tc.validate(mlp, a, ana, tc.baselines.data_parallel(ana, MESH), jm, "tpu-v5e")
    assert fresh.stats()["compiles"] == 2


@pytest.mark.slow
def test_the_judge_says_when_it_reused_a_compile(fresh):
    ana = tc.analyze(tc.trace(mlp, *args()))
    plan = tc.baselines.data_parallel(ana, MESH)
    first = judge(ana, plan, MESH, tc.hardware("tpu-v5e"))
    again = judge(ana, plan, MESH, tc.hardware("tpu-v5e"))
    assert not first.reused and again.reused
    assert again.compiled_step_time_s == first.compiled_step_time_s


def test_compiler_options_and_devices_are_part_of_the_key(fresh):
    f = jax.jit(lambda x: jnp.sin(x) + jnp.sin(x))
    lowered = f.lower(jnp.ones(8))
    mesh = jax.sharding.Mesh(jax.devices()[:1], ("d",))
    other = jax.sharding.Mesh(jax.devices()[1:2], ("d",))
    plain = compile_cache.compile_lowered(lowered, mesh)
    assert compile_cache.compile_lowered(lowered, mesh) is plain
    no_cse = compile_cache.compile_lowered(lowered, mesh, {"xla_disable_hlo_passes": "cse"})
    assert no_cse is not plain
    assert compile_cache.compile_lowered(lowered, other) is not plain
    assert compile_cache.stats()["compiles"] == 3


def test_the_least_recently_used_executable_is_dropped(fresh, monkeypatch):
    monkeypatch.setattr(compile_cache, "MAX_ENTRIES", 2)
    mesh = jax.sharding.Mesh(jax.devices()[:1], ("d",))
    fns = [jax.jit(lambda x, k=k: x * k) for k in (2.0, 3.0, 4.0)]
    lowered = [f.lower(jnp.ones(4)) for f in fns]
    first = compile_cache.compile_lowered(lowered[0], mesh)
    compile_cache.compile_lowered(lowered[1], mesh)
    compile_cache.compile_lowered(lowered[0], mesh)  # used again: now the most recent
    compile_cache.compile_lowered(lowered[2], mesh)  # drops lowered[1]
    assert compile_cache.stats()["entries"] == 2
    assert compile_cache.compile_lowered(lowered[0], mesh) is first
    compile_cache.compile_lowered(lowered[1], mesh)
    assert compile_cache.stats()["compiles"] == 4
