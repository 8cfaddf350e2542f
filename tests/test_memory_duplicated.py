"""Memory of the cheap values XLA recomputes inside every fusion reading them (no buffer), and of
those XLA:CPU stores all the same for the reductions it hands to its kernel library
(`fusion.fused_away`, `cpu_buffers.library_reduction_inputs`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import demos
import toast_core as tc
from toast_core.cost import evaluator
from toast_core.cost.cpu_buffers import LIBRARY_REDUCE_MIN_ELEMENTS, library_reduction_inputs
from toast_core.cost.fusion import fused_away, materialized

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 8})


def _analysis(fn, *shapes):
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return tc.analyze(tc.trace(fn, *args)), args


def _produced_by(prog, primitive: str, shape: tuple) -> list[int]:
    producers = prog.producers()
    return [
        v.id
        for v in prog.values
        if v.shape == shape
        and producers[v.id] is not None
        and prog.ops[producers[v.id]].primitive == primitive
    ]


def _denominator(x, y):
    return jnp.sum(jnp.sin(y / (1 + x * x)))


def test_a_cheap_value_read_by_several_fusions_takes_no_buffer():
    """`1 + x * x` is read by the forward division and its gradient's: XLA recomputes it inside
    each (no buffer of it in the compiled program), while the division, expensive, is stored."""
    ana, _ = _analysis(jax.grad(_denominator, argnums=(0, 1)), (256, 64), (256, 64))
    prog = ana.program
    (denominator,) = _produced_by(prog, "add", (256, 64))
    assert len({o for o, _ in prog.uses()[denominator]}) > 1
    fused = fused_away(prog, materialized(prog))
    assert fused[denominator]
    live = set(evaluator(ana, MESH, HW).live_ids.tolist())
    assert denominator not in live
    assert any(v in live for v in _produced_by(prog, "div", (256, 64)))


def test_batchnorm_recomputes_its_normalized_values_from_the_matmul():
    """The BatchNorm MLP: `z - mean`, `* rsqrt(var)`, `* gamma + beta` take no buffer; the
    matmul's z stays live until the last gradient fusion recomputing them."""
    w = demos.MODEL_ZOO["batchnorm"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    prog = ana.program
    batch, hidden = w.config.batch, w.config.hidden
    centred = _produced_by(prog, "sub", (batch, hidden))
    assert len(centred) == 2
    ev = evaluator(ana, MESH, HW)
    assert all(ev._is_fused[v] for v in centred)
    z = min(_produced_by(prog, "dot_general", (batch, hidden)))  # the forward's
    readers = [o for v in centred for o, _ in prog.uses()[v]]
    assert ev.live_end[z] > max(readers)


def test_library_reductions_keep_their_inputs_on_the_cpu_view():
    """The zoo GPT's LayerNorms: the variance of [8, 32, 64] (16384 elements) reads the centred
    values through the library call, which stores them; with 8 devices splitting the batch it
    reduces 2048 elements per device, a loop fusion, and nothing is stored."""
    w = demos.MODEL_ZOO["gpt"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    prog = ana.program
    is_mat = materialized(prog)
    c = w.config
    centred = set(_produced_by(prog, "sub", (c.batch, c.seq, c.d_model)))
    assert c.batch * c.seq * c.d_model >= LIBRARY_REDUCE_MIN_ELEMENTS
    stored = {v for v, *_ in library_reduction_inputs(prog, is_mat)}
    assert centred and centred <= stored
    assert all(fused_away(prog, is_mat)[v] for v in stored)

    def split_batch(op: int, pos: int) -> tuple:
        shape = prog.values[prog.ops[op].operands[pos]].shape
        return (max(shape[0] // 8, 1), *shape[1:]) if shape else shape

    small = {v for v, *_ in library_reduction_inputs(prog, is_mat, split_batch)}
    assert not small & centred


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "plan", "fn", "shapes", "tolerance"),
    [
        (
            "denominator",
            "replicated",
            jax.grad(_denominator, argnums=(0, 1)),
            [(256, 64)] * 2,
            0.02,
        ),
        # Was 1.49 of XLA's bytes; 1.13 with this rule alone, 1.24 beside `read_last_by_matmul`
        # (a dot's output allocation never taken by an operand it reads last: 6.4 KB more here).
        ("batchnorm", "megatron", None, None, 0.25),
        ("gpt", "megatron", None, None, 0.1),  # 0.74 without the library's inputs
    ],
)
def test_cpu_memory_matches_xla(name, plan, fn, shapes, tolerance):
    mesh = tc.MeshSpec({"data": 2, "model": 4})
    if fn is None:
        w = demos.MODEL_ZOO[name](size="tiny", train=True)
        fn, args = w.fn, w.args
        ana = tc.analyze(tc.trace(fn, *args, param_argnums=w.param_argnums))
    else:
        ana, args = _analysis(fn, *shapes)
    strategy = tc.baselines.all(ana, mesh)[plan][0]
    check = tc.validate(fn, args, ana, strategy, tc.jax_mesh(mesh), HW, check_numerics=False)
    assert np.isfinite(check.memory_ratio)
    assert abs(check.memory_ratio - 1.0) < tolerance, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )


def test_a_library_reduction_broadcasts_its_small_operands_into_buffers():
    """`sum(y * scale, 0)` with scale [1, 256] over y [1024, 256]: the library call reads the
    scale broadcast to [1024, 256] (the Flax MLP's LayerNorm scale gradient, a sum over the batch),
    made as soon as the scale exists without remat, at the call with remat. (A sum down to a
    scalar takes its broadcasts in: `cpu_buffers._call_inputs`, `tests/test_fuzz_memory.py`.)"""
    ana, _ = _analysis(lambda y, s: jnp.sum(jnp.tanh(y) * s, axis=0), (1024, 256), (1, 256))
    prog = ana.program
    (reduce_op,) = [op.index for op in prog.ops if op.primitive == "reduce_sum"]
    for hoisted in (True, False):
        rows = library_reduction_inputs(prog, materialized(prog), hoisted=hoisted)
        broadcast = [(lo, hi) for v, lo, hi, *_ in rows if prog.values[v].shape == (1024, 256)]
        assert broadcast == [(0 if hoisted else reduce_op, reduce_op)], hoisted
