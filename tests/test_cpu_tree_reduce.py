"""XLA:CPU's tree reduction in the CPU view of flops (`toast_core.cost.cpu_tree_reduce`)."""

import jax.numpy as jnp
import pytest

import toast_core as tc
from toast_core.cost.cpu_tree_reduce import tree_factor, tree_folds


def test_tree_folds_pad_each_long_reduced_dim_to_windows_of_32():
    """The counts measured on jaxlib 0.10.2 (CPU): sums of x[40, 40] over dim 0 (2,520) and both
    dims (4,095), of x[1025] (1,086: 33 windows, then 33 results padded to 64), of x[300, 8] over
    dim 0 (2,552 beyond the 2,400 multiplies); dims of 32 or less fold as they are."""
    assert 40 * tree_folds([40]) == 2520
    assert tree_folds([40, 40]) == 4095
    assert tree_folds([1025]) == 1086
    assert 8 * tree_folds([300]) == 2552
    assert tree_folds([32, 6]) == 191
    assert tree_factor((48, 85), (0,)) > 1.0
    assert tree_factor((48, 86), (0,)) == 1.0  # 4,096 elements or more: reduced whole
    assert tree_factor((8, 6, 8), (0, 1, 2)) == 1.0


def _sums(x):
    return jnp.sum(jnp.sin(x), axis=0), jnp.max(x * 2.0)


@pytest.mark.slow
def test_cpu_view_counts_tree_reductions_on_the_local_operand():
    """x[96, 24] sharded on dim 0 over 2 devices: each reduces 48 rows (padded to 64); one
    device alone reduces 96 (already a multiple of 32). Before the CPU view modelled the tree,
    the sharded program was predicted at 0.82 of XLA's count (3,469 of 4,224)."""
    x = jnp.linspace(0.0, 1.0, 96 * 24, dtype=jnp.float32).reshape(96, 24)
    ana = tc.analyze(tc.trace(_sums, x))
    for n in (1, 2):
        mesh = tc.MeshSpec({"data": n})
        strategy = tc.baselines.data_parallel(ana, mesh) if n > 1 else None
        strategy = strategy or tc.baselines.replicated(ana, mesh)
        check = tc.validate(_sums, (x,), ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"))
        assert check.predicted_flops == pytest.approx(check.compiled_flops, rel=0.01), n


def _mean_of_einsum(x, w):
    return jnp.mean(jnp.einsum("abc,deb->acde", jnp.einsum("abc,bz->acz", x, w), x))


@pytest.mark.slow
def test_cpu_view_tree_reduces_a_dot_result_as_its_merged_matrix():
    """The mean of a [12, 3, 12, 4] einsum, no dim over 32: XLA:CPU reduces the dot's own
    [36, 48] result (the 4-D value is its bitcast), padded to 64 x 64 by the tree reduction
    (fuzz seed 16 #947: 0.93 of XLA's flops when the 4-D shape was reduced)."""
    x = jnp.linspace(0.0, 1.0, 12 * 4 * 4, dtype=jnp.float32).reshape(12, 4, 4)
    w = jnp.ones((4, 3), jnp.float32)
    check = _on_one_device(_mean_of_einsum, (x, w))
    assert check.predicted_flops == pytest.approx(check.compiled_flops, rel=0.01)


def _means_of_reshapes(x, y):
    return jnp.mean(x.reshape(4, 6, 72)), jnp.sum(y.reshape(40, 40))


@pytest.mark.slow
def test_cpu_view_tree_reduces_a_reshaped_operand_as_its_source():
    """Full reductions of reshapes: XLA's simplifier reduces the source whole, so x[4, 6, 12, 6]
    seen as [4, 6, 72] is not tree-reduced (1,727 folds, not 2,303) and y[1600] seen as
    [40, 40] is, along its one dim (1,613, not 4,095): fuzz seed 16 #443, 1.30 of XLA's flops
    when the reshaped shape was reduced."""
    x = jnp.linspace(0.0, 1.0, 4 * 6 * 12 * 6, dtype=jnp.float32).reshape(4, 6, 12, 6)
    y = jnp.linspace(0.0, 1.0, 1600, dtype=jnp.float32)
    check = _on_one_device(_means_of_reshapes, (x, y))
    assert check.predicted_flops == pytest.approx(check.compiled_flops, rel=0.01)


def _on_one_device(fn, args):
    """`tc.validate` of `fn` replicated on a one-device mesh: XLA:CPU's own reductions, uncut."""
    ana = tc.analyze(tc.trace(fn, *args))
    mesh = tc.MeshSpec({"data": 1})
    strategy = tc.baselines.replicated(ana, mesh)
    return tc.validate(fn, args, ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"))
