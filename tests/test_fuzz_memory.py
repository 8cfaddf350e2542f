"""Memory misses of the fuzzer (issue 14), each a class of programs the CPU view mispredicted,
with the bytes XLA's buffer assignment gave (seed 14): an output all-reduced into its own
allocation, outer products on a device, matrix-vector dots, stacking ops XLA fuses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost.cpu_buffers import _grouping, dot_operand_copies
from toast_core.cost.fusion import materialized

HW = tc.hardware("tpu-v5e")
MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})
MESH_2X2X2 = tc.MeshSpec({"a": 2, "b": 2, "c": 2})


def _outer(params, batch):
    """Fuzz #166: data parallel splits `a` 4 ways, so on one device the dot contracts a unit
    dim: a multiply, then an all-reduce of the partial products."""
    return (jnp.einsum("abc,az->bcz", batch["x1"], params["w2"]),)


def _outer_args():
    params = {"w2": jax.ShapeDtypeStruct((4, 2), jnp.float32)}
    return params, {"x1": jax.ShapeDtypeStruct((4, 16, 16), jnp.float32)}


def _self_dot(params, batch):
    """Fuzz #1267: `einsum('ab,ab->b')`, batch dim `b` not leading: a copy on one device,
    none once `a` is split down to 1 (an elementwise multiply)."""
    x = batch["x1"]
    return (jnp.einsum("ab,ab->b", x, x),)


def _self_dot_args():
    return {}, {"x1": jax.ShapeDtypeStruct((4, 8), jnp.float32)}


def _stacked(params, batch):
    """Fuzz #623 (without its scan): two stacks and their tanh, whose cotangents XLA computes
    in one loop fusion from the loss's scalar (measured 7,384 bytes; 18,136 predicted with the
    stacks and unstacks materialized)."""

    def loss(p):
        v3 = batch["x1"] @ p["w2"]
        v4 = jnp.stack([v3, jnp.tanh(v3)], axis=1)
        v5 = jnp.stack([v4, jnp.tanh(v4)], axis=3)
        return jnp.mean(v5) + jnp.mean(v4 * p["w6"])

    g = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, g)


def _stacked_args():
    params = {
        "w2": jax.ShapeDtypeStruct((4, 32), jnp.float32),
        "w6": jax.ShapeDtypeStruct((), jnp.float32),
    }
    return params, {"x1": jax.ShapeDtypeStruct((12, 4), jnp.float32)}


def _matvec(params, batch):
    """Fuzz #132: `einsum('abc,az->bcz')` with z = 1, an SGD step: x [4, 8, 32] is copied into
    [256, 4] for the forward dot and the weight gradient reads the same copy (measured 9,368
    bytes; 5,268 predicted without the copy)."""

    def loss(p):
        return jnp.mean(jnp.einsum("abc,az->bcz", batch["x1"], p["w2"]))

    g = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, g)


def _matvec_args():
    params = {"w2": jax.ShapeDtypeStruct((4, 1), jnp.float32)}
    return params, {"x1": jax.ShapeDtypeStruct((4, 8, 32), jnp.float32)}


def _predicted(fn, args, mesh, baseline):
    ana = tc.analyze(tc.trace(fn, *args))
    strategy = tc.baselines.all(ana, mesh)[baseline][0]
    return ana, strategy, predicted_cpu_memory_bytes(ana, strategy, mesh, HW)


def test_an_all_reduced_output_has_its_partial_in_the_temporaries():
    """XLA:CPU's all-reduce writes a new buffer: the output's allocation holds the reduced
    copy (2,048 bytes) and the partial product is a temporary as large (measured: 1,032 bytes
    of arguments + 2,048 output + 2,048 temporary = 5,128); the model had no partial (3,080)."""
    *_, predicted = _predicted(_outer, _outer_args(), MESH_2X4, "data_parallel")
    assert predicted == 5128


def test_a_dot_contracting_only_unit_dims_on_a_device_copies_nothing():
    """Measured 96 bytes (32 argument, 32 output, 32 partial): no layout copy of x, which the
    global shape [4, 8] would need (batch dim 1 not leading)."""
    ana, strategy, predicted = _predicted(_self_dot, _self_dot_args(), MESH_2X2X2, "data_parallel")
    prog = ana.program
    assert len(dot_operand_copies(prog, materialized(prog))[0]) == 1
    unit_a = dot_operand_copies(prog, materialized(prog), lambda op, pos: (1, 8))
    assert len(unit_a[0]) == 0
    assert predicted == 96


def test_the_matrix_of_a_matrix_vector_dot_is_read_in_canonical_order():
    # x [4, 8, 32] contracted over dim 0 by w [4, 1]: the left side must be [256, 4]
    assert _grouping((4, 8, 32), (), (0,)) is None  # a matrix-matrix product folds it
    fwd = _grouping((4, 8, 32), (), (0,), canonical=0)
    assert fwd is not None
    assert _grouping((4, 8, 32), (), (0,), canonical=1) is None  # as a right side it lies well
    # the weight gradient contracts x over dims 1, 2 as a right side: the same [256, 4] copy
    assert _grouping((4, 8, 32), (), (1, 2), canonical=1) == fwd
    assert _grouping((256, 4), (), (1,), canonical=0) is None


def test_stacking_ops_are_fused():
    prog = tc.analyze(tc.trace(_stacked, *_stacked_args())).program
    mat = materialized(prog)
    stacking = [op for op in prog.ops if op.primitive in ("stack", "unstack")]
    assert {op.primitive for op in stacking} == {"stack", "unstack"}
    # the stacks and unstacks read and write fusible ops only here: no buffer of their own
    assert not any(mat[r] for op in stacking for r in op.results)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fn, args, mesh, baseline, within",
    [
        (_outer, _outer_args(), MESH_2X4, "data_parallel", 0.0),
        (_self_dot, _self_dot_args(), MESH_2X2X2, "data_parallel", 0.0),
        (_stacked, _stacked_args(), MESH_2X4, "replicated", 0.0),
        (_matvec, _matvec_args(), MESH_2X2X2, "replicated", 0.01),
    ],
    ids=["all-reduced-output", "unit-contraction", "stacks", "matrix-vector"],
)
def test_fuzz_memory_misses_match_xla(fn, args, mesh, baseline, within):
    ana, strategy, predicted = _predicted(fn, args, mesh, baseline)
    check = tc.validate(fn, args, ana, strategy, tc.jax_mesh(mesh), HW, check_numerics=False)
    assert abs(check.predicted_memory_bytes / check.compiled_memory_bytes - 1) <= within, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )
