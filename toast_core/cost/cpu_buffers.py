"""Temporaries XLA:CPU allocates beyond the target's, for the CPU view of memory (issue 14).

`validate` compares the predicted memory with XLA:CPU's `memory_analysis()`; these buffers
exist there and not on TPU/GPU, and are added to that view only (`cpu_buffers`): layout copies of
dot and convolution operands, the rolled threefry loop's state, the blocked scans of cumulative
ops, the expansion of max-pool gradients (`select_and_scatter_add`), the explicit indices of
batched gathers and scatters, constant arrays made at the step's start, the inputs of the
reductions XLA:CPU runs as library calls, the reciprocals of spread divisors, loops' state
tuples, `TopK`'s outputs and arg reductions' indices and tuples; and the values its dot
products (a multiply and a fused reduce) never store, which the CPU view takes out (`dot_product_fused`).

**Dot operands.** XLA:CPU runs every dot as a 2-D (or batched 2-D) matrix product: its dot decomposer turns
`dot_general` into `[batch, rows, contracted] x [batch, contracted, cols]` by transposing and
reshaping each operand. A matrix operand (one free and one contracted dim, unit dims aside) is
read in either order, the transpose folded into the product; an operand with a group of free or
contracted dims to flatten is read in place only in the canonical order (`[free..., contracted...]`
on the left, `[contracted..., free...]` on the right, after the batch dims: `_grouping`). Any
other order of an operand's dims in its row-major buffer is a real transpose: a copy of the
operand, as large as it, written before the dot and live until it runs.

Worked example (a fuzz SGD step, measured with XLA's buffer assignment): `x @ w` with x
`f32[4, 8, 16, 6]` contracted over its dim 2 cannot be a matrix `[192, 16]` in place (the free
dims 0, 1, 3 surround it), so XLA writes `copy_bitcast_fusion = f32[192, 16]` (12 KiB) into the
temporary block; the backward dot that contracts x over dims 0, 1, 3 reads the same copy (the same
grouping of x's dims, one copy). The compiled temporaries were 46 KiB where the model counted 18.

Not every such operand is copied: a value that a loop fusion makes and only dots wanting the same
grouping read is written in that order by its fusion (layout assignment hands the dot's layout to
the producer). Program inputs, outputs, and results of non-fusible ops (another dot, a gather...)
keep their row-major buffers, so they are copied. An outer product (nothing contracted) is an
elementwise multiply in XLA, not a dot, and copies nothing. Unit dims never matter (bitcasts).

TPU and GPU choose layouts per operand (TPU tiles any dim order; GPU's GEMM rewriter takes
strided batch and transposed operands), so only the CPU view adds these copies.

**Convolution operands.** XLA:CPU's convolution canonicalization hands its conv kernels the
input as `[batch, spatial..., feature]` and the kernel as `[spatial..., in feature, out
feature]` (NHWC, HWIO); an operand whose dims lie in another order (unit dims aside) is
transposed into a copy as large as it. JAX's weight-gradient convolutions are the usual case:
they read the activations with batch and feature swapped (`[C, H, W, N]`) and the output's
cotangent as a kernel with the batch as its in-feature (`[H, W, N, O]`). As for dots, a value
that a loop fusion makes and only such convolutions read is written transposed by its fusion; an
input, or a value another op also reads, is copied. The scheduler makes the copy as soon as the
operand exists (measured: the images' copy at the step's start, the pooled activation's in the
forward pass), so it lives from the operand's producer to the last convolution reading it, and
the operand itself only to its last other reader; the model, which holds the operand to its
last reader of any kind, lacks one copy's bytes only while both are live (the whole step for an
input or output). In
the zoo `convnet` (tiny, replicated) these are f32[3, 16, 16, 16] (the images),
f32[32, 8, 8, 16] (the first pooled activation) and f32[8, 8, 16, 64] (the second conv's
cotangent, read by the input-gradient conv too). A transposed output is left to its reader's
fusion (the SGD update fuses the weight gradient's transpose), so it adds nothing.

**Threefry.** JAX lowers the threefry hash behind `jax.random` (dropout masks) to a rolled
5-round loop on the CPU only (`toast_core.apply.hlo_compute` says more); TPU and GPU unroll it
into elementwise code fused with its counters and readers, which the model prices. The CPU loop
holds four word arrays as large as the bits (the two initial counter words and the two words the
loop carries; measured in XLA's buffer assignment: 4 x 3 KiB of an Adam step's 24 KiB temporary
block for a dropout mask on f32[64, 12], three of them live at once for a lone mask), two more
inside a loop body (the counters are an iota, hoisted out of the enclosing loop and held across
it: 6 x 4 KiB of 30 KiB in a `fori_loop` accumulation), and its state: the tuple's 8-byte
pointer table, its counter and compare, and copy insertion's copies of the key and rotation
elements (twelve small buffers, each a 64-byte aligned temporary: `THREEFRY_STATE_BUFFERS`). A
key split or fold-in runs the same loop on two words.

**Cumulative ops.** XLA:CPU scans a cumulative op's axis (cumsum, cummax, cummin, cumprod,
cumlogsumexp, either direction) in blocks of 16 elements: an axis of at most 16 is one fused
reduce-window and needs nothing more; a longer one is padded to a multiple of 16 and its blocks
scanned, the blocks' totals scanned and added back. Measured (`lax.cummax` of f32[L, 64], either
axis, the temporaries over the result's bytes): 0 for L <= 16; 3.77, 3.2, 2.67, 2.06 for L = 17,
20, 24, 31 (two padded arrays, 2 x 32 rows); 1.09, 1.08, 1.07, 1.07 for L = 32, 48, 128, 512
(the scan and its totals, 1 + 1/16 + ...). Fuzz seed 23 #51: `lax.cummin` over 32 rows held
4.3 KB of temporaries for a 2 KB result.

A cumulative op whose result stays cut along its axis (m of the axis's n elements per device)
is no blocked scan: XLA all-gathers the operand (`replicate_buffers.py` counts that buffer) and
each device slices from it a window of n - 1 + m elements (the m it keeps and the n - 1 before
them, zero-padded), which one reduce-window of size n scans. Measured (`jnp.cumsum` and
`lax.cummax` of f32[L, 64] cut 8 ways on the axis, in and out): temporaries 16.5, 16.67, 16.75,
16.875 local results for L = 16, 24, 32, 64, the gathered L rows and the window's L - 1 + L/8
exactly. One element per device (m = 1) needs no window: the reduce-window then has one output
along the axis, a reduce, and its fusion reads the gathered operand at the device's offset
(measured: L = 8, the gathered 8 rows and nothing more; fuzz seed 17 #905). Fuzz seed 17 #935 (`cumlogsumexp` of f32[16, 4, 8, 3] on 8 devices): the gather's
6,144 bytes and the window's f32[17, 4, 8, 3] (6,528) side by side.

**Select-and-scatter.** XLA:CPU expands select-and-scatter (TPU and GPU emit it as one kernel): it rewrites
each one (the gradient of a max-pool) into a variadic reduce-window that finds, per window, the
winner's value and its index along every dim of the operand (one s32 iota as large as the operand
per dim, all read at once), a concatenation of those indices into `s32[windows, rank]`, and a
scatter of the cotangent (copied into `f32[windows, 1, ..., 1]`) at them. The scheduler puts the
operand-less iotas at the start of the step and the reduce-window right after the pooled
activation is made, in the forward pass, so the concatenated indices stay live until the
backward scatter. Measured in XLA's buffer assignment (the zoo `convnet`, tiny, replicated:
temporaries 5.8 MB where the model counted 2.2): 4 x s32[16, 16, 16, 32] + 4 x s32[16, 8, 8, 64]
iotas (3 MiB) live together from the first op, the reduce-window's five pooled outputs, and the
s32[32768, 4] + s32[16384, 4] indices held across the backward pass.

**Batched gathers and scatters.** `take_along_axis` and `top_k`'s gradient gather and scatter
with batching dims (`operand_batching_dims`): the index array holds one word per element for the
gathered axis, the batch position implied. XLA:CPU's batched gather/scatter normalizer rewrites
each such op into a plain one whose indices spell the batch position out: an iota per batching
dim concatenated with the indices, `s32[..., n_batch + k]` where the indices were
`s32[..., k]`, written into a buffer right before the op; a gather's loop fuses that
concatenation unless a scatter reads the same indices (the two share it before fusion, and the
scatter cannot fuse it: measured on both). Fuzz seed 14 #1038 (measured in
XLA's buffer assignment): `take_along_axis` over 3 batching dims, `s32[2, 12, 1, 6, 4]` for the
forward gather and `s32[144, 4]` for its gradient's scatter; `top_k`'s gradient scatter
`s32[384, 4]` (6 KiB of a 28 KiB temporary block where the model had 18 KiB).

**Library reductions.** XLA:CPU hands a float sum, max or min of 4096 elements or more per
device to its kernel library (`__ynn_fusion` custom fusions in the compiled HLO), which takes in
the elementwise ops feeding the reduction alone and reads the rest from memory: values that
loop fusions recompute everywhere else (a LayerNorm's centred input, its normalized value) are
stored for it, from their producer to the last such reduction (`library_reduction_inputs`).
A reduction to a scalar also takes in the broadcasts and reshapes feeding it alone: it sums
every element, so XLA reduces the reshape's operand and the call broadcasts its small operand
itself (measured: `sum(exp(x) + b)`, `sum(exp(x) * c[:, None])`, `sum((exp(x) - b).reshape(-1))`
on x[64, 128], no temporary; fuzz seed 17 #675, Adam on `einsum('abcd,az->bcdz')`: the loss's
`sum(v + w)` and `sum(log_softmax(v).reshape(-1))` read `v`, `w[16]` and `log(sum)[32, 2, 16]`
straight into their `__ynn_fusion` calls, where the model stored two 32 KiB copies, 1.81 of
XLA's bytes).

**Dot products.** XLA's algebraic simplifier rewrites a dot whose operands both have, unit
dims aside, only batch and contracted dims (a vector dot product `einsum('a,a->')`, a batched
one `einsum('ab,ab->b')`, `x[2] @ w[2, 1]`) into a multiply and a reduce (dot strength
reduction; XLA:CPU leaves every dot with a free dim a dot: measured, `x[2] @ w[2, 8]` and
`w[16, 16] @ x[16]` stay dots, `x[64] @ w[64, 1]` is a `reduce` fusion). That reduce fuses the
elementwise ops making its operands, and its one elementwise reader fuses it, as any reduction:
the values the model stores only because the dot reads them, or only as the dot's result, are
not stored (`dot_product_fused`; the test and the rewrite are `cost.dot_products`', which the
flops view shares: there the dot's operands' cheap producers are computed in each fusion). Fuzz seed 16 #1367: `v = checkpoint(sin(x) * tanh(x))` read
by `v @ w` with x [2], w [2, 8]: data parallelism splitting w's free dim 8 ways leaves
`x[2] @ w[2, 1]` on each device, one `reduce_bitcast_fusion` reading x and w in XLA's buffer
assignment, no temporaries, where the model stored v (64 bytes; 1.64 of XLA's 100). Only
subtractive: a program whose sums would store a value the model fuses (an expensive one that a
fused reader, now duplicated into several loops, no longer hides: seed 16 #33's `tanh(x) * w`
read by three fusions) keeps the model's view.
As for other fused reductions, a contracted length over 32 elements (and under 4,096 on a
device) is a tree reduction whose product XLA stores (`tree_reduced_operands`).

**Reciprocals.** XLA's simplifier turns a division by a divisor spread over the result (`m /
c1` with c1 a scalar, Adam's bias correction) into a multiply by `1 / c1`, and its loop fusion
never fuses an expensive producer (a division, a power) into a consumer that reads each of its
elements many times, as the broadcast of `1 / c1` does: the reciprocal is a fusion of its own,
`subtract_divide_fusion = f32[]` computing `1 / (1 - 0.9 ** count)`, stored until the
multiply. The model fuses the divisor into the update; the CPU view adds a buffer of the
divisor's (spread source's) size from its producer to the last division by it, when the model
stores none (`reciprocal_buffers`; the divisor stored already, a softmax's sums, holds its
place). Fuzz seed 16 #679 (Adam, data parallel on 2x3): two such scalars in XLA's buffer
assignment, one in the temporary block (its 68 bytes: the all-reduced partial and the
reciprocal), one in an output's allocation; the model counted no temporary (0.69 of XLA's
bytes). The target view leaves them out: 4 bytes per divisor on a device.

**Reused expensive values.** XLA:CPU's fusion never fuses an expensive producer (an exp, a
log, a division by a non-constant, a special function) into a consumer that reads each of its
elements several times (a broadcast of it, an outer product, a multiply broadcasting it): the
value is a fusion of its own, stored, where the model fuses it away; a special function XLA
expands stores each of its expensive parts instead (erfc 3, digamma 4, polygamma 13 buffers of
its size: `EXPENSIVE_PARTS`). Fuzz seed 18 #459 (SGD through `digamma(v * v + 1)` of a [2]
vector, 2x3): the gradient's polygamma read by the outer product making the weight gradient,
15 f32[2] fusions in XLA's block, 0.22 of XLA's bytes before (`reused_expensive_buffers`).
The parts are stored as well when several fusions read the function's value (stored in the
model, or the value its fusion computes): XLA duplicates the cheap root over the parts into
each of them and never an expensive part. Not when a dot reads the value in its canonical
operand form (it must be stored as it is: XLA's `do_not_duplicate`), a vector operand being
reshaped in a fusion of its own. Fuzz seed 19 #178, `digamma(x * x + 1)` of f32[4] read by a
matmul, a min and an outer product: the 4 parts and the matmul's operand in XLA's block, the
model's one buffer 0.32 of XLA's bytes (`shared_expansion_parts`).

**Loop state.** XLA:CPU runs a `while` (a scan, a `fori_loop`) on a state tuple in the
temporary block: the tuple's pointer table and the trip counter, each a buffer of up to 64
bytes at an aligned offset, and the loop condition's one-byte predicate, live while the loop
runs (`loop_state_buffers`; fuzz seed 16 #856, `fori_loop(0, 3, f, x)`: 129 bytes of
temporaries, the 16-byte table and the counter at offsets 0 and 64, the predicate at 128; the
predicate's byte is left out). A `cond` runs on tuples as well: the branches' operand tuple
and the result tuple (which the branch roots' tuples share), each a pointer table, and the s32
branch index made before it, three small buffers live through the conditional
(`cond_state_buffers`; fuzz seed 19 #1522: 136 bytes of temporaries, the index at offset 0 and
the two tables at 64 and 128).

**Top-k.** XLA:CPU runs `lax.top_k` as its `TopK` custom call, which writes the values and
the indices, each into a buffer of its own, and a tuple of the two (a pointer table, a small
buffer): a result the program never reads is written all the same (`top_k_buffers`; fuzz seed
16 #656, a routing that reads only the indices of `top_k(softmax(x), 2)`: `custom-call{0}`
f32[2], `{1}` s32[2] and the 16-byte tuple in XLA's 272-byte temporary block, where the model
had the indices alone; 0.55 of XLA's bytes). A `top_k` that keeps its whole dim (k == the dim's
size) is no `TopK` call: XLA expands it into a sort, of the values alone when nothing reads the
indices, which writes one buffer, the values, and no tuple (measured: `lax.top_k(x, 2)[0]` of
x f32[16, 8, 2] and its reshape: XLA's buffers are the parameter, the sort's f32[16, 8, 2], the
reshape's copy and the outputs' 16-byte tuple, 3,088 bytes, where the model added the unread
s32 indices and a tuple, 4,176; fuzz seed 17 #867, 1.83 of XLA's bytes). When the indices are
read it sorts (values, iota): both results and a tuple, as the call writes them
(`top_k_sorts.py`, which also drops the unread indices from the values the model stores).

**Arg reductions.** XLA lowers an argmax or argmin to a variadic reduce of (value, iota), a
multi-output fusion writing a tuple: no reader fuses it, and they take the index through a
get-tuple-element, where the model fuses the index into its readers (`take_along_axis`'s
gather). The index and the tuple's 16-byte table are buffers of the temporary block; the
values nothing reads went outside it in both measured programs (`arg_reduction_buffers`; fuzz
seed 19 #71, `take_along_axis(v, argmax(v))` of the row sums `v` f32[4, 6] on 2x4: the sums,
`iota_reduce_fusion{1}` s32[1] and the table at offsets 0, 64, 128, the max value in the
output's allocation; 0.59 of XLA's bytes before, #252 0.38).

**Constant arrays.** XLA:CPU's scheduler puts the fusions that read no input (a broadcast of a
constant, an iota) at the start of the step, so a stored one lives from there to its last
reader, not from where the program makes it: the zeros a gradient's scatter-add starts from
(`zeros.at[i].add(g)`), live through the forward pass beside the activations (measured: a
`top_k` gradient's f32[32, 64] zeros at offset 0 of the block, live with the product `top_k`
reads; fuzz seed 14 #1038: three such broadcasts and an iota at the start of the schedule).
"""

