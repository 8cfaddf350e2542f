"""XLA:CPU's tree reduction: the flops `cost_analysis()` counts for a reduce on the CPU backend.

XLA's `TreeReductionRewriter` (run by the CPU pipeline, to a fixed point) splits a reduce with a
reduced dim longer than 32 into a reduce-window of windows of `min(n, 32)` elements with stride
the window, padded (SAME) to a whole number of windows, then a reduce of the window results,
itself rewritten again while a reduced dim is longer than 32. So each reduced dim longer than 32
is reduced as if padded to a multiple of 32 (the padding elements are folded in too). Measured
on jaxlib 0.10.2 (CPU, f32): the sum of x[40, 40] over dim 0 counts 2,520 flops (1,560 folded),
over both 4,095 (1,599); of x[1025] 1,086 (1,024: 33 windows, then 33 results padded to 64).

The CPU leaves a reduce whose operand has 4,096 elements or more whole (x[4096]: 4,095;
x[48, 86] over dim 0: no reduce-window; x[48, 85]: tree), and never splits a variadic reduce
(argmax, argmin). TPU and GPU reduce differently, so this is the CPU view only
(`toast_core.apply.validate.cpu_flops`), not part of the cost model the search optimizes.
"""

from __future__ import annotations

from math import ceil, prod

#: Window of XLA:CPU's tree reduction (`TreeReductionRewriter(32)`).
CPU_REDUCE_WINDOW = 32
#: Operands of this many elements or more are reduced whole (measured: 4,095 split, 4,096 not).
CPU_TREE_MAX_ELEMENTS = 4096


def tree_folds(reduced: list[int]) -> int:
    """Combines XLA:CPU spends folding one output element's `reduced` dims (their local sizes),
    windows of padding included: `prod(reduced) - 1` when no dim is longer than the window."""
    if all(n <= CPU_REDUCE_WINDOW for n in reduced):
        return max(prod(reduced) - 1, 0)
    windows = [min(n, CPU_REDUCE_WINDOW) for n in reduced]
    counts = [ceil(n / w) for n, w in zip(reduced, windows)]
    return prod(counts) * (prod(windows) - 1) + tree_folds(counts)


def is_tree_reduced(shape: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """Whether XLA:CPU splits a reduce of a local operand of `shape` over `axes` into a
    reduce-window and a reduce (even when that costs the same folds: x[64] is 2 windows of 32)."""
    reduced = [shape[d] for d in axes]
    return (
        prod(shape) < CPU_TREE_MAX_ELEMENTS
        and prod(reduced) > 1
        and any(n > CPU_REDUCE_WINDOW for n in reduced)
    )


def tree_factor(shape: tuple[int, ...], axes: tuple[int, ...]) -> float:
    """XLA:CPU's flops for reducing a local operand of `shape` over `axes`, over the folds a
    reduce counts (operand elements - result elements): 1.0 when the CPU does not split it."""
    size = prod(shape)
    reduced = [shape[d] for d in axes]
    folded_per_output = prod(reduced) - 1
    if (
        size >= CPU_TREE_MAX_ELEMENTS
        or folded_per_output <= 0
        or all(n <= CPU_REDUCE_WINDOW for n in reduced)
    ):
        return 1.0
    return tree_folds(reduced) / folded_per_output


#: Layout ops XLA emits as bitcasts of a row-major operand (element order unchanged).
_VIEWS = frozenset({"reshape", "squeeze", "expand_dims"})


def dot_matrix_operand(prog, op, local: tuple[int, ...]) -> tuple[tuple[int, ...], tuple] | None:
    """(shape, axes) XLA:CPU reduces when reduction `op` folds every dim of a dot_general's
    result (read directly, or through row-major reshapes, with `local` its operand's local
    shape): the dot's own result, `[batch, lhs free, rhs free]` with each group of dims merged,
    of which the reshape is a bitcast; the simplifier reduces that instead of the bitcast, so the
    tree reduction's windows run along the merged dims (measured: the mean of
    `einsum("abc,deb->acde", v[12, 4, 3], x[12, 4, 4])`, a [36, 48] dot, counts 4,096 flops,
    the reduce-window padded to 64 x 64, not the 1,727 of a [12, 3, 12, 4] reduce with no dim
    over 32: fuzz seed 16 #947, 0.93 of XLA's flops). None otherwise."""
    reduced = tuple(op.param("axes", ()))
    if sorted(reduced) != list(range(len(local))):
        return None
    producers = prog.producers()
    v = op.operands[0]
    p = producers[v]
    direct = True
    while p is not None and prog.ops[p].primitive in _VIEWS and prog.ops[p].operands:
        direct = False
        v = prog.ops[p].operands[0]
        p = producers[v]
    if p is None or prog.ops[p].primitive != "dot_general":
        return None
    dot = prog.ops[p]
    shape = prog.values[dot.results[0]].shape
    if direct:
        shape = tuple(local)
    elif tuple(local) != prog.values[op.operands[0]].shape:
        return None  # a cut reshaped operand: its local grouping is not the dot's
    (lc, _), (lb, _) = dot.param("dimension_numbers")
    nb = len(lb)
    nl = prog.values[dot.operands[0]].rank - len(lc) - nb
    groups = (shape[:nb], shape[nb : nb + nl], shape[nb + nl :])
    merged = tuple(prod(g) for g in groups if g and prod(g) > 1)
    return merged, tuple(range(len(merged)))


def view_source_operand(prog, op, local: tuple[int, ...], source_local) -> tuple | None:
    """(shape, axes) XLA:CPU reduces when reduction `op` folds every dim of an operand made by
    row-major reshapes (`_VIEWS`) of a value no dot makes: the algebraic simplifier reduces the
    reshapes' source whole instead, so the tree reduction's windows run along the source's dims
    (measured on jaxlib 0.10.2: the sum of `x[4, 6, 12, 6].reshape(4, 6, 72)` counts 1,727
    flops, as x's own sum, not the 2,303 of a [4, 6, 72] sum with its dim of 72 tree-reduced;
    `x[40, 40].reshape(1600)` 4,095, `x[1600].reshape(40, 40)` 1,613; fuzz seed 16 #443, the
    mean of such a reshape, 1.30 of XLA's flops). `source_local(i)` is the local shape of op
    `i`'s first operand. None when `op` keeps a dim, when no reshape feeds it, when a dot makes
    the source (`dot_matrix_operand`), or when the source's local shape holds other elements
    than `local` (a cut the reshape moves)."""
    reduced = tuple(op.param("axes", ()))
    if sorted(reduced) != list(range(len(local))):
        return None
    producers = prog.producers()
    p = producers[op.operands[0]]
    last = None
    while p is not None and prog.ops[p].primitive in _VIEWS and prog.ops[p].operands:
        last = p
        p = producers[prog.ops[p].operands[0]]
    if last is None or (p is not None and prog.ops[p].primitive == "dot_general"):
        return None
    shape = tuple(source_local(last))
    if prod(shape) != prod(local):
        return None
    return shape, tuple(range(len(shape)))
