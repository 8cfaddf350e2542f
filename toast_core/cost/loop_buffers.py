"""Loop operands and carries share buffers with the values they enter and leave a loop as.

The tracer flattens a `scan`/`while`/`cond` into `<prim>_start`, the body's ops and `<prim>_end`:
`scan_start` makes a new value for each constant, carry and per-iteration slice the body reads,
and `scan_end` one for each final carry. XLA makes no new buffers for most of them: a loop's
constants are its operands (a parameter read by the body is the parameter), the carry is updated in
place in the loop's tuple, and the final carry *is* that buffer. Counting each such value as a new
buffer counted a gradient accumulation loop's parameters and accumulators twice (measured: the
`grad-accum` workload predicted 1.3-2.5x the compiled memory).

`buffer_aliases` names, for each such value, the value whose buffer it is; the liveness then
extends that value's lifetime to cover the alias instead of adding a buffer. Per-iteration slices
of a scan's stacked inputs (`xs`) and stacked outputs (`ys`) stay new buffers, as do values whose
shape or dtype differ from the operand they mirror.
"""

from __future__ import annotations

from toast_core.ir import primitives as prim
from toast_core.ir.program import Program


def _pairs(op) -> list[tuple[int, int]]:
    """(result, operand) pairs of a region boundary op that share a buffer."""
    params = dict(op.params)
    if op.primitive == prim.SCAN_START:
        n = int(params.get("num_consts", 0)) + int(params.get("num_carry", 0))
        return list(zip(op.results[:n], op.operands[:n]))
    if op.primitive == prim.SCAN_END:
        n = int(params.get("num_carry", 0))
        return list(zip(op.results[:n], op.operands[:n]))
    if op.primitive in (prim.WHILE_START, prim.WHILE_END, prim.COND_START):
        return list(zip(op.results, op.operands))
    return []


def buffer_aliases(prog: Program) -> dict[int, int]:
    """value id -> id of the value whose buffer it shares (resolved to the first of a chain)."""
    alias: dict[int, int] = {}
    for op in prog.ops:
        for result, operand in _pairs(op):
            r, o = prog.values[result], prog.values[operand]
            if r.shape == o.shape and r.dtype == o.dtype and result != operand:
                alias[result] = alias.get(operand, operand)
    return alias


def zero_filled(op) -> list[int]:
    """The values XLA writes whole before a loop runs: a scan's stacked outputs (`ys`). JAX
    lowers a scan to a `while` whose state holds one zero-filled buffer per stacked output, which
    each iteration updates in place with its slice (measured on the CPU's HLO: a broadcast of
    zero, then one `copy` of it per output, every one a full write; TPU and GPU fuse the fill
    but write it all the same). The slices themselves are written by the body."""
    if op.primitive != prim.SCAN_END:
        return []
    return list(op.results[int(dict(op.params).get("num_carry", 0)) :])
