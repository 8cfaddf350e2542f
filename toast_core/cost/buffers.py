"""Memory as XLA's buffer assignment allocates it: the step's outputs in allocations of their own.

The evaluator's timeline (`Evaluator._memory`) counts a value from its producer to its last
reader, and an output from its producer to the end of the step. XLA's buffer assignment does
not pack outputs with the temporaries: every entry output (not aliased to a donated input) gets
an allocation of its own, reserved for the whole step, and `memory_analysis()` reports them
apart (`output_size_in_bytes`); the temporaries share one block (`temp_size_in_bytes`) sized by
the heap simulator, the peak of their live bytes. A temporary may still borrow an output's
allocation before the output is made: buffers are assigned biggest first (outputs first among
equals), and a temporary that fits in an existing allocation whose occupants are never live at
the same time takes it instead of a place in the block (`BufferAssigner::AssignSingleHloBuffer`,
`MaybeAssignBuffer`: no live-range interference, size at most the allocation's).

So the step's memory is `inputs + outputs + max over ops of the temporaries not placed in an
output's allocation`: above the timeline's peak when remat (or a small step) leaves the output
allocations idle at the peak - the Flax MLP with `dots` remat (batch 8192, data=8) holds its
2.6 MB of new parameters and optimizer state all step, beside a 10.5 MB block of activations -
and equal to it when activations of the outputs' sizes fill them. A temporary's last op may
write its reader's result over it (XLA shares an operand's buffer with an elementwise user's:
the update `w - lr * g` is written over g), so a gradient read only by its update fits the
new weight's allocation.

On XLA:CPU (`allocated_memory(cpu=True)`, what `validate` compares) an all-reduce also writes
a new buffer, issued once the last member of its combined op is ready: a data-parallel step's
partial gradients wait in the new weights' allocations, the reduced copies in the block. And its
scheduler runs first every instruction reading only parameters and constants: the block holds
at least that first wave's temporaries at once (`first_wave`), in whatever order the program
has them (a step's constant cotangent broadcast beside its forward product).

Worked example: an SGD step whose outputs are the new `w` [D, F] and the loss: w's allocation
is reserved from the start; the forward's activations [B, F] are bigger than w when B > D, so
they go to the block; the weight gradient [D, F], made in the backward and dead once the update
has read it, fits w's allocation until the update writes w: it is placed there.
"""

from __future__ import annotations

import numpy as np

from toast_core.cost.collectives import COLLECTIVE_KINDS
from toast_core.cost.cpu_buffers import cpu_buffers, dot_product_fused
from toast_core.cost.fusion import fusible, sums_of_broadcasts
from toast_core.cost.replicate_buffers import replicate_gather_buffers
from toast_core.cost.reshaped_dots import reshaped_dot_results
from toast_core.cost.simplify import uniform_dims
from toast_core.ir import primitives as prim
from toast_core.strategy.remat import RematEffect, remat_effect
from toast_core.strategy.space import space_of

ALL_REDUCE = COLLECTIVE_KINDS.index("all-reduce")


