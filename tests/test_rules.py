"""Factor rules, one hand case per family, built by tracing tiny JAX functions.

A rule is shown as a set of factors `(kind, size, slots)`, where a slot names an operand or result
dim: `o1.0` is operand 1 dim 0, `r0.2` result 0 dim 2, and `o0.1:0` the major sub-factor of a dim
split by a reshape. Factors shared by several slots are the op's identities (I-edges).
"""

from __future__ import annotations

from collections import defaultdict
from math import prod

import jax
import jax.numpy as jnp
import pytest
from jax.extend.core import Primitive

import toast_core as tc
from toast_core.analysis.factors import OpFactors
from toast_core.analysis.rules import RULES, factors_of


def sds(*shape, dtype=jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def F(kind: str, size: int, *slots: str) -> tuple[str, int, frozenset[str]]:
    return (kind, size, frozenset(slots))


def rule_of(fn, *args, primitive: str, index: int = 0):
    """(program, op, factors) of the index-th `primitive` op of `fn(*args)`."""
    prog = tc.trace(fn, *args, param_argnums=())
    ops = [op for op in prog.ops if op.primitive == primitive]
    assert ops, f"no {primitive} in {[op.primitive for op in prog.ops]}"
    op = ops[index]
    operand_shapes = [prog.values[i].shape for i in op.operands]
    result_shapes = [prog.values[i].shape for i in op.results]
    factors = factors_of(op, operand_shapes, result_shapes)
    assert_well_formed(factors, operand_shapes, result_shapes)
    return prog, op, factors


def table(f: OpFactors) -> set[tuple[str, int, frozenset[str]]]:
    slots: dict[int, set[str]] = defaultdict(set)
    for side, tensors in (("o", f.operands), ("r", f.results)):
        for t, dims in enumerate(tensors):
            for d, factors in enumerate(dims):
                for k, factor in enumerate(factors):
                    suffix = f":{k}" if len(factors) > 1 else ""
                    slots[factor].add(f"{side}{t}.{d}{suffix}")
    return {(f.kinds[x], f.sizes[x], frozenset(s)) for x, s in slots.items()}


def rule_table(fn, *args, primitive: str, index: int = 0) -> set:
    return table(rule_of(fn, *args, primitive=primitive, index=index)[2])


def assert_well_formed(f: OpFactors, operand_shapes, result_shapes) -> None:
    """Every dim's factors multiply to its size (size-1 dims have none); every factor is used."""
    assert len(f.operands) == len(operand_shapes) and len(f.results) == len(result_shapes)
    for dims, shapes in ((f.operands, operand_shapes), (f.results, result_shapes)):
        for tensor, shape in zip(dims, shapes):
            assert len(tensor) == len(shape)
            for factors, size in zip(tensor, shape):
                assert prod(f.sizes[x] for x in factors) == size, (factors, size)
    used = {x for tensors in (f.operands, f.results) for t in tensors for d in t for x in d}
    assert used == set(range(len(f.sizes)))
    assert all(size > 1 for size in f.sizes)
    assert set(f.kinds) <= {"pass", "reduction", "replicate", "permute"}


X = sds(4, 6)


# --- elementwise -------------------------------------------------------------------------------


def test_elementwise_links_every_operand_dim_to_the_result():
    got = rule_table(lambda x, y: x + y, X, X, primitive="add")
    assert got == {F("pass", 4, "o0.0", "o1.0", "r0.0"), F("pass", 6, "o0.1", "o1.1", "r0.1")}


def test_elementwise_rank0_operands_broadcast_and_size1_dims_have_no_factor():
    got = rule_table(lambda x: x * 2.0, X, primitive="mul")
    assert got == {F("pass", 4, "o0.0", "r0.0"), F("pass", 6, "o0.1", "r0.1")}
    prog, op, _ = rule_of(lambda x: x * 2.0, X, primitive="mul")
    assert prog.values[op.operands[1]].role == "literal"
    got = rule_table(lambda x, y: jnp.maximum(x, y), sds(4, 1), sds(4, 1), primitive="max")
    assert got == {F("pass", 4, "o0.0", "o1.0", "r0.0")}


def test_select_n_links_predicate_and_both_cases():
    got = rule_table(lambda p, a, b: jnp.where(p, a, b), sds(4, 6, dtype=jnp.bool_), X, X,
                     primitive="select_n")  # fmt: skip
    assert got == {
        F("pass", 4, "o0.0", "o1.0", "o2.0", "r0.0"),
        F("pass", 6, "o0.1", "o1.1", "o2.1", "r0.1"),
    }


# --- layout ------------------------------------------------------------------------------------


def test_broadcast_in_dim_new_dims_are_fresh_and_kept_dims_link():
    got = rule_table(lambda v: jnp.broadcast_to(v, (4, 6)), sds(6), primitive="broadcast_in_dim")
    assert got == {F("pass", 4, "r0.0"), F("pass", 6, "o0.0", "r0.1")}
    # An expanded size-1 dim gets no factor; the result dim is fresh.
    got = rule_table(lambda v: jnp.broadcast_to(v, (4, 6)), sds(1, 6), primitive="broadcast_in_dim")
    assert got == {F("pass", 4, "r0.0"), F("pass", 6, "o0.1", "r0.1")}


def test_reshape_split_and_merge_use_sub_factors():
    got = rule_table(lambda x: x.reshape(8, 4, 8), sds(8, 32), primitive="reshape")
    assert got == {
        F("pass", 8, "o0.0", "r0.0"),
        F("pass", 4, "o0.1:0", "r0.1"),
        F("pass", 8, "o0.1:1", "r0.2"),
    }
    got = rule_table(lambda x: x.reshape(8, 32), sds(8, 4, 8), primitive="reshape")
    assert got == {
        F("pass", 8, "o0.0", "r0.0"),
        F("pass", 4, "o0.1", "r0.1:0"),
        F("pass", 8, "o0.2", "r0.1:1"),
    }


def test_reshape_partial_nesting_refines_both_sides():
    """[6, 4] -> [2, 12]: 6 = (2, 3) and 12 = (3, 4) share the factor 3."""
    got = rule_table(lambda x: x.reshape(2, 12), sds(6, 4), primitive="reshape")
    assert got == {
        F("pass", 2, "o0.0:0", "r0.0"),
        F("pass", 3, "o0.0:1", "r0.1:0"),
        F("pass", 4, "o0.1", "r0.1:1"),
    }


def test_reshape_that_does_not_nest_links_nothing():
    """[4, 6] -> [6, 4]: no common ordered factorization, so the operand dims must be whole."""
    got = rule_table(lambda x: x.reshape(6, 4), X, primitive="reshape")
    assert got == {
        F("replicate", 4, "o0.0"),
        F("replicate", 6, "o0.1"),
        F("pass", 6, "r0.0"),
        F("pass", 4, "r0.1"),
    }


def test_transpose_permutes():
    got = rule_table(lambda x: jnp.transpose(x, (2, 0, 1)), sds(2, 3, 4), primitive="transpose")
    assert got == {F("pass", 4, "o0.2", "r0.0"), F("pass", 2, "o0.0", "r0.1"),
                   F("pass", 3, "o0.1", "r0.2")}  # fmt: skip


def test_squeeze_and_expand_dims():
    got = rule_table(lambda x: jnp.squeeze(x, 1), sds(4, 1, 6), primitive="squeeze")
    assert got == {F("pass", 4, "o0.0", "r0.0"), F("pass", 6, "o0.2", "r0.1")}


def test_rev_keeps_the_link_as_a_permutation():
    got = rule_table(lambda x: jnp.flip(x, 1), X, primitive="rev")
    assert got == {F("pass", 4, "o0.0", "r0.0"), F("permute", 6, "o0.1", "r0.1")}


# --- contractions ------------------------------------------------------------------------------


def test_dot_general_with_batch_dims():
    got = rule_table(lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), sds(2, 3, 5), sds(2, 5, 7),
                     primitive="dot_general")  # fmt: skip
    assert got == {
        F("pass", 2, "o0.0", "o1.0", "r0.0"),
        F("pass", 3, "o0.1", "r0.1"),
        F("pass", 7, "o1.2", "r0.2"),
        F("reduction", 5, "o0.2", "o1.1"),
    }


