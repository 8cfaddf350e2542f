"""Flops of an argmax / argmin whose reduced dim is sharded, as XLA's partitioner computes it.

The op's flop rule (`flops.arg_reduce_flops`, 9 per element folded in) divided by the mesh
axes sharding the operand counts 9 x (n - 1) / W per result element for a reduced dim of n
elements cut W ways. XLA does otherwise (`model.Evaluator._arg_reduction_gathers` prices the
collectives): each device reduces its n / W local rows, with indices made from an iota plus its
shard's offset, then all-gathers the W partial maxima and their indices and reduces those again,
9 flops per element folded in each time. Measured with `cost_analysis()` (argmax over dim 0 of
f32[rows, 16], dim cut W ways):

    rows, W   XLA     local 9*16*(r-1)   combine 9*16*(W-1)   index offset
    64, 2     4642    4464               144                  34: convert, multiply, 32 adds
    16, 8     1156     144               1008                  4: convert, multiply, 2 adds
     8, 8     1009       0               1008                  1: convert (one local row)

This is the CPU view only (`validate.cpu_flops`), beside the adds of all-reduces."""

from __future__ import annotations

from math import prod

from toast_core.ir import primitives as prim
from toast_core.ir.program import Program, dtype_itemsize

#: Compare, and select both index and value, per element folded in (`flops.arg_reduce_flops`).
PER_FOLD = 9


def arg_reduction_flops(collectives, program: Program, axis_sizes: dict[str, int]) -> float:
    """Flops XLA spends on the argmax / argmin ops whose reduced dim is sharded beyond what
    the op's flop rule gives each device: the second reduction over the all-gathered partial
    results and the index offsets, less the share of the folds the rule spreads over the
    shards. `collectives`: the priced ones (`CostReport.collectives`); each such op all-gathers
    its result (the indices), which gives the local result size and W."""
    total = 0.0
    for c in collectives:
        op = program.ops[c.op]
        if c.kind != "all-gather" or op.primitive not in prim.ARG_REDUCTIONS:
            continue
        if c.value != op.results[0]:
            continue  # the maxima's gather; the indices' one is counted
        ways = prod(axis_sizes.get(a, 1) for a in c.mesh_axes)
        if ways <= 1:
            continue
        result = program.values[op.results[0]]
        gathered = c.result_bytes / dtype_itemsize(result.dtype)
        local_results = gathered / ways
        (axis,) = op.param("axes")
        rows = program.values[op.operands[0]].shape[axis] // ways
        combine = PER_FOLD * local_results * (ways - 1)
        spread = PER_FOLD * local_results * (ways - 1) / ways  # counted by the rule already
        offsets = 1.0 + (1.0 + rows if rows > 1 else 0.0)
        total += combine - spread + offsets
    return total
