"""The flops of XLA's own loop control, which no op of the traced program stands for.

XLA lowers every `scan` and `while_loop` to an HLO `while` whose condition compares a counter
(`compare`, 1 flop) and whose body increments it (`add`, 1 flop); `cost_analysis()` counts both
once, as it counts the body once whatever the trip count. Measured on this jaxlib: `scan(c + r)`
over x[4, 8] counts 10 flops (8 adds, the counter's add and compare), two such scans 20.

* A `scan` adds both: its counter is not in the jaxpr.
* A `scan` whose carry already steps an int scalar by one (`fori_loop` lowers to a scan carrying
  `i` and `i + 1`) adds only the compare: XLA merges the two induction variables into one, whose
  add is the program's own (`fori_loop(0, 4, lambda i, c: c + x[i], ...)`: 13 flops = 8 adds,
  the index wrap's compare, add and select, the counter's add and the loop's compare).
* A `scan` of one step adds nothing: XLA's while-loop simplifier inlines its body (fuzz seed
  18 #1129: a one-step scan beside two dots counts the dots' flops alone).
* A `while_loop`'s counter step is the program's own op; its condition is a jaxpr the trace
  does not walk, counted here as the one compare of `i < n` (the form of gradient-accumulation
  loops; fuzz seed 16's `accum_while` programs).
* A loop repeating an earlier one (same operands, condition and body) adds nothing: XLA's CSE
  merges the two `while`s (`simplify._same_loop`; fuzz seed 19 #690).

Tiny training steps are where this shows: fuzz seed 16 #812, an accumulated `x @ w` gradient,
predicted 6.25 flops of XLA's 9, two of them the scan's counter.
"""

from __future__ import annotations

import re

from toast_core.cost.simplify import cse_repeats
from toast_core.ir import primitives as prim
from toast_core.ir.program import Program

_ENDS = (prim.WHILE_END, prim.SCAN_END)

#: Flops of an HLO while's counter: the condition's compare and the body's add.
COUNTER_FLOPS = 2.0


def loop_control_flops(program: Program) -> float:
    """Flops of the loop control XLA adds to `program`'s loops, each loop once (module essay)."""
    producers = program.producers()
    repeats = _merged_loops(program)
    total = 0.0
    for op in program.ops:
        if op.index in repeats:
            continue  # merged into an identical loop by XLA's CSE (`simplify._same_loop`)
        if op.primitive == prim.WHILE_END:
            total += COUNTER_FLOPS - 1  # the condition's compare; the step is a body op
        elif op.primitive == prim.SCAN_END and op.param("length") == 1:
            continue  # inlined: no loop left (`simplify.rewired`)
        elif op.primitive == prim.SCAN_END:
            merged = _steps_an_int_counter(program, op, producers)
            total += COUNTER_FLOPS - 1 if merged else COUNTER_FLOPS
    return total


def _merged_loops(program: Program) -> set[int]:
    """The loop end ops whose loops XLA's CSE merges into an earlier identical loop."""
    if not any(op.primitive in _ENDS for op in program.ops):
        return set()
    same = cse_repeats(program)
    return {
        op.index
        for op in program.ops
        if op.primitive in _ENDS and op.results and all(same[r] != r for r in op.results)
    }


def _steps_an_int_counter(program: Program, end, producers) -> bool:
    """Whether a scan's carry holds an int scalar the body steps by one (`i + 1`)."""
    n_carry = int(end.param("num_carry", 0))
    if not n_carry:
        return False
    carry_out = end.operands[:n_carry]
    carry_in = end.operands[len(end.operands) - n_carry :]
    for c_in, c_out in zip(carry_in, carry_out):
        v = program.values[c_in]
        if v.rank or not v.dtype.startswith(("int", "uint")):
            continue
        p = producers[c_out]
        if p is None or program.ops[p].primitive != "add":
            continue
        a, b = program.ops[p].operands
        other = b if a == c_in else a if b == c_in else None
        if other is not None and _is_literal_one(program, other):
            return True
    return False


#: A scalar literal 1 as the trace names it: `lit(1)`, or `lit(TypedInt(1, dtype=int32))` (the
#: `i + 1` of a `fori_loop`).
_ONE = re.compile(r"lit\((?:TypedInt\()?1(?:\.0)?[,)]")


def _is_literal_one(program: Program, vid: int) -> bool:
    v = program.values[vid]
    return v.role == "literal" and not v.rank and _ONE.match(v.name) is not None