def test_dot_general_of_x_with_its_transpose():
    """`x @ x.T` reads x twice (once through the transpose): two result dims of one size."""
    got = rule_table(lambda x: x @ x.T, X, primitive="dot_general")
    assert got == {
        F("pass", 4, "o0.0", "r0.0"),
        F("pass", 4, "o1.1", "r0.1"),
        F("reduction", 6, "o0.1", "o1.0"),
    }


def test_conv_same_padding_spatial_dims_permute_and_features_contract():
    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME")  # NCHW, OIHW

    got = rule_table(conv, sds(2, 3, 8, 8), sds(5, 3, 3, 3), primitive="conv_general_dilated")
    assert got == {
        F("pass", 2, "o0.0", "r0.0"),
        F("reduction", 3, "o0.1", "o1.1"),
        F("pass", 5, "o1.0", "r0.1"),
        F("permute", 8, "o0.2", "r0.2"),
        F("permute", 8, "o0.3", "r0.3"),
        F("replicate", 3, "o1.2"),
        F("replicate", 3, "o1.3"),
    }


def test_conv_valid_spatial_dims_replicate():
    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "VALID")

    got = rule_table(conv, sds(2, 3, 8, 8), sds(5, 3, 3, 3), primitive="conv_general_dilated")
    assert F("replicate", 8, "o0.2") in got and F("pass", 6, "r0.2") in got
    assert F("replicate", 3, "o1.2") in got