def buffer_intervals(
    ev,
    value_local,
    masks,
    remat: RematEffect | None,
    pairs,
    align_bytes: int,
    reduced_at=None,
    partials: list | None = None,
    values: list | None = None,
):
    """(bytes, first op, end op (exclusive), is output) of every buffer of the evaluator's
    timeline: summed over the ops each covers, they give `Evaluator._memory`'s timeline
    exactly (tests/test_buffers.py). A residual that remat drops is two buffers (the forward
    copy and the recomputed one); a value whose life remat extends or shortens is one.

    `reduced_at` {value: op}: partial sums all-reduced into a new buffer at that op (XLA:CPU's
    all-reduce is not in place): the partial lives until then, the reduced copy from then on
    (both at that op), as `all_reduce_issue_ops` finds them. An output's reduced copy is the
    output's allocation (from that op on) and its partial a temporary until then. A value
    fusion removed (`fusion.fused_away`: a logsumexp's max and sum, a loss's mean, computed in
    their reader's loop) is two buffers all the same: the all-reduce is an instruction of its
    own, which no fusion crosses, so the reduction's fusion writes the partial (until the
    all-reduce) and the all-reduce its reduced copy, read by the fusions of its readers
    (`_fused_all_reduced`). Measured in XLA:CPU's buffer assignment (fuzz seed 19 #1546,
    `logsumexp(x[4, 2, 1, 16], axis=0)` data parallel on 2x4, dim 0 cut 4 ways): the max's
    partial and reduced copy, then the sum's, each f32[2, 1, 16], a 256-byte block beside the
    128-byte output (512 bytes in all; the model had one fusion and no temporary: 256); #811
    (dp_megatron on 2x4, a logsumexp over a cut dim) 0.50 -> 1.00 of XLA's bytes; #0 (an SGD
    step, data parallel on 8) 0.58 -> 0.97; #2310, #1527, #2237, #2437 (means and sums, data
    parallel) 0.64-0.67 -> 0.92-0.97. `partials`, a list: receives a bool per returned buffer,
    true for an all-reduced partial (the all-reduce writes its result elsewhere, so no reader
    writes over it). `values`, a list: receives the value of each returned buffer that is a
    value's own (-1 for the others)."""
    n = ev.n_ops
    b = value_local[ev.live_ids]
    if align_bytes:
        b = np.where(ev._live_is_output, b, round_up(b, align_bytes))
    size, start, end = b.astype(np.float64), ev.born.copy(), ev.dies.copy()
    is_out = ev._live_is_output.copy()
    extra_size, extra_start, extra_end = [], [], []
    partial_rows: list[int] = []
    row = np.full(len(value_local), -1, dtype=np.int64)  # value -> its buffer's index
    row[ev.live_ids] = np.arange(len(ev.live_ids))
    if remat is not None:
        if len(remat.values):
            vals, new, _ = ev._remat_liveness(remat)
            end[row[vals]] = new + 1
        for v, lo, hi in zip(
            remat.extend_values.tolist(), remat.extend_from.tolist(), remat.extend_to.tolist()
        ):
            k = row[v]
            if ev._is_fused[v]:  # held for the barrier (`remat.hold_barrier_inputs`)
                whole = value_local[v]
                whole = round_up(whole, align_bytes) if align_bytes else whole
                extra_size.append(whole)
                extra_start.append(ev._producer[v])
                extra_end.append(hi)
            elif k >= 0 and lo <= end[k]:
                end[k] = max(end[k], hi)
            elif k >= 0:
                extra_size.append(size[k])
                extra_start.append(lo)
                extra_end.append(hi)
        gap = remat.bwd_start > remat.fwd_end + 1
        for v, fwd_end, bwd_start in zip(
            remat.values[gap].tolist(), remat.fwd_end[gap].tolist(), remat.bwd_start[gap].tolist()
        ):
            k = row[v]
            if k < 0:
                continue  # fused away: no buffer
            extra_size.append(size[k])
            extra_start.append(bwd_start)
            extra_end.append(end[k])
            end[k] = fwd_end + 1
    cut = _fused_all_reduced(ev, reduced_at or {})
    for v, t in (reduced_at or {}).items():
        k = row[v]
        if k < 0:
            if v in cut:  # fusion removed it: the all-reduce cuts the fusion
                whole = round_up(value_local[v], align_bytes) if align_bytes else value_local[v]
                partial_rows.append(len(size) + len(extra_size))
                extra_size += [whole, whole]
                extra_start += [int(ev._producer[v]), t]
                extra_end += [t + 1, max(cut[v], t + 1)]
            continue
        if is_out[k]:
            # The output's allocation receives the reduced copy; the partial is a temporary
            # (`partials` says which buffers an all-reduce reads: its result never shares them).
            partial_rows.append(len(size) + len(extra_size))
            extra_size.append(size[k])
            extra_start.append(start[k])
            extra_end.append(t + 1)
            start[k] = min(max(start[k], t), end[k] - 1)
            continue
        partial_rows.append(k)
        extra_size.append(size[k])
        extra_start.append(t)
        extra_end.append(max(end[k], t + 1))
        end[k] = t + 1
    r = ev._reshards(masks)
    if len(r.value):
        rb = value_local[r.value] * r.buffer
        if align_bytes:
            rb = round_up(rb, align_bytes)
        lo, hi = r.lo.copy(), r.hi + 1
        if pairs:
            split = ev._remat_block_ops(pairs)[r.lo] & (r.fwd_hi >= 0)
            split &= r.bwd_lo > r.fwd_hi + 1
            extra_size += rb[split].tolist()
            extra_start += r.bwd_lo[split].tolist()
            extra_end += hi[split].tolist()
            hi = np.where(split, r.fwd_hi + 1, hi)
        extra_size += rb.tolist()
        extra_start += lo.tolist()
        extra_end += hi.tolist()
    size = np.concatenate([size, np.asarray(extra_size, dtype=np.float64)])
    start = np.concatenate([start, np.asarray(extra_start, dtype=np.int64)])
    end = np.minimum(np.concatenate([end, np.asarray(extra_end, dtype=np.int64)]), n)
    is_out = np.concatenate([is_out, np.zeros(len(extra_size), dtype=bool)])
    keep = (end > start) & (size > 0)
    if values is not None:
        own = np.full(len(size), -1, dtype=np.int64)
        own[: len(ev.live_ids)] = ev.live_ids
        values.extend(own[keep].tolist())
    if partials is not None:
        is_partial = np.zeros(len(size), dtype=bool)
        is_partial[partial_rows] = True
        partials.extend(is_partial[keep].tolist())
    return size[keep], start[keep], end[keep], is_out[keep]


def _fused_all_reduced(ev, reduced_at) -> dict[int, int]:
    """{value: end op (exclusive) of its reduced copy} for each all-reduced value fusion
    removed (`buffer_intervals`): the copy is read by the fusions of the ops reading it,
    directly or through the fused values made from it, up to the next all-reduced value, whose
    reduction's fusion is the last to read the ones before (`var`: the mean's reduced copy is
    read by the fusion writing the squares' partial sum, not by the division after its
    all-reduce). When that reading fusion's all-reduce is issued at its own op, the copy is
    dead before it: the fusion reads it, then the all-reduce reads the partial and writes its
    copy, two buffers at a time, not three (fuzz seed 19 #1546, logsumexp: the max's copy, the
    sum's partial, then the sum's partial and copy; XLA's block 256 bytes). A sum over dims
    its operand is broadcast along (`fusion.sums_of_broadcasts`) is none: XLA's simplifier
    folds it into a multiply before the partitioner runs, which so makes no all-reduce (fuzz
    seed 19 #970, an SGD step data parallel on 8: the bias gradient, the sum of the mean's
    constant cotangent, computed whole on each device, 1.05 -> 1.56 of XLA's bytes without
    this; the model's all-reduce of it is a collective miss of its own). Nor is a scalar (a
    step's loss before its division): measured, XLA's block holds no partial or copy of it
    (tests/test_cpu_small_tuples.py, an SGD step on 8 devices, 308 bytes = XLA's, 416 with
    them; tests/test_memory_whole_bytes.py on 2x3, 548 = XLA's, 728 with them)."""
    prog = ev._mem_prog
    fused = ev._is_fused
    mine = {
        v
        for v in reduced_at
        if v < len(fused) and fused[v] and ev._producer[v] >= 0 and prog.values[v].size > 1
    }
    if mine:  # a sum of a broadcast XLA folds into a multiply before partitioning: no all-reduce
        folded = sums_of_broadcasts(prog)
        mine = {v for v in mine if not folded[int(ev._producer[v])]}
    if not mine:
        return {}
    cuts = {int(ev._producer[v]) for v in mine if reduced_at[v] == ev._producer[v]}
    last = [-1] * len(prog.values)
    for op in prog.ops:
        for x in op.operands:
            last[x] = max(last[x], op.index)
    for op in reversed(prog.ops):
        ends = [last[r] for r in op.results if fused[r] and r not in mine]
        if ends:
            for x in op.operands:
                last[x] = max(last[x], max(ends))
    return {v: last[v] if last[v] in cuts else last[v] + 1 for v in mine}


