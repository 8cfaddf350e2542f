"""Flop counting against XLA's `cost_analysis()`: per primitive, and with loop fusion's
duplication of cheap producers."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import toast_core as tc
from toast_core.cost.flops import op_flops, op_transcendentals
from toast_core.cost.fusion import fusion_copies, materialized

X = jnp.linspace(0.5, 1.5, 1024, dtype=jnp.float32).reshape(32, 32)

PRIMITIVES = {
    "add": lambda x: x + 1.0,
    "max": lambda x: jnp.maximum(x, 1.0),
    "convert": lambda x: x.astype(jnp.bfloat16),
    "select": lambda x: lax.select(x > 1.0, x, -x),
    "integer_pow3": lambda x: lax.integer_pow(x, 3),
    "integer_pow-2": lambda x: lax.integer_pow(x, -2),
    "square": jnp.square,
    "exp": jnp.exp,
    "tanh": jnp.tanh,
    "rsqrt": lax.rsqrt,
    "pow": lambda x: x**x,
    "logistic": jax.nn.sigmoid,
    "reduce_sum": lambda x: jnp.sum(x, axis=1),
    "reduce_max": lambda x: jnp.max(x),
    "argmax": lambda x: jnp.argmax(x, axis=0),
    "dot": lambda x: x @ x,
}


def xla_cost(fn, *args) -> tuple[float, float]:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return cost.get("flops", 0.0), cost.get("transcendentals", 0.0)


def predicted(fn, *args) -> tuple[float, float]:
    prog = tc.trace(fn, *args)
    copies = fusion_copies(prog, materialized(prog))
    flops = sum(op_flops(op, prog) * copies[op.index] for op in prog.ops)
    trans = sum(op_transcendentals(op, prog) * copies[op.index] for op in prog.ops)
    return flops, trans


@pytest.mark.parametrize("name", list(PRIMITIVES))
def test_each_primitive_counts_as_xla_counts_it(name):
    fn = PRIMITIVES[name]
    assert predicted(fn, X) == pytest.approx(xla_cost(fn, X)), name


def fan_out(x):
    """Producers read by two reductions: XLA fuses the cheap y (and, measured, sin) into both and
    computes them twice; the exp is expensive and computed once."""
    y = x * 2.0 + 1.0
    e = jnp.exp(x)
    s = jnp.sin(x)
    return jnp.sum(y * e * s, axis=0), jnp.max(y - e + s, axis=1)


def test_cheap_producers_are_counted_once_per_fusion_that_reads_them():
    prog = tc.trace(fan_out, X)
    copies = fusion_copies(prog, materialized(prog))
    first = {}
    for op in prog.ops:
        first.setdefault(op.primitive, copies[op.index])
    assert first["mul"] == 2 and first["add"] == 2  # x * 2.0 + 1.0
    assert first["exp"] == 1 and first["sin"] == 2
    assert predicted(fan_out, X) == pytest.approx(xla_cost(fan_out, X))
