"""The XLA-judged compute time: the compiled program's instructions re-fused as TPU/GPU fuse them
(issue 10: the CPU's `bytes accessed` judged plans 1.5x slower than the model by CPU fusion alone),
and bf16 collectives the CPU promotes to f32 priced at their logical width."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import toast_core as tc
from toast_core.apply.hlo_compute import fused_traffic, judged_compute_s
from toast_core.apply.hlo_pricing import promoted_elements, target_collective_ops

MB = 1 << 20  # f32[512,512]: 1 MiB

# p0 -> exp (fusible) -> add (fusible) -> dot (heavy) -> all-reduce (collective) -> multiply (root)
# plus an iota generator read by the add, and a dynamic-slice of a stacked parameter read by the dot.
MODULE = """HloModule m, num_partitions=8

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p0: f32[512,512], p1: f32[4,512,512], i: s32[]) -> f32[512,512] {
  %p0 = f32[512,512]{1,0} parameter(0)
  %p1 = f32[4,512,512]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %zero = s32[] constant(0)
  %e = f32[512,512]{1,0} exponential(%p0)
  %g = f32[512,512]{1,0} iota(), iota_dimension=0
  %x = f32[512,512]{1,0} add(%e, %g)
  %w = f32[1,512,512]{2,1,0} dynamic-slice(%p1, %i, %zero, %zero), dynamic_slice_sizes={1,512,512}
  %wb = f32[512,512]{1,0} bitcast(%w)
  %d = f32[512,512]{1,0} dot(%x, %wb), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %r = f32[512,512]{1,0} all-reduce(%d), replica_groups={}, to_apply=%sum
  ROOT %y = f32[512,512]{1,0} multiply(%r, %r)
}
"""


def test_fused_chain_moves_only_what_crosses_hbm():
    fusible_bytes, dots = fused_traffic(MODULE)
    # exp reads p0 (1 MiB); its result stays on chip (read only by the fusible add); the iota is
    # fused into the add; the add writes x (read by the dot): 1 MiB; the dynamic slice reads and
    # writes one layer (1 + 1 MiB, its result read by the dot through a bitcast); the multiply
    # reads r twice (once per operand, as XLA counts) and writes the root: 3 MiB. The all-reduce
    # is communication, not compute.
    assert fusible_bytes == pytest.approx(7 * MB)
    ((flops, dot_bytes),) = dots
    assert flops == pytest.approx(2 * 512**3)
    assert dot_bytes == pytest.approx(3 * MB)


def test_judged_compute_prices_dots_apart_from_the_rest():
    hw = tc.hardware("tpu-v5e")
    peak, hbm = hw.effective_flops_per_s, hw.hbm_bytes_per_s
    xla_flops = 2 * 512**3 + 3 * 512 * 512  # the dot plus the elementwise work
    expected = max(2 * 512**3 / peak, 3 * MB / hbm) + max(3 * 512 * 512 / peak, 7 * MB / hbm)
    assert judged_compute_s(MODULE, xla_flops, hw) == pytest.approx(expected)


def _reduce_and_gather(dtype):
    mesh = Mesh(jax.devices()[:8], ("data",))

    def f(x, w):
        y = jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P()))
        return y, jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P()))

    x = jax.ShapeDtypeStruct((64, 128), dtype, sharding=NamedSharding(mesh, P(None, "data")))
    w = jax.ShapeDtypeStruct((128, 32), dtype, sharding=NamedSharding(mesh, P("data", None)))
    return jax.jit(f).lower(x, w).compile().as_text()


@pytest.mark.slow
def test_bf16_collectives_the_cpu_promotes_are_priced_at_bf16():
    mesh, hw = tc.MeshSpec({"data": 8}), tc.hardware("tpu-v5e")
    narrow, wide = _reduce_and_gather(jnp.bfloat16), _reduce_and_gather(jnp.float32)
    assert promoted_elements(wide) == {}
    promoted = promoted_elements(narrow)
    assert len(promoted) == 2 and all(v == {0} for v in promoted.values())
    narrow_bytes = sorted(op.full_bytes for op in target_collective_ops(narrow, mesh, hw))
    wide_bytes = sorted(op.full_bytes for op in target_collective_ops(wide, mesh, hw))
    assert narrow_bytes == pytest.approx([b / 2 for b in wide_bytes])


@pytest.mark.slow
def test_rolled_threefry_loop_of_the_cpu_is_judged_as_one_fused_elementwise_op():
    # JAX lowers threefry2x32 to a 5-trip loop on the CPU only; TPU/GPU unroll it and fuse the
    # random bits into the mask: only x is read and the masked x written for the dot (2 x x).
    def f(key, x, w):
        return jnp.where(jax.random.bernoulli(key, 0.5, x.shape), x, 0.0) @ w

    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    w = jax.ShapeDtypeStruct((512, 64), jnp.float32)
    text = jax.jit(f).lower(jax.random.key(0), x, w).compile().as_text()
    assert " while(" in text  # the CPU's rolled loop is there to be recognized
    fusible_bytes, dots = fused_traffic(text)
    assert fusible_bytes == pytest.approx(2 * 256 * 512 * 4, rel=1e-3)  # was 26 x (loop carries)
    assert len(dots) == 1


@pytest.mark.slow
def test_expanded_select_and_scatter_is_judged_as_the_native_instruction():
    # The CPU expands a max-pool gradient into a reduce-window writing argmax coordinates, their
    # concatenate and a scatter; TPU runs select-and-scatter: x and g in, the gradient out.
    def pool_loss(x, g):
        p = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jnp.sum(p * g)

    x = jax.ShapeDtypeStruct((8, 16, 16, 32), jnp.float32)
    g = jax.ShapeDtypeStruct((8, 8, 8, 32), jnp.float32)
    text = jax.jit(jax.grad(pool_loss)).lower(x, g).compile().as_text()
    assert "reduce-window" in text and "scatter" in text  # the CPU's expansion
    fusible_bytes, heavy = fused_traffic(text)
    x_bytes, g_bytes = 8 * 16 * 16 * 32 * 4, 8 * 8 * 8 * 32 * 4
    assert fusible_bytes == 0.0  # the indices and the updates' layout copy move nothing
    # x read, g read, the gradient written (plus the reduce-window's two scalar init values)
    assert sum(b for _, b in heavy) == pytest.approx(2 * x_bytes + g_bytes + 8)


@pytest.mark.slow
def test_the_cpus_conv_canonicalization_copies_are_not_charged():
    # The filter gradient contracts the batch: the CPU transposes x into a canonical layout and
    # the result back; TPU and GPU (cuDNN backward-filter) run it as is: x in, the gradient out.
    def loss(w, x):
        dims = ("NHWC", "HWIO", "NHWC")
        return jnp.sum(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dims))

    w = jax.ShapeDtypeStruct((3, 3, 16, 32), jnp.float32)
    x = jax.ShapeDtypeStruct((8, 16, 16, 16), jnp.float32)
    text = jax.jit(jax.grad(loss)).lower(w, x).compile().as_text()
    assert "transpose" in text  # the CPU's canonicalization copies
    fusible_bytes, heavy = fused_traffic(text)
    assert fusible_bytes == 0.0
    ((flops, conv_bytes),) = heavy
    assert conv_bytes == 8 * 16 * 16 * 16 * 4 + 3 * 3 * 16 * 32 * 4


# Two loop fusions recompute `p0 + p1` (the CPU duplicated the producer into each reader), two more
# compute other expressions of the same values, each reading p0 through the same bitcast.
DUPLICATED = """HloModule m