def all_reduce_issue_ops(ev, masks, value_local) -> dict[int, int]:
    """{value: op} for every value a sharded reduction leaves partial and an all-reduce sums,
    at the op where XLA:CPU issues it: its combiner merges the all-reduces of one combined op
    (`Evaluator._groups`, as the CPU combines) and issues them once the last is ready, so every
    partial of a data-parallel step's gradients waits for the last one."""
    out: dict[int, int] = {}
    for v, t, _ in _cpu_all_reduces(ev, masks, value_local):
        out[v] = max(out.get(v, -1), t)
    return out


def combined_all_reduce_ops(ev, masks, value_local) -> list[int]:
    """The op where XLA:CPU issues each all-reduce its combiner made of two or more values
    (`all_reduce_issue_ops`). Such an all-reduce returns a tuple of its results, whose table
    of 8-byte pointers is a buffer of the temporary block beside them while its
    get-tuple-elements read it (measured in XLA:CPU's buffer assignment: fuzz seed 19 #337,
    dp_megatron on 2x2x2, `all-reduce.3{}` (f32[2], f32[]) a 16-byte table at offset 192 of
    a 208-byte block; #389 and #565, data parallel, 24 and 16 bytes; the model had none)."""
    members: dict[int, set[int]] = {}
    issue: dict[int, int] = {}
    for v, t, g in _cpu_all_reduces(ev, masks, value_local):
        members.setdefault(g, set()).add(v)
        issue[g] = t
    return [issue[g] for g, vs in members.items() if len(vs) > 1]


def _cpu_all_reduces(ev, masks, value_local) -> list[tuple[int, int, int]]:
    """(value, issue op, combined op id) of every all-reduce as XLA:CPU combines them."""
    kinds, ms, vs, ops, vals, sites = ev._collective_arrays(masks, value_local)
    if not len(kinds):
        return []
    group = ev._groups(kinds, ms, vs, ops, sites, cpu=True)
    last = np.full(len(kinds), -1, dtype=np.int64)
    np.maximum.at(last, group, ops)
    return [
        (int(vals[i]), int(last[group[i]]), int(group[i]))
        for i in np.flatnonzero(kinds == ALL_REDUCE).tolist()
    ]


#: Collectives after which XLA:CPU's partitioned program computes the device's offset: a
#: halo's collective-permute masks with it, a reduce-scatter (an all-reduce there) slices at it.
_OFFSET_COLLECTIVES = tuple(
    COLLECTIVE_KINDS.index(k) for k in ("collective-permute", "reduce-scatter")
)


def partition_id_end(ev, masks, value_local) -> int:
    """The last op that reads the device's position along a cut dim, or -1 if none: XLA's SPMD
    partitioner computes it from one `partition-id` (a u32 scalar, a buffer of the temporary
    block from the step's start, where XLA:CPU's scheduler puts an instruction without
    operands, to its last reader). Such readers: a gather indexing a cut operand dim (the
    masked lookup subtracts the device's first row), a scatter into one, an iota counting
    along a cut dim, an argmax / argmin over one, a dynamic slice or update slicing one,
    and the collectives in `_OFFSET_COLLECTIVES`. Measured in XLA:CPU's buffer assignment
    (fuzz seed 19): #354, data parallel on 2x3, `v[i]` of a cut v, `partition-id` at offset
    64 of the block until the masked gather's select (0.39 of XLA's bytes before); #565, data
    parallel on 8, `take` of a cut operand; #550 the same, in a 4-byte output's allocation."""
    space = space_of(ev.ana, ev.mesh)
    prog = ev._mem_prog
    last = -1
    for op in prog.ops:
        dims = _offset_dims(op, prog)
        if dims is None:
            continue
        axes = space.value_axes(masks, op.operands[0] if op.operands else op.results[0])
        if any(axes[d] for d in dims if d < len(axes)):
            last = max(last, op.index)
    kinds, _, _, ops, _, _ = ev._collective_arrays(masks, value_local)
    hit = np.isin(kinds, _OFFSET_COLLECTIVES)
    if hit.any():
        last = max(last, int(ops[hit].max()))
    return last


