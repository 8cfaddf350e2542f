"""A dot that is an outer product on each device, by a spread scalar (`model._folded`,
`simplify.spread_dot_other`): the weight gradient of a mean loss with the batch cut."""

import jax
import jax.numpy as jnp
import pytest

import toast_core as tc


def _sgd(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.mean(x @ w))(w)


@pytest.mark.slow
def test_a_local_outer_product_by_a_spread_scalar_multiplies_the_other_shard():
    """SGD on `mean(x[8, 8] @ w[8, 12])`, data parallel on 8 devices: each device's weight
    gradient `x.T @ broadcast(1/96)` contracts one row, an outer product, which XLA computes as
    `x`'s row times 1/96 (8 flops), broadcast; counted per result element (96) the device was
    predicted at 1.06 of XLA's flops (fuzz seed 18 #480, Adam: 1,651 of 1,564)."""
    w = jnp.linspace(-1.0, 1.0, 96, dtype=jnp.float32).reshape(8, 12)
    x = jnp.linspace(0.0, 1.0, 64, dtype=jnp.float32).reshape(8, 8)
    ana = tc.analyze(tc.trace(_sgd, w, x))
    mesh = tc.MeshSpec({"data": 8})
    strategy = tc.baselines.data_parallel(ana, mesh)
    assert strategy is not None
    check = tc.validate(_sgd, (w, x), ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"))
    assert check.predicted_flops == pytest.approx(check.compiled_flops, rel=0.01)


def _scaled_broadcast(x, w):
    return jnp.broadcast_to(x[None], (12, *x.shape)) * w


@pytest.mark.slow
def test_work_on_a_broadcast_is_not_divided_by_cutting_the_broadcast_dim():
    """`broadcast_to(x[16, 8, 1][None], (12, ...)) * w[1]`: XLA multiplies `x` (128 flops) and
    broadcasts the product. With the broadcast dim cut 3 ways each device still multiplies the
    whole `x`; counted as the cut's share, 43 (fuzz seed 18 #498, 0.33 of XLA's flops)."""
    x = jnp.linspace(0.0, 1.0, 128, dtype=jnp.float32).reshape(16, 8, 1)
    w = jnp.full((1,), 2.0, jnp.float32)
    ana = tc.analyze(tc.trace(_scaled_broadcast, x, w))
    mesh = tc.MeshSpec({"model": 3})
    (dim,) = ana.value_named_dims(ana.program.outputs[0])[0]  # the broadcast dim, 12
    strategy = tc.Strategy.make(ana, {f"N{dim}": "model"}, name="cut_broadcast")
    check = tc.validate(
        _scaled_broadcast, (x, w), ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e")
    )
    assert check.predicted_flops == pytest.approx(check.compiled_flops, rel=0.01)