def test_conv_weight_gradient_reduces_over_spatial_dims():
    """dW = conv(x, dy): the kernel is as large as the input, so spatial dims contract."""

    def loss(k, x):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME").sum()

    prog = tc.trace(jax.grad(loss), sds(5, 3, 3, 3), sds(2, 3, 8, 8), param_argnums=())
    convs = [op for op in prog.ops if op.primitive == "conv_general_dilated"]
    (grad_conv,) = [op for op in convs if prog.values[op.results[0]].shape[-1] == 3]
    shapes = [prog.values[i].shape for i in grad_conv.operands]
    got = table(factors_of(grad_conv, shapes, [prog.values[grad_conv.results[0]].shape]))
    reductions = {(size, slots) for kind, size, slots in got if kind == "reduction"}
    # Batch (2) contracts like a feature dim; both spatial dims (8) contract input with kernel.
    assert sorted(size for size, _ in reductions) == [2, 8, 8]
    assert all(any(s.startswith("o0") for s in slots) for _, slots in reductions)
    assert all(any(s.startswith("o1") for s in slots) for _, slots in reductions)


# --- reductions and scans ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn, primitive",
    [
        (lambda x: x.sum(1), "reduce_sum"),
        (lambda x: x.max(1), "reduce_max"),
        (lambda x: jnp.argmax(x, axis=1), "argmax"),
    ],
)
def test_reductions_mark_the_reduced_dim(fn, primitive):
    assert rule_table(fn, X, primitive=primitive) == {
        F("pass", 4, "o0.0", "r0.0"),
        F("reduction", 6, "o0.1"),
    }


def test_cumsum_needs_its_dim_whole():
    got = rule_table(lambda x: jnp.cumsum(x, axis=1), X, primitive="cumsum")
    assert got == {F("pass", 4, "o0.0", "r0.0"), F("replicate", 6, "o0.1", "r0.1")}


