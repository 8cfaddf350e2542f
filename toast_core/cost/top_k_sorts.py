"""A `top_k` that keeps its whole dim is a sort to XLA, not its `TopK` call.

`lax.top_k(x, k)` with k the size of x's last dim orders every element: XLA's expander rewrites
it into a `sort` of (x, iota) and, when nothing reads the indices, the simplifier drops the iota
operand: a sort of the values alone, which writes one buffer and no tuple. The indices are then
never made. Measured (XLA:CPU, x f32[16, 8, 2], k = 2): `top_k(x, 2)[0].reshape(128, 2)` as
the only output is 2,048 bytes, the parameter and the sort's values (the reshape a bitcast of
them, the output's buffer); the model held the unread s32 indices as well, 3,072 (fuzz seed 17
#867: the same f32[16, 8, 2] indices, 1,024 of its 3,488 predicted bytes, XLA 2,464). With the
indices read XLA sorts (values, iota) and both are written, as the call writes them.

A `top_k` XLA:CPU runs as its `TopK` custom call counts -1 flop in `cost_analysis()`: the cost
analysis marks a custom call's flops unknown with -1 (`HloCostAnalysis::HandleCustomCall`) and
the module's total adds that in (`top_k_call_flops`). Measured: `lax.top_k(x, 2)[0] * 2.0` of x
f32[8, 16] counts 15 flops (16 multiplies), two calls 2 less, a call in a scan body 1 less once;
fuzz seed 19 #117, a lone `top_k` with its result cut, 1 flop compiled (2 scalar offsets).
"""

from __future__ import annotations

from dataclasses import replace

from toast_core.cost.flops_measured import top_k_stays_a_sort
from toast_core.cost.simplify import live_ops, rewired
from toast_core.ir.program import Program

#: What `cost_analysis()` adds for one custom call: its flops, marked unknown (module essay).
CUSTOM_CALL_FLOPS = -1.0


def keeps_whole_dim(prog: Program, op) -> bool:
    """Whether `top_k` op keeps every element of its dim (k == the dim's size). A dead top_k
    (`simplify.without_dead_ops` leaves it no operand) keeps nothing."""
    if not op.operands:
        return False
    shape = prog.values[op.operands[0]].shape
    axis = op.param("axis", len(shape) - 1)
    return bool(shape) and -len(shape) <= axis < len(shape) and op.param("k", 0) >= shape[axis]


def sorts_values_alone(prog: Program, op) -> bool:
    """Whether `top_k` op is XLA's sort of the values alone: it keeps its whole dim and neither
    an op nor the program's outputs read its indices."""
    if op.primitive != "top_k" or len(op.results) < 2 or not keeps_whole_dim(prog, op):
        return False
    uses, outputs = prog.uses(), set(prog.outputs)
    return not any(uses[r] or r in outputs for r in op.results[1:])


def whole_dim_sorts(prog: Program) -> Program:
    """`prog` with each `top_k` that XLA sorts the values of alone making its values only: its
    unread indices have no producer, so no buffer (same ops, values and ids otherwise)."""
    alone = {op.index for op in prog.ops if sorts_values_alone(prog, op)}
    if not alone:
        return prog
    ops = tuple(replace(op, results=op.results[:1]) if op.index in alone else op for op in prog.ops)
    return replace(prog, ops=ops)


def top_k_call_flops(prog: Program) -> float:
    """The flops `cost_analysis()` adds for the `TopK` custom calls of `prog` (module essay): one
    per live `top_k` XLA:CPU does not leave a sort, a repeat CSE merges into an earlier one
    counted once, a call in a loop body once (as the body is)."""
    if not any(op.primitive == "top_k" for op in prog.ops):
        return 0.0
    simple = rewired(prog, barriers=False)
    live = live_ops(simple)
    calls = sum(
        1
        for op in prog.ops
        if op.primitive == "top_k" and live[op.index] and not top_k_stays_a_sort(op, prog)
    )
    return calls * CUSTOM_CALL_FLOPS
