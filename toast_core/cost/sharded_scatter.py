"""Flops of a scatter on one device as XLA's SPMD partitioner runs it: each device applies every
update it holds, whatever share of the operand it owns.

`rules_indexing.scatter_rule` passes the operand's indexed dims through the scatter: with one
of them sharded, each device applies the updates that land in its rows and drops the others.
XLA's partitioned scatter still combines every update element the device holds (the dropped
ones too): its count is the local updates, not the global count over the op's cut (fuzz seed 31
#37, `x[4, 4, 16, 4].at[i[4]].add(u)` with dim 0 on 4 devices: 1,024 combines per device, not
256). It also moves each index into the device's rows: a subtract per index vector and the
device's offset from its partition id (1; measured on x[8, 16], i[3]: 62 flops on 4 devices
against 57 unsharded, with the index normalization duplicated).

A one-window scatter's bounds test and select (`flops.scatter_flops`) are per device too: the
select per local update element, the test (4 x rank - 1) whole.
"""

from __future__ import annotations

from math import prod

from toast_core.ir import primitives as prim
from toast_core.ir.program import Op, Program


def sharded_scatters(program: Program) -> list[int]:
    """Indices of the scatters (`prim.SCATTERS`) with flops to count per device."""
    return [
        i for i, op in enumerate(program.ops) if op.primitive in prim.SCATTERS and op.results
    ]  # fmt: skip


def local_scatter_flops(
    op: Op, program: Program, updates_ways: float, indexed_ways: float, index_ways: float
) -> float:
    """Flops of one execution of a scatter on one device whose updates are cut `updates_ways`
    ways, indices `index_ways` ways, and whose operand's indexed dims are cut `indexed_ways`
    ways (module essay)."""
    updates = program.values[op.operands[2]].size / updates_ways
    indices = program.values[op.operands[1]].shape
    vectors = prod(indices[:-1]) if indices else 1
    out = updates if op.primitive in prim.COMBINING_SCATTERS else 0.0
    if vectors == 1:
        out += updates + 4 * len(program.values[op.operands[0]].shape) - 1
    if indexed_ways > 1 + 1e-9:
        out += vectors / index_ways + 1
    return out