def test_sort_needs_its_dim_whole_in_every_operand():
    got = rule_table(lambda x: jnp.sort(x, axis=0), X, primitive="sort")
    assert got == {F("replicate", 4, "o0.0", "r0.0"), F("pass", 6, "o0.1", "r0.1")}
    got = rule_table(lambda k, v: jax.lax.sort((k, v), dimension=1, num_keys=1), X, X,
                     primitive="sort")  # fmt: skip
    assert got == {
        F("pass", 4, "o0.0", "o1.0", "r0.0", "r1.0"),
        F("replicate", 6, "o0.1", "o1.1", "r0.1", "r1.1"),
    }


def test_top_k_gathers_every_dim_and_approx_top_k_only_its_reduced_dim():
    """XLA's partitioner replicates `topk` whole (tests/test_workloads.py measures it)."""
    x3 = sds(4, 6, 8)
    got = rule_table(lambda x: jax.lax.top_k(x, 2), x3, primitive="top_k")
    assert got == {
        F("replicate", 4, "o0.0"), F("replicate", 6, "o0.1"), F("replicate", 8, "o0.2"),
        F("replicate", 4, "r0.0"), F("replicate", 6, "r0.1"), F("replicate", 2, "r0.2"),
        F("replicate", 4, "r1.0"), F("replicate", 6, "r1.1"), F("replicate", 2, "r1.2"),
    }  # fmt: skip
    got = rule_table(lambda x: jax.lax.approx_max_k(x, 2), x3, primitive="approx_top_k")
    assert got == {
        F("pass", 4, "o0.0", "r0.0", "r1.0"), F("pass", 6, "o0.1", "r0.1", "r1.1"),
        F("replicate", 8, "o0.2"), F("pass", 2, "r0.2"), F("pass", 2, "r1.2"),
    }  # fmt: skip


# --- slicing, concatenation, padding -----------------------------------------------------------


def test_concatenate_needs_the_joined_dim_whole():
    got = rule_table(lambda a, b: jnp.concatenate([a, b], 0), X, sds(2, 6),
                     primitive="concatenate")  # fmt: skip
    assert got == {
        F("replicate", 4, "o0.0"),
        F("replicate", 2, "o1.0"),
        F("pass", 6, "r0.0"),
        F("pass", 6, "o0.1", "o1.1", "r0.1"),
    }


def test_split_needs_the_split_dim_whole():
    got = rule_table(lambda x: jnp.split(x, 2, axis=1), X, primitive="split")
    assert got == {
        F("pass", 4, "o0.0", "r0.0", "r1.0"),
        F("replicate", 6, "o0.1"),
        F("pass", 3, "r0.1"),
        F("pass", 3, "r1.1"),
    }


def test_slice_and_dynamic_slice_resize_a_dim():
    want = {F("replicate", 4, "o0.0"), F("pass", 2, "r0.0"), F("pass", 6, "o0.1", "r0.1")}
    assert rule_table(lambda x: x[1:3], X, primitive="slice") == want
    got = rule_table(lambda x, i: jax.lax.dynamic_slice(x, (i, 0), (2, 6)), X, sds(dtype=jnp.int32),
                     primitive="dynamic_slice")  # fmt: skip
    assert got == want


def test_dynamic_update_slice_links_operand_and_result():
    got = rule_table(lambda x, u, i: jax.lax.dynamic_update_slice(x, u, (i, 0)), X, sds(2, 6),
                     sds(dtype=jnp.int32), primitive="dynamic_update_slice")  # fmt: skip
    assert got == {
        F("pass", 4, "o0.0", "r0.0"),
        F("replicate", 2, "o1.0"),
        F("pass", 6, "o0.1", "o1.1", "r0.1"),
    }


def test_pad_exchanges_halos_on_the_padded_dim():
    got = rule_table(lambda x: jnp.pad(x, ((1, 1), (0, 0))), X, primitive="pad")
    assert got == {F("permute", 4, "o0.0"), F("pass", 6, "r0.0"), F("pass", 6, "o0.1", "r0.1")}


# --- gather and scatter ------------------------------------------------------------------------


