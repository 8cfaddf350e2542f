"""A constant scaling read by an outer product of one element: XLA's simplifier makes the dot a
multiply by the broadcast element and moves the scaling onto that element
(`simplify._outer_of_one`). Each test holds the model to XLA's `cost_analysis()`."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from xla_flops import predicted_and_compiled, unsharded_flops

F32 = jnp.float32


def erf_grad(w, x):
    """The gradient wrt `w` of `mean(erf(x @ w))`: `outer(x, exp(-v * v) * 2 / sqrt(pi) / 8)`."""
    return jax.grad(lambda w: jnp.mean(lax.erf(x @ w)))(w)


@pytest.mark.slow
@pytest.mark.parametrize("n, compiled", [(1, 33.0), (3, 96.0)])
def test_the_scaling_moves_onto_an_outer_products_single_element(n, compiled):
    """x[1]: the scaling multiplies x (1 flop), not the [8] derivative: 33 flops. x[3]: both
    operands are broadcasts and the scaling stays on the [8]: 96."""
    args = (jax.ShapeDtypeStruct((n, 8), F32), jax.ShapeDtypeStruct((n,), F32))
    predicted, xla = unsharded_flops(erf_grad, *args)
    assert xla == compiled
    assert predicted == xla


def sgd(loss):
    def step(params, b):
        grads = jax.grad(loss)(params, b)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    return step


@pytest.mark.slow
def test_an_element_of_one_devices_shard_takes_the_scaling():
    """Fuzz seed 19 #503 as SGD: x[3] cut 3 ways is one element per device; the erf derivative's
    scaling (a scalar times the mean's splat, one splat again) moves onto it. 183 flops
    predicted before, XLA's count after."""
    loss = lambda p, b: jnp.mean(lax.erf(b["x"] @ p["w"]))  # noqa: E731
    args = ({"w": jax.ShapeDtypeStruct((3, 8), F32)}, {"x": jax.ShapeDtypeStruct((3,), F32)})
    predicted, compiled = predicted_and_compiled(sgd(loss), args, {"data": 3})
    assert predicted == compiled


@pytest.mark.slow
def test_a_mean_splat_times_a_weight_moves_onto_the_shards_element():
    """Fuzz seed 19 #1589: `mean((x @ w2) * w4)` with x[6] cut 6 ways: the gradient wrt w2 is
    `outer(x, w4 / 3)`, XLA scales x's one element: 28 flops, predicted 30 before."""
    loss = lambda p, b: jnp.mean((b["x"] @ p["w2"]) * p["w4"])  # noqa: E731
    args = (
        {"w2": jax.ShapeDtypeStruct((6, 3), F32), "w4": jax.ShapeDtypeStruct((3,), F32)},
        {"x": jax.ShapeDtypeStruct((6,), F32)},
    )
    predicted, compiled = predicted_and_compiled(sgd(loss), args, {"data": 2, "model": 3})
    assert predicted == compiled