from __future__ import annotations

import numpy as np

from toast_core.cost.cpu_tree_reduce import CPU_REDUCE_WINDOW, CPU_TREE_MAX_ELEMENTS
from toast_core.cost.dot_products import as_sums
from toast_core.cost.flops import spread_divisor_elements
from toast_core.cost.flops_measured import top_k_stays_a_sort
from toast_core.cost.fusion import (
    FUSIBLE,
    _feeds_max_and_exp_shift,
    _in_loop_fusion,
    conv_read_order,
    fused_away,
    fusible,
    materialized,
)
from toast_core.cost.reshaped_dots import canonical_dot_dims
from toast_core.cost.simplify import constant_values, uniform_dims, without_dead_ops
from toast_core.cost.top_k_sorts import keeps_whole_dim, sorts_values_alone
from toast_core.ir import primitives as prim
from toast_core.ir.program import Program

#: Word arrays the CPU's rolled threefry loop holds, each as large as the bits (module essay),
#: and the hoisted counters it adds inside a loop body.
THREEFRY_WORD_BUFFERS = 4
THREEFRY_HOISTED_COUNTERS = 2
#: The loop's other state, in buffers of up to 64 bytes: the state tuple's table, the s32 trip
#: counter and its increment, the loop's compare, and copy insertion's copies of the key and
#: rotation elements (three u32 scalars, two u32[4]) with the body's updates of them. Measured
#: (`memory_analysis()` of a lone `bernoulli` mask of f32[n], XLA:CPU): temporaries of
#: 3 x 4n + 772 bytes for n = 8 ... 1024 (three word arrays live at once and twelve small
#: buffers, the topmost unpadded), and a lone key fold-in or split 964 (the same twelve and three
#: words of 4 bytes). Counted as five, fuzz seed 61 #26 (a tiny dropout) was 0.55 of XLA's bytes.
THREEFRY_STATE_BUFFERS = 12
#: The word arrays of a key split or fold-in live at once (measured: three, as for the bits).
THREEFRY_KEY_WORD_BUFFERS = 3
_THREEFRY_KEY_OPS = frozenset({"random_split", "random_fold_in"})


