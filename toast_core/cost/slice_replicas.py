"""Flops of a narrow slice of a cut dim whose result is read whole, as XLA's partitioner makes it.

The model gathers the operand of a slice along a cut dim (`concat_slice.py`: a replicate
factor). XLA keeps the slice's result cut as its operand was, n ways along the sliced dim (its w
elements padded to n shards of ceil(w / n)), reads each shard's window through halo
collective-permutes, and makes the result whole where it is read (`PartitionedHlo::
ReplicatePartial`, xla/service/spmd/spmd_partitioner.cc) by one of three rules for that dim:

* w == 1, the shard as big as the whole (`Broadcast`): the one device holding the element keeps
  its shard (a compare of the partition id and a select per shard element), the others zeros,
  and an all-reduce sums them (`cost_analysis()` counts an all-reduce one flop per element);
* w <= n // 2 (a DUS and an all-reduce): each shard masked to its valid part (a select per shard
  element, a convert and a compare of the partition id), written at its offset into zeros of the
  whole result, all-reduced (w elements along the dim);
* otherwise an all-gather of the padded shards, then a slice: no flops.

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

from toast_core.cost.simplify import live_ops, rewired
from toast_core.ir.program import Program

#: Scalars of the two masks: the compare of `Broadcast`, the convert and compare of a DUS's.
BROADCAST_SCALARS, MASK_SCALARS = 1.0, 2.0


def slice_replica_flops(program: Program, value_axes, mesh_axes: dict[str, int]) -> float:
    """Flops of making whole the narrow results of the live unit-stride slices of `program`
    along a cut dim (module essay). `value_axes(v)`: the mesh axes cutting each dim of value
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
    n, w = ways(cut[d]), result[d]
    out_axes = value_axes(op.results[0])
    if any(set(names) & set(cut[d]) for names in out_axes):
        return 0.0  # the result is cut along those axes too: not made whole
    if -(-operand[d] // n) == 1 and op.param("start_indices")[d] == 0:
        return 0.0  # one element per shard, from the first: the operand is gathered
    rest = prod(
        -(-size // ways(names)) for e, (size, names) in enumerate(zip(result, out_axes)) if e != d
    )
    if w == 1:
        return BROADCAST_SCALARS + 2.0 * rest
    if w <= n // 2:
        return MASK_SCALARS + rest + w * rest
    return 0.0
