"""Flops of an iota whose counted dim is cut, as XLA's partitioner computes it.

An iota costs nothing unsharded (a constant the fusion reading it generates). Cut along its
counted dim, each device needs the global positions of its own shard: XLA's partitioner emits
the local iota plus a broadcast offset, the device's index along the cutting mesh axes times the
local length. The simplifier shrinks a broadcasted iota to the 1-D iota of its counted dim, so
the add runs once per local element of that dim, whatever the other dims. The device's index is
the partition id itself (a convert, then the multiply: 2 scalar flops) when the cut takes every
mesh axis in mesh order; otherwise a constant table indexed by the partition id gives it (the
multiply alone: 1). Measured with `cost_analysis()`, `one_hot(i[32], 64) * 1.5` (a compare and a
select per local element) with the result cut as said:

    mesh   cut             XLA    compare+select   add   offset
    8      classes         522    512              8     2
    2x4    classes on b    1041   1024             16    1
    2x4    classes on a    2081   2048             32    1
    2x4    classes on a,b  522    512              8     2
    2x2x2  classes on b    2081   2048             32    1
    3      classes (12)    54     48               4     2

The same for a `broadcasted_iota` of (32, 64) along dim 1, both dims cut on 2x4 (the add on
the 16 or 32 local positions of dim 1 alone). Identical iotas cut alike are one (XLA's CSE).
This is the CPU view only (`validate.cpu_flops`), beside the argmax offsets of
`arg_reduce.py`."""

from __future__ import annotations

from math import prod

from toast_core.cost.simplify import live_ops
from toast_core.ir.program import Program


def iota_offset_flops(program: Program, value_axes, mesh_axes: dict[str, int]) -> float:
    """Flops of the partition offsets of the live iotas of `program` cut along their counted
    dim. `value_axes(v)`: the mesh axes cutting each dim of value `v`; `mesh_axes`: each mesh
    axis's size, in mesh order."""
    iotas = [op for op in program.ops if op.primitive == "iota" and op.results]
    if not iotas:
        return 0.0
    live = live_ops(program)
    whole = tuple(a for a, n in mesh_axes.items() if n > 1)
    seen, total = set(), 0.0
    for op in iotas:
        if not live[op.index]:
            continue
        dim = op.param("dimension")
        shape = program.values[op.results[0]].shape
        axes = tuple(value_axes(op.results[0])[dim])
        ways = prod(mesh_axes.get(a, 1) for a in axes)
        if ways <= 1:
            continue
        key = (shape, dim, axes)
        if key in seen:
            continue
        seen.add(key)
        total += -(-shape[dim] // ways) + (2.0 if axes == whole else 1.0)
    return total
