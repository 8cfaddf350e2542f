"""How often XLA computes a special function it expands (erfc, digamma: `prim.
EXPANDED_TRANSCENDENTAL`) and the ops around it, against XLA's `cost_analysis()` (fuzz seed 19's
flop misses with erfc, exact GELU and digamma)."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from xla_flops import predicted_and_compiled, replicated_ratio, unsharded_flops

import toast_core as tc


def f32(*shape):
    n = 1
    for d in shape:
        n *= d
    return jnp.linspace(-1.1, 1.3, n, dtype=jnp.float32).reshape(shape)


def test_a_gelu_read_by_a_softmax_is_computed_once():
    """Fuzz seed 19 #155: `jax.nn.gelu(x, approximate=False)` ends in a `copy`, which JAX
    lowers to nothing; the softmax's max and its shift `exp(x - max)` read the GELU itself,
    and XLA computes it once (1,080 flops on [8, 2]). Read through the copy, the GELU was
    duplicated into both fusions, erfc's expansion with it: 2,232."""

    def fn(x):
        return jax.nn.softmax(jax.nn.gelu(x, approximate=False), axis=-1)

    predicted, compiled = unsharded_flops(fn, f32(8, 2))
    assert predicted == pytest.approx(compiled, rel=0.05)


def test_a_path_through_a_scatter_keeps_erfc_once():
    """Fuzz seed 19 #434: erfc is read by `v = x / (1 + e * e)`, `e = erfc(x)`, and by the gradient;
    `v`'s other path to the gradient runs through a scatter of several windows, which no fusion
    takes in, so XLA computes erfc once and stores it (`InstructionFusion::
    ComputeGloballyUnfusible`: erfc's final select reads several arrays, and it cannot be fused
    into its consumers on all paths). Duplicated into both loops: 6,952 of XLA's 3,928."""
    i = jnp.array([1, 3], jnp.int32)

    def loss(x):
        e = lax.erfc(x)
        v = x / (1.0 + e * e)
        return jnp.mean(v.at[:, :, i].set(jnp.tanh(v[:, :, i])))

    predicted, compiled = unsharded_flops(jax.grad(loss), f32(3, 2, 8))
    assert predicted == pytest.approx(compiled, rel=0.05)


def test_a_special_function_read_by_a_dot_through_a_layout_copy_is_expanded_into_it():
    """Fuzz seed 19 #11: `digamma(x * x + 1)` read by `einsum('abc,bz->acz')` and by a
    multiply. XLA:CPU reads the dot's operand through a layout copy, a loop fusion that computes
    digamma's cheap part like the multiply's (`copy_bitcast_fusion` and `select_multiply_fusion`
    each hold it; nothing stores digamma itself): 0.84 of XLA's flops when counted once."""

    def fn(x, w):
        v = jax.scipy.special.digamma(x * x + 1.0)
        return jnp.einsum("abc,bz->acz", v, w), v * 2

    assert replicated_ratio(fn, (f32(8, 5, 4), f32(5, 32))) == pytest.approx(1.0, abs=0.05)


def test_a_special_function_read_by_a_library_reduction_and_a_loop_is_computed_once():
    """Fuzz seed 19 #39: the mean of an exact GELU of 4,096 elements is an XLA:CPU library call
    (`__ynn_fusion`), which takes in `0.5 * x * erfc(...)` but reads erfc from memory; erfc,
    read by the gradient's loop too, is computed once and stored (307,200 flops on [4, 4, 8,
    32]; expanded into both, 1.88 of that)."""

    def fn(x):
        return jax.value_and_grad(lambda x: jnp.mean(jax.nn.gelu(x, approximate=False)))(x)

    assert replicated_ratio(fn, (f32(4, 4, 8, 32),)) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize(
    "f",
    [
        jax.scipy.special.digamma,
        lax.erfc,
        lax.lgamma,
        lambda v: jax.scipy.special.polygamma(1, v),
    ],
    ids=["digamma", "erfc", "lgamma", "polygamma"],
)
def test_a_special_function_widened_by_its_one_reader_is_split(f):
    """Fuzz seed 19 #1258, #1525, #1279: a special function read by one loop that broadcasts
    it (an outer-product weight gradient). XLA fuses no expensive op into a consumer that
    reuses its elements, so the expansion's exp, log and divisions are fusions of their own,
    each computing `x * x + 1` again, and its cheap part is in the reader's loop, as for
    several readers (on f32[32] into [32, 8]: digamma 3,104 flops, erfc 2,560, lgamma 2,560,
    polygamma 3,136). Counted as one fusion: 0.86, 0.88, 0.78, 0.83 of those."""
    x = jnp.linspace(0.5, 1.5, 32, dtype=jnp.float32)

    def fn(x, w):
        return f(x * x + 1.0)[:, None] * w

    predicted, compiled = unsharded_flops(fn, x, f32(32, 8))
    assert predicted == pytest.approx(compiled, rel=0.05)