def _offset_dims(op, prog) -> tuple | None:
    """The dims of `op`'s first operand (an iota's result) whose cut makes it read the device's
    offset (`partition_id_end`), or None for an op that never does."""
    p = op.primitive
    if p == "gather" and op.operands:
        return tuple(dict(op.param("dimension_numbers")).get("start_index_map", ()))
    if p in prim.SCATTERS and op.operands:
        dn = dict(op.param("dimension_numbers"))
        return tuple(dn.get("scatter_dims_to_operand_dims", ()))
    if p == "iota" and op.results:
        return (op.param("dimension", 0),)
    if p in prim.ARG_REDUCTIONS and op.operands:
        return tuple(op.param("axes", ()))
    if p in ("dynamic_slice", "dynamic_update_slice") and op.operands:
        # Only the dims it slices: XLA's partitioner indexes a cut dim taken whole at 0, no
        # offset read (a gradient-accumulation loop's `batch[i]`, its batch dim cut).
        whole = prog.values[op.operands[0]].shape
        part = prog.values[op.results[0] if p == "dynamic_slice" else op.operands[1]].shape
        return tuple(d for d, (n, k) in enumerate(zip(whole, part)) if k != n)
    return None


def merged_repeat_rows(rows: tuple[np.ndarray, ...], repeat_of) -> tuple[np.ndarray, ...]:
    """`cpu_buffers` rows (value, first op, last op, scale, count, small) with each row of a
    value XLA's CSE merges into an earlier one (`repeat_of`: `simplify.cse_repeats`) folded into
    that value's row of the same kind (scale, count, small), which then covers both ranges:
    one buffer, read by both values' readers. Fuzz seed 19 #936: `jnp.minimum(v, v)`'s
    gradient divides by the tie count twice, one `select_divide_fusion` f32[8] in XLA's block
    (`cpu_buffers.reused_expensive_buffers`), where the model stored two (1.32 of XLA's
    bytes)."""
    vals = rows[0]
    if not len(vals):
        return rows
    canon = np.asarray(repeat_of, dtype=np.int64)[vals]
    if (canon == vals).all():
        return rows
    lo, hi = rows[1].copy(), rows[2].copy()
    keep = np.ones(len(vals), dtype=bool)
    kind = list(zip(rows[3].tolist(), rows[4].tolist(), rows[5].tolist()))
    first = {(v, k): i for i, (v, k) in enumerate(zip(vals.tolist(), kind))}
    for i in np.flatnonzero(canon != vals).tolist():
        j = first.get((int(canon[i]), kind[i]))
        if j is None:
            continue
        lo[j], hi[j] = min(lo[j], lo[i]), max(hi[j], hi[i])
        keep[i] = False
    out = (vals, lo, hi, *rows[3:])
    return tuple(a[keep] for a in out)


def timeline_of(size, start, end, n_ops: int) -> np.ndarray:
    """Live bytes after each op of the buffers [start, end)."""
    delta = np.zeros(n_ops + 1)
    np.add.at(delta, start, size)
    np.add.at(delta, end, -size)
    return np.cumsum(delta)[:n_ops]


def place_in_output_allocations(
    size, start, end, is_out, n_ops: int, fit_size=None, whole_life=None, top=None, placed=None
):
    """(bytes of the output allocations, live bytes of the temporary block after each op).

    Each output gets an allocation of its size for the whole step; then each temporary,
    biggest first, takes the smallest output allocation it fits in whose occupants (the
    output from its producer on, temporaries placed before) are never live with it, but at its
    last op (where its reader may write over it), and otherwise goes to the block. `fit_size`: the temporaries' own sizes, when `size` rounds
    them up to the block's alignment (an allocation of its own is not aligned: a 24-byte
    temporary fits a 24-byte output's). `whole_life`: a bool per buffer, true where no reader
    writes over it at its last op (an all-reduce's partial on XLA:CPU). `top`: (bytes of each
    buffer's smallest piece, its padding), to end the block at its top buffer (`top_padding`).
    `placed`, a list: receives a bool per buffer, true for a temporary left in the block."""
    fit = size if fit_size is None else fit_size
    outs = np.flatnonzero(is_out)
    alloc_size = size[outs]
    order_alloc = np.argsort(alloc_size, kind="stable")
    alloc_size = alloc_size[order_alloc]
    busy = np.zeros((len(outs), n_ops + 1), dtype=bool)
    for a, k in enumerate(outs[order_alloc].tolist()):
        busy[a, start[k] : n_ops + 1] = True
    temps = np.flatnonzero(~is_out)
    temps = temps[np.lexsort((start[temps], -fit[temps]))]
    in_block = np.ones(len(size), dtype=bool)
    in_block[outs] = False
    for k in temps.tolist():
        first = int(np.searchsorted(alloc_size, fit[k]))
        if first >= len(alloc_size):
            continue
        s, e = int(start[k]), int(end[k])
        # Its last op may write its result over it (XLA shares an operand's buffer with an
        # elementwise user's: the update `w - lr * g` is written over the gradient g), when
        # the result is its size: Adam's scalar reciprocals, read by the [1, 4] update, stay
        # in XLA's block (`test_cpu_reciprocal_buffers.py`, 2x3: 68 bytes, both of them).
        last = e if whole_life is not None and whole_life[k] else max(e - 1, s + 1)
        free = ~busy[first:, s:e].any(axis=1)
        if last < e:
            free |= (alloc_size[first:] == fit[k]) & ~busy[first:, s:last].any(axis=1)
        if free.any():
            a = first + int(np.argmax(free))
            busy[a, s:e] = True
            in_block[k] = False
    if placed is not None:
        placed.extend(in_block.tolist())
    block = timeline_of(size[in_block], start[in_block], end[in_block], n_ops)
    if top is not None:
        smallest, pad = top
        block -= top_padding(
            smallest[in_block], pad[in_block], start[in_block], end[in_block], n_ops
        )
    return float(alloc_size.sum()), block


