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