def cpu_buffers(
    prog: Program,
    is_materialized: list[bool],
    local_shape=None,
    remat: bool = False,
    value_shape=None,
) -> tuple[np.ndarray, ...]:
    """Every extra temporary of the CPU view as (value, first op, last op, bytes per byte of the
    value's local size, count of such buffers, count of small state buffers): the layout copies
    (`dot_operand_copies`, `conv_operand_copies`), the threefry loops (`threefry_buffers`),
    the select-and-scatter expansions (`select_and_scatter_buffers`) and the other rules of the
    module essay, one function each. `local_shape(op, pos)`:
    an operand use's shape on one device, for the dots (their copies depend on it);
    `value_shape(value)`: a value's, for the cumulative ops (a cut axis is scanned in a window)."""
    copies = dot_operand_copies(prog, is_materialized, local_shape)
    rows = [(v, lo, hi, 1.0, 1, 0) for v, lo, hi in zip(*copies)]
    rows += threefry_buffers(prog)
    rows += select_and_scatter_buffers(prog)
    rows += cumulative_buffers(prog, value_shape)
    rows += conv_operand_copies(prog, is_materialized)
    rows += batched_index_buffers(prog)
    rows += hoisted_constant_buffers(prog, is_materialized)
    rows += library_reduction_inputs(prog, is_materialized, local_shape, hoisted=not remat)
    rows += tree_reduced_operands(prog, is_materialized, local_shape)
    rows += broadcasts_per_layout(prog, is_materialized, local_shape)
    rows += reciprocal_buffers(prog, is_materialized)
    reused = reused_expensive_buffers(prog, is_materialized, value_shape)
    rows += reused
    reused_values = {row[0] for row in reused}
    shared = shared_expansion_parts(prog, is_materialized, value_shape)
    rows += [row for row in shared if row[0] not in reused_values]
    rows += loop_state_buffers(prog)
    rows += cond_state_buffers(prog)
    rows += top_k_buffers(prog)
    rows += arg_reduction_buffers(prog, is_materialized)
    a = np.array(rows, dtype=np.float64).reshape(-1, 6)
    ints = a[:, [0, 1, 2, 4, 5]].astype(np.int64)
    return ints[:, 0], ints[:, 1], ints[:, 2], a[:, 3], ints[:, 3], ints[:, 4]


def threefry_buffers(prog: Program) -> list[tuple]:
    """(value, op, op, scale, word buffers, state buffers) per rolled threefry loop: random bits
    hash one 32-bit word per element of each counter word array (`scale`: word bytes per byte of
    the bits), a `threefry2x32` its two results' words, a key split or fold-in two words."""
    rows = []
    for op in prog.ops:
        if op.primitive == "random_bits":
            v = prog.values[op.results[0]]
            scale = 4.0 / max(1, v.nbytes // max(1, v.size))
            words = THREEFRY_WORD_BUFFERS + (THREEFRY_HOISTED_COUNTERS if op.trip_count > 1 else 0)
            rows.append((v.id, op.index, op.index, scale, words, THREEFRY_STATE_BUFFERS))
        elif op.primitive == "threefry2x32":
            words = THREEFRY_WORD_BUFFERS  # its two results are the carried words
            rows.append((op.results[0], op.index, op.index, 1.0, words, THREEFRY_STATE_BUFFERS))
        elif op.primitive in _THREEFRY_KEY_OPS:
            small = THREEFRY_STATE_BUFFERS + THREEFRY_KEY_WORD_BUFFERS  # words of 64 bytes at most
            rows.append((op.results[0], op.index, op.index, 0.0, 0, small))
    return rows


#: XLA:CPU scans a cumulative op's axis in blocks of this many elements (module essay).
CUMULATIVE_BLOCK = 16


def cumulative_buffers(prog: Program, value_shape=None) -> list[tuple]:
    """(value, op, op, scale, 1, 0) of the temporaries of each cumulative op (cumsum, cummax,
    cummin, cumprod, cumlogsumexp): `scale` bytes per byte of its result, at the op (module
    essay): the window of a result cut along its axis (`value_shape(value)`: its shape on one
    device; default: the global shape), else the blocked scan of an axis longer than a block."""
    rows = []
    for op in prog.ops:
        if op.primitive not in prim.CUMULATIVE:
            continue
        axis = op.param("axis")
        n = prog.values[op.results[0]].shape[axis]
        m = n if value_shape is None else value_shape(op.results[0])[axis]
        if m == 1 and n > 1:  # a reduce reading the gathered operand in place
            continue
        if m < n:  # the n - 1 + m elements a device's reduce-window scans
            rows.append((op.results[0], op.index, op.index, (n - 1 + m) / m, 1, 0))
            continue
        if n <= CUMULATIVE_BLOCK:
            continue
        padded = -(-n // CUMULATIVE_BLOCK) * CUMULATIVE_BLOCK
        if padded == n:  # the blocks' scans, and the scan of their totals (1/16 as large)
            scale = CUMULATIVE_BLOCK / (CUMULATIVE_BLOCK - 1)
        else:  # the padded operand and the padded scan
            scale = 2.0 * padded / n
        rows.append((op.results[0], op.index, op.index, scale, 1, 0))
    return rows


def select_and_scatter_buffers(prog: Program) -> list[tuple]:
    """(value, first op, last op, scale, count, 0) of the buffers XLA:CPU's expansion of each
    `select_and_scatter_add` holds (module essay): per dim of the operand an s32 iota as large
    as it, from the step's start to the reduce-window (right after the operand is made); the
    window indices (a word per window and dim), from there to the scatter; the reduce-window's
    own pooled outputs at it (the value and the per-dim indices it concatenates); the copy of
    the cotangent the scatter reads."""
    producers = prog.producers()
    rows = []
    for op in prog.ops:
        if op.primitive != "select_and_scatter_add":
            continue
        source, operand = op.operands[0], op.operands[1]
        rank = len(prog.values[operand].shape)
        window = producers[operand]
        window = 0 if window is None else window
        words_op = 4.0 / _itemsize(prog.values[operand])
        words_src = 4.0 / _itemsize(prog.values[source])
        rows.append((operand, 0, window, words_op, rank, 0))  # the iotas
        rows.append((source, window, op.index, words_src, rank, 0))  # the indices, concatenated
        rows.append((source, window, window, words_src, rank, 0))  # the reduce-window's indices
        rows.append((source, window, window, 1.0, 1, 0))  # and its value
        rows.append((source, op.index, op.index, 1.0, 1, 0))  # the scattered cotangent's copy
    return rows


def batched_index_buffers(prog: Program) -> list[tuple]:
    """(indices, op, op, scale, 1, 0) per scatter with batching dims, and per such gather whose
    indices a batched scatter reads too: the explicit indices XLA:CPU's normalizer
    concatenates at the op, `scale` = (batching dims + index vector size) / index vector size
    words per word of the indices (module essay). A gather whose indices only gathers read
    fuses the concatenation into its loop (a cheap producer read only by gathers:
    `fusion._fused_into_gathers`; measured: `take_along_axis(x, i, axis=1)` has no index
    buffer)."""
    uses = prog.uses()
    rows = []
    for op in prog.ops:
        n_batch = _batching_dims(op)
        if not n_batch or len(op.operands) < 2:
            continue
        indices = prog.values[op.operands[1]]
        if op.primitive == "gather" and not any(
            prog.ops[o].primitive.startswith("scatter") and _batching_dims(prog.ops[o])
            for o, _ in uses[indices.id]
        ):
            continue
        k = indices.shape[-1] if indices.shape else 1
        rows.append((indices.id, op.index, op.index, (n_batch + k) / max(k, 1), 1, 0))
    return rows


def hoisted_constant_buffers(prog: Program, is_materialized: list[bool]) -> list[tuple]:
    """(value, 0, op before its producer, 1, 1, 0) per stored value computed from constants
    alone (its producer reads only literals, constants or such values) that only scatters
    update: the time before its producer that XLA:CPU's schedule holds it for (module essay);
    the timeline counts the rest. Only the scatters' starting arrays, as measured: a constant
    cotangent a weight-gradient dot reads is not held from the start (fuzz seed 14 #26, an
    f32[8, 8, 3, 32] of 1/N: 2.21 of XLA's bytes counted so, 1.52 without), though the
    `jnp.ones` a dot reads in tests/test_cpu_buffers.py is (1 KiB, left out)."""
    fused = fused_away(prog, is_materialized)
    const = [v.role in ("literal", "constant") for v in prog.values]
    producers = prog.producers()
    rows = []
    for op in prog.ops:
        if not all(const[x] for x in op.operands):
            continue
        for r in op.results:
            const[r] = True
            if op.index > 0 and is_materialized[r] and not fused[r] and producers[r] is not None:
                readers = prog.uses()[r]
                if (
                    not prog.values[r].is_output
                    and readers
                    and all(
                        prog.ops[o].primitive.startswith("scatter") and k == 0 for o, k in readers
                    )
                ):
                    rows.append((r, 0, op.index - 1, 1.0, 1, 0))
    return rows


#: Float reductions XLA:CPU hands to its kernel library (a `__ynn_fusion` custom fusion) once
#: their operand holds this many elements on a device; smaller ones stay loop fusions.
LIBRARY_REDUCE_MIN_ELEMENTS = 4096
LIBRARY_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})