def test_embedding_lookup_uses_the_masked_rule_on_the_vocab_dim():
    got = rule_table(lambda t, i: jnp.take(t, i, axis=0), sds(10, 8), sds(4, 5, dtype=jnp.int32),
                     primitive="gather")  # fmt: skip
    assert got == {
        F("reduction", 10, "o0.0"),  # each device looks up its own rows, then partial sums
        F("pass", 8, "o0.1", "r0.2"),
        F("pass", 4, "o1.0", "r0.0"),
        F("pass", 5, "o1.1", "r0.1"),
    }


def test_gather_with_batching_dims_links_operand_indices_and_result():
    got = rule_table(lambda x, i: jnp.take_along_axis(x, i, axis=2), sds(4, 5, 6),
                     sds(4, 5, 1, dtype=jnp.int32), primitive="gather")  # fmt: skip
    assert F("pass", 4, "o0.0", "o1.0", "r0.0") in got
    assert F("pass", 5, "o0.1", "o1.1", "r0.1") in got
    assert F("reduction", 6, "o0.2") in got


def test_scatter_add_sums_partial_updates():
    got = rule_table(lambda t, i, u: t.at[i].add(u), sds(10, 8), sds(4, dtype=jnp.int32),
                     sds(4, 8), primitive="scatter-add")  # fmt: skip
    assert got == {
        F("pass", 10, "o0.0", "r0.0"),
        F("pass", 8, "o0.1", "o2.1", "r0.1"),
        F("reduction", 4, "o1.0", "o2.0"),
    }


def test_scatter_overwrite_needs_its_updates_whole():
    got = rule_table(lambda t, i, u: t.at[i].set(u), sds(10, 8), sds(4, dtype=jnp.int32),
                     sds(4, 8), primitive="scatter")  # fmt: skip
    assert F("replicate", 4, "o1.0", "o2.0") in got


# --- creation and regions ----------------------------------------------------------------------


def test_iota_creates_fresh_dims():
    got = rule_table(lambda: jax.lax.broadcasted_iota(jnp.int32, (4, 6), 1), primitive="iota")
    assert got == {F("pass", 4, "r0.0"), F("pass", 6, "r0.1")}


def scan_program(c, xs):
    return jax.lax.scan(lambda carry, x: (carry * x, jnp.sin(x)), c, xs)


def test_scan_start_links_carry_and_slices_and_keeps_the_stacked_dim_whole():
    got = rule_table(scan_program, sds(3), sds(5, 3), primitive="scan_start")
    assert got == {
        F("pass", 3, "o0.0", "r0.0"),  # carry -> body carry
        F("replicate", 5, "o1.0"),  # the stacked dim of xs: iterations are sequential
        F("pass", 3, "o1.1", "r1.0"),  # xs[:, j] -> x[j]
    }


def test_scan_end_links_carry_in_and_out_and_stacks_ys():
    prog, op, factors = rule_of(scan_program, sds(3), sds(5, 3), primitive="scan_end")
    # Operands: body outputs (carry', y) then the body's carry input; results: (carry, ys).
    assert [prog.values[i].shape for i in op.operands] == [(3,), (3,), (3,)]
    assert table(factors) == {
        F("pass", 3, "o0.0", "o2.0", "r0.0"),
        F("pass", 3, "o1.0", "r1.1"),
        F("pass", 5, "r1.0"),
    }


def test_cond_end_links_every_branch_output_to_the_result():
    def branch(p, x):
        return jax.lax.cond(p, lambda x: x * 2.0, lambda x: x + 1.0, x)

    got = rule_table(branch, sds(dtype=jnp.bool_), X, primitive="cond_end")
    assert got == {F("pass", 4, "o0.0", "o1.0", "r0.0"), F("pass", 6, "o0.1", "o1.1", "r0.1")}


# --- every zoo primitive has a real rule -------------------------------------------------------


PURE_JAX_ZOO = ["gns", "gpt", "gpt-scan", "llama", "mlp", "moe", "unet"]
SLOW_ZOO = ["equinox", "flax"]  # building these workloads imports and initialises the libraries


