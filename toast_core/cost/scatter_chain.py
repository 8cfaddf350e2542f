"""Where XLA turns a partial sum into a reduce-scatter: at its uses, or after layout-only ops.

A sharded reduction leaves a partial sum; XLA's SPMD partitioner all-reduces it and each device
then slices its own piece wherever a reader wants it sharded. On TPU and GPU, XLA's
reduce-scatter creator (`MatchReduceScatter`, openxla/xla `xla/service/collective_opt_utils.cc`)
fuses the two into one reduce-scatter when the all-reduce's single user is that dynamic-slice,
through at most an intervening reshape or bitcast whose split dims are unmodified. XLA's
algebraic simplifier first folds the ops that only add or drop size-1 dims (a reshape
`[D] -> [1, 1, D]`, a `reduce_sum` over size-1 dims, `squeeze`, `expand_dims`) into bitcasts.

So the cost model looks for the slice not only at the partial sum's own uses but also along
the chain of such size-1 reshapes that follows it, each link the only use of the value before
it (`scatter_values`). Worked example: a LayerNorm bias gradient under FSDP is
`reduce_sum(dy, (0, 1))` of shape [D], partial over `data`; the train step reads it as
`reshape -> [1, 1, D]`, then `reduce_sum` over the two size-1 dims (the transpose of a
broadcast), whose result the Adam update reads sharded `[D_data]`. XLA compiles
all-reduce -> bitcast -> dynamic-slice: one reduce-scatter (measured: GPT-2 train step,
fsdp_megatron on 2x4).

XLA's simplifier also moves a dynamic-slice ahead of a transpose (slice, then transpose the
piece), so a transpose continues the chain too (measured: the [256, 64] weight gradients of
the label-smoothing MLP under FSDP, transposed back to [64, 256] before the update; the
compiled fusion slices the all-reduce, then transposes).

Elementwise ops in between stop it: XLA computes them on the whole all-reduced buffer and
slices afterwards, and the all-reduce stays one (measured: Adam's second moment `g * g` of the
MoE embedding gradient under FSDP; the compiled fusion multiplies the [V, D] all-reduce whole,
then takes the device's rows).
"""

from __future__ import annotations

import math
from collections.abc import Collection

from toast_core.ir import Program

__all__ = ["SIZE_ONE_RESHAPES", "scatter_values"]

#: Primitives that are a plain reshape when they only add or drop size-1 dims.
SIZE_ONE_RESHAPES = frozenset(
    {
        "broadcast_in_dim",
        "expand_dims",
        "reduce_max",
        "reduce_min",
        "reduce_sum",
        "reshape",
        "squeeze",
    }
)


def _big_dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _size_one_reshape_of(prog: Program, op_index: int, value: int) -> int | None:
    """The result of op `op_index` if it only adds or drops size-1 dims of `value` (its first
    operand) or transposes it, else None."""
    op = prog.ops[op_index]
    if len(op.results) != 1 or not op.operands or op.operands[0] != value:
        return None
    if op.primitive == "transpose":
        return op.results[0]
    if op.primitive not in SIZE_ONE_RESHAPES:
        return None
    src, dst = prog.values[value].shape, prog.values[op.results[0]].shape
    if math.prod(src) != math.prod(dst) or _big_dims(src) != _big_dims(dst):
        return None
    return op.results[0]


def scatter_values(
    prog: Program, value: int, uses: list, cut_uses: Collection[tuple[int, int]]
) -> tuple[int, ...]:
    """The values whose readers may take a partial sum `value` as a reduce-scatter: `value`
    itself and each value down its chain of size-1 reshapes and transposes (module essay), each
    the only use of the one before it. A value qualifies when it is no program output and each of its uses
    is a possible cut (`cut_uses`: where a reader may want it sharded); the cost model then
    reduce-scatters over the mesh axes every use of it holds (`Evaluator._scatter_masks`).

    `uses[v]` lists the (op, position) uses of value v (`Program.uses()`).
    """
    out = []
    current = value
    while True:
        here = uses[current]
        if here and not prog.values[current].is_output and all(u in cut_uses for u in here):
            out.append(current)
        if len(here) != 1 or prog.values[current].is_output:
            return tuple(out)
        op_index, position = here[0]
        if position != 0:
            return tuple(out)
        following = _size_one_reshape_of(prog, op_index, current)
        if following is None:
            return tuple(out)
        current = following
