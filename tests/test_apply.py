"""Applying strategies with XLA on 8 simulated devices: compile, numerics, and predicted vs compiled.

The judge is XLA: the sharded function must compute what the unsharded one computes, and the cost
model's per-device flops, memory and collective bytes are compared with `cost_analysis()`,
`memory_analysis()` and the collectives parsed from the optimized HLO.

Observed fidelity on the tiny zoo models (predicted / compiled): MLP flops 0.99-1.00, memory
0.89-1.20, collective bytes exact for every baseline; GPT flops 0.92-0.98, memory 0.93-1.17,
collective bytes exact for every baseline. Collective op counts after combining equal the
compiled ones for every baseline on every mesh.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import lookup
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.cost.collectives import COLLECTIVE_KINDS

pytestmark = pytest.mark.slow

HW = tc.hardware("tpu-v5e")
MESHES = {
    "8": ((8,), ("data",)),
    "2x4": ((2, 4), ("data", "model")),
    "4x2": ((4, 2), ("data", "model")),
    "2x2x2": ((2, 2, 2), ("data", "fsdp", "model")),
}


def meshes(key: str) -> tuple[tc.MeshSpec, Mesh]:
    shape, names = MESHES[key]
    spec = tc.MeshSpec(dict(zip(names, shape)))
    return spec, Mesh(np.array(jax.devices()).reshape(shape), names)


@functools.cache
def zoo(name: str):
    w = MODEL_ZOO[name](size="tiny", train=True)
    return w.fn, w.args, tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


def attention(params: dict, x: jax.Array) -> jax.Array:
    """One single-head self-attention layer, x[B, S, D] -> [B, S, D]: the sequence conflict."""
    q, k, v = x @ params["wq"], x @ params["wk"], x @ params["wv"]
    p = jax.nn.softmax(jnp.einsum("bsd,btd->bst", q, k) / 4.0, axis=-1)
    return jnp.einsum("bst,btd->bsd", p, v) @ params["wo"]


@functools.cache
def attention_workload():
    rng = np.random.default_rng(0)
    params = {
        k: jnp.asarray(rng.normal(0, 0.3, (16, 16)), jnp.float32) for k in ("wq", "wk", "wv", "wo")
    }
    x = jnp.asarray(rng.normal(0, 1, (4, 8, 16)), jnp.float32)
    args = (params, x)
    return attention, args, tc.analyze(tc.trace(attention, *args, param_argnums=(0,)))


def fidelity(check: tc.ValidationReport) -> str:
    return (
        f"flops {check.predicted_flops:.0f}/{check.compiled_flops:.0f}={check.flops_ratio:.3f}, "
        f"memory {check.predicted_memory_bytes:.0f}/{check.compiled_memory_bytes:.0f}="
        f"{check.memory_ratio:.3f}, collectives predicted {nonzero(check.predicted_collective_bytes)}"
        f" compiled {nonzero(check.compiled_collective_bytes)}"
    )


def nonzero(by_kind: dict) -> dict:
    return {k: v for k, v in by_kind.items() if v}


def assert_faithful(check, what: str, flops_rel: float, memory_rel: float) -> None:
    shown = f"{what}: {fidelity(check)}"
    assert check.numerics_ok, f"{what}: max abs error {check.max_abs_error}"
    assert check.flops_ratio == pytest.approx(1.0, abs=flops_rel), shown
    assert check.predicted_transcendentals == pytest.approx(
        check.compiled_transcendentals, rel=0.02
    ), shown
    assert check.memory_ratio == pytest.approx(1.0, abs=memory_rel), shown
    for kind in COLLECTIVE_KINDS:
        predicted = check.predicted_collective_bytes.get(kind, 0.0)
        compiled = check.compiled_collective_bytes.get(kind, 0.0)
        assert predicted == pytest.approx(compiled, rel=0.01), f"{kind} bytes, {shown}"
    # Op counts after XLA's combiners (CPU: only all-reduces combine; reduce-scatters run as
    # all-reduces), and a step time judged from the compiled program.
    assert check.predicted_collective_ops == check.compiled_collective_ops, shown
    assert check.compiled_step_time_s >= check.compiled_comm_s > 0 or not any(
        check.compiled_collective_ops.values()
    ), shown


# -- baselines --------------------------------------------------------------------------------


@pytest.mark.parametrize("mesh_key", list(MESHES))
def test_mlp_baselines_compile_match_numerics_and_predictions(mesh_key):
    fn, args, ana = zoo("mlp")
    spec, mesh = meshes(mesh_key)
    applied = {n: s for n, (s, _) in tc.baselines.all(ana, spec).items() if s is not None}
    expected = {"replicated", "data_parallel", "fsdp", "megatron"}
    if len(spec.axis_names) > 1:
        expected.add("dp_megatron")
    assert expected <= set(applied), f"missing baselines on {spec}: {expected - set(applied)}"
    for name, strategy in applied.items():
        check = tc.validate(fn, args, ana, strategy, mesh, HW)
        assert_faithful(check, f"mlp {name} on {spec}", flops_rel=0.05, memory_rel=0.30)


GPT_ON_2X4 = (
    "replicated",
    "data_parallel",
    "fsdp",
    "megatron",
    "dp_megatron",
    "fsdp_megatron",
    "sequence_parallel",
)
GPT_CASES = [("2x4", name) for name in GPT_ON_2X4] + [
    ("8", "data_parallel"),
    ("8", "fsdp"),
    ("4x2", "megatron"),
    ("4x2", "sequence_parallel"),
    ("2x2x2", "dp_megatron"),
    ("2x2x2", "fsdp"),
]


def test_every_gpt_baseline_applicable_on_2x4_is_covered():
    _, _, ana = zoo("gpt")
    spec, _ = meshes("2x4")
    applicable = {n for n, (s, _) in tc.baselines.all(ana, spec).items() if s is not None}
    assert applicable == set(GPT_ON_2X4)


@pytest.mark.parametrize(("mesh_key", "name"), GPT_CASES, ids=[f"{m}-{n}" for m, n in GPT_CASES])
def test_gpt_baselines_compile_match_numerics_and_predictions(mesh_key, name):
    fn, args, ana = zoo("gpt")
    spec, mesh = meshes(mesh_key)
    strategy, why = tc.baselines.all(ana, spec)[name]
    assert strategy is not None, why
    check = tc.validate(fn, args, ana, strategy, mesh, HW)
    assert_faithful(check, f"gpt {name} on {spec}", flops_rel=0.05, memory_rel=0.30)


# -- random legal strategies ------------------------------------------------------------------


def random_legal_strategy(data, ana: tc.Analysis, mesh: tc.MeshSpec) -> tc.Strategy:
    return lookup.random_legal_strategy(data, ana, mesh, (1, 7), "random")


def check_random_strategy(data, workload) -> None:
    fn, args, ana = workload
    spec, mesh = meshes(data.draw(st.sampled_from(list(MESHES)), label="mesh"))
    strategy = random_legal_strategy(data, ana, spec)
    check = tc.validate(fn, args, ana, strategy, mesh, HW)
    what = f"{strategy.shardings} options {strategy.options} on {spec}: {fidelity(check)}"
    assert check.numerics_ok, f"max abs error {check.max_abs_error}; {what}"
    assert check.flops_ratio == pytest.approx(1.0, abs=0.05), what
    # Cuts that move a dim between mesh axes: XLA permutes shards; the total moved must agree.
    predicted = sum(check.predicted_collective_bytes.values())
    compiled = sum(check.compiled_collective_bytes.values())
    if strategy.remat:
        # Remat plans compile with CSE off on CPU (validate.REMAT_COMPILER_OPTIONS), which can
        # leave a duplicated weight-gradient dot and its all-reduce that CSE merges (MLP, batch on
        # data, w2 recomputed: 4,096 compiled bytes for 2,048 predicted). Known gap: bounded here.
        assert predicted - 64 <= compiled <= 2 * predicted + 64, what
        return
    assert predicted == pytest.approx(compiled, rel=0.25, abs=64), what


def test_a_dim_moving_between_mesh_axes_at_a_cut_is_a_collective_permute():
    """A weight dim on (data, model) read on (model,) alone: the shards a device needs are not the
    ones a gather over `data` would give it, so XLA permutes them first."""
    fn, args, ana = zoo("mlp")
    spec, mesh = meshes("4x2")
    strategy = tc.Strategy.make(
        ana,
        {"N1.0": ("model",), "N1.2": ("data", "model"), "N2.0": ("model",)},
        ((0, 0), (1, 0), (2, 1)),
    )
    check = tc.validate(fn, args, ana, strategy, mesh, HW)
    assert check.numerics_ok
    permuted = check.compiled_collective_bytes["collective-permute"]
    assert permuted > 0
    assert check.predicted_collective_bytes["collective-permute"] == pytest.approx(permuted)
    report = tc.estimate(ana, strategy, spec, HW)
    assert any("resharded" in c.cause for c in report.collectives if c.kind == "collective-permute")


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_random_legal_strategies_of_the_mlp_train_step_compile_and_match(data):
    check_random_strategy(data, zoo("mlp"))


def test_attention_has_the_sequence_self_conflict():
    _, _, ana = attention_workload()
    assert [c.kind for c in ana.conflicts] == ["self"]
    assert len(ana.conflicts[0].options) >= 2


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_random_legal_strategies_of_attention_compile_and_match(data):
    check_random_strategy(data, attention_workload())


# -- the sharded function itself --------------------------------------------------------------


def test_shard_places_inputs_and_outputs_as_the_partition_specs_say():
    fn, args, ana = zoo("mlp")
    spec, mesh = meshes("2x4")
    strategy = tc.baselines.dp_megatron(ana, spec)
    ins, outs = tc.partition_specs(ana, strategy, mesh)
    assert ins[0] == {"w1": P(None, "model"), "w2": P("model", None)}
    sharded = tc.shard(fn, ana, strategy, mesh)
    got = sharded(*args)
    want = jax.jit(fn)(*args)
    for leaf, expected_spec in zip(jax.tree.leaves(got), jax.tree.leaves(outs)):
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, expected_spec), leaf.ndim)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
    compiled = sharded.lower(*args).compile()
    for sharding, expected_spec in zip(
        jax.tree.leaves(compiled.input_shardings[0]), jax.tree.leaves(ins)
    ):
        assert sharding.is_equivalent_to(NamedSharding(mesh, expected_spec), 2)


def test_shard_rejects_bad_meshes():
    fn, _, ana = zoo("mlp")
    spec, _ = meshes("2x4")
    strategy = tc.baselines.dp_megatron(ana, spec)
    with pytest.raises(tc.ToastError, match="mesh"):
        tc.shard(fn, ana, strategy, spec)
    _, only_data = meshes("8")
    with pytest.raises(tc.StrategyError, match="'model'"):
        tc.shard(fn, ana, strategy, only_data)


def test_validate_refuses_a_run_this_host_cannot_hold_before_allocating():
    big = jax.ShapeDtypeStruct((1 << 20, 1 << 15), jnp.float32)  # 128 GiB

    def double(x):
        return x * 2.0

    ana = tc.analyze(tc.trace(double, big))
    spec, mesh = meshes("8")
    with pytest.raises(tc.ToastError, match=r"validate: .* GiB of host memory"):
        tc.validate(double, (big,), ana, tc.Strategy(), mesh, HW)