@pytest.mark.parametrize(
    "name", PURE_JAX_ZOO + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW_ZOO]
)
def test_every_zoo_primitive_has_a_real_well_formed_rule(name):
    from demos import MODEL_ZOO

    w = MODEL_ZOO[name](size="tiny", train=True)
    prog = tc.trace(w.fn, *w.args, param_argnums=w.param_argnums)
    for op in prog.ops:
        assert op.primitive in RULES, f"{name}: no rule for {op.primitive}"
        operand_shapes = [prog.values[i].shape for i in op.operands]
        result_shapes = [prog.values[i].shape for i in op.results]
        factors = factors_of(op, operand_shapes, result_shapes)
        assert not factors.is_fallback
        assert_well_formed(factors, operand_shapes, result_shapes)
    assert not tc.analyze(prog).nda.fallback_ops


# --- primitives beyond the zoo: tiling, stacking, pooling, bits and randomness -----------------


def test_tile_result_dim_is_copies_of_the_operand_dim():
    got = rule_table(lambda x: jnp.tile(x, (2, 1)), X, primitive="tile")
    assert got == {
        F("pass", 2, "r0.0:0"),
        F("pass", 4, "o0.0", "r0.0:1"),
        F("pass", 6, "o0.1", "r0.1"),
    }


def test_stack_links_every_operand_and_adds_a_dim():
    got = rule_table(lambda x, y: jnp.stack([x, y], axis=1), X, X, primitive="stack")
    assert got == {F("pass", 4, "o0.0", "o1.0", "r0.0"), F("pass", 2, "r0.1"),
                   F("pass", 6, "o0.1", "o1.1", "r0.2")}  # fmt: skip


def test_unstack_needs_the_unstacked_dim_whole():
    got = rule_table(lambda x: sum(jnp.unstack(x[:, :3], axis=1)), X, primitive="unstack")
    assert got == {F("replicate", 3, "o0.1"), F("pass", 4, "o0.0", "r0.0", "r1.0", "r2.0")}


def test_pooling_gathers_windowed_dims_and_keeps_the_others():
    pool = lambda x: jax.lax.reduce_window(  # noqa: E731
        x, -jnp.inf, jax.lax.max, (1, 2, 1), (1, 2, 1), "VALID"
    )
    got = rule_table(pool, sds(2, 8, 4), primitive="reduce_window_max")
    assert got == {F("pass", 2, "o0.0", "r0.0"), F("replicate", 8, "o0.1"),
                   F("replicate", 4, "r0.1"), F("pass", 4, "o0.2", "r0.2")}  # fmt: skip
    grad = jax.grad(lambda x: pool(x).sum())
    got = rule_table(grad, sds(2, 8, 4), primitive="select_and_scatter_add")
    assert got == {F("pass", 2, "o0.0", "o1.0", "r0.0"), F("replicate", 4, "o0.1"),
                   F("replicate", 8, "o1.1", "r0.1"), F("pass", 4, "o0.2", "o1.2", "r0.2")}  # fmt: skip


def test_bitcast_to_a_narrower_type_adds_a_whole_minor_dim():
    got = rule_table(lambda x: jax.lax.bitcast_convert_type(x, jnp.uint8), X,
                     primitive="bitcast_convert_type")  # fmt: skip
    assert got == {
        F("pass", 4, "o0.0", "r0.0"),
        F("pass", 6, "o0.1", "r0.1"),
        F("replicate", 4, "r0.2"),
    }


def test_random_bits_dims_are_shardable_when_threefry_is_partitionable():
    def bits(k):
        return jax.random.bits(k, (4, 6))

    got = rule_table(bits, jax.random.key(0), primitive="random_bits")
    assert got == {F("pass", 4, "r0.0"), F("pass", 6, "r0.1")}
    keys = jax.random.split(jax.random.key(0), 4)
    got = rule_table(jax.vmap(bits), keys, primitive="random_bits")
    assert F("pass", 4, "o0.0", "r0.0") in got  # per-example keys shard like the batch
    with jax.threefry_partitionable(False):
        got = rule_table(bits, jax.random.key(0), primitive="random_bits")
    assert got == {F("replicate", 4, "r0.0"), F("replicate", 6, "r0.1")}


