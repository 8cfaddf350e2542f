"""Flops of a scan whose stacked output is cut along its scanned dim, as XLA's partitioner
computes it.

Each device holds only its own slots of the stacked output, yet every device runs every step
of the loop (the carry is whole on each). XLA's partitioner keeps the step's output only on the
device owning its slot: per step, a select between the new slot and the held one under
`lo <= step < hi` (a compare, a compare and an `and` on scalars), with the bounds made once from
the partition id before the loop. Measured with `cost_analysis()` (the body once, as it counts
a loop), `scan(lambda c, x: (0.5 * c + x, sin(c)), zeros((16, 4)), xs[8, 16, 4])` with its
stacked output cut as said:

    mesh   cut               XLA   replicated   select   scalars
    8      steps             200   130          64       6
    2x4    steps on a        202   130          64       8
    2x4    steps on b        202   130          64       8
    8      16 steps, 2 each  204   130          64       10

and fuzz seed 18 #25 (a decay scan of (3, 3, 24) slots over 8 steps on 8 devices: 216 selects
and 6 scalars beyond the model's 650 flops: 872). The select runs on the slot's local elements
(its other dims divided by their own cuts); the scalars are counted as the 6 of the plainest
case. This is the CPU view only (`validate.cpu_flops`), beside `iota_offsets.py`."""

from __future__ import annotations

from math import prod

from toast_core.ir import primitives as prim
from toast_core.ir.program import Program

#: The bounds' scalars: converts and the add before the loop, two compares and an `and` in it.
SCALARS = 6.0


def scan_slot_flops(program: Program, value_axes, mesh_axes: dict[str, int]) -> float:
    """Flops of the slot selects of the scans of `program` whose stacked outputs are cut along
    their scanned dim (dim 0). `value_axes(v)`: the mesh axes cutting each dim of value `v`;
    `mesh_axes`: each mesh axis's size."""
    total = 0.0
    for op in program.ops:
        if op.primitive != prim.SCAN_END:
            continue
        for v in op.results[op.param("num_carry", 0) :]:
            shape = program.values[v].shape
            if not shape:
                continue
            axes = value_axes(v)
            if prod(mesh_axes.get(a, 1) for a in axes[0]) <= 1:
                continue
            slot = prod(
                -(-n // prod(mesh_axes.get(a, 1) for a in names))
                for n, names in zip(shape[1:], axes[1:])
            )
            total += slot + SCALARS
    return total
