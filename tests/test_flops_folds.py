"""Constants XLA's simplifier folds into nothing, against XLA's `cost_analysis()`: an outer
product with a spread 1.0 (`simplify._splats_of_one`) and a sum over broadcast dims scaled by
a constant (`simplify.folded_broadcast_sums`). Fuzz seed 19 #1534 and #734 (SGD on a
one-column matmul: 1.26 and 1.25 of XLA's flops)."""

import jax
import jax.numpy as jnp
import pytest
from xla_flops import predicted_and_compiled, unsharded_flops

F32 = jnp.float32


def _sgd(loss):
    return lambda w, x: w - 0.1 * jax.grad(loss)(w, x)


def _over_rows(n: int, scale=None):
    """The mean (or the sum times `scale`) over `n` broadcast rows of `tanh(a)`."""

    def fn(a):
        rows = jnp.broadcast_to(jnp.tanh(a)[:, None], (a.shape[0], n))
        return jnp.mean(rows, axis=1) if scale is None else jnp.sum(rows, axis=1) * scale

    return fn


FOLDS = {
    # the cotangent of a sum is a spread 1.0: the weight gradient `outer(ones, x)` is `x`
    # broadcast, no multiply (the update alone: `0.1 * x` on x's 16, the subtract on 128)
    "sgd_on_a_summed_vector_matmul": (
        _sgd(lambda w, x: jnp.sum(x @ w)),
        (((16, 8), F32), ((16,), F32)),
        144,
    ),
    # ...and so is the mean of one element's (#1534)
    "sgd_on_a_one_column_vector_matmul": (
        _sgd(lambda w, x: jnp.mean(x @ w)),
        (((16, 1), F32), ((16,), F32)),
        32,
    ),
    # ...and a batch of one contracted (a contraction of a size-1 dim is an outer product)
    "sgd_on_a_summed_batch_of_one": (
        _sgd(lambda w, x: jnp.sum(x @ w)),
        (((16, 8), F32), ((1, 16), F32)),
        144,
    ),
    # the mean over broadcast rows is `a * n * (1 / n)`: a multiply by 1, nothing (#734)...
    "mean_over_broadcast_rows": (_over_rows(32), (((64,), F32),), 0),
    # ...unless float32's n * (1 / n) is not 1: one multiply per element
    "mean_over_41_broadcast_rows": (_over_rows(41), (((64,), F32),), 64),
    # a sum over broadcast rows then scaled is one multiply, none when the product is 1
    "sum_over_broadcast_rows_quartered": (_over_rows(2, 0.25), (((64,), F32),), 64),
    "sum_over_broadcast_rows_halved": (_over_rows(2, 0.5), (((64,), F32),), 0),
}


@pytest.mark.parametrize("name", list(FOLDS))
def test_folded_constants_count_as_xla_counts_them(name):
    fn, shapes, xla = FOLDS[name]
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    predicted, compiled = unsharded_flops(fn, *args)
    assert compiled == xla
    assert predicted == compiled


def test_summed_vector_matmul_on_devices_counts_as_xla_counts_it():
    """The same fold on a partitioned program (data parallel on 2 devices: the batch of one's
    weight gradient is `x` broadcast on each, then all-reduced)."""
    fn = _sgd(lambda w, x: jnp.mean(x @ w))
    args = (jnp.ones((16, 1), F32), jnp.linspace(0.0, 1.0, 16, dtype=F32))
    predicted, compiled = predicted_and_compiled(fn, args, {"data": 2})
    assert predicted == compiled


def _splat_of_sum(x):
    """1/3 spread over x's shape, computed from a one-element array (a `var`'s cotangent)."""
    return jnp.broadcast_to(jnp.sum(jnp.full((1,), 1 / 3, F32)), x.shape)


def _splat_of_scalars(x):
    """1/4 spread over x's shape, computed from scalars alone (a `var` over a whole axis)."""
    n = jnp.float32(4.0)
    return jnp.broadcast_to(jnp.where(n > 0, jnp.float32(1.0), jnp.float32(0.0)) / n, x.shape)