def test_key_plumbing_links_the_key_array_dims():
    keys = jax.random.split(jax.random.key(0), 4)
    got = rule_table(lambda k: jax.random.split(k, 3) if k.ndim == 0 else jax.vmap(
        lambda kk: jax.random.split(kk, 3))(k), keys, primitive="random_split")  # fmt: skip
    assert got == {F("pass", 4, "o0.0", "r0.0"), F("pass", 3, "r0.1")}
    got = rule_table(jax.random.key_data, keys, primitive="random_unwrap")
    assert got == {F("pass", 4, "o0.0", "r0.0"), F("pass", 2, "r0.1")}
    got = rule_table(jax.random.wrap_key_data, sds(4, 2, dtype=jnp.uint32), primitive="random_wrap")
    assert got == {F("pass", 4, "o0.0", "r0.0"), F("replicate", 2, "o0.1")}


@pytest.mark.parametrize("spelling", ["scatter-mul", "scatter-min", "scatter-max"])
def test_combining_scatters_have_their_jax_spelling(spelling):
    method = {"scatter-mul": "multiply", "scatter-min": "min", "scatter-max": "max"}[spelling]

    def fn(t, i, u):
        return getattr(t.at[i], method)(u)

    got = rule_table(fn, sds(10, 8), sds(4, dtype=jnp.int32), sds(4, 8), primitive=spelling)
    assert F("reduction", 4, "o1.0", "o2.0") in got


# --- unknown primitives ------------------------------------------------------------------------

mystery_p = Primitive("toast_test_mystery")
mystery_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
mystery_p.def_impl(lambda x: x * 2)


def test_unknown_primitive_gets_the_fallback_and_a_diagnostic():
    def fn(params, x):
        h = x @ params["w1"]
        return mystery_p.bind(h) @ params["w2"]

    prog = tc.trace(fn, {"w1": sds(4, 8), "w2": sds(8, 2)}, sds(3, 4))
    (op,) = [op for op in prog.ops if op.primitive == "toast_test_mystery"]
    shapes = [prog.values[op.operands[0]].shape]
    assert factors_of(op, shapes, shapes).is_fallback
    ana = tc.analyze(prog)
    assert any("toast_test_mystery" in d for d in ana.diagnostics)
    before = {c for dim in ana.value_named_dims(op.operands[0]) for c in dim}
    after = {c for dim in ana.value_named_dims(op.results[0]) for c in dim}
    assert len(before) == 2 and len(after) == 2
    assert not before & after, "a named dim crosses the unknown op"
    assert not ana.conflicts
    # The batch dim of x and of the output are different named dims now (the op cut them).
    assert len(ana.named_dims) == 6


def test_sharding_into_an_unknown_primitive_costs_an_all_gather():
    """Pessimistic pricing: the batch dim of h = x @ w1 sharded on `data` must be gathered before
    the op we cannot model, never carried through it for free."""

    def fn(params, x):
        return mystery_p.bind(x @ params["w1"]) @ params["w2"]

    prog = tc.trace(fn, {"w1": sds(4, 8), "w2": sds(8, 2)}, sds(16, 4))
    ana = tc.analyze(prog)
    (op,) = [op for op in prog.ops if op.primitive == "toast_test_mystery"]
    shapes = [prog.values[op.operands[0]].shape]
    assert set(factors_of(op, shapes, shapes).kinds) == {"replicate"}
    (batch,) = ana.value_named_dims(op.operands[0])[0]
    mesh = tc.MeshSpec({"data": 8})
    report = tc.estimate(ana, tc.Strategy.make(ana, {f"N{batch}": "data"}), mesh, "tpu-v5e")
    gathers = [c for c in report.collectives if c.kind == "all-gather" and c.op == op.index]
    assert [(c.value, c.mesh_axes) for c in gathers] == [(op.operands[0], ("data",))]
    assert gathers[0].bytes > 0


