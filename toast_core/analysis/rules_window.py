"""Factor rules for windowed ops: pooling (`reduce_window*`) and its gradient
(`select_and_scatter_add`, the max-pool backward).

A dim whose window is trivial (size 1, stride 1, no padding or dilation) is an ordinary batch-like
dim and links operand to result. A windowed dim is modelled pessimistically: the operand dim must be
whole at the op (`replicate`: an all-gather if it was sharded) and the result's windowed dim does
not divide the op's work. XLA can partition windowed dims with halo exchanges; we do not price that
yet, so sharding across a pooling window never looks cheaper than it is.
"""

from __future__ import annotations

from toast_core.analysis.factors import FactorBuilder, OpFactors
from toast_core.analysis.rules import rule
from toast_core.ir import primitives as prim


def _param_at(op, name: str, d: int, default):
    """Entry d of a per-dim window param (`padding` entries as (lo, hi) tuples)."""
    values = op.param(name, None) or ()
    if d >= len(values):
        return default
    return tuple(values[d]) if name == "padding" else values[d]


def _is_trivial_window(op, d: int) -> bool:
    """Size-1 window with stride 1 and no padding or dilation along dim d."""
    return (
        _param_at(op, "window_dimensions", d, 1) == 1
        and _param_at(op, "window_strides", d, 1) == 1
        and _param_at(op, "padding", d, (0, 0)) == (0, 0)
        and _param_at(op, "base_dilation", d, 1) == 1
        and _param_at(op, "window_dilation", d, 1) == 1
    )


@rule(*sorted(prim.REDUCE_WINDOWS))
def reduce_window_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`reduce_window_max(x[B, H, W, C], window=(1, 2, 2, 1))`: B and C link x to the result; H and
        W replicate on x, and the result's H/2 and W/2 are its own `replicate` factors (with SAME padding
    and stride 1 the result dim shares x's `replicate` factor instead, as `cumsum` does). The generic
        `reduce_window` has n operands then n scalar init values; operand i pairs with result i."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    n = len(result_shapes)
    for d, size in enumerate(operand_shapes[0]):
        if _is_trivial_window(op, d) and result_shapes[0][d] == size:
            fb.shared(size, operands=[(i, d) for i in range(n)], results=[(i, d) for i in range(n)])
            continue
        results = [(i, d) for i in range(n)]
        if result_shapes[0][d] == size:  # SAME, stride 1: the result dim lines up with x's
            fb.shared(size, "replicate", operands=[(i, d) for i in range(n)], results=results)
            continue
        for i in range(n):
            fb.set_operand(i, d, fb.factor(size, "replicate"))
        fb.shared(result_shapes[0][d], "replicate", results=results)
    return fb.build()


@rule("select_and_scatter_add")
def select_and_scatter_add_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Max-pool gradient `select_and_scatter_add(dy[B, H/2, W/2, C], x[B, H, W, C]) -> dx[B, H, W,
    C]`: each dy element is added at the position of its window's maximum in x. Trivial-window dims
    link dy, x and dx; windowed dims replicate on dy and on x, and dx's matching dim shares x's
    `replicate` factor (dx is computed whole there, then kept sharded like x)."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    source, operand = operand_shapes[0], operand_shapes[1]
    for d, size in enumerate(operand):
        if _is_trivial_window(op, d) and source[d] == size:
            fb.shared(size, operands=[(0, d), (1, d)], results=[(0, d)])
            continue
        fb.set_operand(0, d, fb.factor(source[d], "replicate"))
        fb.shared(size, "replicate", operands=[(1, d)], results=[(0, d)])
    return fb.build()