def is_library_reduction(prog: Program, op, elements: int) -> bool:
    """Whether XLA:CPU hands reduction `op`, whose operand has `elements` elements (on a device,
    or the program's), to its kernel library: a float sum, max or min of at least
    `LIBRARY_REDUCE_MIN_ELEMENTS` (a `__ynn_fusion` call no producer fuses into)."""
    return (
        op.primitive in LIBRARY_REDUCTIONS
        and bool(op.operands)
        and prog.values[op.operands[0]].dtype.startswith(("float", "bfloat"))
        and elements >= LIBRARY_REDUCE_MIN_ELEMENTS
    )


def library_reduction_inputs(
    prog: Program, is_materialized: list[bool], local_shape=None, hoisted: bool = True
) -> list[tuple]:
    """(value, producer, reduction, 1, 1, 0) per value XLA:CPU stores for a reduction it hands
    to its kernel library, where the cost model fuses it away (`fusion.fused_away`: a cheap
    value XLA duplicates into every loop fusion reading it).

    XLA:CPU runs a float sum, max or min whose operand has at least
    `LIBRARY_REDUCE_MIN_ELEMENTS` elements on a device as a library call (`__ynn_fusion` in the
    compiled HLO), which takes in only the elementwise ops that feed the reduction alone (a
    variance's `square`, a weight gradient's `dy * xhat`); what those read is an input of the
    call, written to memory by the loop fusion that makes it, and held until the last such call.
    Measured on the zoo GPT (tiny, megatron on 2x4, `memory_analysis()` and the live ranges at
    the peak): each LayerNorm's centred `x - mean` [8, 32, 64] is stored for its variance and
    held into the backward pass for its `sum(dy * (x - mean))`, and its normalized value for the
    scale's gradient, while the loop fusions reading them recompute them; 0.74 of XLA's bytes
    were predicted without these buffers. The BatchNorm MLP under megatron reduces [32, 64] per
    device: loop fusions, nothing stored (1.49 of XLA's bytes when it was counted).
    `local_shape(op, pos)`: an operand use's shape on one device (default: global). `hoisted`:
    broadcasts made for a call live from their source's making (XLA:CPU's schedule without
    remat), else at the call only (with remat's barriers). A reduction along dims its operand
    is uniform on (`simplify.uniform_dims`) reduces a broadcast, which XLA's simplifier rewrites
    as a multiply of its core: no call (fuzz seed 19 #2277, the gradient of
    `sigmoid(broadcast(v)**2)` summed over the broadcast's 16: no 32 KiB input in XLA's
    buffers)."""
    if local_shape is None:

        def local_shape(op: int, pos: int) -> tuple:
            return prog.values[prog.ops[op].operands[pos]].shape

    fused = fused_away(prog, is_materialized)
    uses = prog.uses()
    producers = prog.producers()
    uni = uniform_dims(prog)
    last: dict[tuple[int, int], int] = {}
    for op in prog.ops:
        if not op.operands or not is_library_reduction(
            prog, op, int(np.prod(local_shape(op.index, 0)))
        ):
            continue
        if set(op.param("axes", ())) <= uni[op.operands[0]]:
            continue  # a sum along broadcast dims only: XLA's simplifier makes it a multiply
        operand = prog.values[op.operands[0]]
        whole = prog.values[op.results[0]].size == 1  # a reduction to a scalar
        inputs = library_call_inputs(prog, op.operands[0], uses, producers, whole)
        if all(v != sized or _is_spread(prog, v, producers) for v, sized in inputs):
            continue  # a reduction of broadcasts: XLA reduces their sources (`_is_spread`)
        for v, sized in inputs:
            if v != sized or (fused[v] and prog.values[v].size >= operand.size):
                last[v, sized] = max(last.get((v, sized), -1), op.index)
    rows = []
    for (v, sized), t in last.items():
        first = producers[v]
        if v != sized:  # a broadcast made for the call: hoisted to its source, or at the call
            rows.append((sized, (0 if first is None else first) if hoisted else t, t, 1.0, 1, 0))
        elif first is not None:  # an input or parameter is stored already
            rows.append((v, first, t, 1.0, 1, 0))
    return rows


def _is_spread(prog: Program, v: int, producers) -> bool:
    """Whether `v` is a broadcast of a smaller value. A reduction whose operand only combines
    such broadcasts elementwise is no library call: XLA's simplifier moves the reduction onto
    their sources and broadcasts the result. Fuzz seed 17 #869 (`fori_loop` accumulating the
    gradient of `einsum(...)[..., None] * x4`, 2x3): `sum(broadcast(c) * broadcast(x[32]))`
    over [2, 16, 8, 32] compiles to `multiply_reduce_fusion = f32[]` on x and a broadcast of
    it, no temporary of the broadcast's size; the model stored two 16 KiB inputs (19.6x XLA's
    1,760 bytes)."""
    p = producers[v]
    if p is None or prog.ops[p].primitive != "broadcast_in_dim":
        return False
    return prog.values[prog.ops[p].operands[0]].size < prog.values[v].size


#: What a library reduction to a scalar takes in besides elementwise ops (module essay).
_TAKEN_IN_WHOLE = frozenset({"broadcast_in_dim", "reshape"})


def library_call_inputs(
    prog: Program, x: int, uses, producers, whole: bool = False
) -> list[tuple[int, int]]:
    """(value, value whose size its buffer has) per input a library reduction of `x` reads:
    `x` itself, or, through the elementwise ops that make it and feed nothing else, their
    operands; an operand smaller than its reader's result (a `[1, D]` scale read by `[N, D]`)
    is broadcast into a buffer of the reader's size (measured: the Flax MLP's LayerNorm scale
    and `rsqrt(var)` broadcast to [1024, 256] for its gradients' library reductions; XLA's
    scheduler made them as soon as their sources exist, 8 MB of its peak, without remat, and
    next to the recomputation under `dots`: `library_reduction_inputs`' `hoisted`). `whole`:
    the reduction sums every element, so the call also takes in the broadcasts and reshapes
    feeding it alone, and broadcasts its small operands itself (module essay)."""
    out, stack, seen = [], [x], set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        p = producers[v]
        alone = p is not None and len(uses[v]) == 1 and prog.values[v].size > 1
        if alone and whole and prog.ops[p].primitive in _TAKEN_IN_WHOLE:
            stack.extend(prog.ops[p].operands[:1])
        elif alone and prog.ops[p].primitive in prim.ELEMENTWISE:
            for o in prog.ops[p].operands:
                if whole and prog.values[o].size < prog.values[v].size:
                    stack.append(o)  # broadcast inside the call
                elif 1 < prog.values[o].size < prog.values[v].size:
                    out.append((o, v))
                else:
                    stack.append(o)
        else:
            out.append((v, v))
    return out


