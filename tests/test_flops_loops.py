"""Flops of loops and prefix scans as XLA's `cost_analysis()` counts them (fuzz seed 16's
gradient-accumulation misses, issue 14): each loop's counter (`cost.loop_control`), and prefix
scans of constants, which XLA folds, rewrites or computes depending on their length
(`simplify.constant_scan_fraction`)."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from xla_flops import replicated_ratio

import toast_core as tc
from toast_core.cost.loop_control import loop_control_flops

F32 = jnp.float32
X = {"x": jax.ShapeDtypeStruct((4, 8), F32)}


def scan_sum(b):
    return lax.scan(lambda c, r: (c + r, None), jnp.zeros(8), b["x"])[0]


def fori_sum(b):
    return lax.fori_loop(0, 4, lambda i, c: c + b["x"][i], jnp.zeros(8))


def while_sum(b):
    def body(s):
        return s[0] + 1, s[1] + lax.dynamic_index_in_dim(b["x"], s[0], 0, False)

    return lax.while_loop(lambda s: s[0] < 4, body, (0, jnp.zeros(8)))[1]


def two_scans(b):
    a = lax.scan(lambda c, r: (c + r, None), jnp.zeros(8), b["x"])[0]
    return lax.scan(lambda c, r: (c * r, None), a, b["x"])[0]


def nested_scans(b):
    def outer(c, r):
        return lax.scan(lambda d, s: (d + s, None), c, b["x"])[0] * r, None

    return lax.scan(outer, jnp.zeros(8), b["x"])[0]


LOOPS = {
    "scan": (scan_sum, 2.0),
    "fori_loop": (fori_sum, 1.0),  # its `i + 1` is XLA's counter: only the compare is added
    "while_loop": (while_sum, 1.0),  # its condition's compare; its step is a body op
    "two scans": (two_scans, 4.0),
    "nested scans": (nested_scans, 4.0),
}


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_each_loop_adds_its_counters_flops(name):
    fn, control = LOOPS[name]
    assert loop_control_flops(tc.trace(fn, X)) == control


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LOOPS))
def test_loops_count_as_xla_counts_them(name):
    """scan(c + r) over [4, 8]: 8 adds and the counter's add and compare, 10 flops (the body
    once); a fori_loop's index wrap and counter, 13."""
    assert replicated_ratio(LOOPS[name][0], (X,)) == pytest.approx(1.0, abs=1e-9)


SCANS = {
    "cumsum": lambda c: jnp.cumsum(c, axis=0),
    "cumsum_reverse": lambda c: lax.cumsum(c, axis=0, reverse=True),
    "cumprod": lambda c: jnp.cumprod(c, axis=0),
}


@pytest.mark.slow
@pytest.mark.parametrize("rows", [2, 16, 17, 40])
@pytest.mark.parametrize("name", sorted(SCANS))
def test_scans_of_constants_count_as_xla_counts_them(name, rows):
    """A forward cumsum of up to 16 constant rows is `c * (iota + 1)`, 3 flops per element; the
    others are folded; past 16 rows all are computed as blocked scans."""
    scan = SCANS[name]
    args = ({"x": jax.ShapeDtypeStruct((1, 4), F32)},)
    assert replicated_ratio(
        lambda b: b["x"] + scan(jnp.full((rows, 4), 0.125)), args
    ) == pytest.approx(1.0)


@pytest.mark.slow
def test_the_gradient_of_a_reversed_cumsum_under_a_mean():
    """The cotangent of the mean is a constant; its cumsum is the iota form (fuzz seed 16 #34)."""

    def grad(p, b):
        loss = lambda w: jnp.mean(lax.cumsum(b["x"] @ w, axis=0, reverse=True))  # noqa: E731
        return jax.grad(loss)(p["w"])

    args = ({"w": jax.ShapeDtypeStruct((16, 8), F32)}, {"x": jax.ShapeDtypeStruct((8, 16), F32)})
    assert replicated_ratio(grad, args) == pytest.approx(1.0)


def cell_scan(ys):
    def fn(b):
        def cell(c, x):
            c = 0.5 * c + x
            return c, ys(c)

        return lax.scan(cell, jnp.zeros(8), b["x"])

    return fn


@pytest.mark.slow
@pytest.mark.parametrize("ys", [jnp.sin, lambda c: c * 2.0, lambda c: c * c + 1.0])
def test_a_carry_is_computed_once_whatever_reads_it_in_the_body(ys):
    """`c = 0.5 * c + x` is the carry's fusion; `ys(c)` reads that buffer (fuzz seed 41 #55)."""
    assert replicated_ratio(
        cell_scan(ys), ({"x": jax.ShapeDtypeStruct((3, 8), F32)},)
    ) == pytest.approx(1.0)


def _decay(n, a=0.9):
    def run(x):
        return lax.while_loop(
            lambda c: c[0] < n, lambda c: (c[0] + 1, a * c[1] + 0.1 * jnp.tanh(c[1])), (0, x)
        )[1]

    return run


def _fori_decay(n, a=0.9):
    return lambda x: lax.fori_loop(0, n, lambda i, c: a * c + 0.1 * jnp.tanh(c), x)


TWIN_LOOPS = {
    "same while": (_decay(3), _decay(3)),
    "while, other trip count": (_decay(3), _decay(5)),
    "while, other body": (_decay(3), _decay(3, 0.8)),
    "same fori": (_fori_decay(3), _fori_decay(3)),
    "fori, other trip count": (_fori_decay(3), _fori_decay(5)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TWIN_LOOPS))
def test_identical_loops_are_one_loop(name):
    """XLA's CSE merges two `while`s of equal operands, condition and body: two identical
    `while_loop`s on one input are one loop, its body and counter counted once (fuzz seed 19
    #690: counted twice, 1.24 of XLA's flops); loops differing in trip count or body stay two."""
    first, second = TWIN_LOOPS[name]

    def fn(b):
        return first(b["x"]), second(b["x"])

    assert replicated_ratio(fn, (X,)) == pytest.approx(1.0, abs=1e-9)