# --- registries --------------------------------------------------------------------------------


def test_registering_a_primitive_twice_is_an_error():
    from toast_core.analysis.rules import rule
    from toast_core.cost.flops import flop_rule

    with pytest.raises(tc.ToastError, match="'add' registered twice"):
        rule("add")(lambda op, operand_shapes, result_shapes: None)
    with pytest.raises(tc.ToastError, match="'dot_general' registered twice"):
        flop_rule("dot_general")(lambda op, program: (0.0, 0.0))
    assert RULES["add"].__name__ == "elementwise_rule"


def test_every_primitive_family_has_factor_rules():
    from toast_core.ir import primitives as prim

    families = (
        prim.REGION_BOUNDARIES,
        prim.ELEMENTWISE,
        prim.REDUCTIONS,
        prim.ARG_REDUCTIONS,
        prim.CUMULATIVE,
        prim.FUSIBLE_LAYOUT,
        prim.SCATTERS,
        prim.REDUCE_WINDOWS,
        prim.RANDOM_KEYS,
        prim.CREATION,
    )
    for family in families:
        assert family <= set(RULES), sorted(family - set(RULES))
    assert prim.FUSED_REDUCTIONS <= prim.REDUCTIONS
    assert prim.NO_OP_ELEMENTWISE | prim.TRANSCENDENTAL <= prim.ELEMENTWISE


# --- the newer rules drive valid plans ---------------------------------------------------------


def _conv_pool_dropout_step(p, x, y, key):
    """Conv, batch norm, max pool, dropout, a tiled class row and a stack, with label smoothing:
    the primitives of `rules_window.py` and `rules_random.py` in one train step."""

    def loss(p):
        h = jax.lax.conv_general_dilated(
            x, p["conv"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        h = (h - h.mean((0, 1, 2))) * jax.lax.rsqrt(h.var((0, 1, 2)) + 1e-5) * p["gamma"]
        h = jax.lax.reduce_window(
            jax.nn.relu(h), -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"
        )
        h = h.reshape(h.shape[0], -1)
        h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h / 0.9, 0.0)
        logits = jnp.stack([h @ p["w"], jnp.tile(p["cls"], (h.shape[0], 1))], axis=1).sum(1)
        target = jax.nn.one_hot(y, 10) * 0.9 + 0.01
        return -(target * jax.nn.log_softmax(logits)).sum(-1).mean()

    value, grads = jax.value_and_grad(loss)(p)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), value


@pytest.mark.slow
def test_plans_over_pooling_and_dropout_match_the_unsharded_numerics():
    import numpy as np
    from jax.sharding import Mesh

    rng = np.random.default_rng(0)

    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)

    params = {"conv": normal(3, 3, 3, 8, scale=0.3), "gamma": jnp.ones(8),
              "w": normal(128, 10, scale=0.1), "cls": normal(1, 10, scale=0.1)}  # fmt: skip
    args = (params, normal(16, 8, 8, 3), jnp.arange(16) % 10, jax.random.key(3))
    ana = tc.analyze(tc.trace(_conv_pool_dropout_step, *args))
    assert not ana.diagnostics
    spec, hw = tc.MeshSpec({"data": 2, "model": 4}), tc.hardware("tpu-v5e")
    baselines = tc.baselines.all(ana, spec)
    plans = {n: baselines[n][0] for n in ("data_parallel", "dp_megatron")}
    plans["search"] = tc.search(ana, spec, hw, budget_s=None, num_simulations=40).best
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    for name, plan in plans.items():
        report = tc.validate(_conv_pool_dropout_step, args, ana, plan, mesh, hw)
        assert report.numerics_ok, (name, report.max_abs_error)
