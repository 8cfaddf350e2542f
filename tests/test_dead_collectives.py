"""Collectives of ops whose work reaches no output are not priced: XLA removes those ops, and
their collectives with them (a train step's loss: the gradient of a mean never reads the value)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from lookup import dim_name

import toast_core as tc

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 2, "model": 4})


def _loss(w, x):
    h = x @ w  # [B, 8]: its dim 1 sharded over `model`
    return jnp.mean(h * jnp.tanh(h))


def accumulate(w, x):
    """Gradient accumulation over two micro-batches in a `while_loop` (the fuzzer's
    `accum_while`): the loss's mean is a partial sum over `model`, read by nothing (jax keeps
    the primal loss in the loop body; XLA removes it and its all-reduce)."""

    def body(carry):
        i, acc = carry
        return i + 1, acc + jax.grad(_loss)(w, x[i])

    g = jax.lax.while_loop(lambda c: c[0] < 2, body, (0, jnp.zeros_like(w)))[1]
    return w - 0.1 * g


def accumulate_with_loss(w, x):
    """The same, also returning the last micro-batch's loss: its all-reduce stays."""

    def body(carry):
        i, acc, _ = carry
        loss, g = jax.value_and_grad(_loss)(w, x[i])
        return i + 1, acc + g, loss

    _, g, loss = jax.lax.while_loop(lambda c: c[0] < 2, body, (0, jnp.zeros_like(w), jnp.zeros(())))
    return w - 0.1 * g, loss


def _analysis(fn):
    w = jax.random.normal(jax.random.PRNGKey(0), (16, 8))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 16))
    ana = tc.analyze(tc.trace(fn, w, x, param_argnums=(0,)))
    s = tc.Strategy.make(ana, {dim_name(ana, "w", 1): "model"})
    return ana, s, (w, x)


def _loss_all_reduces(ana, report) -> list:
    """All-reduces of the loss's scalar partial sum."""
    return [c for c in report.collectives if c.kind == "all-reduce" and c.result_bytes == 4]


def test_a_partial_sum_read_only_by_the_dead_loss_is_not_reduced():
    ana, s, _ = _analysis(accumulate)
    assert not _loss_all_reduces(ana, tc.estimate(ana, s, MESH, HW))


def test_the_same_partial_sum_is_reduced_when_the_loss_is_returned():
    ana, s, _ = _analysis(accumulate_with_loss)
    assert len(_loss_all_reduces(ana, tc.estimate(ana, s, MESH, HW))) == 1


@pytest.mark.slow
def test_dead_collectives_match_xla():
    ana, s, args = _analysis(accumulate)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(accumulate, args, ana, s, mesh, HW)
    assert check.numerics_ok
    assert check.predicted_collective_bytes == pytest.approx(check.compiled_collective_bytes)


def _linear_loss(w, x):
    return jnp.mean(x @ w)  # the gradient, x.T @ 1/n, never reads x @ w


def accumulate_linear(w, x):
    """A linear forward in a gradient accumulation loop: the weight goes into the loop only for
    the dead forward matmul."""

    def body(carry):
        i, acc = carry
        return i + 1, acc + jax.grad(_linear_loss)(w, x[i])

    g = jax.lax.while_loop(lambda c: c[0] < 2, body, (0, jnp.zeros_like(w)))[1]
    return w - 0.1 * g


def _fsdp(fn):
    w = jax.random.normal(jax.random.PRNGKey(0), (16, 8))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 16))
    ana = tc.analyze(tc.trace(fn, w, x, param_argnums=(0,)))
    strategy, why = tc.baselines.all(ana, MESH)["fsdp"]
    assert strategy is not None, why
    return ana, strategy, (w, x)


def test_a_weight_passed_into_a_loop_only_for_dead_ops_is_not_gathered():
    ana, s, _ = _fsdp(accumulate_linear)
    report = tc.estimate(ana, s, MESH, HW)
    assert not [c for c in report.collectives if c.kind == "all-gather"]
    # The same weight gathered for the loss that `_loss` keeps alive through its tanh.
    ana, s, _ = _fsdp(accumulate)
    report = tc.estimate(ana, s, MESH, HW)
    assert [c for c in report.collectives if c.kind == "all-gather"]


@pytest.mark.slow
def test_dead_loop_uses_match_xla():
    ana, s, args = _fsdp(accumulate_linear)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(accumulate_linear, args, ana, s, mesh, HW)
    assert check.numerics_ok
    assert check.predicted_collective_bytes == pytest.approx(check.compiled_collective_bytes)
