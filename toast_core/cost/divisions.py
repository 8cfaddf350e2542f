"""Divisions XLA's simplifier rewrites into more work: the multiplies they add.

`AlgebraicSimplifierVisitor::HandleDivide` rewrites, once a division by a constant has become a
multiply by its reciprocal:

* `(A / B) / C` to `A / (B * C)`, `A / (B / C)` to `(A * C) / B`, and `(A / B) / (C / D)` to
  `(A * D) / (B * C)`: each inner division is replaced by a multiply. When the inner division
  has no other reader it is dead and the count is unchanged; when it has (a program output, or
  another op reading it: the fuzzer's `v / (1 + v * v)` applied to a division), it stays, and
  the multiply is one more flop per element. Measured on [16, 32] (jaxlib 0.10.2, CPU):
  `((a / b) / c, (a / b) ** 2)` counts 4 flops per element, not 3; `(a / b) / c` alone 2.
* `A / exp(B)` to `A * exp(-B)`: the negate is one more flop per element (`a / exp(b)`: 2).

These are target-independent rewrites, priced in the model itself (`simplify.work_factors`).
"""

from __future__ import annotations

from toast_core.ir.program import Program


def divided_divisions(prog: Program, const: list[bool]) -> dict[int, int]:
    """Per live division of `prog` (a `rewired`, dead-pruned program: a dead reader reads
    nothing), the elementwise ops XLA's divide rewrites add to it (see the module docstring).
    `const`: per value, whether it is a compile-time constant (`simplify.constant_values`)."""
    uses = prog.uses()
    producers = prog.producers()
    outputs = set(prog.outputs)

    def division(v: int) -> int | None:
        """The op producing `v` if it is a division by a non-constant (one by a constant is a
        multiply by the reciprocal by then), else None."""
        p = producers[v]
        if p is None:
            return None
        op = prog.ops[p]
        if op.primitive != "div" or len(op.operands) != 2 or const[op.operands[1]]:
            return None
        return p

    def kept(v: int, reader: int) -> bool:  # read by something besides `reader`
        return v in outputs or any(i != reader for i, _ in uses[v])

    out: dict[int, int] = {}
    for op in prog.ops:
        if op.primitive != "div" or len(op.operands) != 2 or not op.results:
            continue
        a, b = op.operands
        if const[b] or const[a]:
            continue
        divisor = producers[b]
        if divisor is not None and prog.ops[divisor].primitive == "exp":
            out[op.index] = 1  # A / exp(B) -> A * exp(-B): the negate
            continue
        inner = [v for v in (a, b) if division(v) is not None]
        extra = sum(1 for v in inner if kept(v, op.index))
        if extra:
            out[op.index] = extra
    return out
