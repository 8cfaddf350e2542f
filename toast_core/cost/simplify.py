"""What XLA's simplifier leaves to compute: dead code, constants, and work done on broadcasts.

`cost_analysis()` counts the optimized program, not the jaxpr, and three rewrites of XLA's
pipeline change the count by whole ops (measured on jaxlib 0.10.2, CPU, `tests/test_flops.py`):

* **Dead code.** An op none of whose results reaches an output is removed. `jax.grad` inside a
  gradient-accumulation loop still computes the forward's loss value, which nothing reads: a
  2-micro-batch accumulation of `x @ w` compiles to one matmul per step, not two.
* **Constants.** An op whose operands are all compile-time constants (literals, closed-over
  arrays, broadcasts of those) is folded: the cotangent seed `1/N` of a mean loss and everything
  computed from it alone cost nothing.
* **Scalings.** Multiplies and divides by constant scalars in a row are one multiply
  (`(g / 2) * 0.1`, gradient accumulation's average then SGD's learning rate).
* **Work on broadcasts.** An elementwise op whose non-scalar operands are all broadcast along the
  same dims runs before the broadcast (`tanh(broadcast(a[4]) -> [4, 32])` costs 4, not 128); a
  reduction over a broadcast reduces the original (`sum(broadcast(a[4]) -> [4, 32], axis=1)` is a
  multiply: 4); a dot_general without contracted dims is an elementwise multiply of two broadcasts
  (one flop per result element, and fewer when an operand is itself a broadcast: the gradient of
  `mean(x @ w)` wrt `w[24, 8]` is `broadcast(x * 1/8)`, 24 flops). A dot_general that contracts
  is computed in full even when an operand is a broadcast.

`work_factors(prog)` gives, per op, the fraction of its jaxpr flops (`flops.py`) that remain.
A value's *uniform dims* are those along which it is a broadcast, as XLA sees it (a `[4, 32]`
broadcast of `a[4]` is uniform along dim 1). Sharding a uniform dim does not divide the remaining
work; the model neglects that (the cores are small: a scalar or a vector).

Example: an SGD step on `mean(x[24] @ w[24, 8])`: the gradient `outer(x, broadcast(1/8))` costs
24 (not 384), the update `w - 0.1 * g` multiplies the core (24) and subtracts in full (192).
"""

from __future__ import annotations

from math import prod

from toast_core.analysis.factors import mixed_radix_groups
from toast_core.ir import primitives as prim
from toast_core.ir.program import Op, Program

_CONSTANT_ROLES = ("literal", "constant")
#: Ops that never fold: they create or draw data, or mark regions.
_NEVER_CONSTANT = prim.CREATION | prim.RANDOM_KEYS | prim.REGION_BOUNDARIES | {"random_bits"}


def live_ops(prog: Program) -> list[bool]:
    """Whether each op's work reaches an output (XLA removes the others). Walks the ops backwards
    from the outputs; region boundary ops link loop bodies to their results like any op."""
    needed = [False] * len(prog.values)
    for v in prog.outputs:
        needed[v] = True
    live = [False] * len(prog.ops)
    for op in reversed(prog.ops):
        if any(needed[r] for r in op.results):
            live[op.index] = True
            for v in op.operands:
                needed[v] = True
    return live


def constant_values(prog: Program) -> list[bool]:
    """Whether each value is a compile-time constant XLA folds (made from literals and constants
    alone)."""
    const = [v.role in _CONSTANT_ROLES for v in prog.values]
    for op in prog.ops:
        if op.operands and op.primitive not in _NEVER_CONSTANT:
            if all(const[v] for v in op.operands):
                for r in op.results:
                    const[r] = True
    return const


def uniform_dims(prog: Program) -> list[frozenset[int]]:
    """Per value, the dims along which XLA sees it as a broadcast (see module docstring)."""
    uni: list[frozenset[int]] = [frozenset()] * len(prog.values)
    for op in prog.ops:
        rule = _UNIFORM_RULES.get(op.primitive)
        if rule is None and op.primitive in prim.ELEMENTWISE:
            rule = _elementwise_uniform
        if rule is None or len(op.results) != 1:
            continue
        uni[op.results[0]] = rule(op, prog, uni)
    return uni


def merged_scalings(prog: Program, const: list[bool]) -> set[int]:
    """Ops XLA merges into the next one: a multiply or divide by a constant scalar whose only
    reader is another (`(g / 2) * 0.1` is one multiply by 0.05)."""
    uses = prog.uses()
    producers = prog.producers()
    out = set()
    for op in prog.ops:
        inner = _scaled_operand(op, prog, const)
        if inner is None or prog.values[inner].is_output or len(uses[inner]) != 1:
            continue
        p = producers[inner]
        if p is not None and _scaled_operand(prog.ops[p], prog, const) is not None:
            out.add(p)
    return out


def _scaled_operand(op: Op, prog: Program, const: list[bool]) -> int | None:
    """The operand `x` of `x * c`, `c * x` or `x / c` with `c` a constant scalar, else None."""
    if op.primitive not in ("mul", "div") or len(op.operands) != 2:
        return None
    a, b = op.operands

    def scalar_const(v: int) -> bool:
        return const[v] and prog.values[v].rank == 0

    if scalar_const(b) and not const[a]:
        return a
    if op.primitive == "mul" and scalar_const(a) and not const[b]:
        return b
    return None


