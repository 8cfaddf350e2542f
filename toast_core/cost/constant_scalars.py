"""The values of the scalars XLA's constant folder computes, for the selects it then removes.

`jnp.var(x, axis)` ends with JAX's ddof guard `where(N - ddof > 0, sum / (N - ddof), nan)`: the
predicate is made from literals alone, so XLA folds it and the select with it, keeping the
chosen case (measured: `var(x[16, 12, 8], axis=0)` counts 6,144 flops, no select; the model
counted the [12, 8] select too). Knowing which case survives needs the predicate's value, so
the scalar chains of literals are evaluated here; anything else is left unknown (None).

Example: `lit(16.0) - convert(lit(0))` is 16.0, `16.0 > 0.0` is True, and `select_n(True, nan,
s)` is `s`.
"""

from __future__ import annotations

import math
import operator

from toast_core.ir.program import Program

#: Scalar ops the folder evaluates, by primitive.
_BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": lambda a, b: a / b if b else math.nan,
    "max": max,
    "min": min,
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
    "eq": operator.eq,
    "ne": operator.ne,
}
_UNARY = {"neg": operator.neg, "convert_element_type": lambda a: a, "copy": lambda a: a}


def literal_scalar(name: str) -> float | bool | None:
    """The value of a scalar literal from its IR name (`lit(16.0)`, `lit(nan)`, `lit(True)`,
    `lit(TypedInt(0, dtype=int32))`), else None."""
    if not (name.startswith("lit(") and name.endswith(")")):
        return None
    text = name[4:-1]
    if text.startswith("Typed") and "(" in text:
        text = text[text.index("(") + 1 :].split(",")[0]
    if text in ("True", "False"):
        return text == "True"
    try:
        return float(text)
    except ValueError:
        return None


def constant_scalars(prog: Program) -> dict[int, float | bool]:
    """Value id -> value, for each scalar literal and each scalar made from them alone by the
    ops above (in program order, so one pass)."""
    out: dict[int, float | bool] = {}
    for v in prog.values:
        if v.role == "literal" and not v.shape:
            val = literal_scalar(v.name)
            if val is not None:
                out[v.id] = val
    for op in prog.ops:
        if len(op.results) != 1 or prog.values[op.results[0]].shape:
            continue
        args = [out.get(x) for x in op.operands]
        if not args or None in args:
            continue
        try:
            if op.primitive in _BINARY and len(args) == 2:
                out[op.results[0]] = _BINARY[op.primitive](*args)
            elif op.primitive in _UNARY and len(args) == 1:
                out[op.results[0]] = _UNARY[op.primitive](args[0])
        except (TypeError, ValueError, OverflowError):
            continue
    return out


def chosen_case(op, scalars: dict[int, float | bool]) -> int | None:
    """The operand a `select_n` with a folded scalar predicate returns, else None: case
    `int(predicate)` (False picks the first case, True the second)."""
    if op.primitive != "select_n" or len(op.operands) < 2:
        return None
    pred = scalars.get(op.operands[0])
    if pred is None or isinstance(pred, float) and math.isnan(pred):
        return None
    k = int(pred)
    cases = op.operands[1:]
    return cases[k] if 0 <= k < len(cases) else None
