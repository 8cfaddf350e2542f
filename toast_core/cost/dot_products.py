"""Dot products: the dots XLA's algebraic simplifier rewrites into a multiply and a reduce.

A dot whose operands both have, unit dims aside, only batch and contracted dims (a vector dot
product `einsum('a,a->')`, a batched one `einsum('ab,ab->b')`, `x[64] @ w[64, 1]`, the
weight gradient `einsum('abc,abz->z')` of a `[.., 1]` weight) is rewritten before fusion into
`reduce(multiply(x, y))` (dot strength reduction). What is left is a reduction like any other:
fusible, its multiply fusing the cheap ops making its operands, computed once however many
fusions read it. A dot with a free dim over 1 on either side (a matrix-vector product
`einsum('ab,b->a')`, `x[2] @ w[2, 8]`) stays a dot.

Measured on jaxlib 0.10.2's XLA:CPU (optimized HLO, `cost_analysis()` flops): `a,a->` on [2] to
[100000], `ab,ab->b`, `ab,ab->a`, `ab,ab->`, `abc,abc->a`, `ab,a->b` with [64, 1] and
`a,ab->b` with [64] x [64, 1] are a `reduce` fusion; `ab,a->b` ([2, 8] and [16, 16]),
`ab,b->a`, `a,ab->b` with [2] x [2, 8], the batched matrix-vector `abc,ac->ab` and the
multi-contracted `abc,bc->a` stay dots. XLA:GPU's simplifier strength-reduces the same
vector-vector dots (`GpuAlgebraicSimplifierVisitor::ShouldStrengthReduceDotToReduce`).

The flops view (`simplify.executions`) and XLA:CPU's buffers (`cpu_buffers.dot_product_fused`)
both read the program through `as_sums`: each dot product replaced by the `reduce_sum` it
becomes, for the fusion analysis alone (its flops stay the dot's: `2 K - 1` per result element,
the multiply's `K` and the reduce's `K - 1`).
"""

from __future__ import annotations

import dataclasses

from toast_core.cost.fusion import fusible
from toast_core.ir.program import Program


def is_dot_product(op, local_shape) -> bool:
    """Whether XLA's simplifier rewrites dot `op` into a multiply and a reduce (module essay):
    something contracted, and no free dim over 1 on either side, on one device
    (`local_shape(op, pos)`)."""
    if op.primitive != "dot_general" or len(op.operands) != 2:
        return False  # a dead dot reads nothing (`simplify._pruned`)
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    if not lc:
        return False
    for pos, (batch, contracted) in enumerate(((lb, lc), (rb, rc))):
        shape = local_shape(op.index, pos)
        if any(n != 1 for d, n in enumerate(shape) if d not in batch and d not in contracted):
            return False
    return True


def as_sums(prog: Program, local_shape=None) -> Program:
    """`prog` with each dot product that is not already fusible (an outer product,
    `fusion.fusible`) replaced by a `reduce_sum` of its two operands, for the fusion analysis
    (`fusion.materialized`, `fusion.fusion_work`); `prog` itself when it has none.
    `local_shape(op, pos)`: an operand use's shape on one device (default: the global one)."""
    if local_shape is None:

        def local_shape(op: int, pos: int) -> tuple:
            return prog.values[prog.ops[op].operands[pos]].shape

    ops = list(prog.ops)
    changed = False
    for op in prog.ops:
        if op.primitive == "dot_general" and is_dot_product(op, local_shape):
            if not fusible(op, prog):
                ops[op.index] = dataclasses.replace(op, primitive="reduce_sum", params=())
                changed = True
    return dataclasses.replace(prog, ops=tuple(ops)) if changed else prog
