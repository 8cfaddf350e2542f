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
