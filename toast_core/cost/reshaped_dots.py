"""Dots whose result XLA makes in another shape than the program's, so no reader writes over it.

XLA rewrites every dot into its canonical form before emitting it (`DotDecomposer`: the batch
dims, then one free dim per operand, the free dims of a side merged into one; the algebraic
simplifier first drops the dims of size 1), and a bitcast gives the result back its shape. A
reader may write its result over an operand's buffer only when the operand's shape is the
result's (`HloDataflowAnalysis::CanShareOperandBufferWithUser` compares the two shapes): the
canonical dot result read by the elementwise op that makes an output therefore stays a
temporary beside the output's allocation, where `buffers.place_in_output_allocations` had put
it into that allocation for its last op.

Measured (fuzz seed 17 #1395, `x[8, 16, 2, 8] @ w[8, 12] + b`, x sharded 8 ways on dim 0): XLA
emits the dot as f32[32, 12] (1,536 bytes) in the temporary block and the add writes the output
f32[1, 16, 2, 12] in an allocation of its own; memory_analysis() 4,528 bytes, the model 2,992
with the dot's result in the output's allocation.
"""

from __future__ import annotations

import numpy as np

from toast_core.ir import primitives as prim
from toast_core.ir.program import Program


def reshaped_dot_results(prog: Program, local_shape) -> list[int]:
    """The results of the dots whose canonical shape on one device (`local_shape(op, pos)`: an
    operand use's shape there) is not the program's: a side with several free dims over 1
    (merged into one), or a result dim of size 1 (dropped)."""
    out = []
    for op in prog.ops:
        if op.primitive != "dot_general":
            continue
        (lc, rc), (lb, rb) = op.param("dimension_numbers")
        lhs, rhs = local_shape(op.index, 0), local_shape(op.index, 1)
        lfree = [n for d, n in enumerate(lhs) if d not in lb and d not in lc]
        rfree = [n for d, n in enumerate(rhs) if d not in rb and d not in rc]
        result = [lhs[d] for d in lb] + lfree + rfree
        merged = sum(n > 1 for n in lfree) > 1 or sum(n > 1 for n in rfree) > 1
        if merged or any(n == 1 for n in result):
            out.append(op.results[0])
    return out


def canonical_dot_dims(prog: Program, x: int, shape, producers, fused) -> list[int] | None:
    """The dims XLA reduces for a reduction over all of `x` (`shape`: its shape on one device)
    when a fused chain of elementwise ops makes `x` from a dot's result: the dot's canonical
    dims (module essay), since the simplifier moves the reduce through the bitcast back to the
    dot's shape. None when no dot is there. Fuzz seed 17 #73: the mean of `abs(x[8, 24, 1] @
    w[1, 6])` reduces f32[192, 6] (a tree reduction, its operand stored: 4,608 bytes), not [8,
    24, 6] (no dim over 32)."""
    while fused[x] and producers[x] is not None:
        op = prog.ops[producers[x]]
        if op.primitive == "dot_general":
            (lc, rc), (lb, rb) = op.param("dimension_numbers")
            nb = len(lb)
            nl = len(prog.values[op.operands[0]].shape) - nb - len(lc)
            dims = list(shape[:nb]) + [
                int(np.prod(shape[nb : nb + nl], dtype=np.int64)),
                int(np.prod(shape[nb + nl :], dtype=np.int64)),
            ]
            return [n for n in dims if n != 1]
        if op.primitive not in prim.ELEMENTWISE:
            return None
        same = [v for v in op.operands if prog.values[v].shape == prog.values[x].shape]
        if len(same) != 1:
            return None
        x = same[0]
    return None
