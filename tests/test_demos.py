"""The model zoo: every model trains at tiny size, real sizes trace without allocating."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from demos import MODEL_ZOO, SIZES, Workload
from demos.adam import adam_init
from demos.gpt_scan import stack_blocks


@functools.cache
def tiny_train(name: str) -> tuple[Workload, object, tuple]:
    """(workload, compiled step, step outputs), compiled once per model for the whole file.

    XLA's backend optimisations are off: they halve compile time and these tests check values,
    not speed.
    """
    w = MODEL_ZOO[name](size="tiny", train=True)
    step = jax.jit(w.fn).lower(*w.args).compile(compiler_options=FAST_COMPILE)
    return w, step, step(*w.args)


FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def shapes(tree) -> list[tuple]:
    return [(x.shape, jnp.dtype(x.dtype)) for x in jax.tree.leaves(tree)]


def test_zoo_keys_and_sizes_agree():
    expected = {"mlp", "gpt", "gpt-scan", "llama", "moe", "unet", "gns", "flax", "equinox"}
    expected |= {
        "decoder",
        "dropout",
        "batchnorm",
        "grad-accum",
        "convnet",
        "vit",
        "label-smoothing",
    }
    assert set(MODEL_ZOO) == expected
    assert set(SIZES) == expected
    assert all(sizes[0] == "tiny" for sizes in SIZES.values())


@pytest.mark.parametrize("name", sorted(MODEL_ZOO))
def test_tiny_train_step_has_finite_loss_and_updates_params_in_place(name):
    w, _, out = tiny_train(name)
    assert w.is_concrete and w.name == name
    loss = out[-1]
    assert loss.shape == () and np.isfinite(float(loss))
    assert len(out) == len(w.param_argnums) + 1
    for i, argnum in enumerate(w.param_argnums):
        assert jax.tree.structure(out[i]) == jax.tree.structure(w.args[argnum])
        assert shapes(out[i]) == shapes(w.args[argnum])
    old, new = jax.tree.leaves(w.args[0]), jax.tree.leaves(out[0])
    assert any(not np.array_equal(a, b) for a, b in zip(old, new)), "step changed no param"


@pytest.mark.parametrize("name", sorted(MODEL_ZOO))
def test_tiny_forward_has_the_train_steps_params_deterministically(name):
    fwd = MODEL_ZOO[name](size="tiny", train=False)
    train, _, _ = tiny_train(name)
    assert fwd.param_argnums == (0,)
    assert jax.tree.structure(fwd.args[0]) == jax.tree.structure(train.args[0])
    for x, y in zip(jax.tree.leaves(fwd.args[0]), jax.tree.leaves(train.args[0])):
        np.testing.assert_array_equal(x, y)
    out = jax.eval_shape(fwd.fn, *fwd.args)
    assert out.ndim >= 2


def test_gpt_scan_matches_unrolled_gpt():
    gpt, _, (gpt_params, _, gpt_loss) = tiny_train("gpt")
    scan, scan_step, _ = tiny_train("gpt-scan")
    params, _, batch = gpt.args
    stacked = stack_blocks(params)
    assert shapes(stacked) == shapes(scan.args[0])
    new_params, _, loss = scan_step(stacked, adam_init(stacked), batch)
    np.testing.assert_allclose(loss, gpt_loss, rtol=1e-5)
    expected = stack_blocks(gpt_params)
    for got, want in zip(jax.tree.leaves(new_params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name, size, n_params",
    [("gpt", "gpt2", 124.4e6), ("llama", "llama3-8b", 8.03e9), ("moe", "mixtral-8x7b", 46.7e9)],
)
def test_real_size_traces_from_shapes_only(name, size, n_params):
    w = MODEL_ZOO[name](size=size)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(w.args))
    assert sum(x.size for x in jax.tree.leaves(w.args[0])) == pytest.approx(n_params, rel=0.01)
    jaxpr = jax.make_jaxpr(w.fn)(*w.args)
    assert jaxpr.out_avals[-1].shape == ()
    assert [a.shape for a in jaxpr.out_avals[:-1]] == [x.shape for x in jax.tree.leaves(w.args[:2])]


def test_concrete_args_fills_abstract_workload_within_int_bounds():
    small = dict(vocab=64, seq=16, d_model=32, n_heads=4, n_layers=1, d_ff=64, batch=8)
    w = MODEL_ZOO["gpt"](size="gpt2", **small)
    assert not w.is_concrete
    args = w.concrete_args(seed=0)
    assert jax.tree.structure(args) == jax.tree.structure(w.args)
    assert shapes(args) == [(x.shape, x.dtype) for x in jax.tree.leaves(w.args)]
    tokens = args[2]["tokens"]
    assert 1 < int(tokens.max()) < 64 and int(tokens.min()) >= 0
    assert 0.01 < float(jnp.std(args[0]["wte"].astype(jnp.float32))) < 0.03
    assert args[1]["step"].dtype == jnp.int32 and int(args[1]["step"]) in (0, 1)


def test_concrete_args_of_concrete_workload_are_the_args():
    w = MODEL_ZOO["mlp"]()
    assert w.concrete_args() is w.args


@pytest.mark.parametrize("name", sorted(MODEL_ZOO))
def test_unknown_size_raises_naming_argument_and_choices(name):
    with pytest.raises(ValueError, match=r"size='nope'") as info:
        MODEL_ZOO[name](size="nope")
    assert repr(SIZES[name]) in str(info.value)


def test_unknown_override_and_bad_heads_raise():
    with pytest.raises(ValueError, match="d_modle"):
        MODEL_ZOO["gpt"](d_modle=32)
    with pytest.raises(ValueError, match="n_kv_heads=3"):
        MODEL_ZOO["llama"](n_kv_heads=3)
