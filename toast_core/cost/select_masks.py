"""Where a predicate's conversion to numbers is computed, once XLA's simplifier has turned its
multiplies into selects.

`convert(p) * x` is `select(p, x, 0)` after XLA's simplifier (`simplify.masking_converts`): the
multiply's loop reads the predicate, not the convert. When the convert has other readers too, it
is computed only in their loops. The gradient of `max(x, axis)` is the textbook case: the mask
`convert(x == max)` is summed (the tie count) and multiplied by the cotangent; XLA computes the
convert in the sum's fusion alone (measured on `x[16, 12, 8]`, axis 0: 9,216 flops; counting the
convert in the select's loop too gave 10,752, 1.17 of XLA's).
"""

from __future__ import annotations

from toast_core.ir.program import Program

_PREDICATES = ("bool", "pred")


def convert_copies(prog: Program, roots: list[frozenset[int]]) -> dict[int, int]:
    """Per predicate convert read both by multiplies and by other ops: how many fusions compute
    it (those of its other readers, and its own when it roots one). `roots` [ops]: the fusions
    computing each op (`fusion.fusion_work`'s `roots_out`)."""
    uses = prog.uses()
    out: dict[int, int] = {}
    for op in prog.ops:
        if op.primitive != "convert_element_type" or len(op.operands) != 1 or not op.results:
            continue
        if prog.values[op.operands[0]].dtype not in _PREDICATES:
            continue
        readers = uses[op.results[0]]
        if not any(prog.ops[o].primitive == "mul" for o, _ in readers):
            continue
        others = [o for o, _ in readers if prog.ops[o].primitive != "mul"]
        if not others:
            continue  # all multiplies: free (`masking_converts`)
        fusions = set().union(*(roots[o] for o in others))
        if op.index in roots[op.index]:
            fusions.add(op.index)
        if fusions and len(fusions) < len(roots[op.index]):
            out[op.index] = len(fusions)
    return out