def tree_reduced_operands(prog: Program, is_materialized: list[bool], local_shape=None) -> list:
    """(operand, op, op, bytes per byte of the operand, 1, 0) per reduction whose operand a
    fusion computes in registers (`fused_away`) and that XLA:CPU's tree reduction splits (a
    reduced dim longer than 32 and under 4,096 elements on a device: `cpu_tree_reduce`): the
    reduce-window it becomes takes no fused producer, so the operand is stored, then the
    windows' partial results (module essay). Measured on `sum(tanh(x) * 2 + x)` (temporaries):
    x[128, 4] 2,064 bytes, x[2000] 8,252, x[64, 63] over dim 0 16,632; x[32, 32] and x[64, 64]
    (no dim over 32, or 4,096 elements: one fused reduce) none. Fuzz seed 15 #53: the outer
    product `x[2, 64, 1] @ w[1, 4]` under a mean, 2 KiB XLA stores and the model fused away.
    `local_shape(op, pos)`: an operand use's shape on one device (default: the global one)."""
    fused = fused_away(prog, is_materialized)
    producers = prog.producers()
    rows = []
    for op in prog.ops:
        if op.primitive not in prim.FUSED_REDUCTIONS or not op.operands:
            continue
        x = op.operands[0]
        if not fused[x]:
            continue
        shape = prog.values[x].shape if local_shape is None else local_shape(op.index, 0)
        size = int(np.prod(shape, dtype=np.int64))
        axes = tuple(op.param("axes") or ())
        reduced = [shape[d] for d in axes]
        if len(set(axes)) == len(shape):  # all of it: of the value a reshape made it from
            src = _reshape_source(prog, x, producers, fused)
            if src is not None:  # that value's own dims, or its dot's canonical ones
                v, reader = src
                here = prog.values[v].shape if local_shape is None else local_shape(reader, 0)
                reduced = canonical_dot_dims(prog, v, here, producers, fused) or list(
                    prog.values[v].shape
                )
            else:
                reduced = canonical_dot_dims(prog, x, shape, producers, fused) or reduced
        if (
            not size
            or size >= CPU_TREE_MAX_ELEMENTS
            or all(n <= CPU_REDUCE_WINDOW for n in reduced)
        ):
            continue
        windows = size // max(1, int(np.prod(reduced, dtype=np.int64)))
        for n in reduced:
            windows *= -(-n // CPU_REDUCE_WINDOW)
        windows = max(windows, 1)
        rows.append((x, op.index, op.index, 1.0, 1, 0))
        rows.append((x, op.index, op.index, windows / size, 1, 0))
    return rows


def _reshape_source(prog: Program, x: int, producers, fused) -> tuple[int, int] | None:
    """(value, the reshape reading it) that a fused chain of reshapes made `x` from (None: not
    a reshape): a reduction over all of `x` reduces that value's dims instead (XLA's simplifier
    folds the reshape into the reduce: fuzz seed 15 #17, the mean of `v.reshape(-1)` with v
    [12, 3, 8] is one fused reduce, no dim over 32), and a dot's canonical ones when a dot
    makes that value (`canonical_dot_dims`: fuzz seed 19 #689, the mean of `(x[1, 24, 6] @
    w[1, 4]).reshape(24, 6, 2, 2)` reduces the outer product f32[144, 4] XLA writes, a tree
    reduction whose 2,304-byte operand is stored; the model had [24, 6, 4], no dim over 32)."""
    src = None
    while fused[x] and producers[x] is not None:
        op = prog.ops[producers[x]]
        if op.primitive not in ("reshape", "squeeze", "expand_dims") or op.param("dimensions"):
            break
        src = (op.operands[0], op.index)
        x = op.operands[0]
    return src


def reciprocal_buffers(prog: Program, is_materialized: list[bool]) -> list[tuple]:
    """(divisor, its producer, last op of the last division's fusion, 1, 1, 0) per value that
    divisions spread over their results (`flops.spread_divisor_elements`) divide by, when the
    model fuses it away and it is no constant: XLA stores its reciprocal (module essay)."""
    fused = fused_away(prog, is_materialized)
    const = constant_values(prog)
    producers = prog.producers()
    uses = prog.uses()
    last: dict[int, int] = {}
    for op in prog.ops:
        if op.primitive != "div" or len(op.operands) != 2 or not op.results:
            continue
        if not prog.values[op.results[0]].dtype.startswith(("float", "bfloat")):
            continue
        if not spread_divisor_elements(op, prog):
            continue
        d = op.operands[1]
        while producers[d] is not None and prog.ops[producers[d]].primitive == "broadcast_in_dim":
            d = prog.ops[producers[d]].operands[0]
        if fused[d] and not const[d] and producers[d] is not None:
            last[d] = max(last.get(d, -1), _fused_until(prog, op.results[0], fused, uses))
    return [(d, producers[d], hi, 1.0, 1, 0) for d, hi in last.items()]


#: Buffers of its result's size XLA:CPU stores for an expensive elementwise op that a fusion
#: reusing its elements reads (`reused_expensive_buffers`): 1 (the op's own fusion) but for the
#: special functions it expands into several expensive parts under a cheap root, each a fusion
#: of its own then. Measured (`f(x * 0.5 + 1)[:, :, None] * w[4]` on x f32[64, 24] and [32, 16],
#: XLA:CPU's buffer assignment: the temporaries of f's size).
EXPENSIVE_PARTS = {
    "acosh": 2,
    "asinh": 2,
    "atanh": 2,
    "bessel_i0e": 2,
    "bessel_i1e": 2,
    "cosh": 2,
    "digamma": 4,
    "erf_inv": 2,
    "erfc": 3,
    "lgamma": 4,
    "polygamma": 13,
    "sinh": 4,
    "zeta": 12,
}
#: Elementwise ops XLA's fusion takes as expensive (never duplicated, never fused into a
#: consumer that reuses their elements).
_EXPENSIVE = (
    (prim.TRANSCENDENTAL - prim.DUPLICATED_TRANSCENDENTAL) | prim.EXPANDED_TRANSCENDENTAL | {"div"}
)
#: Fusible ops that read some operand's elements more than once when their result is larger
#: (elementwise ops broadcast an operand of unit dims implicitly).
_REUSING = prim.ELEMENTWISE | {"broadcast_in_dim", "dot_general", "tile"}


def reused_expensive_buffers(
    prog: Program, is_materialized: list[bool], value_shape=None
) -> list[tuple]:
    """(value, its producer, last op of its readers' fusion, 1, parts, 0) per value of an
    expensive elementwise op (`_EXPENSIVE`: exp, log, a division, a special function) that the
    model fuses away into a fusion reusing its elements: a broadcast of it or of a value the
    fusion computes from it, or an outer product reading it, writes more elements than it
    reads. XLA:CPU's fusion never fuses an expensive producer into a consumer that reuses its
    operand's elements (it would recompute it per reuse): the value is a fusion of its own,
    stored; an expanded special function stores each of its expensive parts
    (`EXPENSIVE_PARTS`). Measured: `exp(x * 0.5 + 1)[:, :, None] * w` with x [64, 24] and w
    [4] stores exp's 6 KiB, where the model had no temporary (0.83 of XLA's bytes); digamma's
    gradient on a [2] vector read by the outer product of its weight gradient (fuzz seed 18
    #459, 2x3): XLA's block holds 15 such f32[2] fusions (13 of polygamma, two divisions of a
    sqrt's gradient), 0.22 of XLA's bytes before. A spread divisor's reciprocal is
    `reciprocal_buffers`'. `value_shape(value)`: a value's shape on one device (default: the
    global one): an outer product whose other side is one element there reuses nothing."""
    if value_shape is None:

        def value_shape(v: int) -> tuple:
            return prog.values[v].shape

    fused = fused_away(prog, is_materialized)
    producers = prog.producers()
    uses = prog.uses()
    reciprocals = {d for d, *_ in reciprocal_buffers(prog, is_materialized)}
    const = constant_values(prog)
    rows = []
    for op in prog.ops:
        if op.primitive not in _EXPENSIVE or len(op.results) != 1:
            continue
        if op.primitive == "div" and const[op.operands[-1]]:
            continue  # a multiply by the constant's reciprocal once XLA's simplifier is done
        (v,) = op.results
        if not fused[v] or v in reciprocals:
            continue
        if int(np.prod(value_shape(v))) < 2 or not prog.values[v].dtype.startswith(
            ("float", "bfloat")
        ):
            continue  # one element: simplified with its reader (exp(x - x) over one) or kept
        if any(_reduced_for(prog, x, producers, uses) for x in op.operands):
            continue  # the reduction's stored result is its: `reduce_log_fusion` (log_softmax)
        if _reused_in_fusion(prog, v, fused, uses, reciprocals, value_shape):
            parts = EXPENSIVE_PARTS.get(op.primitive, 1)
            rows.append((v, producers[v], _fused_until(prog, v, fused, uses), 1.0, parts, 0))
    return rows


def _reduced_for(prog: Program, x: int, producers, uses) -> bool:
    """Whether `x` is a reduction's result (through reshapes and keepdims broadcasts of its
    size) read by one op alone: XLA fuses that op into the reduction's fusion, whose stored
    result is then the op's, where the model stores the reduction's."""
    while len(uses[x]) == 1 and producers[x] is not None:
        op = prog.ops[producers[x]]
        if op.primitive in prim.FUSED_REDUCTIONS:
            return True
        if op.primitive not in _KEEPDIMS or prog.values[op.operands[0]].size != prog.values[x].size:
            return False
        x = op.operands[0]
    return False


_KEEPDIMS = frozenset({"broadcast_in_dim", "reshape", "expand_dims", "squeeze"})


def _reused_in_fusion(prog: Program, v: int, fused: list[bool], uses, stored, value_shape) -> bool:
    """Whether the fusion computing fused-away `v` reads its elements more than once: an op
    of `_REUSING` writing more elements than the operand it reads from `v` (or from a value
    the fusion computes from `v`) has (`y[:, :, None] * w`: a multiply of [64, 24, 1] by
    [1, 1, 4]). `stored`: values XLA stores all the same (a spread divisor's reciprocal: the
    fusion computing it reads `v` once per element)."""
    todo, seen = [v], set()
    while todo:
        x = todo.pop()
        if x in seen or x in stored:
            continue
        seen.add(x)
        for o, _ in uses[x]:
            reader = prog.ops[o]
            if reader.primitive in _REUSING and any(
                np.prod(value_shape(r)) > np.prod(value_shape(x)) for r in reader.results
            ):
                if reader.primitive != "dot_general" or fusible(reader, prog):
                    return True
            if reader.primitive not in prim.FUSED_REDUCTIONS | prim.ARG_REDUCTIONS:
                todo.extend(r for r in reader.results if fused[r])  # a reduction reads it once
    return False


def _fused_until(prog: Program, v: int, fused: list[bool], uses) -> int:
    """The last op whose fusion computes `v`: its producer when stored, else (fused away into
    its readers) the last such op of its readers' results. The reciprocal lives until there:
    Adam's bias corrections until the update that the divisions fuse into (measured: XLA's
    two reciprocals side by side in the block, `test_cpu_reciprocal_buffers.py`)."""
    start = prog.producers()[v] or 0
    return max(
        [start] + [o for x in _fused_reach(prog, v, fused, uses) if fused[x] for o, _ in uses[x]]
    )


def shared_expansion_parts(
    prog: Program, is_materialized: list[bool], value_shape=None
) -> list[tuple]:
    """(value, its producer, last reader, 1, buffers, 0) per expanded special function
    (`EXPENSIVE_PARTS` > 1) whose stored value (its own, or the one its fusion computes) several
    fusions read: XLA expands it into expensive parts under a cheap root, duplicates the cheap
    root (and a cheap chain over it) into each reading fusion, and, an expensive op being never
    duplicated, stores each part as a fusion of its own, read by all of them. The model stores
    the value once: XLA holds the parts besides it while a reader that is no loop (a dot) or an
    output still needs it, else the parts instead of it. Fuzz seed 19 #178 (`digamma(x * x +
    1)` of f32[4] read by a matmul, a min and an outer product): XLA's block holds
    `sine_divide_fusion`, two `add_divide_fusion`s, `multiply_log-plus-one_fusion` and the
    matmul's `select_bitcast_fusion`, five f32[4] (the model: one, 0.32 of XLA's bytes); #146
    (polygamma in digamma's gradient, read by a matmul and the outer product making a weight's
    gradient): 13 f32[2] parts besides the stored gradient. A value fused into a loop that
    reuses its elements is `reused_expensive_buffers`'. `value_shape(value)`: a value's shape
    on one device (default: the global one): one element there is simplified with its readers
    (#1852, digamma of f32[8] on 8 devices read by a log_softmax: no part in XLA's block). A
    softmax's scores are computed once, never duplicated (`fusion._feeds_max_and_exp_shift`):
    the measured masked scores. Nor a library reduction's input (`_library_reduced`)."""
    if value_shape is None:

        def value_shape(v: int) -> tuple:
            return prog.values[v].shape

    prog, _ = without_dead_ops(prog)  # a discarded loss reading it is no fusion (#114)
    fused = fused_away(prog, is_materialized)
    producers = prog.producers()
    uses = prog.uses()
    rows = []
    for op in prog.ops:
        parts = EXPENSIVE_PARTS.get(op.primitive, 1)
        if parts < 2 or len(op.results) != 1:
            continue
        (v,) = op.results
        if int(np.prod(value_shape(v))) < 2 or not prog.values[v].dtype.startswith(
            ("float", "bfloat")
        ):
            continue
        stored = _stored_roots(prog, v, fused, uses)
        if len(stored) != 1:
            continue
        (s,) = stored
        readers = _readers_through_bitcasts(prog, s, uses)
        fusions = {_fusion_of(prog, o, fused, uses) for o, _ in readers}
        if len(fusions) < 2 or any(_dot_reads_as_is(prog, o, x, value_shape) for o, x in readers):
            continue  # one fusion computes it, or a dot reads it as it is
        if producers[s] is not None and _feeds_max_and_exp_shift(prog, prog.ops[producers[s]]):
            continue  # a softmax's scores: XLA:CPU never duplicates them
        if any(_library_reduced(prog, o, fused, uses, value_shape) for o, _ in readers):
            continue  # an input of a library call, stored as it is (#39)
        held = not all(_reads_in_loop(prog, prog.ops[o]) for o, _ in readers)
        held = held or prog.values[s].is_output or s in prog.outputs
        rows.append((v, producers[v], max(o for o, _ in readers), 1.0, parts - (not held), 0))
    return rows


def _library_reduced(prog: Program, o: int, fused: list[bool], uses, value_shape) -> bool:
    """Whether op `o` or a fused reader down from it is a library reduction
    (`is_library_reduction`), whose call reads a value other fusions read too from memory
    (`library_reduction_inputs`): XLA stores the value, its parts inside, and never
    duplicates it. Fuzz seed 19 #39: erfc of f32[4, 4, 8, 32] read by the GELU's mean (a
    `__ynn_fusion`) and its gradient: `select_select_fusion.1`, its value, in XLA's block."""
    reached = {o} | {
        k
        for r in prog.ops[o].results
        for x in _fused_reach(prog, r, fused, uses)
        if fused[x]
        for k, _ in uses[x]
    }
    return any(
        prog.ops[k].operands
        and is_library_reduction(
            prog, prog.ops[k], int(np.prod(value_shape(prog.ops[k].operands[0])))
        )
        for k in reached
    )


def _fusion_of(prog: Program, o: int, fused: list[bool], uses) -> frozenset:
    """The fusion op `o` is in, as the stored values it writes: readers fused into one loop
    share it (fuzz seed 19 #114's GELU: erfc read by the forward product and the backward
    derivative, both in the gradient's one fusion, no part in XLA's block)."""
    out = set()
    for r in prog.ops[o].results:
        out |= _stored_roots(prog, r, fused, uses) if fused[r] else {r}
    return frozenset(out) or frozenset({-1 - o})


def _reads_in_loop(prog: Program, op) -> bool:
    """Whether XLA computes `op` in a loop fusion that recomputes its operands' cheap ops,
    needing no buffer of them: a fusible op, a gather or a scatter of one window
    (`fusion._in_loop_fusion`), a dot product (a fused reduction on XLA:CPU, `dot_products`).
    Fuzz seed 19 #354: erfc of f32[8] read by a dot product, a gather and a one-index
    scatter-add: XLA stores its 3 parts alone."""
    if fusible(op, prog) or _in_loop_fusion(op, prog):
        return True
    if op.primitive != "dot_general":
        return False
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    sides = zip(op.operands[:2], (lc, rc), (lb, rb))
    return all(len(prog.values[x].shape) == len(c) + len(b) for x, c, b in sides)


def _dot_reads_as_is(prog: Program, o: int, x: int, value_shape) -> bool:
    """Whether op `o` is a dot reading `x` in its canonical operand form (`reshaped_dots`
    essay: the batch dims, one free dim and one contracting dim in that order, the rhs's
    contracting before its free, no unit dim), so that XLA needs `x` stored as it is and never
    duplicates the cheap ops making it (instruction fusion's `do_not_duplicate`: a producer
    not fusible into all its consumers): `digamma(x)` of f32[16, 8] read by `@ w[8, 4]` and a
    min is one f32[16, 8] fusion in XLA's block, its parts inside. Any other reader reads it
    through a loop (a vector's reshape, a transpose, a conv's or a scatter's operand copy, a
    gather) into which XLA duplicates them."""
    op = prog.ops[o]
    if op.primitive != "dot_general" or x not in op.operands[:2] or fusible(op, prog):
        return False
    pos = op.operands.index(x)
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    contract, batch = (tuple(lc), tuple(lb)) if pos == 0 else (tuple(rc), tuple(rb))
    shape = value_shape(x)
    free = tuple(d for d in range(len(shape)) if d not in contract and d not in batch)
    order = batch + (free + contract if pos == 0 else contract + free)
    return (
        len(free) == 1
        and len(contract) == 1
        and 1 not in shape
        and order == tuple(range(len(shape)))
    )


def _stored_roots(prog: Program, v: int, fused: list[bool], uses) -> set[int]:
    """The stored values the fusion computing `v` writes: `v` when stored, else the first
    stored results down its fused readers."""
    return {x for x in _fused_reach(prog, v, fused, uses) if not fused[x]}


def _fused_reach(prog: Program, v: int, fused: list[bool], uses):
    """`v` and the values its fusion reaches: the results of the readers of each fused value
    (a stored one ends its path)."""
    todo, seen = [v], set()
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        yield x
        if fused[x]:
            todo.extend(r for o, _ in uses[x] for r in prog.ops[o].results)


def _readers_through_bitcasts(prog: Program, v: int, uses) -> set[tuple[int, int]]:
    """(op, the value it reads) of the ops reading `v`, a reshape of it (a bitcast in XLA, no
    op) standing for its readers."""
    out = set()
    for o, _ in uses[v]:
        op = prog.ops[o]
        if op.primitive in ("reshape", "squeeze", "expand_dims") and len(op.results) == 1:
            out |= _readers_through_bitcasts(prog, op.results[0], uses) or {(o, v)}
        else:
            out.add((o, v))
    return out


#: Buffers of up to 64 bytes a loop's state holds on XLA:CPU: the tuple's table, the counter.
LOOP_STATE_BUFFERS = 2
_LOOP_STARTS = {prim.SCAN_START: prim.SCAN_END, prim.WHILE_START: prim.WHILE_END}


def loop_state_buffers(prog: Program) -> list[tuple]:
    """(value, loop start, loop end, 0, 0, LOOP_STATE_BUFFERS) per scan or while loop: its state
    tuple's small buffers (module essay), live from the loop's start to its end."""
    rows, open_at = [], []
    for op in prog.ops:
        if op.primitive in _LOOP_STARTS:
            open_at.append(op)
        elif open_at and op.primitive == _LOOP_STARTS[open_at[-1].primitive]:
            start = open_at.pop()
            v = (start.operands or start.results or op.results or (None,))[0]
            if v is not None:
                rows.append((v, start.index, op.index, 0.0, 0, LOOP_STATE_BUFFERS))
    return rows


#: Buffers of up to 64 bytes a `cond` holds on XLA:CPU: the operand tuple's table, the
#: result tuple's table and the s32 branch index.
COND_STATE_BUFFERS = 3


def cond_state_buffers(prog: Program) -> list[tuple]:
    """(value, first branch's start, cond end, 0, 0, COND_STATE_BUFFERS) per `cond`: XLA runs a
    `conditional` on tuples (the branches' operands in one tuple, which every branch reads, and
    the result a tuple the branch roots' tuples share), each a pointer table in the temporary
    block, and reads the s32 branch index the program computes before it (the model's buffer
    of it ends where it is made). Measured (fuzz seed 19 #1522, `cond(sum(x) > 0, 2 * t, tanh,
    x)` replicated on 2x2x2): XLA's 136-byte block is `compare_convert_fusion` s32[] at 0, the
    result tuple's table at 64 and the operand tuple's at 128; the model had the index alone."""
    rows, open_at = [], []
    for op in prog.ops:
        if op.primitive == prim.COND_START and op.param("branch", 0) == 0:
            open_at.append(op)
        elif op.primitive == prim.COND_END and open_at:
            start = open_at.pop()
            v = (start.operands or start.results or op.results or (None,))[0]
            if v is not None:
                rows.append((v, start.index, op.index, 0.0, 0, COND_STATE_BUFFERS))
    return rows


def top_k_buffers(prog: Program) -> list[tuple]:
    """(result, op, op, 1, 1, 0) per result of a `top_k` that nothing reads, and (first result,
    op, op, 0, 0, 1) per `top_k` for its tuple's table; none for a `top_k` that keeps its whole
    dim and whose indices nothing reads, a sort of the values alone (module essay)."""
    uses = prog.uses()
    outputs = set(prog.outputs)
    rows = []
    for op in prog.ops:
        if op.primitive != "top_k" or not op.results:
            continue
        if sorts_values_alone(prog, op):
            continue
        if not keeps_whole_dim(prog, op) and top_k_stays_a_sort(op, prog):
            rows += _partial_sort_buffers(prog, op, uses, outputs)
            continue
        rows += [(r, op.index, op.index, 1.0, 1, 0) for r in op.results if not uses[r]]
        rows.append((op.results[0], op.index, op.index, 0.0, 0, 1))
    return rows


def arg_reduction_buffers(prog: Program, is_materialized: list[bool]) -> list[tuple]:
    """(index, op, last op of its readers' fusions, 1, 1, 0) per argmax / argmin whose index
    the model fuses away, and (index, op, op, 0, 0, 1) per one for its tuple's table (module
    essay): XLA lowers it to a variadic reduce of (value, iota), a multi-output fusion whose
    tuple no reader fuses; the readers take the index through a get-tuple-element. The max
    values are written too, outside the block where measured (an output's allocation, one of
    their own), and left out. An arg reduction over dims of size 1 is a constant
    (`simplify.constant_values`) and writes nothing."""
    fused = fused_away(prog, is_materialized)
    uses = prog.uses()
    const = constant_values(prog)
    rows = []
    for op in prog.ops:
        if op.primitive not in prim.ARG_REDUCTIONS or len(op.results) != 1:
            continue
        (r,) = op.results
        if const[r] or not uses[r]:
            continue
        if fused[r]:
            rows.append((r, op.index, _fused_until(prog, r, fused, uses), 1.0, 1, 0))
        rows.append((r, op.index, op.index, 0.0, 0, 1))
    return rows


def _partial_sort_buffers(prog: Program, op, uses, outputs) -> list[tuple]:
    """The rows of a `top_k` XLA:CPU leaves a whole sort (`flops_measured.top_k_stays_a_sort`):
    the sort writes every element of the dim, n where the program's results hold k, and the
    readers slice the k they read from it; of the values alone (no tuple) when nothing reads
    the indices. A read result's buffer grows by n / k - 1 of itself over its life (the
    model's); an unread one read beside it is written whole at the op. Fuzz seed 18 #256
    (`top_k(x, 2)[0][:, :, :-1]` of x f32[3, 3, 8, 8], 2x4): XLA's block holds the sort's
    f32[3, 3, 8, 8] (2,304 bytes), no indices, no tuple; the model had the k-wide values, the
    unread indices and a tuple (0.77 of XLA's bytes)."""
    shape = prog.values[op.operands[0]].shape
    axis = op.param("axis", len(shape) - 1) % len(shape)
    scale = shape[axis] / max(1, op.param("k", 1))
    read = [bool(uses[r]) or r in outputs for r in op.results]
    rows = []
    for r, is_read in zip(op.results, read):
        if is_read:
            last = max((o for o, _ in uses[r]), default=op.index)
            rows.append((r, op.index, last, scale - 1.0, 1, 0))
        elif any(read[1:]):  # values unread beside read indices: sorted as a pair
            rows.append((r, op.index, op.index, scale, 1, 0))
    if any(read[1:]):
        rows.append((op.results[0], op.index, op.index, 0.0, 0, 1))  # the pair's tuple
    return rows


def dot_product_fused(prog: Program, stored: list[bool], local_shape=None) -> list[int]:
    """The values the model stores (`stored` [values]: not `fusion.fused_away`) that XLA:CPU
    does not, its dot products being fused reductions (module essay): those `fused_away` finds
    once each dot product is the sum it becomes (a fusible reduction of its operands, kept once
    like one). `local_shape(op, pos)`: an operand use's shape on one device (default: the
    global one)."""
    summed = as_sums(prog, local_shape)
    if summed is prog:
        return []
    fused = fused_away(summed, materialized(summed))
    uses = summed.uses()
    if any(not s and not f and uses[v] for v, (s, f) in enumerate(zip(stored, fused))):
        # the sums store a value the model fuses (an expensive one its fused reader, now
        # duplicated into several loops, no longer hides): left to the model's view
        return []

    return [v for v, (s, f) in enumerate(zip(stored, fused)) if s and f]


def _batching_dims(op) -> int:
    """How many batching dims a gather or scatter has (0 for any other op)."""
    if op.primitive != "gather" and not op.primitive.startswith("scatter"):
        return 0
    return len(dict(op.param("dimension_numbers") or ()).get("operand_batching_dims", ()))


def conv_operand_copies(prog: Program, is_materialized: list[bool]) -> list[tuple]:
    """(value, first op, last op, 1, 1, 0) of each transposed copy XLA:CPU makes of a
    convolution operand not in its canonical dim order (module essay), one per value and order,
    over the ops where XLA holds both the copy and the operand."""
    uses = prog.uses()
    producers = prog.producers()
    outputs = set(prog.outputs)
    wants: dict[tuple, list[int]] = {}
    for op in prog.ops:
        if op.primitive != "conv_general_dilated":
            continue
        for pos, x in enumerate(op.operands[:2]):
            order = conv_read_order(op, pos)
            shape = prog.values[x].shape
            wide = tuple(d for d in order if shape[d] != 1)
            if wide != tuple(d for d in range(len(shape)) if shape[d] != 1) and is_materialized[x]:
                wants.setdefault((x, wide), []).append(op.index)
    rows = []
    for (x, _), ops in wants.items():
        if _written_in_place(prog, x, ops, uses, producers, outputs):
            continue
        made = producers[x]
        if made is None or x in outputs:  # the value itself lives throughout: both are held
            rows.append((x, 0 if made is None else made, max(ops), 1.0, 1, 0))
            continue
        # the model holds the value to its last reader; XLA holds it to its last reader but
        # these convs (which read the copy) and the copy to the last of them: both at once
        # from the copy's making to whichever ends first
        others = [o for o, _ in uses[x] if o not in ops]
        rows.append((x, made, min(max(ops), max(others, default=made)), 1.0, 1, 0))
    return rows


def _itemsize(v) -> int:
    return max(1, v.nbytes // max(1, v.size))


def _grouping(shape, batch, contracted, side: int | None = None) -> tuple | None:
    """The regrouping a dot needs of one operand: None when its row-major order (unit dims
    left out) already suits XLA:CPU, else (batch, frozenset({free, contracted})): the copy's
    layout, so that two dots wanting the same grouping share one copy.

    An operand with at most one free and one contracted dim (a matrix) is read in either
    order, after its batch dims: the dot folds the transpose. One with more (a free or a
    contracted group to flatten) is read as a matrix only in the canonical order, `batch...,
    free..., contracted...` as the left side (`side` 0) and `batch..., contracted...,
    free...` as the right (1); otherwise XLA's dot decomposer transposes it into a copy.
    Measured (`lax.dot_general` of f32 operands, compiled HLO): a left side [4, 8, 12]
    contracted over dim 0 is copied, [8, 12, 4] over dim 2 and [4, 96] over dim 0 are not; as
    a right side [4, 8, 12] over dim 0 is not, [8, 12, 4] over dim 2 is (fuzz seed 14 #132:
    `einsum('abc,az->bcz')` copied x f32[4, 8, 32] into [256, 4]). Unit dims count there (a
    left side [1, 16, 12] contracted over dim 1 is copied into [12, 16]: seed 23 #16, data
    parallel splitting dim 0 down to 1) but not in the order. `side` None: either side (the
    grouping alone)."""
    wide = [d for d in range(len(shape)) if shape[d] != 1]
    b = tuple(d for d in batch if shape[d] != 1)
    c = tuple(d for d in contracted if shape[d] != 1)
    free = tuple(d for d in wide if d not in batch and d not in contracted)
    rest = tuple(wide[len(b) :])
    # matrix or not counts unit dims too: the decomposer flattens [1, 16, 12] (seed 23 #16)
    n_free = len(shape) - len(batch) - len(contracted)
    if side is None or (n_free <= 1 and len(contracted) <= 1):
        allowed = (free + c, c + free)
    else:
        allowed = ((free + c),) if side == 0 else ((c + free),)
    if tuple(wide[: len(b)]) == b and rest in allowed:
        return None
    return b, frozenset({free, c})


def dot_operand_copies(
    prog: Program, is_materialized: list[bool], local_shape=None
) -> tuple[np.ndarray, ...]:
    """(value, first op, last op) of each layout copy XLA:CPU makes for dot operands (module
    essay): one per operand value and grouping, live from the first dot reading it that way to
    the last.

    `local_shape(op, pos)`: the operand's shape on one device (default: its global shape). The
    per-device dot is what XLA:CPU compiles: a dim sharded down to 1 is a unit dim there, and a
    dot whose contracted dims are all 1 on a device is an outer product, which XLA's algebraic
    simplifier rewrites into a multiply (fuzz seed 14 #1267: `einsum('ab,ab->b')` with `a`
    split 4 ways is `multiply_bitcast_fusion` then the all-reduce, no copy)."""
    if local_shape is None:

        def local_shape(op: int, pos: int) -> tuple:
            return prog.values[prog.ops[op].operands[pos]].shape

    uses = prog.uses()
    producers = prog.producers()
    outputs = set(prog.outputs)
    remade = set(dot_broadcasts(prog, is_materialized))  # `broadcasts_per_layout` has them
    wants: dict[tuple, list[int]] = {}
    for op in prog.ops:
        if op.primitive != "dot_general":
            continue
        (lc, rc), (lb, rb) = op.param("dimension_numbers")
        shapes = (local_shape(op.index, 0), local_shape(op.index, 1))
        if not lc or all(shapes[0][d] == 1 for d in lc):
            continue  # an outer product: an elementwise multiply
        for side, (x, shape, batch, contracted) in enumerate(
            ((op.operands[0], shapes[0], lb, lc), (op.operands[1], shapes[1], rb, rc))
        ):
            g = _grouping(shape, batch, contracted, side)
            if g is not None and is_materialized[x] and x not in remade:
                wants.setdefault((x, g), []).append(op.index)
    rows = []
    for (x, _), ops in wants.items():
        if _written_in_place(prog, x, ops, uses, producers, outputs):
            continue
        rows.append((x, min(ops), max(ops)))
    out = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return out[:, 0], out[:, 1], out[:, 2]


def dot_broadcasts(prog: Program, is_materialized: list[bool]) -> list[int]:
    """The stored broadcasts (`broadcast_in_dim` results, not outputs) inside a loop body that
    only contracting dots read: XLA:CPU makes one per layout its dots read it in
    (`broadcasts_per_layout`), so the value's own buffer is not in the CPU view
    (`buffers.allocated_memory`). Outside loops XLA's scheduler makes such broadcasts (a mean's
    seed) at the step's start and holds them, as the value and its layout copy do (measured:
    the gradients of `mean(x[2, 16, 8, 8] @ w[8, 32])`, two 32 KiB broadcasts held together,
    84 KB in all; 51 KB counted per layout); inside one, the dot that reads the seed and the
    weights alone is loop-invariant and hoisted out of it (fuzz seed 15 #86)."""
    uses = prog.uses()
    producers = prog.producers()
    outputs = set(prog.outputs)
    out = []
    for v in prog.values:
        p = producers[v.id]
        if p is None or v.id in outputs or not is_materialized[v.id]:
            continue
        if prog.ops[p].primitive != "broadcast_in_dim" or not uses[v.id]:
            continue
        if prog.ops[p].region_depth == 0:
            continue
        if all(
            prog.ops[o].primitive == "dot_general" and not fusible(prog.ops[o], prog)
            for o, _ in uses[v.id]
        ):
            out.append(v.id)
    return out


def broadcasts_per_layout(prog: Program, is_materialized: list[bool], local_shape=None) -> list:
    """(broadcast, first dot, last dot, 1, 1, 0) per layout in which dots read a broadcast of
    `dot_broadcasts`: layout assignment gives a dot wanting another order a transposed copy of
    the broadcast, which XLA's simplifier turns into a broadcast in that order, made right
    before its dots; a dot that is an outer product on a device (nothing contracted there of
    size > 1) is a multiply, which fuses the broadcast. Fuzz seed 15 #86: a mean's seed
    broadcast to f32[2, 16, 8, 32] read by the weight-gradient dot as [32, 256] and by the
    input-gradient dot as [256, 32]: two 32 KiB broadcasts in XLA's buffer assignment, at the
    same offset (one after the other), where the model held the broadcast across both dots and
    a 32 KiB copy beside it (1.63 of XLA's bytes; 0.98 so). Each lives from its first dot to its
    last, as the program orders them; XLA's scheduler may move a dot that reads only inputs
    and a constant broadcast to the step's start, and with it the broadcast (seed 14 #26: the
    first layer's weight gradient; seed 15 #2 holds two such broadcasts from the start, 0.61
    of XLA's bytes before this rule, 0.42 with it): the model keeps the program's order.
    Holding constant broadcasts from the start fixed #2 (0.79) and broke #26 (2.13, 1.43
    without), whose dot moved with its broadcast."""
    if local_shape is None:

        def local_shape(op: int, pos: int) -> tuple:
            return prog.values[prog.ops[op].operands[pos]].shape

    rows = []
    uses = prog.uses()
    for x in dot_broadcasts(prog, is_materialized):
        layouts: dict[object, list[int]] = {}
        for o, pos in uses[x]:
            op = prog.ops[o]
            (lc, rc), (lb, rb) = op.param("dimension_numbers")
            shapes = (local_shape(o, 0), local_shape(o, 1))
            if not lc or all(shapes[0][d] == 1 for d in lc):
                continue  # a multiply on this device: the broadcast fuses into it
            batch, contracted = (lb, lc) if pos == 0 else (rb, rc)
            layouts.setdefault(_grouping(shapes[pos], batch, contracted, pos), []).append(o)
        rows += [(x, min(ops), max(ops), 1.0, 1, 0) for ops in layouts.values()]
    return rows


def _written_in_place(prog: Program, x: int, ops: list[int], uses, producers, outputs) -> bool:
    """Whether a loop fusion making `x` can write it in the order these dots want: a fusible
    producer, or a scan's per-iteration slice of its stacked input (`_is_scan_slice`), and no
    reader but them (not an output)."""
    p = producers[x]
    if p is None or x in outputs:
        return False
    if prog.ops[p].primitive not in FUSIBLE and not _is_scan_slice(prog.ops[p], x):
        return False
    return all(o in ops for o, _ in uses[x])


def _is_scan_slice(op, x: int) -> bool:
    """Whether `x` is one iteration's slice of a scan's stacked input (`xs`), a `scan_start`
    result after its constants and carries. XLA slices it with a `dynamic-slice` that fuses
    into the copy a dot wants of it: one buffer, the copy, in the dot's layout. Fuzz seed 17
    #1155 (`lax.scan` over x1 [2, 4, 8, 32] read by a dot, 8 devices): XLA's block holds
    `copy_bitcast_fusion = f32[256, 4]` (4,096 bytes) and no slice; the model held the slice
    and a copy of it (1.30x XLA's bytes)."""
    if op.primitive != prim.SCAN_START:
        return False
    params = dict(op.params)
    n = int(params.get("num_consts", 0)) + int(params.get("num_carry", 0))
    return x in op.results[n:]