SPLAT_SCALINGS = {
    # a splat computed through an array folds a scaling from either side: one multiply
    "computed_splat_left": (lambda x: _splat_of_sum(x) * (2.0 * x), 24),
    "computed_splat_left_divided": (lambda x: _splat_of_sum(x) * (x / 3.0), 24),
    "computed_splat_right_of_splat_left": (
        lambda x: (jnp.full(x.shape, 0.5, F32) * x) * _splat_of_sum(x),
        24,
    ),
    # ...not when it is the inner scaling, nor when scalars alone make it (a scalar constant
    # before the simplifier runs: its fixed-order rule), nor a literal's splat on the left
    "computed_splat_inner_left": (lambda x: (_splat_of_sum(x) * x) * 3.0, 48),
    "scalar_splat_left": (lambda x: _splat_of_scalars(x) * (2.0 * x), 48),
    "literal_splat_left": (lambda x: jnp.full(x.shape, 1 / 3, F32) * (2.0 * x), 48),
}


@pytest.mark.parametrize("name", list(SPLAT_SCALINGS))
def test_splat_scalings_fold_as_xla_folds_them(name):
    """Seed 19 #1334: SGD on `var(x @ w, axis=0, keepdims=True)` (`simplify._computed_splat`)."""
    fn, xla = SPLAT_SCALINGS[name]
    predicted, compiled = predicted_and_compiled(
        fn, (jnp.linspace(-1.0, 1.0, 24, dtype=F32),), {"data": 1}
    )
    assert compiled == xla
    assert predicted == compiled


def test_gradient_of_a_kept_dims_variance_counts_as_xla_counts_it():
    """Seed 19 #1334 on 6 devices: the variance's gradient `sum(ct) / 3 * (2 * d)` is one
    multiply by 2/3 (the fuzz program: 72 flops predicted before, 66 compiled; 66 now)."""
    fn = _sgd(lambda w, x: jnp.mean(jnp.var(x @ w, axis=0, keepdims=True)))
    args = (
        jnp.linspace(-1.0, 1.0, 36, dtype=F32).reshape(12, 3),
        jnp.linspace(0.0, 1.0, 12, dtype=F32),
    )
    predicted, compiled = predicted_and_compiled(fn, args, {"data": 6})
    assert compiled == 56
    assert predicted == compiled


def _dot_of_broadcasts(spec: str, shape: tuple[int, ...], dims=None, scale=None):
    """`einsum(spec, b(x), b(y))` with `b` broadcasting an operand to `shape` (`dims`: where
    its dims go, as `lax.broadcast_in_dim`), times `scale` if given."""

    def fn(x, y):
        b = lambda v: jax.lax.broadcast_in_dim(v, shape, dims or ())  # noqa: E731
        out = jnp.einsum(spec, b(x), b(y))
        return out if scale is None else out * scale

    return fn


DOTS = {
    # a dot of two broadcast scalars is `x * y * 32` (fuzz seed 19 #857: 63 counted)
    "vector_dot_of_broadcast_scalars": (_dot_of_broadcasts("a,a->", (32,)), (), 2),
    # batched, the broadcast rows summed: the multiply on the core [4], then `* 32`
    "batched_dot_over_broadcast_rows": (_dot_of_broadcasts("ab,ab->b", (32, 4), (1,)), (4,), 8),
    # summed over broadcast and core dims alike: the multiply on the core, the sum in full
    "dot_over_both_kinds": (_dot_of_broadcasts("ab,ab->", (32, 4), (1,)), (4,), 131),
}


@pytest.mark.parametrize("name", list(DOTS))
def test_dot_products_of_broadcasts_count_as_xla_counts_them(name):
    """`simplify._spread_dot_product_fraction`: XLA's simplifier makes the dot product a
    multiply and a sum, runs the multiply of two broadcasts on their core and folds the sum
    over broadcast dims into a multiply (measured on jaxlib 0.10.2's CPU)."""
    fn, shape, xla = DOTS[name]
    args = [jax.ShapeDtypeStruct(shape, F32)] * 2
    predicted, compiled = unsharded_flops(fn, *args)
    assert compiled == xla
    assert predicted == compiled
