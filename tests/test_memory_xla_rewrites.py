"""Memory of what XLA rewrites before it assigns buffers (issue 14, fuzz seed 15): dead code
(the loss `jax.grad` computes and discards inside a gradient-accumulation loop) makes no buffer
and keeps none alive, and a `split` fuses as the slices it lowers to (the cotangent of a
concatenation, a split of the loss's broadcast seed, is never stored)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost import CostOptions, evaluator
from toast_core.cost.simplify import live_ops, splits_as_slices, without_dead_ops

HW = tc.hardware("tpu-v5e")
MESH_2X3 = tc.MeshSpec({"data": 2, "model": 3})


def _accumulated(loss):
    """A two-micro-batch gradient accumulation of `loss` in a while loop, then SGD."""

    def step(params, batch):
        def body(carry):
            i, acc = carry
            micro = jax.tree.map(lambda b: lax.dynamic_index_in_dim(b, i, 0, False), batch)
            g = jax.grad(loss)(params, micro)
            return i + 1, jax.tree.map(jnp.add, acc, g)

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads = lax.while_loop(lambda c: c[0] < 2, body, (0, zeros))[1]
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)

    return step


def _gelu_loss(params, batch):
    """Fuzz #114: the loss reads the GELU, its clipped copy and their difference; `jax.grad`
    discards it, and with it XLA drops every forward value only the loss read (measured 5,744
    bytes; 12,544 predicted while the dead loss kept them live)."""
    v3 = batch["x1"] @ params["w2"]
    v4 = jnp.pad(v3, [(0, 0), (1, 2), (0, 0)])
    v5 = jax.nn.gelu(v4, approximate=False)
    v6 = jnp.minimum(v5, 0.3)
    return jnp.mean(jnp.transpose(v5, (2, 1, 0))) + jnp.mean((v6 - v5)[:2])


def _gelu_args():
    params = {"w2": jax.ShapeDtypeStruct((2, 16), jnp.float32)}
    return params, {"x1": jax.ShapeDtypeStruct((2, 4, 16, 2), jnp.float32)}


def _concat_loss(params, batch):
    """Fuzz #149: the mean of a concatenation; its cotangent splits the mean's broadcast seed
    (measured 2,080 bytes; 3,776 predicted with the split's halves and source stored)."""
    v3 = jnp.einsum("ab,az->bz", batch["x1"], params["w2"])
    v4 = lax.rsqrt(v3 * v3 + 1.0)
    v6 = jnp.broadcast_to(jnp.expand_dims(v4, 1)[None], (8, 2, 1, 8))
    return jnp.mean(jnp.var(v4, axis=1)) + jnp.mean(jnp.concatenate([v6, jnp.tanh(v6)], axis=1))


def _concat_args():
    params = {"w2": jax.ShapeDtypeStruct((32, 8), jnp.float32)}
    return params, {"x1": jax.ShapeDtypeStruct((2, 32, 2), jnp.float32)}


def _analysis(loss, args):
    return tc.analyze(tc.trace(_accumulated(loss), *args))


def test_dead_ops_make_no_buffer_and_keep_none_alive():
    ana = _analysis(_gelu_loss, _gelu_args())
    prog = ana.program
    live = live_ops(prog)
    dead = [op for op in prog.ops if not live[op.index]]
    assert any(op.primitive == "reduce_sum" for op in dead)  # the discarded loss
    ev = evaluator(ana, MESH_2X3, HW, CostOptions(donate_outputs=False))
    buffers = set(ev.live_ids.tolist())
    assert not buffers & {r for op in dead for r in op.results}
    pruned, _ = without_dead_ops(prog)
    assert all(not pruned.ops[op.index].operands for op in dead)
    # the erfc of the GELU is read by its forward product and its backward derivative: it
    # lives until the derivative's fusion, not until the discarded loss read the clipped copy
    erfc = next(op for op in prog.ops if op.primitive == "erfc")
    (v,) = erfc.results
    last_live_reader = max(o for o, _ in pruned.uses()[v])
    assert ev.live_end[v] <= last_live_reader + 1


def test_a_split_fuses_as_slices():
    ana = _analysis(_concat_loss, _concat_args())
    prog = ana.program
    splits = [op for op in prog.ops if op.primitive == "split"]
    assert splits
    rewritten = splits_as_slices(prog).ops
    assert all(rewritten[op.index].primitive == "slice" for op in splits)
    ev = evaluator(ana, MESH_2X3, HW, CostOptions(donate_outputs=False))
    buffers = set(ev.live_ids.tolist())
    # the halves of the broadcast seed, and the seed itself, are never stored
    assert not buffers & {r for op in splits for r in op.results}
    assert not buffers & {v for op in splits for v in op.operands}


def test_the_dead_loss_no_longer_sets_the_peak():
    ana = _analysis(_gelu_loss, _gelu_args())
    strategy = tc.baselines.all(ana, MESH_2X3)["data_parallel"][0]
    # measured 5,744 bytes (XLA:CPU, data parallel on 2x3)
    assert predicted_cpu_memory_bytes(ana, strategy, MESH_2X3, HW) < 1.3 * 5744


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss, args, baseline, tolerance",
    [
        (_gelu_loss, _gelu_args(), "data_parallel", 0.15),
        # XLA: 2,080 bytes. The model over-counts this step's weight gradient inside the loop
        # (1.14 of XLA's bytes before the loop state's two small buffers were counted, which
        # XLA's block holds too: `cpu_buffers.loop_state_buffers`; 1.20 with them)
        (_concat_loss, _concat_args(), "data_parallel", 0.25),
    ],
    ids=["dead-loss", "split-seed"],
)
def test_rewritten_memory_matches_xla(loss, args, baseline, tolerance):
    ana = _analysis(loss, args)
    strategy = tc.baselines.all(ana, MESH_2X3)[baseline][0]
    fn = _accumulated(loss)
    check = tc.validate(fn, args, ana, strategy, tc.jax_mesh(MESH_2X3), HW, check_numerics=False)
    assert abs(check.predicted_memory_bytes / check.compiled_memory_bytes - 1) <= tolerance, (
        check.predicted_memory_bytes,
        check.compiled_memory_bytes,
    )
