"""Known XLA limitations (`toast_core/analysis/xla_limits.py`): each still fails in plain `jax.jit`,
and no plan we propose (baselines, search) asks for it.

The reproductions run in a subprocess: some of these shardings segfault the process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import toast_core as tc
from toast_core.analysis.rules import factors_of
from toast_core.analysis.xla_limits import KNOWN_XLA_LIMITATIONS

_PREAMBLE = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("d",))
"""

#: Per limitation: programs that must still fail. Each prints `maxerr <e>` or raises/crashes.
_REPRODUCTIONS = {
    "pad-interior-sharded-result": [
        # f32[4, 2] -> [8, 2] with a zero between rows (the gradient of x[::2]), result sharded.
        """
        x = jnp.arange(8, dtype=jnp.float32).reshape(4, 2) + 1
        f = lambda x: jax.lax.pad(x, 0.0, ((0, 1, 1), (0, 0, 0)))
        y = jax.jit(f, out_shardings=NamedSharding(mesh, P("d")))(x)
        print("maxerr", float(jnp.abs(y - f(x)).max()))
        """,
        # f32[6, 2] -> [16, 2] with two zeros between rows: XLA's HLO verifier rejects it.
        """
        x = jnp.arange(12, dtype=jnp.float32).reshape(6, 2) + 1
        f = lambda x: jax.lax.pad(x, 0.0, ((0, 0, 2), (0, 0, 0)))
        y = jax.jit(f, out_shardings=NamedSharding(mesh, P("d")))(x)
        print("maxerr", float(jnp.abs(y - f(x)).max()))
        """,
    ],
    "conv-spatial-multi-axis-mesh": [
        # Spatial dim W on `data`, output features on `model`, on a 2 x 4 mesh.
        """
        from jax import lax
        mesh2 = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((4, 16, 6)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((3, 6, 8)), jnp.float32)
        f = lambda x, k: lax.conv_general_dilated(x, k, (1,), "SAME",
                                                  dimension_numbers=("NWC", "WIO", "NWC"))
        s = lambda *spec: NamedSharding(mesh2, P(*spec))
        g = jax.jit(f, in_shardings=(s(None, "data", None), s(None, None, "model")),
                    out_shardings=s(None, "data", "model"))
        print("maxerr", float(jnp.abs(g(x, k) - f(x, k)).max()))
        """,
        # The kernel gradient with the input's spatial dim on `data` alone.
        """
        from jax import lax
        mesh2 = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((4, 16, 6)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((3, 6, 8)), jnp.float32)
        f = lambda x, k: lax.conv_general_dilated(x, k, (1,), "SAME",
                                                  dimension_numbers=("NWC", "WIO", "NWC"))
        grad = jax.grad(lambda k, x: jnp.sum(jnp.tanh(f(x, k))))
        s = lambda *spec: NamedSharding(mesh2, P(*spec))
        g = jax.jit(grad, in_shardings=(s(), s(None, "data", None)), out_shardings=s())
        print("maxerr", float(jnp.abs(g(k, x) - grad(k, x)).max()))
        """,
    ],
    "scatter-one-window-indexed-sharded": [
        # x.at[i].add(u) with one index: x arrives replicated and is sharded at the scatter.
        """
        s = lambda *spec: NamedSharding(mesh, P(*spec))
        x = jnp.asarray(np.random.default_rng(0).normal(size=48), jnp.float32)
        i, u = jnp.asarray([5], jnp.int32), jnp.asarray([0.5], jnp.float32)
        f = lambda x, i, u: x.at[i].add(u)
        wsc = jax.lax.with_sharding_constraint
        g = jax.jit(lambda x, i, u: f(wsc(x, s("d")), i, u), in_shardings=(s(), s(), s()),
                    out_shardings=s("d"))
        print("maxerr", float(jnp.abs(g(x, i, u) - f(x, i, u)).max()))
        """,
    ],
    "slice-prefix-same-shard-size": [
        # x[0:1] with one element per shard, concatenated with x (the fuzzer's edge pad).
        """
        rep = NamedSharding(mesh, P())
        x = jnp.arange(8, dtype=jnp.float32) + 1
        f = lambda x: jnp.concatenate([jax.lax.with_sharding_constraint(x[0:1], rep), x])
        y = jax.jit(f, in_shardings=NamedSharding(mesh, P("d")))(x)
        print("maxerr", float(jnp.abs(y - f(x)).max()))
        """,
        # x[:-1] with two elements per shard, and x gathered whole by another reader.
        """
        rep = NamedSharding(mesh, P())
        wsc = jax.lax.with_sharding_constraint
        x = jnp.arange(16, dtype=jnp.float32) + 1
        f = lambda x: (wsc(x[:-1], rep), wsc(x, rep))
        y = jax.jit(f, in_shardings=NamedSharding(mesh, P("d")))(x)
        print("maxerr", max(float(jnp.abs(a - b).max()) for a, b in zip(y, f(x))))
        """,
    ],
}