%f1 (a: f32[512,512], b: f32[512,512]) -> f32[512,512] {
  %a = f32[512,512]{1,0} parameter(0)
  %b = f32[512,512]{1,0} parameter(1)
  %s = f32[512,512]{1,0} add(%a, %b), metadata={op_name="jit(f)/add"}
  ROOT %m = f32[512,512]{1,0} multiply(%s, %s)
}

%f2 (c: f32[512,512], d: f32[512,512]) -> f32[512,512] {
  %c = f32[512,512]{1,0} parameter(0)
  %d = f32[512,512]{1,0} parameter(1)
  %t = f32[512,512]{1,0} add(%c, %d), metadata={op_name="jit(f)/add_any"}
  ROOT %n = f32[512,512]{1,0} negate(%t)
}

%f3 (e: f32[512,512], f: f32[512,512]) -> f32[512,512] {
  %e = f32[512,512]{1,0} parameter(0)
  %ev = f32[512,512]{1,0} bitcast(%e)
  %f = f32[512,512]{1,0} parameter(1)
  ROOT %u = f32[512,512]{1,0} subtract(%ev, %f)
}

%f4 (g: f32[512,512], h: f32[512,512]) -> f32[512,512] {
  %g = f32[512,512]{1,0} parameter(0)
  %gv = f32[512,512]{1,0} bitcast(%g)
  %h = f32[512,512]{1,0} parameter(1)
  ROOT %v = f32[512,512]{1,0} multiply(%gv, %h)
}