def top_padding(smallest, pad, start, end, n_ops: int) -> np.ndarray:
    """Bytes after each op by which the block's aligned sum overstates the heap XLA lays out.

    The heap simulator places the block's buffers at aligned offsets, biggest first, and the
    block ends where its topmost buffer ends, unpadded: the last placed, the smallest live one
    when nothing leaves a hole. So the block is its buffers' aligned sizes less the padding
    (`pad`) of the smallest (`smallest`: bytes; infinite: not allocated) buffer live at the op.
    Measured in XLA:CPU's buffer assignment of a `fori_loop` accumulating a gradient (fuzz seed
    18 #988, 3 devices): the loop's table at offset 0, its predicate at 64 and its s32 counter
    at 128, a 132-byte block where the aligned sum was 192. On a sample of 535 seed-18
    validations under 1 KiB, the model met XLA's bytes exactly in 156 (99 before; 174 with
    `made_from_inputs`)."""
    out = np.zeros(n_ops)
    for k in np.argsort(-smallest, kind="stable").tolist():  # smaller ones overwrite bigger
        if np.isfinite(smallest[k]):
            out[int(start[k]) : int(end[k])] = pad[k]
    return out


def cpu_temporaries(
    ev,
    value_local,
    align_bytes: int,
    masks=None,
    remat: bool = False,
    small: float | None = None,
    values: list | None = None,
    several: float | None = None,
):
    """(bytes, first op, end op (exclusive)) of the temporaries only XLA:CPU makes (dot-operand
    and conv layout copies, threefry loops, select-and-scatter expansions:
    `cost/cpu_buffers.py`), as `Evaluator._memory(cpu_buffers=
    True)` counts them; with the strategy's `masks`, the dots' copies as its per-device dots
    need them (`local_dot_shapes`), and `remat` (the strategy recomputes: XLA:CPU's schedule
    then makes a library reduction's broadcast inputs at the call, `cpu_buffers.
    library_reduction_inputs`). `small`: the bytes of a row that holds small buffers (default:
    `align_bytes` each, or one byte each unaligned). `values`, a list: receives the value of
    each row. `several`: the bytes of a row of several buffers (default: their sum)."""
    if masks is None:
        vals, lo, hi, scale, count, n_small = ev._cpu_buffers
    else:
        is_mat = ev._is_mat.tolist()
        rows = ev.live_cpu_rows(
            cpu_buffers(
                ev.ana.program,
                is_mat,
                local_dot_shapes(ev, masks),
                remat,
                local_value_shapes(ev, masks),
            )
        )
        vals, lo, hi, scale, count, n_small = rows
    if values is not None:
        values.extend(vals.tolist())
    size = value_local[vals] * scale
    if align_bytes:
        size = round_up(size, align_bytes)
    size = count * size + n_small * max(align_bytes, 1)
    if small is not None:
        size = np.where(n_small > 0, small, size)
    if several is not None:
        size = np.where(count > 1, several, size)
    return np.asarray(size, dtype=np.float64), lo.astype(np.int64), hi.astype(np.int64) + 1


