"""All-reduced values that fusion removes (fuzz seed 19's memory under-predictions): a reduction
over a sharded dim computed inside its reader's loop in the model (a logsumexp's max and sum, a
variance's mean) is cut there by the all-reduce, an instruction of its own, so XLA:CPU stores its
partial and its reduced copy (`buffers.buffer_intervals`, `buffers._fused_all_reduced`). Fuzz
seed 19 #1546, `logsumexp(x[4, 2, 1, 16], axis=0)` data parallel on 2x4: 256 predicted bytes for
XLA's 512."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes

HW = tc.hardware("tpu-v5e")


def _logsumexp(params, batch):
    return (jax.nn.logsumexp(batch["x1"], axis=0, keepdims=True),)


def _var(params, batch):
    return (jnp.var(batch["x1"], axis=0),)


#: (program, x1's shape, mesh, XLA's compiled bytes per device: `memory_analysis()`'s
#: arguments + outputs + temporaries, measured with the data_parallel baseline, which cuts
#: x1's dim 0 - the reduced one).
CASES = {
    # #1546: the max's and the sum's partials and reduced copies, f32[2, 1, 16] each, two at
    # a time: a 256-byte block beside the 128-byte input and output (the model had 256)
    "logsumexp_unit_shards": (_logsumexp, (4, 2, 1, 16), {"data": 2, "model": 4}, 512.0),
    # the same over 2 rows per device: 64 bytes of input, 32 of output, 96 of block (model: 96)
    "logsumexp": (_logsumexp, (16, 8), {"data": 8}, 192.0),
    # the mean's copy is read by the squares' partial sum, then dead: 32 bytes of block beside
    # the output's allocation, which takes the other buffers in turn (the model had 96; 192
    # with the mean's copy read until the division after the second all-reduce)
    "var": (_var, (16, 8), {"data": 8}, 128.0),
}


def _args(shape):
    return {}, {"x1": jax.ShapeDtypeStruct(shape, jnp.float32)}


def _plan(fn, shape, mesh):
    args = _args(shape)
    ana = tc.analyze(tc.trace(fn, *args))
    ms = tc.MeshSpec(mesh)
    return args, ana, ms, tc.baselines.all(ana, ms)["data_parallel"][0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_partial_and_the_reduced_copy_are_stored(name):
    fn, shape, mesh, compiled = CASES[name]
    _, ana, ms, plan = _plan(fn, shape, mesh)
    assert predicted_cpu_memory_bytes(ana, plan, ms, HW) == compiled


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_partial_and_the_reduced_copy_match_xla(name):
    fn, shape, mesh, compiled = CASES[name]
    args, ana, ms, plan = _plan(fn, shape, mesh)
    check = tc.validate(fn, args, ana, plan, tc.jax_mesh(ms), HW, check_numerics=False)
    assert (check.predicted_memory_bytes, check.compiled_memory_bytes) == (compiled, compiled)


def _sgd_of_bias_mean(params, batch):
    """An SGD step on `mean(x @ w + b)` (fuzz seed 19 #970): b's gradient is the sum of the
    mean's constant cotangent over the batch."""

    def loss(p):
        return jnp.mean(batch["x1"] @ p["w2"] + p["w4"])

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


_BIAS_ARGS = (
    {
        "w2": jax.ShapeDtypeStruct((3, 4), jnp.float32),
        "w4": jax.ShapeDtypeStruct((4,), jnp.float32),
    },
    {"x1": jax.ShapeDtypeStruct((16, 3), jnp.float32)},
)


def _bias_plan():
    ana = tc.analyze(tc.trace(_sgd_of_bias_mean, *_BIAS_ARGS))
    ms = tc.MeshSpec({"data": 8})
    return ana, ms, tc.baselines.all(ana, ms)["data_parallel"][0]


def test_a_folded_sum_of_a_broadcast_stores_no_partial():
    # XLA folds b's gradient into a multiply before partitioning (`broadcast_add_fusion` makes
    # the new b from b alone): no all-reduce, so no partial and copy of it (504 with them)
    ana, ms, plan = _bias_plan()
    assert predicted_cpu_memory_bytes(ana, plan, ms, HW) == 340.0


@pytest.mark.slow
def test_a_folded_sum_of_a_broadcast_stores_no_partial_near_xla():
    ana, ms, plan = _bias_plan()
    check = tc.validate(
        _sgd_of_bias_mean, _BIAS_ARGS, ana, plan, tc.jax_mesh(ms), HW, check_numerics=False
    )
    # measured 324 bytes: 1.05 of them (1.16 with the loss's scalar partial and copy, 1.56 with
    # b's gradient's too)
    assert (check.predicted_memory_bytes, check.compiled_memory_bytes) == (340.0, 324.0)