ENTRY %main (p0: f32[512,512], p1: f32[512,512]) -> (f32[512,512], f32[512,512], f32[512,512], f32[512,512]) {
  %p0 = f32[512,512]{1,0} parameter(0)
  %p1 = f32[512,512]{1,0} parameter(1)
  %p1v = f32[512,512]{1,0} bitcast(%p1)
  %y1 = f32[512,512]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%f1
  %y2 = f32[512,512]{1,0} fusion(%p0, %p1v), kind=kLoop, calls=%f2
  %y3 = f32[512,512]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%f3
  %y4 = f32[512,512]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%f4
  ROOT %out = (f32[512,512]{1,0}, f32[512,512]{1,0}, f32[512,512]{1,0}, f32[512,512]{1,0}) tuple(%y1, %y2, %y3, %y4)
}
"""


def test_a_producer_the_cpu_duplicated_into_several_fusions_is_read_once():
    # The CPU fused `p0 + p1` into both y1 and y2 (a GPT step's residual-gradient sum was in 16
    # fusions: 20 % of its judged bytes); TPU/GPU compute it once. y1 reads p0 and p1 and writes
    # (3 MiB); y2 recomputes the same sum (p1 through a view), so reads nothing and writes
    # (1 MiB); y3's subtraction and y4's product are other expressions: each reads both and
    # writes (3 MiB), the bitcast they share being a view, not a computation.
    fusible_bytes, dots = fused_traffic(DUPLICATED)
    assert fusible_bytes == pytest.approx(10 * MB)  # 12 MiB when every fusion read its operands
    assert dots == []


# A fused QKV projection's result sliced into q, k and v through a bitcast, each slice written
# transposed for its attention dot (XLA:CPU's fusion of `jnp.split` after a reshape).
SLICED_VIEW = """HloModule m

%q (a: f32[256,768]) -> f32[8,32,256] {
  %a = f32[256,768]{1,0} parameter(0)
  %v = f32[256,3,8,32]{3,2,1,0} bitcast(%a)
  %s = f32[256,1,8,32]{3,2,1,0} slice(%v), slice={[0:256], [2:3], [0:8], [0:32]}
  %b = f32[256,8,32]{2,1,0} bitcast(%s)
  ROOT %t = f32[8,32,256]{2,1,0} transpose(%b), dimensions={1,2,0}
}

ENTRY %main (p: f32[256,768]) -> f32[8,32,256] {
  %p = f32[256,768]{1,0} parameter(0)
  ROOT %y = f32[8,32,256]{2,1,0} fusion(%p), kind=kLoop, calls=%q
}
"""


def test_a_slice_of_a_bitcast_of_an_operand_reads_the_slice():
    # The fusion reads one third of p (its slice through the bitcast, a view) and writes it: a
    # decoder's attention read its whole [B*S, 3*D] projection three times (5 % of its bytes).
    fusible_bytes, _ = fused_traffic(SLICED_VIEW)
    assert fusible_bytes == 2 * 256 * 256 * 4


@pytest.mark.slow
def test_the_cpus_tree_reduction_window_fuses_into_its_reduce():
    # XLA:CPU splits a reduce of a small operand with a reduced dim longer than 32 into a
    # reduce-window (windows of 32 tiling the row) and a reduce; TPU and GPU fuse the exp into one
    # reduce: x read, the row sums written. Judged heavy, the window would add exp's result
    # written and read again (twice the operand) and its own result (the Flax MLP's 0.918).
    x = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    text = jax.jit(lambda x: jnp.sum(jnp.exp(x), axis=1)).lower(x).compile().as_text()
    assert "reduce-window" in text  # the CPU's rewrite is there to be recognized
    fusible_bytes, heavy = fused_traffic(text)
    assert heavy == []
    assert fusible_bytes == pytest.approx(16 * 128 * 4 + 16 * 4, abs=16)  # + scalar init values
    # A reduce-window the program asked for (a max-pool, with its source) stays heavy.
    pooled = lambda x: jnp.sum(  # noqa: E731
        jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 32), (1, 32), "VALID"), axis=1
    )
    text = jax.jit(pooled).lower(x).compile().as_text()
    assert len(fused_traffic(text)[1]) == 1