@pytest.mark.parametrize(
    "f",
    [lambda v: jax.nn.gelu(v, approximate=False), jax.scipy.special.digamma],
    ids=["gelu_exact", "digamma"],
)
def test_a_special_function_on_a_broadcast_computes_its_operand_in_each_expensive_part(f):
    """Fuzz seed 19 #1071: an exact GELU of a (transposed) broadcast. Run on a broadcast, a
    special function's expensive parts (erfc's exp and two divisions, digamma's division) are
    fusions of their own even with one reader (the loop reads the core through the broadcast,
    and XLA fuses no expensive op into a loop that reuses its elements), each computing the
    cheap ops making the operand's core again (`fusion.EXPANDED_APART_ON_BROADCAST`): the
    GELU's `-x / sqrt(2)` four times (0.93 of XLA's flops counted once)."""
    x = jnp.linspace(0.5, 1.5, 64, dtype=jnp.float32)

    def fn(x):
        return f(jnp.broadcast_to((x * 1.7 - 0.3)[:, None], (64, 4)))

    predicted, compiled = unsharded_flops(fn, x)
    assert predicted == pytest.approx(compiled, rel=0.01)


@pytest.mark.parametrize(
    "loss",
    [
        lambda x: jnp.sum(lax.erfc(x) * x),
        lambda x: jnp.sum(jax.nn.gelu(x, approximate=False)),
    ],
    ids=["erfc", "gelu_exact"],
)
def test_erfc_gradient_shares_the_expansions_exp(loss):
    """erfc's gradient `-2 / sqrt(pi) * exp(-x * x)` is the expression XLA's erfc expansion
    computes: CSE merges them, one exp per element and no square or negation of the gradient's
    own (`simplify.erfc_gradient_exps`; 2 flops and 1 transcendental per element more before,
    on fuzz seed 19 #926 with the min and scale around an exact GELU)."""
    x = f32(16, 32)
    mesh = tc.MeshSpec({"data": 1})
    fn = jax.value_and_grad(loss)
    ana = tc.analyze(tc.trace(fn, x))
    rep = tc.validate(
        fn, (x,), ana, tc.baselines.replicated(ana, mesh), tc.jax_mesh(mesh), tc.hardware("tpu-v5e")
    )
    assert rep.predicted_flops == pytest.approx(rep.compiled_flops, rel=0.002)
    assert rep.predicted_transcendentals == pytest.approx(rep.compiled_transcendentals, rel=0.002)


def test_all_reduced_sums_are_not_merged_into_one_reduce():
    """Fuzz seed 19 #926: the means of an exact GELU's min and of another term, data-parallel.
    XLA's simplifier merges `sum(a) + sum(b)` into one reduce of `a + b`, so the GELU is in one
    loop; cut along the summed dim, each sum is a partial that the partitioner all-reduces, the
    add reads the all-reduces, and the two sums stay fusions of their own, the erfc expansion in
    each (`fusion._all_reduced`; 0.73 of XLA's flops with the sums merged)."""

    def loss(x):
        g = jax.nn.gelu(x, approximate=False)
        return jnp.mean(g) + jnp.mean(jnp.minimum(g, 0.3))

    predicted, compiled = predicted_and_compiled(
        jax.value_and_grad(loss), (f32(16, 32),), {"data": 2}
    )
    assert predicted == pytest.approx(compiled, rel=0.05)


@pytest.mark.parametrize("shape", [(1, 4), (2, 1, 4), (4, 4)])
def test_a_reduction_past_unit_dims_does_not_block_duplicating_its_operand(shape):
    """Fuzz seed 19 #155: an exact GELU read by a row max and by the softmax's shift `g - max`,
    on f32[8, 2] cut to [1, 2] per device. XLA reduces past the unit dims through bitcasts, so
    the max's reader is a bitcast, not the broadcast, and the all-paths test lets the GELU be
    duplicated into the max's fusion and the shift's (551 flops on [1, 4], 1,102 on [2, 1, 4];
    on [4, 4] the max reads the broadcast, and the GELU is computed once: 1,052); counted once
    there, 0.50 of XLA's flops (`fusion._keeps_unit_dims`)."""

    def fn(x):
        g = jax.nn.gelu(x, approximate=False)
        return g - jnp.max(g, axis=-1, keepdims=True)

    predicted, compiled = unsharded_flops(fn, f32(*shape))
    assert predicted == pytest.approx(compiled, rel=0.01)