def _still_fails(body: str) -> tuple[bool, str]:
    """(whether XLA still gets it wrong, what happened): an error, a crash or a numeric error."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    run = subprocess.run(
        [sys.executable, "-c", _PREAMBLE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    if run.returncode != 0:
        return True, f"exit {run.returncode}: {run.stderr.strip().splitlines()[-1:]}"
    err = float(run.stdout.split("maxerr")[-1])
    return err > 0, f"max error {err}"


def test_every_limitation_has_a_reproduction_and_a_test_id():
    assert set(_REPRODUCTIONS) == set(KNOWN_XLA_LIMITATIONS)
    for name, limit in KNOWN_XLA_LIMITATIONS.items():
        assert limit.test == f"tests/test_xla_limits.py::test_xla_still_fails_on[{name}]"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(KNOWN_XLA_LIMITATIONS))
def test_xla_still_fails_on(name):
    """If this fails, a JAX upgrade fixed the limitation: relax the rule, drop the entry."""
    for body in _REPRODUCTIONS[name]:
        fails, what = _still_fails(body)
        assert fails, f"{name} no longer fails ({what}):\n{body}"


# --- the analysis keeps plans away ---------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: jax.grad(lambda x: (x[::2] ** 2).sum())(x),
        lambda x: jax.grad(lambda x: jax.lax.cummax(x, axis=0).sum())(x),
        lambda x: jax.grad(lambda x: jax.lax.associative_scan(jnp.add, x, axis=0).sum())(x),
    ],
    ids=["strided_slice_grad", "cummax_grad", "associative_scan_grad"],
)
def test_interior_padded_dims_are_never_shardable(fn):
    prog = tc.trace(fn, jax.ShapeDtypeStruct((8, 6), jnp.float32), param_argnums=())
    pads = [op for op in prog.ops if op.primitive == "pad"]
    interior = [op for op in pads if any(c[2] for c in op.param("padding_config"))]
    assert interior
    ana = tc.analyze(prog)
    for op in interior:
        shapes = [prog.values[i].shape for i in op.operands]
        rule = factors_of(op, shapes, [prog.values[op.results[0]].shape])
        for d, (_, _, inner) in enumerate(op.param("padding_config")):
            if inner:
                assert rule.results[0][d] == ()  # no factor: never sharded
                assert all(rule.kinds[f] == "replicate" for f in rule.operands[0][d])
                assert ana.value_named_dims(op.results[0])[d] == ()


def strided_train_step(params, x):
    """A train step whose gradient pads along the batch dim: loss reads every other row."""

    def loss(p):
        h = jnp.tanh(x @ p["w1"])
        return jnp.sum((h[::2] @ p["w2"]) ** 2)

    grads = jax.grad(loss)(params)
    new = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return new, loss(params)


STRIDED_ARGS = (
    {
        "w1": jnp.linspace(-1.0, 1.0, 6 * 16, dtype=jnp.float32).reshape(6, 16),
        "w2": jnp.linspace(-1.0, 1.0, 16 * 4, dtype=jnp.float32).reshape(16, 4),
    },
    jnp.linspace(-2.0, 2.0, 8 * 6, dtype=jnp.float32).reshape(8, 6),
)


def _interior_pad_results(ana: tc.Analysis) -> list[int]:
    return [
        op.results[0]
        for op in ana.program.ops
        if op.primitive == "pad" and any(c[2] for c in op.param("padding_config"))
    ]


@pytest.mark.slow
def test_baselines_and_search_never_shard_an_interior_padded_dim_and_validate():
    """Batch 8 on 8 devices: data parallel once sharded the gradient's pad to one row per device,
    where XLA computes wrong values (errors of 8 and more). Now every plan keeps that dim whole
    and matches the unsharded numerics."""
    ana = tc.analyze(tc.trace(strided_train_step, *STRIDED_ARGS))
    (pad_result,) = _interior_pad_results(ana)
    assert ana.value_named_dims(pad_result)[0] == ()  # the padded batch dim: no named dim
    spec = tc.MeshSpec({"data": 8})
    hw = tc.hardware("tpu-v5e")
    plans = {name: s for name, (s, _) in tc.baselines.all(ana, spec).items() if s is not None}
    plans["search"] = tc.search(ana, spec, hw, budget_s=None, num_simulations=60).best
    assert "data_parallel" in plans
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    for name, plan in plans.items():
        specs = tc.partition_specs(ana, plan, spec)
        report = tc.validate(strided_train_step, STRIDED_ARGS, ana, plan, mesh, hw)
        assert report.numerics_ok, (name, report.max_abs_error, specs)


def conv_train_step(params, x):
    """A 1-D conv layer and a dense head: the conv's spatial dim W is a named dim of its own."""

    def loss(p):
        h = jax.lax.conv_general_dilated(
            x, p["k"], (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC")
        )
        return jnp.sum(jnp.tanh(h) @ p["w"])

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


CONV_ARGS = (
    {
        "k": jnp.linspace(-1.0, 1.0, 3 * 6 * 8, dtype=jnp.float32).reshape(3, 6, 8),
        "w": jnp.linspace(-1.0, 1.0, 8 * 4, dtype=jnp.float32).reshape(8, 4),
    },
    jnp.linspace(-2.0, 2.0, 4 * 16 * 6, dtype=jnp.float32).reshape(4, 16, 6),
)


def _spatial_dim(ana) -> str:
    x = next(v for v in ana.program.values if v.name.endswith("x") and v.rank == 3)
    (d,) = ana.value_named_dims(x.id)[1]
    return f"N{d}"


def test_conv_spatial_dims_stay_replicated_on_multi_axis_meshes():
    ana = tc.analyze(tc.trace(conv_train_step, *CONV_ARGS))
    spatial = _spatial_dim(ana)
    two_axes = tc.MeshSpec({"data": 2, "model": 4})
    with pytest.raises(tc.PinError, match="known XLA limitation"):
        tc.check_pins(ana, two_axes, [f"{spatial}@data"])
    with pytest.raises(tc.StrategyError, match="must stay replicated"):
        tc.Strategy.make(ana, {spatial: "model"}).validate(ana, two_axes)
    # On a one-axis mesh the same sharding is legal (XLA gets it right there).
    tc.Strategy.make(ana, {spatial: "data"}).validate(ana, tc.MeshSpec({"data": 8}))
    plans = [s for s, _ in tc.baselines.all(ana, two_axes).values() if s is not None]
    plans.append(
        tc.search(ana, two_axes, tc.hardware("tpu-v5e"), budget_s=None, num_simulations=80).best
    )
    for plan in plans:
        assert not [n for n, _ in plan.shardings if tc.parent_name(n) == spatial], plan


@pytest.mark.slow
def test_searched_conv_plans_validate_on_a_multi_axis_mesh():
    ana = tc.analyze(tc.trace(conv_train_step, *CONV_ARGS))
    spec = tc.MeshSpec({"data": 2, "model": 4})
    hw = tc.hardware("tpu-v5e")
    plan = tc.search(ana, spec, hw, budget_s=None, num_simulations=80).best
    report = tc.validate(conv_train_step, CONV_ARGS, ana, plan, tc.jax_mesh(spec), hw)
    assert report.numerics_ok, (plan, report.max_abs_error)


def one_index_scatter(params, batch):
    """The fuzzer's program 475 (seed 11), minimized: a one-window scatter-add into a replicated
    concatenation that is also read whole, and a bias on the scattered result."""
    v2 = jnp.concatenate([batch["x"], jnp.tanh(batch["x"])], axis=0)
    v6 = v2.at[batch["i"]].add(jnp.tanh(v2[batch["i"]]))
    return jnp.where(v2 > 0.1, v2, v6), v6 + params["w"]


SCATTER_ARGS = (
    {"w": jnp.linspace(-1.0, 1.0, 48, dtype=jnp.float32)},
    {"x": jnp.linspace(-2.0, 2.0, 24, dtype=jnp.float32), "i": jnp.asarray([3], jnp.int32)},
)


def _scatter_operand_factors(ana):
    (op,) = [op for op in ana.program.ops if op.primitive == "scatter-add"]
    shapes = [ana.program.values[i].shape for i in op.operands]
    return op, factors_of(op, shapes, [ana.program.values[op.results[0]].shape])


def test_one_window_scatter_gathers_its_indexed_operand_dim():
    ana = tc.analyze(tc.trace(one_index_scatter, *SCATTER_ARGS))
    op, rule = _scatter_operand_factors(ana)
    assert rule.operands[0][0] == ()  # read whole: never sharded at the scatter
    assert rule.results[0][0]  # the result may still be sharded
    # A scatter with many update windows keeps the masked rule (each device its own rows).
    many = (SCATTER_ARGS[0], {**SCATTER_ARGS[1], "i": jnp.asarray([3, 9, 30], jnp.int32)})
    _, rule = _scatter_operand_factors(tc.analyze(tc.trace(one_index_scatter, *many)))
    assert rule.operands[0][0] == rule.results[0][0]


@pytest.mark.slow
def test_one_window_scatter_plans_validate():
    """Before the rule, the searched plan sharded the scatter's operand on `data` (a cut from the
    replicated concatenation) and XLA computed wrong values (error 0.0497)."""
    ana = tc.analyze(tc.trace(one_index_scatter, *SCATTER_ARGS))
    spec = tc.MeshSpec({"data": 8})
    hw = tc.hardware("tpu-v5e")
    plans = {name: s for name, (s, _) in tc.baselines.all(ana, spec).items() if s is not None}
    plans["search"] = tc.search(ana, spec, hw, budget_s=None, num_simulations=24).best
    op, _ = _scatter_operand_factors(ana)
    (result_dim,) = ana.value_named_dims(op.results[0])[0]
    plans["pinned"] = tc.search(
        ana, spec, hw, budget_s=None, num_simulations=8, pins=[f"N{result_dim}@data"]
    ).best
    for name, plan in plans.items():
        report = tc.validate(one_index_scatter, SCATTER_ARGS, ana, plan, tc.jax_mesh(spec), hw)
        assert report.numerics_ok, (name, plan, report.max_abs_error)


def edge_pad(params, batch):
    """The fuzzer's program 1041 (seed 13), minimized: `jnp.pad(..., mode="edge")` slices
    `x[0:1]` and `x[1:2]` and concatenates them with x."""
    return (jnp.pad(batch["x"], [(1, 2)], mode="edge"),)


def prefix_beside_cumsum(b: int):
    """`x[0:b]` beside a cumulative sum that gathers x along the same dim."""

    def step(params, batch):
        x = jnp.tanh(batch["x"])
        return jnp.cumsum(x, axis=0), x[0:b] * 2.0

    return step


def _prefix_args(n: int):
    batch = {"x": jnp.linspace(-2.0, 2.0, n * 3, dtype=jnp.float32).reshape(n, 3)}
    return {}, batch


def _slice_value_and_use_specs(ana, plan, spec):
    """(the value's PartitionSpec, the use's) of the one prefix slice's operand under the plan."""
    from toast_core.apply.shard import _Specs

    specs = _Specs(ana, plan, spec)
    (op,) = [
        op
        for op in ana.program.ops
        if op.primitive == "slice" and not any(op.param("start_indices"))
    ]
    value = specs.value(op.operands[0])
    return value, specs.cut_uses().get((op.index, 0), value)


@pytest.mark.parametrize("b, gathered", [(15, True), (9, True), (8, False), (1, False)])
def test_prefix_slices_read_their_operand_gathered_exactly_when_xla_would_fail(b, gathered):
    """x[0:b] of [16] on 8 shards (2 elements each): XLA fails when ceil(b / 8) == 2."""
    ana = tc.analyze(tc.trace(prefix_beside_cumsum(b), *_prefix_args(16)))
    x = next(v for v in ana.program.values if v.name.endswith("x"))
    (row,) = ana.value_named_dims(x.id)[0]
    spec = tc.MeshSpec({"data": 8})
    plan = tc.Strategy.make(ana, {f"N{row}": "data"})
    value, use = _slice_value_and_use_specs(ana, plan, spec)
    assert value == jax.sharding.PartitionSpec("data", None)
    assert use == (jax.sharding.PartitionSpec(None, None) if gathered else value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fn, args, mesh_axes",
    [
        (edge_pad, ({}, {"x": jnp.asarray([0.5, -1.0], jnp.float32)}), {"data": 2, "model": 4}),
        (prefix_beside_cumsum(7), _prefix_args(8), {"data": 8}),
    ],
    ids=["edge_pad_2x4", "prefix_beside_cumsum_8"],
)
def test_prefix_slice_plans_validate(fn, args, mesh_axes):
    """The sliced dim on `data` (one element per shard; data parallel's plan for the edge pad):
    before the explicit gather, XLA's verifier rejected it (the fuzzer's invalid plan). Every
    plan now compiles and matches the unsharded numerics."""
    ana = tc.analyze(tc.trace(fn, *args))
    spec = tc.MeshSpec(mesh_axes)
    hw = tc.hardware("tpu-v5e")
    plans = {name: s for name, (s, _) in tc.baselines.all(ana, spec).items() if s is not None}
    plans["search"] = tc.search(ana, spec, hw, budget_s=None, num_simulations=16).best
    x = next(v for v in ana.program.values if v.name.endswith("x"))
    (row,) = ana.value_named_dims(x.id)[0]
    plans["sliced_dim_on_data"] = tc.Strategy.make(ana, {f"N{row}": "data"})
    value, use = _slice_value_and_use_specs(ana, plans["sliced_dim_on_data"], spec)
    assert value[0] == "data" and use[0] is None  # the limitation's sharding, gathered
    for name, plan in plans.items():
        report = tc.validate(fn, args, ana, plan, tc.jax_mesh(spec), hw)
        assert report.numerics_ok, (name, plan, report.max_abs_error)