def local_dot_shapes(ev, masks):
    """`local_shape(op, pos)` for `cpu_buffers`: an operand use's shape on one device (each dim
    divided by the sizes of the mesh axes it is split on, rounded up as XLA pads)."""
    space = space_of(ev.ana, ev.mesh)
    sizes = dict(ev.mesh.axes)
    prog = ev.ana.program

    def local_shape(op: int, pos: int) -> tuple:
        shape = prog.values[prog.ops[op].operands[pos]].shape
        if (op, pos) not in space.layout.use_dim_fine:
            return shape
        axes = space.use_axes(masks, op, pos)
        return tuple(-(-n // int(np.prod([sizes[a] for a in ax]))) for n, ax in zip(shape, axes))

    return local_shape


def local_value_shapes(ev, masks):
    """`value_shape(value)` for `cpu_buffers`: a value's shape on one device (each dim divided
    by the sizes of the mesh axes it is split on, rounded up as XLA pads)."""
    space = space_of(ev.ana, ev.mesh)
    sizes = dict(ev.mesh.axes)
    prog = ev.ana.program

    def value_shape(v: int) -> tuple:
        shape = prog.values[v].shape
        axes = space.value_axes(masks, v)
        return tuple(-(-n // int(np.prod([sizes[a] for a in ax]))) for n, ax in zip(shape, axes))

    return value_shape


#: Relative slack below which a per-device size counts as whole: a value's local bytes are its
#: bytes times 2^-(log2 of its shard count), and 2^-log2(3) is not exact, so a [6, 12, 4] f32
#: operand cut 6 ways holds 192.00000000000003 bytes, not 192.
WHOLE_BYTES_SLACK = 1e-9


def round_up(nbytes, align_bytes: int):
    """Buffer sizes rounded up to a multiple of `align_bytes` (an empty buffer stays empty),
    a size within `WHOLE_BYTES_SLACK` of a multiple taken as that multiple: rounding the
    shard-count error up added a whole alignment unit to every temporary of a mesh of 3 or 6
    devices whose size is a multiple of it (fuzz seed 19 #1649, one matmul data parallel on 2x3:
    the [1, 12, 4] cotangent broadcast 256 bytes for XLA's 192; 1.32 of XLA's bytes, 1.20
    exact)."""
    units = np.asarray(nbytes) / align_bytes
    return np.ceil(units * (1 - WHOLE_BYTES_SLACK)) * align_bytes


def allocated_memory(ev, strategy, align_bytes: int = 0, cpu: bool = False):
    """(bytes of the inputs, bytes of the output allocations, live bytes of the temporary block
    after each op) of `strategy` as XLA's buffer assignment lays them out (module essay), for
    the evaluator `ev` (its `donate_outputs` option says which outputs alias their inputs).
    `cpu`: all-reduces write new buffers, issued as XLA:CPU combines them
    (`all_reduce_issue_ops`; the MLP demo, data parallel on 2x4: its gradients' partials in
    the new weights' allocations, the 48 KB of reduced copies in the block), and the
    temporaries only XLA:CPU makes (`cpu_temporaries`) and the operands gathered whole for
    ops with a replicate factor (`replicate_buffers.py`) join the others."""
    masks = strategy.fine_masks(ev.ana, ev.mesh)
    _, value_local, _ = ev._local(masks)
    local = value_local
    pairs = ev._remat_pairs(strategy)
    effect = remat_effect(ev.remat, pairs) if pairs else None
    reduced = all_reduce_issue_ops(ev, masks, value_local) if cpu else None
    dot_shape = local_dot_shapes(ev, masks)  # an operand use's shape on one device
    if cpu:  # the broadcasts remade per layout (`cpu_buffers.broadcasts_per_layout`), and the
        # values dot products fuse (`cpu_buffers.dot_product_fused`); work on broadcasts is
        # stored at its core's size (`broadcast_core_fractions`), while the CPU temporaries
        # sized like it (a broadcast made for a library call) hold its whole shape
        value_local = value_local * broadcast_core_fractions(ev, masks)
        value_local[ev.dot_broadcasts] = 0.0
        stored = (~ev._is_fused).tolist()
        fused = dot_product_fused(ev._mem_prog, stored, dot_shape)
        value_local[np.asarray(fused, dtype=np.int64)] = 0.0
    partials: list[bool] = []
    values: list[int] = []
    size, start, end, is_out = buffer_intervals(
        ev, value_local, masks, effect, pairs, align_bytes, reduced, partials, values
    )
    # The dots XLA makes in another shape: no reader writes over them (`reshaped_dots.py`).
    reshaped = np.zeros(len(value_local) + 1, dtype=bool)
    if cpu:
        reshaped[reshaped_dot_results(ev.ana.program, dot_shape)] = True
    own = (
        buffer_intervals(ev, value_local, masks, effect, pairs, 0, reduced)[0]
        if align_bytes
        else None
    )
    if cpu:
        cpu_values: list[int] = []
        extra, lo, hi = cpu_temporaries(
            ev, local, align_bytes, masks, effect is not None, values=cpu_values
        )
        cpu_row = len(size)  # the first of their rows
        size, start, end = (np.concatenate(x) for x in ((size, extra), (start, lo), (end, hi)))
        is_out = np.concatenate([is_out, np.zeros(len(extra), dtype=bool)])
        # An arg reduction's index is read as positions (a gather's, a dynamic slice's), never
        # written over by its reader (`cpu_buffers.arg_reduction_buffers`).
        prog = ev.ana.program
        partials += [
            prog.ops[ev._producer[v]].primitive in prim.ARG_REDUCTIONS
            if ev._producer[v] >= 0
            else False
            for v in cpu_values
        ]
        if own is not None:  # rows of small buffers (a loop's state) fit no one allocation,
            # nor do rows of several (an expanded special function's parts: each is a buffer
            # of its own, and an allocation holds one at a time; fuzz seed 19 #1525, the 13
            # f32[8] parts of digamma's gradient in XLA's block, not in the 512-byte output)
            own_extra = cpu_temporaries(
                ev, local, 0, masks, effect is not None, small=np.inf, several=np.inf
            )[0]
            own = np.concatenate([own, own_extra])
        # The tuple tables of combined all-reduces (`combined_all_reduce_ops`): small buffers.
        tables = np.asarray(combined_all_reduce_ops(ev, masks, local), dtype=np.int64)
        small = np.full(len(tables), float(max(align_bytes, 1)))
        size, start, end = (
            np.concatenate(x) for x in ((size, small), (start, tables), (end, tables + 1))
        )
        is_out = np.concatenate([is_out, np.zeros(len(tables), dtype=bool)])
        partials += [True] * len(tables)
        if own is not None:
            own = np.concatenate([own, np.full(len(tables), np.inf)])
        # The device's partition id, read by offsets along cut dims (`partition_id_end`).
        pid = partition_id_end(ev, masks, local)
        if pid >= 0:
            size = np.append(size, float(max(align_bytes, 1)))
            start, end = np.append(start, 0), np.append(end, pid + 1)
            is_out = np.append(is_out, False)
            partials.append(True)
            if own is not None:
                own = np.append(own, np.inf)
        # The gathered operands of ops that read a sharded dim whole (`replicate_buffers.py`).
        gathered, lo, hi = replicate_gather_buffers(ev, masks, local)
        aligned = round_up(gathered, align_bytes) if align_bytes else gathered
        size, start, end = (np.concatenate(x) for x in ((size, aligned), (start, lo), (end, hi)))
        is_out = np.concatenate([is_out, np.zeros(len(gathered), dtype=bool)])
        partials += [False] * len(gathered)
        if own is not None:
            own = np.concatenate([own, gathered])
    matmul = read_last_by_matmul(ev) | moves_elements(ev, masks)
    for v in reduced or {}:  # its result is a partial, all-reduced into the output later
        matmul[ev._producer[v]] = False
    values += [-1] * (len(size) - len(values))
    whole_life = np.asarray(partials, dtype=bool) | matmul[end - 1] | reshaped[values]
    if cpu:  # outputs made from the inputs alone are written at the step's start
        early = made_from_inputs(ev._mem_prog, ev._is_fused, reduced or {})
        out_rows = np.flatnonzero(is_out)
        vals = np.asarray(values, dtype=np.int64)[out_rows]
        first = out_rows[(vals >= 0) & early[np.maximum(vals, 0)]]
        start = start.copy()
        start[first] = 0
        # The temporaries of XLA:CPU's first wave (`first_wave`): a value's own buffer, or
        # an operand a CPU rewrite stores whole (a tree reduction's), made by one.
        made = np.asarray(cpu_values, dtype=np.int64)
        whole = local[np.maximum(made, 0)]
        whole = round_up(whole, align_bytes) if align_bytes else whole
        rows = np.asarray(values, dtype=np.int64)
        cpu_rows = slice(cpu_row, cpu_row + len(made))
        rows[cpu_rows] = np.where(size[cpu_rows] == whole, made, -1)
        wave = first_wave(ev._mem_prog, ev._is_fused, reduced or {}, dot_shape)
        in_wave = (rows >= 0) & wave[np.maximum(rows, 0)] & ~is_out
    top = None
    if own is not None:  # a row of small buffers (infinite `own`), its pieces' sizes unknown,
        # is never the top: measured, 446 of 535 small seed-18 validations within 30 % of XLA's
        # bytes so, 440 with a 4-byte counter on top, 442 with a 16-byte table
        top = (np.where(size > 0, own, np.inf), np.maximum(size - own, 0.0))
    placed: list[bool] = []
    outputs_bytes, block = place_in_output_allocations(
        size, start, end, is_out, ev.n_ops, own, whole_life, top, placed
    )
    if cpu and len(block):  # the first wave's temporaries in the block, all live at its end
        in_wave &= np.asarray(placed, dtype=bool)
        block = block.copy()
        block[0] = max(block[0], _block_bytes(size[in_wave], None if own is None else own[in_wave]))
    return float(value_local[kept_inputs(ev)].sum()), outputs_bytes, block


def _block_bytes(size, own) -> float:
    """Bytes of a block holding the buffers of aligned sizes `size` at once, ending at the top
    of the smallest (`own`: their unaligned sizes; infinite: rows of small buffers), as
    `top_padding` ends it."""
    total = float(size.sum())
    if own is not None and len(own):
        j = int(np.argmin(own))
        if np.isfinite(own[j]):
            total -= float(size[j] - own[j])
    return total


def first_wave(prog, is_fused, reduced, local_shape) -> np.ndarray:
    """A bool per value: XLA:CPU's first wave makes it. Its scheduler (`BFSMemoryScheduler`,
    on by default there: `xla_cpu_enable_concurrency_optimized_scheduler`) emits instructions
    in the order a FIFO queue makes them ready, the parameters and constants first: every
    instruction reading only those runs before any other, and its result stays live until a
    later one reads it. So the buffers of that first wave are all live at once when it ends,
    whatever order the program has them in.

    Such a value: made outside loops by an op reading only the step's inputs, literals and
    values fused away made from them alone (`made_from_inputs`), and that op is an
    instruction reading them as they are (`_reads_in_place`). Measured in XLA:CPU's buffer
    assignment (fuzz seed 19): an SGD step on `mean(x[16, 2] @ w[2, 64])` (#974) broadcasts
    the mean's constant cotangent to [16, 64] first, beside the forward's [16, 64] product,
    both read later: an 8,192-byte block (the model, the broadcast made after the forward
    product's last reader, 4,096: 0.56 of XLA's bytes); #1794, #1970, #2027, #1390: the same
    with an outer product XLA writes as a multiply, 0.50 of XLA's bytes."""
    source = np.array([v.role != "intermediate" for v in prog.values], dtype=bool)
    early = np.zeros(len(prog.values), dtype=bool)
    for op in prog.ops:
        if op.primitive in prim.REGION_BOUNDARIES or op.trip_count > 1 or not op.results:
            continue
        if all(source[o] for o in op.operands) and _reads_in_place(prog, op, local_shape):
            for r in op.results:
                early[r] = r not in reduced
                source[r] = early[r] and bool(is_fused[r])
    return early


def _reads_in_place(prog, op, local_shape) -> bool:
    """Whether XLA makes `op` from its operands as they are, not from a bitcast or a copy of
    one (an instruction of its own, which puts the op in a later wave), and writes a buffer:
    a broadcast or reshape keeping the element count is a bitcast, no buffer (fuzz seed 19
    #587: segment_sum's indices [2] -> [2, 1]); a dot reads a bitcast when an operand
    (`local_shape(op, pos)`, on one device) has dims of size 1, batch dims not first, or
    several free or contracted dims to merge (`reshaped_dots.py`; #89: `x[8, 4, 8] @ w` reads
    x as [32, 8], so the weight gradient's dot, reading the cotangent broadcast, runs before
    the forward dot: no two [32, 8] buffers at once). An outer product (one contracted
    element) is a multiply fusion reading them as they are."""
    if op.primitive in ("broadcast_in_dim", "reshape", "squeeze", "expand_dims") and op.operands:
        return prog.values[op.results[0]].size != prog.values[op.operands[0]].size
    if op.primitive != "dot_general":
        return op.primitive not in prim.MATMULS
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    for pos, (c, b) in enumerate(((lc, lb), (rc, rb))):
        shape = local_shape(op.index, pos)
        if int(np.prod([shape[d] for d in c], dtype=np.int64)) == 1:
            return True
        free = [d for d in range(len(shape)) if d not in b and d not in c]
        if 1 in shape or list(b) != list(range(len(b))) or len(c) != 1 or len(free) > 1:
            return False
    return True


def broadcast_core_fractions(ev, masks) -> np.ndarray:
    """Per value, the fraction of its local bytes XLA stores: for the result of an elementwise
    op uniform along some dims (`simplify.uniform_dims`), one over its local extent along them,
    else 1. XLA's simplifier sinks a broadcast below an elementwise op whose only non-scalar
    operand it is (`TryToSinkBroadcastAfterOpWithUniqueNonScalarOperand`), so the op writes its
    core and the broadcast is re-applied inside each reader's fusion (a reduction of it, the
    whole broadcast taken into the library call). Fuzz seed 19 #2277: `sigmoid(broadcast(v)**2)`
    over [16, 2, 64, 4], its mean and gradient: XLA stores `f32[2, 64, 4]` and the gradient's
    sum over the broadcast dim is a multiply; no 32 KiB buffer (compiled 31,380 bytes, the model
    had three of them: 111,380). An output, or a value read by an op that fuses no producer (a
    dot, a sort), is the broadcast itself there: stored whole."""
    prog = ev.ana.program
    uni = uniform_dims(prog)
    uses = prog.uses()
    shape_of = local_value_shapes(ev, masks)
    out = np.ones(len(prog.values))
    for op in prog.ops:
        if op.primitive not in prim.ELEMENTWISE or len(op.results) != 1:
            continue
        v = op.results[0]
        fused_readers = all(fusible(prog.ops[u], prog) for u, _ in uses[v])
        if uni[v] and fused_readers and not prog.values[v].is_output:
            shape = shape_of(v)
            out[v] = 1.0 / max(int(np.prod([shape[d] for d in uni[v]])), 1)
    return out


def made_from_inputs(prog, is_fused, reduced) -> np.ndarray:
    """A bool per value: an op outside loops reading only the step's inputs and literals, or
    values fused away (`is_fused`) made from them alone, makes it, and it is not all-reduced
    (`reduced`). XLA:CPU's scheduler runs such an output's fusion at the step's start, so its
    allocation holds nothing before: an SGD step on `mean(x @ w)` writes the new w (its
    gradient is x times a constant) first, and the forward's all-reduced partial goes to the
    block, not to w's allocation (fuzz seed 18 #195 and #296, data parallel on 8: XLA's block
    the partial and its reduced copy, 80 bytes). A value stored on the way (a dot's result)
    is made before it: no."""
    source = np.array([v.role != "intermediate" for v in prog.values], dtype=bool)
    early = np.zeros(len(prog.values), dtype=bool)
    for op in prog.ops:
        if op.primitive in prim.REGION_BOUNDARIES or op.trip_count > 1 or not op.results:
            continue
        if all(source[o] for o in op.operands):
            for r in op.results:
                early[r] = r not in reduced
                source[r] = early[r] and bool(is_fused[r])
    return early


def read_last_by_matmul(ev) -> np.ndarray:
    """Per op, whether it is a dot or a convolution that contracts (not an outer product, which
    XLA rewrites as an elementwise multiply): such an op writes its result into a buffer of its
    own, never over an operand it reads last (XLA shares an operand's buffer only with an
    elementwise user's). Fuzz seed 15 #183: `broadcast(x[32]) -> [8, 32]` read by the dot that
    makes the output `[32, 8]`: the broadcast's 1 KiB is a temporary beside the output's
    allocation (XLA: 1,024 bytes of temporaries; the model had put it in the output's). A dot
    whose result is a partial that an all-reduce then writes into the output is not one there
    (`allocated_memory`): it writes a temporary, and its operands may take the output's
    allocation (seed 15 #72, data parallel: `v @ v.T` with v a broadcast, XLA puts v there)."""
    prog = ev.ana.program
    return np.array(
        [op.primitive in prim.MATMULS and not fusible(op, prog) for op in prog.ops],
        dtype=bool,
    )


def moves_elements(ev, masks) -> np.ndarray:
    """Per op, whether it is a transpose that moves elements on one device (its permutation
    reorders dims longer than 1 there): XLA emits it as a copy into another layout (a `copy` or
    a transpose fusion), which is not elementwise on its operand, so it never writes its result
    over the operand it reads last (XLA shares an operand's buffer only with a user elementwise
    on it, of the same shape and layout). Fuzz seed 19 #560, data parallel on 8: the all-reduced
    einsum result, read last by `transpose(swapaxes(v3))` that makes an output, stays in XLA's
    block beside that output's allocation (16,384 bytes of temporaries; the model had put it in
    the output's and counted none)."""
    prog = ev.ana.program
    shape_of = local_value_shapes(ev, masks)
    out = np.zeros(len(prog.ops), dtype=bool)
    for i, op in enumerate(prog.ops):
        if op.primitive != "transpose" or len(op.operands) != 1:
            continue
        shape = shape_of(op.operands[0])
        moved = [d for d in op.param("permutation", ()) if shape[d] > 1]
        out[i] = moved != sorted(moved)
    return out


def kept_inputs(ev) -> np.ndarray:
    """The persistent values `jax.jit` passes to the compiled program: it prunes the arguments
    no op reads (`keep_unused=False`), so they take no memory there (fuzz seed 23 #31: of
    `swapaxes(x2)` with an unused `x1`, XLA's arguments are x2's 1,152 bytes alone)."""
    prog = ev.ana.program
    uses = prog.uses()
    return np.array(
        [v for v in ev.persistent_ids.tolist() if uses[v] or prog.values[v].is_output],
        dtype=np.int64,
    )
