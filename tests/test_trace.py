"""The tracer: JAX function -> our IR (values, ops, names, roles, inlined calls, regions, replay)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_core as tc
from toast_core.ir.program import Program
from toast_core.ir.trace import CALL_PRIMITIVES, REGION_PRIMITIVES, UNBARRED, run_with_constraints


def sds(*shape, dtype=jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def by_name(prog: Program) -> dict:
    return {v.name: v for v in prog.values}


def mlp(params, x):
    return jax.nn.relu(x @ params["w1"]) @ params["w2"]


# --- arrays and ShapeDtypeStructs -----------------------------------------------------------------


def test_traces_arrays_and_shape_dtype_structs_alike():
    params = {"w1": jnp.ones((4, 8)), "w2": jnp.ones((8, 2))}
    concrete = tc.trace(mlp, params, jnp.ones((3, 4)))
    abstract = tc.trace(mlp, jax.tree.map(lambda a: sds(*a.shape), params), sds(3, 4))
    assert concrete.values == abstract.values
    assert [op.primitive for op in concrete.ops] == ["dot_general", "max", "dot_general"]
    assert [op.primitive for op in concrete.ops] == [op.primitive for op in abstract.ops]
    assert [concrete.values[i].shape for i in concrete.inputs] == [(4, 8), (8, 2), (3, 4)]
    assert [concrete.values[i].shape for i in concrete.outputs] == [(3, 2)]


def test_a_huge_shape_traces_without_allocating():
    """A 4 TiB weight: tracing must only read its shape (allocating it would fail)."""
    n = 1 << 20
    prog = tc.trace(mlp, {"w1": sds(n, n), "w2": sds(n, 8, dtype=jnp.bfloat16)}, sds(16, n))
    w1 = by_name(prog)["params.w1"]
    assert w1.shape == (n, n) and w1.nbytes == 4 * n * n
    assert by_name(prog)["params.w2"].dtype == "bfloat16"
    assert prog.n_tensor_dims == sum(v.rank for v in prog.values if v.role != "literal")


def test_values_keep_dtypes_and_ops_their_params():
    prog = tc.trace(lambda x: jnp.max(x.astype(jnp.bfloat16), axis=1), sds(4, 6))
    reduce_op = next(op for op in prog.ops if op.primitive == "reduce_max")
    assert reduce_op.param("axes") == (1,)
    assert prog.values[reduce_op.results[0]].dtype == "bfloat16"
    assert prog.values[reduce_op.results[0]].shape == (4,)


# --- names and roles ------------------------------------------------------------------------------


class Pair(NamedTuple):
    left: jax.Array
    right: jax.Array


def test_value_names_follow_pytree_paths_and_parameter_names():
    def step(params, batch, pair):
        h = batch["x"] @ params["blocks"][3]["attn"]["wq"]
        return {"y": h + pair.left}, pair.right.sum()

    blocks = [{"attn": {"wq": sds(4, 4)}} for _ in range(4)]
    prog = tc.trace(step, {"blocks": blocks}, {"x": sds(2, 4)}, Pair(sds(2, 4), sds(3)))
    names = [prog.values[i].name for i in prog.inputs]
    assert names == [
        "params.blocks[0].attn.wq",
        "params.blocks[1].attn.wq",
        "params.blocks[2].attn.wq",
        "params.blocks[3].attn.wq",
        "batch.x",
        "pair.left",
        "pair.right",
    ]
    assert [prog.values[i].output_name for i in prog.outputs] == ["out[0].y", "out[1]"]
    # Intermediates are named after their primitive and value id.
    dot = next(op for op in prog.ops if op.primitive == "dot_general")
    assert prog.values[dot.results[0]].name == f"dot_general#{dot.results[0]}"


def test_jitted_and_partial_functions_keep_their_names():
    prog = tc.trace(jax.jit(mlp), {"w1": sds(4, 8), "w2": sds(8, 2)}, sds(3, 4))
    assert prog.name == "mlp"
    assert [prog.values[i].name for i in prog.inputs] == ["params.w1", "params.w2", "x"]
    assert [op.primitive for op in prog.ops] == ["dot_general", "max", "dot_general"]

    def scaled(params, x, *, scale):
        return mlp(params, x) * scale

    prog = tc.trace(functools.partial(scaled, scale=2.0), {"w1": sds(4, 8), "w2": sds(8, 2)},
                    sds(3, 4))  # fmt: skip
    assert prog.name == "scaled"
    assert [prog.values[i].name for i in prog.inputs] == ["params.w1", "params.w2", "x"]


def test_unnamed_positional_args_fall_back_to_argn():
    prog = tc.trace(lambda *xs: xs[0] + xs[1], sds(2), sds(2))
    assert [prog.values[i].name for i in prog.inputs] == ["arg0", "arg1"]


def test_roles_follow_param_argnums_and_updated_state():
    from demos import MODEL_ZOO

    w = MODEL_ZOO["gpt"](size="tiny", train=True)
    roles = {}
    for argnums in [(0,), (0, 1)]:
        prog = tc.trace(w.fn, *w.args, param_argnums=argnums)
        roles[argnums] = {prog.values[i].name: prog.values[i].role for i in prog.inputs}
    by_role = roles[(0,)]
    assert by_role["params.blocks[1].attn.wq"] == "parameter"
    assert by_role["opt_state.mu.blocks[1].attn.wq"] == "state"  # returned updated
    assert by_role["opt_state.nu.wte"] == "state"
    assert by_role["opt_state.step"] == "input"  # a scalar counter is not worth sharding
    assert by_role["batch.tokens"] == "input"
    assert roles[(0, 1)]["opt_state.mu.blocks[1].attn.wq"] == "parameter"
    assert roles[(0, 1)]["batch.tokens"] == "input"


def test_state_detection_reads_paths_inside_tuple_arguments():
    """optax-style state: a tuple of records whose leaves come back under the same path."""

    def step(params, opt_state, x):
        mu = opt_state[0].left + params["w"].sum()
        return params, (Pair(mu, opt_state[0].right),), x.sum()

    prog = tc.trace(step, {"w": sds(4)}, (Pair(sds(4), sds(4)),), sds(4))
    roles = {prog.values[i].name: prog.values[i].role for i in prog.inputs}
    assert roles == {
        "params.w": "parameter",
        "opt_state[0].left": "state",
        "opt_state[0].right": "state",
        "x": "input",  # a bare array argument is never state, even if an output has its shape
    }


def test_default_roles_single_and_multiple_arguments():
    single = tc.trace(lambda x: x * 2, sds(3))
    assert single.values[single.inputs[0]].role == "input"
    several = tc.trace(mlp, {"w1": sds(4, 8), "w2": sds(8, 2)}, sds(3, 4))
    assert [several.values[i].role for i in several.inputs] == ["parameter"] * 2 + ["input"]


def test_literals_and_closed_over_constants_get_their_roles():
    table = np.arange(6, dtype=np.float32).reshape(2, 3)
    prog = tc.trace(lambda x: x * 3.0 + jnp.asarray(table), sds(2, 3))
    roles = [v.role for v in prog.values]
    assert "literal" in roles and "constant" in roles
    lit = next(v for v in prog.values if v.role == "literal")
    assert lit.shape == () and lit.name == "lit(3.0)"


# --- inlined calls --------------------------------------------------------------------------------


@jax.custom_vjp
def sin_with_vjp(x):
    return jnp.sin(x)


sin_with_vjp.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda cos_x, g: (cos_x * g,))


@jax.jit
def project(x, w):
    return x @ w


def layered(params, x):
    h = jax.nn.relu(project(x, params["w1"]))  # jit, then custom_jvp (relu)
    h = jax.checkpoint(lambda h: jnp.tanh(h) * 2.0)(h)  # remat
    h = sin_with_vjp(h)  # custom_vjp
    return jax.jit(lambda a, b: a @ b)(h, params["w2"])


def test_calls_are_inlined_and_their_names_kept():
    prog = tc.trace(layered, {"w1": sds(4, 8), "w2": sds(8, 2)}, sds(3, 4))
    assert not {op.primitive for op in prog.ops} & CALL_PRIMITIVES
    path_of = {op.primitive: op.call_path for op in prog.ops}
    assert [op.primitive for op in prog.ops] == ["dot_general", "max", "tanh", "mul", "sin",
                                                 "dot_general"]  # fmt: skip
    assert prog.ops[0].call_path == ("project",)
    assert "relu" in path_of["max"] and "custom_jvp_call" in path_of["max"]
    # not differentiated: a checkpoint JAX lowers with no optimization barrier
    assert path_of["tanh"] == ("remat2" + UNBARRED,)
    assert "custom_vjp_call" in path_of["sin"]
    assert prog.ops[-1].call_path == ("<lambda>",)
    # Inlining keeps the data flow: the jitted projection reads the parameter directly.
    assert prog.ops[0].operands == (prog.inputs[2], prog.inputs[0])
    assert prog.ops[1].operands[0] == prog.ops[0].results[0]
    assert prog.ops[0].where().startswith("dot_general in project at test_trace.py:")


def test_grad_through_custom_rules_traces_and_inlines():
    prog = tc.trace(
        jax.grad(lambda p, x: layered(p, x).sum()), {"w1": sds(4, 8), "w2": sds(8, 2)}, sds(3, 4)
    )
    assert not {op.primitive for op in prog.ops} & CALL_PRIMITIVES
    assert {"cos", "dot_general", "transpose"} <= {op.primitive for op in prog.ops}


# --- regions --------------------------------------------------------------------------------------


def scan_program(c, xs):
    def body(carry, x):
        return carry * x + 1.0, jnp.sin(x)

    return jax.lax.scan(body, c, xs)


def test_scan_is_a_region_with_a_trip_count():
    prog = tc.trace(scan_program, sds(3), sds(5, 3))
    prims = [op.primitive for op in prog.ops]
    assert prims[0] == "scan_start" and prims[-1] == "scan_end"
    assert not set(prims) & REGION_PRIMITIVES
    start, end = prog.ops[0], prog.ops[-1]
    body = prog.ops[1:-1]
    assert {op.primitive for op in body} == {"mul", "add", "sin"}
    assert all(op.trip_count == 5 and op.region_depth == 1 for op in body)
    assert start.trip_count == end.trip_count == 1 and start.region_depth == 0
    assert start.param("num_carry") == 1 and start.param("length") == 5
    # scan_start maps outer (carry [3], xs [5, 3]) to body inputs (carry [3], x [3]).
    assert [prog.values[i].shape for i in start.operands] == [(3,), (5, 3)]
    assert [prog.values[i].shape for i in start.results] == [(3,), (3,)]
    # scan_end reads the body outputs (carry', y) plus the body's carry input.
    assert [prog.values[i].shape for i in end.results] == [(3,), (5, 3)]
    assert end.operands[-1] == start.results[0]
    assert list(end.results) == list(prog.outputs)


def test_nested_scan_multiplies_trip_counts():
    def nested(xs):
        def outer(c, x):
            inner = jax.lax.scan(lambda c2, y: (c2 + y, None), c, x)[0]
            return inner, None

        return jax.lax.scan(outer, jnp.zeros(2), xs)[0]

    prog = tc.trace(nested, sds(4, 3, 2))
    add = next(op for op in prog.ops if op.primitive == "add")
    assert add.trip_count == 12 and add.region_depth == 2


def test_while_and_cond_are_regions():
    def loop(x):
        return jax.lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))

    prog = tc.trace(loop, sds(3))
    prims = [op.primitive for op in prog.ops]
    assert prims[0] == "while_start" and prims[-1] == "while_end" and "mul" in prims
    assert any("trip count unknown" in d for d in prog.diagnostics)

    def branch(p, x):
        return jax.lax.cond(p, lambda x: x * 2.0, lambda x: x + 1.0, x)

    prog = tc.trace(branch, sds(dtype=jnp.bool_), sds(3))
    prims = [op.primitive for op in prog.ops]
    assert prims.count("cond_start") == 2 and prims[-1] == "cond_end"
    assert {"mul", "add"} <= set(prims)
    assert prog.ops[-1].param("n_branches") == 2
    # Replay runs regions whole, as the original equations.
    assert_same_outputs(loop, (jnp.arange(3.0),), ())
    for pred in (True, False):
        assert_same_outputs(branch, (jnp.bool_(pred), jnp.arange(3.0)), ())


# --- replay ---------------------------------------------------------------------------------------


def replay(fn, args, param_argnums=(0,)):
    prog = tc.trace(fn, *args, param_argnums=param_argnums)
    return prog, run_with_constraints(prog, jax.tree.leaves(args))


def assert_same_outputs(fn, args, param_argnums=(0,)):
    _, got = replay(fn, args, param_argnums)
    want = jax.tree.leaves(fn(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_replay_matches_the_function_on_an_mlp():
    from demos import MODEL_ZOO

    w = MODEL_ZOO["mlp"](size="tiny", train=True)
    assert_same_outputs(w.fn, w.args)


def test_replay_matches_the_function_on_a_scan_and_calls():
    assert_same_outputs(scan_program, (jnp.full(3, 0.5), jnp.linspace(0.0, 1.0, 15).reshape(5, 3)))
    params = {"w1": jnp.linspace(-1, 1, 32).reshape(4, 8), "w2": jnp.ones((8, 2))}
    assert_same_outputs(layered, (params, jnp.linspace(0, 1, 12).reshape(3, 4)))


@pytest.mark.slow
def test_replay_matches_the_gpt_train_step():
    from demos import MODEL_ZOO

    w = MODEL_ZOO["gpt"](size="tiny", train=True)
    prog = tc.trace(w.fn, *w.args, param_argnums=w.param_argnums)
    flat = jax.tree.leaves(w.args)
    fast = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

    def compiled(f):
        return jax.jit(f).lower(*flat).compile(compiler_options=fast)

    tree = jax.tree.structure(w.args)
    got = compiled(lambda *xs: run_with_constraints(prog, list(xs)))(*flat)
    want = compiled(lambda *xs: jax.tree.leaves(w.fn(*jax.tree.unflatten(tree, xs))))(*flat)
    assert len(got) == len(want) == len(prog.outputs)
    for g, x in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(x))


def test_replay_hooks_see_every_use_and_value_and_can_replace_them():
    params = {"w1": jnp.ones((4, 8)), "w2": jnp.ones((8, 2))}
    x = jnp.ones((3, 4))
    prog = tc.trace(mlp, params, x)
    uses, defs = [], []

    def before_use(op_index, position, value_id, array):
        uses.append((op_index, position, value_id))
        return array

    def after_value(value_id, array):
        defs.append(value_id)
        return array

    flat = jax.tree.leaves((params, x))
    run_with_constraints(prog, flat, before_use, after_value)
    expected_uses = {
        (op.index, pos, vid)
        for op in prog.ops
        for pos, vid in enumerate(op.operands)
        if prog.values[vid].role != "literal"
    }
    assert set(uses) == expected_uses
    assert set(defs) == {v.id for v in prog.values if v.role not in ("literal", "constant")}

    # Replacing w2 at its use changes the result accordingly.
    def doubled(op_index, position, value_id, array):
        return array * 2 if value_id == prog.inputs[1] else array

    (out,) = run_with_constraints(prog, flat, doubled)
    np.testing.assert_allclose(out, 2 * mlp(params, x))


def test_an_input_returned_as_is_gets_its_own_output_value():
    prog = tc.trace(lambda p, x: (p, x + 1.0, x + 1.0), sds(2), sds(2))
    assert len(set(prog.outputs)) == 3
    assert all(prog.values[i].is_output for i in prog.outputs)
    outs = run_with_constraints(prog, [jnp.ones(2), jnp.zeros(2)])
    np.testing.assert_array_equal(outs[0], np.ones(2))
    np.testing.assert_array_equal(outs[1], outs[2])


def test_replay_without_a_trace_handle_is_an_error():
    prog = tc.trace(lambda x: x * 2.0, sds(2))
    bare = Program(prog.name, prog.values, prog.ops, prog.inputs, prog.outputs)
    with pytest.raises(tc.TraceError, match="trace handle"):
        run_with_constraints(bare, [jnp.ones(2)])


# --- errors ---------------------------------------------------------------------------------------


def test_trace_error_is_a_toast_error():
    assert issubclass(tc.TraceError, tc.ToastError)


def test_not_a_callable():
    with pytest.raises(tc.TraceError, match=r"callable.*`fn=3`"):
        tc.trace(3, jnp.ones(2))


def test_a_function_that_raises_while_tracing():
    def broken(x):
        return x[:2] + jnp.ones(3)

    with pytest.raises(tc.TraceError, match=r"`fn='broken'` failed: TypeError: add got incomp"):
        tc.trace(broken, sds(4))

    def divides(x):
        return 1 / 0

    with pytest.raises(tc.TraceError, match="ZeroDivisionError") as info:
        tc.trace(divides, sds(4))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize(
    "args, path, type_name",
    [
        (({"a": sds(2), "b": "hello"}, sds(2)), "params.b", "str"),
        ((sds(2), {"z": [sds(1), object()]}), "x.z[1]", "object"),
        ((sds(2), Pair(sds(2), None), {"k": {"deep": b"raw"}}), "arg2.k.deep", "bytes"),
    ],
)
def test_non_array_leaves_are_named_by_path(args, path, type_name):
    def fn(params, x, *rest):
        return x

    with pytest.raises(tc.TraceError) as info:
        tc.trace(fn, *args)
    message = str(info.value)
    assert f"`{path}=" in message and f"not {type_name}" in message


def test_scalar_leaves_are_accepted():
    prog = tc.trace(lambda x, s: x * s, sds(3), 2.0)
    assert prog.values[prog.inputs[1]].shape == ()