def work_factors(prog: Program) -> list[float]:
    """Per op, the fraction of its jaxpr flops XLA still computes: 0 when dead, constant or
    merged into the next scaling, the broadcast core's share on broadcasts, else 1."""
    live = live_ops(prog)
    const = constant_values(prog)
    uni = uniform_dims(prog)
    merged = merged_scalings(prog, const)
    out = []
    for op in prog.ops:
        if (
            not live[op.index]
            or op.index in merged
            or (op.results and all(const[r] for r in op.results))
        ):
            out.append(0.0)
        elif op.primitive in prim.ELEMENTWISE or _is_outer_product(op):
            out.append(_core_fraction(prog.values[op.results[0]].shape, uni[op.results[0]]))
        elif op.primitive in prim.REDUCTIONS:
            out.append(_reduction_fraction(op, prog, uni))
        else:
            out.append(1.0)
    return out


# --- uniform dims, per primitive ----------------------------------------------------------------


def _scalar_or(prog: Program, vid: int, uni) -> frozenset[int] | None:
    """Uniform dims of an operand; None for a scalar (uniform along every dim)."""
    return None if prog.values[vid].rank == 0 else uni[vid]


def _elementwise_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    sets = [s for s in (_scalar_or(prog, v, uni) for v in op.operands) if s is not None]
    if not sets:
        return frozenset()
    return frozenset.intersection(*sets)


def _broadcast_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    shape = op.param("shape", ())
    bdims = tuple(op.param("broadcast_dimensions", ()))
    src = prog.values[op.operands[0]]
    out = {d for d in range(len(shape)) if d not in bdims and shape[d] > 1}
    for j, d in enumerate(bdims):
        if j in uni[src.id] or (src.shape[j] == 1 and shape[d] > 1):
            out.add(d)
    return frozenset(out)


def _transpose_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    perm = op.param("permutation", ())
    src = uni[op.operands[0]]
    return frozenset(d for d, p in enumerate(perm) if p in src)


def _reshape_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    """A group of result dims made of operand dims that are all uniform stays uniform."""
    a = prog.values[op.operands[0]].shape
    b = prog.values[op.results[0]].shape
    src = uni[op.operands[0]]
    out: set[int] = set()
    for ga, gb, _ in mixed_radix_groups(tuple(a), tuple(b)):
        if all(d in src for d in ga):
            out.update(gb)
    return frozenset(out)


def _reduction_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    axes = set(op.param("axes", ()))
    kept = [d for d in range(prog.values[op.operands[0]].rank) if d not in axes]
    return frozenset(i for i, d in enumerate(kept) if d in uni[op.operands[0]])


def _dot_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    """Only an outer product (no contracted dims) stays a broadcast: XLA rewrites it into an
    elementwise multiply of its two operands broadcast to the result."""
    if not _is_outer_product(op):
        return frozenset()
    lhs_side, rhs_side = _outer_operand_uniform(op, prog, uni)
    return lhs_side & rhs_side


_UNIFORM_RULES = {
    "broadcast_in_dim": _broadcast_uniform,
    "transpose": _transpose_uniform,
    "reshape": _reshape_uniform,
    "squeeze": _reshape_uniform,
    "expand_dims": _reshape_uniform,
    "dot_general": _dot_uniform,
    **{name: _reduction_uniform for name in prim.REDUCTIONS},
}


# --- remaining work -------------------------------------------------------------------------------


def _is_outer_product(op: Op) -> bool:
    if op.primitive != "dot_general":
        return False
    (lc, _), _ = op.param("dimension_numbers")
    return not lc


def _outer_operand_uniform(op: Op, prog: Program, uni) -> tuple[frozenset[int], frozenset[int]]:
    """For an outer product `[batch..., lhs free..., rhs free...]`: the result dims along which
    each operand, broadcast to the result, is uniform."""
    (_, _), (lb, rb) = op.param("dimension_numbers")
    lhs, rhs = prog.values[op.operands[0]], prog.values[op.operands[1]]
    lfree = [d for d in range(lhs.rank) if d not in lb]
    rfree = [d for d in range(rhs.rank) if d not in rb]
    nb = len(lb)
    l_out = {d: nb + i for i, d in enumerate(lfree)} | {d: i for i, d in enumerate(lb)}
    r_out = {d: nb + len(lfree) + i for i, d in enumerate(rfree)} | {d: i for i, d in enumerate(rb)}
    rank = nb + len(lfree) + len(rfree)
    lhs_side = set(range(rank)) - set(l_out.values()) | {l_out[d] for d in uni[lhs.id]}
    rhs_side = set(range(rank)) - set(r_out.values()) | {r_out[d] for d in uni[rhs.id]}
    return frozenset(lhs_side), frozenset(rhs_side)


def _core_fraction(shape: tuple[int, ...], uniform: frozenset[int]) -> float:
    return 1.0 / prod(shape[d] for d in uniform) if uniform else 1.0


def _reduction_fraction(op: Op, prog: Program, uni) -> float:
    """A reduction over dims that are all broadcast is a multiply of the core (a sum) or nothing
    (max, min); otherwise it folds the core of its operand into the core of its result."""
    src = prog.values[op.operands[0]]
    res = prog.values[op.results[0]]
    u = uni[src.id]
    axes = set(op.param("axes", ()))
    base = src.size - res.size
    if not u or not base:
        return 1.0
    core_in = prod(s for d, s in enumerate(src.shape) if d not in u)
    core_out = prod(s for d, s in enumerate(src.shape) if d not in u and d not in axes)
    if axes <= u:
        flops = core_out if op.primitive in ("reduce_sum", "reduce_prod") else 0
    else:
        flops = core_in - core_out
    return flops / base
