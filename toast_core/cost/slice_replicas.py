"""Flops of a slice of a cut dim, as XLA's partitioner makes it: its halo's selects, and, for a
narrow result read whole, the masked all-reduce that makes it whole.

XLA keeps the slice's result cut as its operand was, n ways along the sliced dim (its w
elements padded to n shards of ceil(w / n)), and reads each shard's window through halo
collective-permutes (`halo.py`). In the compact form (`ExchangeHaloCompact`) each shard's piece
of the window is its own data or one of the permutes, picked by the shard's ordinal: a select
over the piece per distinct source beyond the first, a compare each, and the partition id
converted once (`halo.compact_halo_selects`). Measured, `x[lo:hi] * 2.0` of x f32[rows, 4] with
rows cut n ways (whole result or cut as x, alike): [0:16] of 32 on 8, two selects of [4, 4] and
3 scalars (35 beyond the 64 multiplies, XLA 99); [16:32], two of [2, 4] (19); [0:32] of 64, two
of [8, 4] (67). The neighbour form (`ExchangeHalo`) selects nothing (its 2 or 3 offset scalars
are left out).

The model gathers the operand of a slice whose result is whole along the cut dim
(`concat_slice.py`). XLA makes the cut result whole where it is read
(`PartitionedHlo::ReplicatePartial`, xla/service/spmd/spmd_partitioner.cc) by one of three rules
for that dim:

* w == 1, the shard as big as the whole (`Broadcast`): the one device holding the element keeps
  its shard (a compare of the partition id and a select per shard element), the others zeros,
  and an all-reduce sums them (`cost_analysis()` counts an all-reduce one flop per element);
* w <= n // 2 (a DUS and an all-reduce): each shard masked to its valid part (a select per shard
  element, a convert and a compare of the partition id), written at its offset into zeros of the
  whole result, all-reduced (w elements along the dim);
* otherwise an all-gather of the padded shards after the halo exchange, then a slice.

When each operand shard is one element and the slice starts at 0, XLA gathers the operand
instead, as the model does (no flops). Measured with `cost_analysis()`, `x[lo:hi] * 2.0` of x
f32[rows, 4] with rows cut n ways and the result whole (4 or 8 multiplies):

    n   rows   slice     XLA   multiplies   compare/scalars   select   all-reduce
    8   32     [0:1]     13    4            1                 4        4
    8   32     [31:32]   13    4            1                 4        4
    6   6      [5:6]     13    4            1                 4        4
    6   6      [0:1]     4     4            (operand gathered)
    8   32     [0:2]     24    8            4                 4        8
    6   6      [4:6]     22    8            2                 4        8
    4   8      [0:2]     24    8            4                 4        8

(the halo's own scalars, 0 to 3, are left out). The edge rows of `jnp.pad(x, ..., mode="edge")`
are such slices: fuzz seed 19 #1614 (x f32[6, 32] cut 6 ways, its last row read whole by the
pad: 184 flops predicted, 252 compiled, 65 of them this). This is the CPU view only
(`validate.cpu_flops`), beside `iota_offsets.py`."""

from __future__ import annotations

from math import prod

from toast_core.cost.halo import compact_halo_selects
from toast_core.cost.simplify import live_ops, rewired
from toast_core.ir.program import Program

#: Scalars of the two masks: the compare of `Broadcast`, the convert and compare of a DUS's.
BROADCAST_SCALARS, MASK_SCALARS = 1.0, 2.0
#: The shard ordinal the compact halo's selects test (the partition id converted).
ORDINAL_SCALARS = 1.0


def slice_replica_flops(program: Program, value_axes, mesh_axes: dict[str, int]) -> float:
    """Flops of the halo selects of the live unit-stride slices of `program` along a cut dim,
    and of making their narrow results whole where the model has them whole (module essay). `value_axes(v)`: the mesh axes cutting each dim of value
    `v`; `mesh_axes`: each mesh axis's size. A repeated slice XLA's CSE merges counts once."""
    simple = rewired(program, barriers=False)
    live = live_ops(simple)
    total = 0.0
    for op in simple.ops:
        if op.primitive != "slice" or not live[op.index] or not op.results:
            continue
        if any(s not in (None, 1) for s in op.param("strides") or ()):
            continue
        total += _replica_flops(program, op, value_axes, mesh_axes)
    return total


def _replica_flops(program: Program, op, value_axes, mesh_axes: dict[str, int]) -> float:
    operand = program.values[op.operands[0]].shape
    result = program.values[op.results[0]].shape
    ways = lambda names: prod(mesh_axes.get(a, 1) for a in names)  # noqa: E731
    cut = value_axes(op.operands[0])
    sliced = [d for d, (a, b) in enumerate(zip(operand, result)) if a != b and ways(cut[d]) > 1]
    if len(sliced) != 1:
        return 0.0
    (d,) = sliced
    n, w, start = ways(cut[d]), result[d], op.param("start_indices")[d]
    out_axes = value_axes(op.results[0])
    if out_axes[d] and tuple(out_axes[d]) != tuple(cut[d]):
        return 0.0  # the result cut otherwise along the dim: another reshard
    if any(set(names) & set(cut[d]) for e, names in enumerate(out_axes) if e != d):
        return 0.0  # the axes moved to another dim of the result: another reshard
    rest = prod(
        -(-size // ways(names)) for e, (size, names) in enumerate(zip(result, out_axes)) if e != d
    )
    pieces = compact_halo_selects(operand[d], n, start, w)
    halo = sum(selects * (width * rest + 1.0) for width, selects in pieces)
    halo += ORDINAL_SCALARS if halo else 0.0
    if out_axes[d]:
        return halo  # kept cut, as XLA keeps it
    if -(-operand[d] // n) == 1 and start == 0:
        return 0.0  # one element per shard, from the first: the operand is gathered
    if w == 1:
        return BROADCAST_SCALARS + 2.0 * rest
    if w <= n // 2:
        return MASK_SCALARS + rest + w * rest
    return halo  # all-gathered after the halo exchange
