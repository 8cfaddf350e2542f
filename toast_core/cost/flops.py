"""Global FLOP counts per op (before sharding), as XLA's `cost_analysis()` counts them.

* dot_general: `2 * batch * M * N * K` = 2 x result elements x contracted elements;
* conv_general_dilated: 2 x output elements x (input features per group x kernel window);
* elementwise ops: one per result element; reductions and scans: one per operand element;
* layout ops (reshape, transpose, broadcast, gather, slicing...): zero (they only move bytes).

Ops inside a `scan` body are multiplied by the trip count.
"""

from __future__ import annotations

from math import prod

from toast_core.analysis.rules import ELEMENTWISE
from toast_core.ir.program import Op, Program

_FREE = frozenset(
    {
        "convert_element_type",
        "copy",
        "copy_p",
        "device_put",
        "optimization_barrier",
        "sharding_constraint",
        "stop_gradient",
        "select_n",
    }
)
_COUNT_RESULT = frozenset(ELEMENTWISE) - _FREE
_COUNT_OPERAND = frozenset(
    {
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "reduce_xor",
        "argmax",
        "argmin",
        "cumsum",
        "cumprod",
        "cummax",
        "cummin",
        "cumlogsumexp",
        "scatter-add",
        "scatter_add",
    }
)


def op_flops(op: Op, program: Program) -> float:
    """FLOPs of one execution of `op` on whole (unsharded) arrays."""
    values = program.values
    if op.primitive == "dot_general":
        (lc, _), _ = op.param("dimension_numbers")
        lhs = values[op.operands[0]].shape
        return 2.0 * values[op.results[0]].size * prod(lhs[d] for d in lc)
    if op.primitive == "conv_general_dilated":
        dn = dict(op.param("dimension_numbers"))
        rhs = values[op.operands[1]].shape
        out_features = rhs[dn["rhs_spec"][0]]
        return 2.0 * values[op.results[0]].size * prod(rhs) / max(out_features, 1)
    if op.primitive in _COUNT_RESULT:
        return float(sum(values[r].size for r in op.results))
    if op.primitive in _COUNT_OPERAND:
        return float(values[op.operands[0]].size)
    return 0.0
