"""Factor rules for the region pseudo-ops `trace.py` writes around `scan`, `while` and `cond`
bodies: they link a region's outer operands and results to its body's inputs and outputs."""

from __future__ import annotations

from toast_core.analysis.factors import FactorBuilder, OpFactors
from toast_core.analysis.rules import rule
from toast_core.ir import primitives as prim

# --- regions: scan, while, cond ------------------------------------------------------------------


@rule(prim.SCAN_START)
def scan_start_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Outer (consts, carry, xs[L, ...]) -> body inputs (consts, carry, x[...]).

    The stacked leading dim L of xs is its own factor; it must be whole (iterations are sequential).
    """
    n_consts, n_carry = op.param("num_consts", 0), op.param("num_carry", 0)
    fb = FactorBuilder(operand_shapes, result_shapes)
    for i, shape in enumerate(operand_shapes):
        sliced = i >= n_consts + n_carry
        for d, size in enumerate(shape):
            if sliced and d == 0:
                fb.set_operand(i, d, fb.factor(size, "replicate"))
            else:
                fb.shared(size, operands=[(i, d)], results=[(i, d - 1 if sliced else d)])
    return fb.build()


@rule(prim.SCAN_END)
def scan_end_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Body outputs (carry', y) and the body's carry inputs -> outer (carry, ys[L, ...]).

    Carry out ~ carry in ~ final carry: a loop-carried value keeps one sharding.
    """
    n_carry = op.param("num_carry", 0)
    n_out = len(result_shapes)
    fb = FactorBuilder(operand_shapes, result_shapes)
    for i in range(n_out):
        for d, size in enumerate(operand_shapes[i]):
            if i < n_carry:
                fb.shared(size, operands=[(i, d), (n_out + i, d)], results=[(i, d)])
            else:
                fb.shared(size, operands=[(i, d)], results=[(i, d + 1)])
    return fb.build()


@rule(prim.WHILE_START, prim.COND_START)
def region_start_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Region operands map one to one onto body inputs."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    for i, shape in enumerate(result_shapes):
        for d, size in enumerate(shape):
            if i < len(operand_shapes) and operand_shapes[i][d] == size:
                fb.shared(size, operands=[(i, d)], results=[(i, d)])
    return fb.build()


@rule(prim.WHILE_END)
def while_end_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Body outputs ~ body carry inputs ~ loop results."""
    n_out = len(result_shapes)
    fb = FactorBuilder(operand_shapes, result_shapes)
    for i, shape in enumerate(result_shapes):
        for d, size in enumerate(shape):
            fb.shared(size, operands=[(i, d), (n_out + i, d)], results=[(i, d)])
    return fb.build()


@rule(prim.COND_END)
def cond_end_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Result i ~ output i of every branch."""
    n_out = len(result_shapes)
    fb = FactorBuilder(operand_shapes, result_shapes)
    n_branches = len(operand_shapes) // max(n_out, 1)
    for i, shape in enumerate(result_shapes):
        for d, size in enumerate(shape):
            fb.shared(
                size, operands=[(b * n_out + i, d) for b in range(n_branches)], results=[(i, d)]
            )
    return fb.build()
