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
  `mean(x @ w)` wrt `w[24, 8]` is `broadcast(x * 1/8)`, 24 flops; none when the broadcast is
  of 1.0, a `sum`'s cotangent: `_splats_of_one`). A dot_general that contracts is computed in
  full even when an operand is a broadcast. A sum over broadcast dims then scaled by a constant
  is one multiply, none when the constants' product is 1 (`folded_broadcast_sums`: the mean
  of a broadcast is its source).

* **Identities and repeats** (`rewired`): `x + 0`, `x * 1`, `max(x, x)`, `select(p, x, x)`
  are `x`; an op repeating an earlier one on the same operands is CSE'd away.
* **Clamps.** `min(max(x, lo), hi)` with constant scalar bounds (`jnp.clip`) is one op.
* **Onto the smaller side** (`moved_to_smaller`): `sum(-x)` is `-sum(x)`, and
  `(c * x) * broadcast(y)` is `x * broadcast(c * y)`.
* **Masks.** `convert(p) * x` with `p` a predicate is `select(p, x, 0)`: the convert is free
  (`masking_converts`; `jax.nn.one_hot(i, n) * s`, a float mask times an array).
* **Conditionals.** `HloCostAnalysis` prices a `cond` as its costliest branch, and the predicate
  is work like any other (`cond_branches`).

These are rewrites of XLA's target-independent pipeline (algebraic simplifier, CSE, DCE) and
of its cost analysis, so they hold for TPU and GPU as for the CPU the comparison runs on: they
are priced in the model itself, not only where predictions are compared with XLA:CPU.

`work_factors(prog)` gives, per op, the fraction of its jaxpr flops (`flops.py`) that remain.
A value's *uniform dims* are those along which it is a broadcast, as XLA sees it (a `[4, 32]`
broadcast of `a[4]` is uniform along dim 1). Sharding a uniform dim does not divide the remaining
work; the model neglects that (the cores are small: a scalar or a vector).

Example: an SGD step on `mean(x[24] @ w[24, 8])`: the gradient `outer(x, broadcast(1/8))` costs
24 (not 384), the update `w - 0.1 * g` multiplies the core (24) and subtracts in full (192).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import replace
from math import copysign, prod

import numpy as np

from toast_core.analysis.factors import mixed_radix_groups
from toast_core.cost.constant_scalars import chosen_case, constant_scalars
from toast_core.cost.divisions import divided_divisions
from toast_core.cost.dot_products import as_sums
from toast_core.cost.flops import one_window_test_flops, op_flops, spread_divisor_elements
from toast_core.cost.flops_measured import (
    EXPANDED,
    EXPANDED_ON_BROADCAST,
    expanded_extra_copies,
    scan_combines,
)
from toast_core.cost.fusion import (
    EXPANDED_APART_ON_BROADCAST,
    REASSOCIATED,
    _duplicable,
    _kept_once,
    _root_op,
    fusible,
    fusion_work,
    materialized,
)
from toast_core.cost.gather_fusion import gather_copies
from toast_core.cost.select_masks import convert_copies
from toast_core.ir import primitives as prim
from toast_core.ir.program import Op, Program, Value

_CONSTANT_ROLES = ("literal", "constant")
#: Ops that never fold: they create or draw data, or mark regions.
_NEVER_CONSTANT = prim.CREATION | prim.RANDOM_KEYS | prim.REGION_BOUNDARIES | {"random_bits"}


def live_ops(prog: Program) -> list[bool]:
    """Whether each op's work reaches an output (XLA removes the others). Walks the ops backwards
    from the outputs; region boundary ops link loop bodies to their results like any op.

    An op making only empty arrays reads nothing: XLA's simplifier replaces it by a constant, so
    what only it reads is dead. jnp.pad's edge mode slices each side's edge row and broadcasts it
    to the side's width, zero for a dim it does not pad (measured, jaxlib 0.10.2 CPU: an edge
    pad of `x * w` on [8, 8, 4, 2] padding dim 1 alone computes the multiply in the pad's
    fusion alone, none for the two slices of each other dim; fuzz seed 19 #1735, the multiply
    counted in 6 fusions, XLA's 4: 1.053 of XLA's flops)."""
    needed = [False] * len(prog.values)
    for v in prog.outputs:
        needed[v] = True
    live = [False] * len(prog.ops)
    for op in reversed(prog.ops):
        if True in map(needed.__getitem__, op.results):
            live[op.index] = True
            if _makes_empty(op, prog):
                continue
            for v in op.operands:
                needed[v] = True
            if op.primitive == prim.COND_START and op.param("predicate") is not None:
                needed[op.param("predicate")] = True
    return live


def _makes_empty(op: Op, prog: Program) -> bool:
    """Whether `op` makes only empty arrays (not a region boundary, which links a loop body)."""
    return (
        bool(op.results)
        and op.primitive not in prim.REGION_BOUNDARIES
        and not any(prog.values[r].size for r in op.results)
    )


def without_dead_ops(prog: Program, live: list[bool] | None = None) -> tuple[Program, list[bool]]:
    """(`prog` with its dead ops reading nothing, `live_ops(prog)`, or `live` when the caller
    has it): the program as XLA's DCE
    leaves it, same ops, values and ids. A dead op makes no buffer and keeps none alive: the
    loss that `jax.grad` computes inside a gradient-accumulation loop and discards holds its
    forward values there in the jaxpr only (fuzz seed 15 #114: a GELU's erfc, its clipped copy
    and their minimum, 7 KiB of a 5.7 KiB compiled block)."""
    live = live_ops(prog) if live is None else live
    return (prog if all(live) else _pruned(prog, live)), live


def splits_as_slices(prog: Program) -> Program:
    """`prog` with each `split` a (multi-result) `slice`, as XLA sees it: JAX lowers `lax.split`
    to one `slice` per result, which XLA fuses like any slice (the flops' fusions take `split`
    as one fusible op: `fusion.STACKING`). For memory: the cotangent of a concatenation, `split`
    of a mean loss's broadcast seed, is a broadcast XLA never stores (fuzz seed 15 #149: two [8, 2, 1, 8]
    halves and their [8, 4, 1, 8] source, 2 KiB of the model's 2.5 KiB block; XLA's was 0.8)."""
    if not any(op.primitive == "split" for op in prog.ops):
        return prog
    return replace(
        prog,
        ops=tuple(
            replace(op, primitive="slice") if op.primitive == "split" else op for op in prog.ops
        ),
    )


def constant_values(prog: Program) -> list[bool]:
    """Whether each value is a compile-time constant XLA folds (made from literals and constants
    alone)."""
    const = [v.role in _CONSTANT_ROLES for v in prog.values]
    for op in prog.ops:
        if op.primitive == "iota" and op.results and _along_size_1(op, prog):
            const[op.results[0]] = True  # zeros: XLA's simplifier makes it a broadcast of 0
        elif op.primitive in prim.ARG_REDUCTIONS and op.results and _over_size_1(op, prog):
            const[op.results[0]] = True  # the index of one element: zeros
        elif op.operands and op.primitive not in _NEVER_CONSTANT:
            if (
                False not in map(const.__getitem__, op.operands)
                and not _unfolded_scan(op, prog)
                and not _padded_broadcast(op, prog)
            ):
                for r in op.results:
                    const[r] = True
    return const


def _along_size_1(op: Op, prog: Program) -> bool:
    """Whether iota `op` counts along a dim of size 1 (all zeros: the argsort of rows of one,
    `_sorts_rows_of_one`)."""
    shape = prog.values[op.results[0]].shape
    dim = op.param("dimension", 0)
    return bool(shape) and 0 <= dim < len(shape) and shape[dim] == 1


def _over_size_1(op: Op, prog: Program) -> bool:
    """Whether arg reduction `op` reduces only dims of size 1: its result is zeros, which XLA
    folds with what reads it (measured on XLA:CPU: `take_along_axis(x, argmax(x, axis=0,
    keepdims=True), axis=0)` of x[1] counts nothing; the model counted its index normalization
    and the take's mask, fuzz seed 18 #613)."""
    shape = prog.values[op.operands[0]].shape if op.operands else ()
    axes = op.param("axes", ())
    return bool(axes) and all(shape[a] == 1 for a in axes)


def _padded_broadcast(op: Op, prog: Program) -> bool:
    """Whether `op` pads a broadcast XLA keeps (`_kept_broadcast`): XLA's constant folder
    skips a pad of a broadcast of a constant (it would store a large constant), so such a pad,
    and every op reading it, runs. Measured (jaxlib 0.10.2 CPU, SGD on [8, 8]): the gradient of
    `mean(p[2:])` or `mean(p[::2])` pads the mean's broadcast cotangent back to [8, 8] and
    `0.1 * g` is computed on the pad's [8] core (72 flops, not 64). A pad that only slices
    (jax's transpose of a pad) is a slice of a broadcast, which XLA folds.

    The gradient of an edge pad leaving a dim unpadded pads a reduction of an empty array,
    which XLA's simplifier rewrites as a broadcast of the init value and keeps
    (`_kept_broadcast`)."""
    if op.primitive != "pad":
        return False
    if all(lo <= 0 and hi <= 0 and not mid for lo, hi, mid in op.param("padding_config", ())):
        return False  # a slice of a broadcast is a broadcast
    return _kept_broadcast(prog, op.operands[0])


def _kept_broadcast(prog: Program, vid: int) -> bool:
    """Whether XLA sees constant `vid` as a broadcast op: one that grows its operand, reached
    through layout ops (`_SPLAT_PIECES`, which XLA's simplifier folds into the broadcast). A
    reduction of a broadcast is folded to a literal constant first (an edge pad of every dim
    of `p` folds its whole gradient, whose pads read such reductions: 64 flops); a reduction of
    an EMPTY array to more than one element is a broadcast of its init value to XLA's
    simplifier, kept like any (`_empty_reduction_kept`)."""
    producers = prog.producers()
    while (p := producers[vid]) is not None and prog.ops[p].operands:
        op = prog.ops[p]
        src = prog.values[op.operands[0]]
        if op.primitive == "broadcast_in_dim" and src.size < prog.values[vid].size:
            return True
        if op.primitive in prim.REDUCTIONS and src.size == 0 and prog.values[vid].size > 1:
            return _empty_reduction_kept(prog, src.id)
        if op.primitive not in _SPLAT_PIECES:
            return False
        vid = src.id
    return False


def _empty_reduction_kept(prog: Program, vid: int) -> bool:
    """Whether XLA keeps the broadcast of zero that a reduction of empty `vid` becomes, padded
    and added by the reader: jnp.pad's edge mode reduces an empty slice for each side of a dim
    it does not pad, and the gradient pads that reduction's cotangent and adds it. Measured
    (jaxlib 0.10.2 CPU, the SGD step of `mean(jnp.pad(p, pads, mode="edge"))`): a dim whose
    two sides are both empty (pads (0, 0): a `split` with two empty pieces) keeps both, an add
    over the whole padded cotangent each (`p[8, 8]`, `((1, 2), (0, 0))`: 440 flops, the model
    counted 64; `((0, 0), (3, 1))` on [16, 32]: 2048, counted 512; fuzz seed 18 #397, a conv's
    output edge-padded on one of four dims, 0.33); the empty side of a dim padded on one side
    only (pads (1, 0)) is folded away (`((1, 0), (2, 0))`: 64 flops, the update alone; with
    (1, 0) on dim 0 and (0, 0) on dim 1: 336 = dim 1's two adds on [9, 8], dim 0's one and the
    update). Why the lone empty side folds was not traced in XLA's passes: the rule is the
    measured split, and an empty array from anything else than a split is taken as kept."""
    producers = prog.producers()
    while (p := producers[vid]) is not None and prog.ops[p].primitive == "reshape":
        vid = prog.ops[p].operands[0]
    if p is None or prog.ops[p].primitive not in ("split", "slice"):
        return True
    return sum(prog.values[r].size == 0 for r in prog.ops[p].results) > 1


#: Longest prefix scan of a constant XLA folds: a longer one is lowered to blocked scans first,
#: which the constant folder leaves (`flops_measured.scan_combines`).
_FOLDED_SCAN = 16


def _unfolded_scan(op: Op, prog: Program) -> bool:
    """Whether XLA computes a prefix scan of a constant at run time: a scan of more than 16
    elements that is not a multiple of 16 (blocked, its operand padded to whole blocks: a pad of
    a broadcast, which the constant folder skips, `_padded_broadcast`), and a forward `cumsum`
    of more than one element, which XLA's simplifier rewrites as `c * (iota + 1)` within each
    block (`constant_scan_fraction`). Measured on `x + f(jnp.full((n, 4), 0.125))`: cumsum of
    2 and 16 rows 3 flops per element, reversed cumsum, cumprod and cummax none; of 17, 33 and
    257 rows all four count `scan_combines` in full (2,060 flops for 17); of 32, 48, 64, 256
    and 512 rows (no pad) reversed cumsum, cumprod and cummax none, cumsum 9 flops per element
    fewer than in full. The gradient of `mean(cumsum(v, reverse=True))` is such a cumsum of the
    mean's constant cotangent (fuzz seed 16 #34: 24 flops on [8, 1] missing; on [8, 32] along
    dim 1, folded, the model counted 4,120 flops more than XLA's 768)."""
    if op.primitive not in prim.CUMULATIVE or not op.operands:
        return False
    n = _scan_length(op, prog)
    forward_cumsum = op.primitive == "cumsum" and not op.param("reverse", False)
    return (n > _FOLDED_SCAN and n % _FOLDED_SCAN != 0) or (forward_cumsum and n > 1)


def _scan_length(op: Op, prog: Program) -> int:
    shape = prog.values[op.operands[0]].shape
    return shape[op.param("axis", 0)] if shape else 1


def constant_scan_fraction(op: Op, prog: Program) -> float:
    """Share of a prefix scan's counted combines (`scan_combines`) XLA spends on it when its
    operand is a constant (`_unfolded_scan`): all of them past 16 elements but for a multiple
    of 16; for a forward cumsum of n <= 16, the add, convert and multiply of `c * (iota + 1)`
    per element, 3 of the row's n - 1 combines; of a longer multiple of 16, 9 combines per
    element fewer than in full (measured: n = 32, 48, 64, 256, 512); else none (folded)."""
    n = _scan_length(op, prog)
    if not _unfolded_scan(op, prog):
        return 0.0
    if n > _FOLDED_SCAN and n % _FOLDED_SCAN != 0:
        return 1.0
    if n <= _FOLDED_SCAN:
        return 3.0 / (n - 1)
    full = scan_combines(n)
    return (full - 9 * n) / full


def _per_program(build):
    """Decorator: `build(prog)` memoized per live program, by identity (hashing a program hashes
    all its ops), for results its callers only read. The evaluator of each mesh and hardware
    asks the same of the analysis's program again, as do the CPU view's buffer rules, and one
    evaluator asked `rewired_behind_barriers` of it three times (0.2 s each at GPT-3 175B)."""
    table: dict[int, tuple[weakref.ref, object]] = {}

    @functools.wraps(build)
    def get(prog: Program):
        key = id(prog)
        hit = table.get(key)
        if hit is not None and hit[0]() is prog:
            return hit[1]
        made = build(prog)
        table[key] = (weakref.ref(prog, lambda _, key=key: table.pop(key, None)), made)
        return made

    return get


@_per_program
def uniform_dims(prog: Program) -> list[frozenset[int]]:
    """Per value, the dims along which XLA sees it as a broadcast (see module docstring). A
    dead op that `without_dead_ops` left reading nothing makes none."""
    return uniform_dims_on(prog)


def uniform_dims_on(
    prog: Program, local_shapes: dict[int, tuple[int, ...]] | None = None
) -> list[frozenset[int]]:
    """`uniform_dims`, with one device's `local_shapes` of the values where the partitioned
    program's transposes keep or reorder a broadcast's core (`_transposed_core`)."""
    uni: list[frozenset[int]] = [frozenset()] * len(prog.values)
    reordered: dict[int, tuple[int, ...]] = {}  # `_transposed_core`
    uses = prog.uses()
    for op in prog.ops:
        rule = _UNIFORM_RULES.get(op.primitive)
        if rule is None and op.primitive in prim.ELEMENTWISE:
            rule = _elementwise_uniform
        if rule is None or len(op.results) != 1 or not op.operands:
            continue
        uni[op.results[0]] = rule(op, prog, uni)
        _transposed_core(op, prog, uni, reordered, uses, local_shapes or {})
    return uni


def _transposed_core(op: Op, prog: Program, uni, reordered: dict, uses, local_shapes) -> None:
    """A transpose that reorders a broadcast's core dims (`swapaxes(broadcast_to(x[4, 16][None],
    (8, 4, 16)), 1, 2)`) is no broadcast to XLA: a broadcast keeps its operand's dims in order,
    so the simplifier leaves `transpose(broadcast(x))`. It moves the transpose below an
    elementwise op that alone reads it, which then sinks below the broadcast as usual, but not
    below one of several readers: those run on the whole transposed array (measured on jaxlib
    0.10.2, `t` such a [8, 16, 4] transpose: `2 * t` and `tanh(t) + 1` count 64 flops, `(2 * t)
    * t`, `(1 - t) + t` and `exp(t) * t` 512 per op; with a transpose that keeps the core's
    order, `transpose(b, (1, 0, 2))`, 128 for `(2 * t) * t`; fuzz seed 19 #758, the gradient of
    `prod(1 + 0.1 * tanh(t))`, 0.81 of XLA's flops).

    On a device, a core dim cut down to one element is no dim to order (fuzz seed 19 #1071:
    `swapaxes(broadcast_to(v[4, 12, 2][None], ...), 2, 0)` with the 4 cut 4 ways keeps the
    core's order, and a gelu on it runs on the core).

    Updates `reordered` (value -> the broadcast position of each of its dims) with `op`'s
    result, and empties the uniform dims of an elementwise reader of a reordered value read
    by more than one op."""
    (r,) = op.results
    if not uni[r]:
        return
    if op.primitive == "transpose":
        src = prog.values[op.operands[0]]
        perm = op.param("permutation", ())
        key = reordered.get(src.id, tuple(range(src.rank)))
        shape = local_shapes.get(src.id, src.shape)
        core = {d for d in range(src.rank) if d not in uni[src.id] and shape[d] > 1}
        order = [key[p] for p in perm if p in core]
        if order != sorted(order):
            reordered[r] = tuple(key[p] for p in perm)
        return
    if op.primitive not in prim.ELEMENTWISE:
        return
    moved = [v for v in dict.fromkeys(op.operands) if v in reordered]
    if not moved:
        return
    if any(len({o for o, _ in uses[v]}) > 1 for v in moved):
        uni[r] = frozenset()
        return
    reordered[r] = reordered[moved[0]]


def broadcast_work_dims(prog: Program) -> list[frozenset[int]]:
    """Per op, the result dims along which it is computed on a broadcast: an elementwise op or
    an outer product whose result is uniform there (`uniform_dims`, on the `rewired` program)
    runs on the broadcast's core, so cutting such a dim does not divide its work on a device
    (measured on jaxlib 0.10.2: `broadcast_to(x[16, 8, 1][None], (12, ...)) * w[1]` with the
    broadcast dim cut 3 ways, 128 flops per device, the whole core, not 43; fuzz seed 18 #498).
    Empty for any other op."""
    simple = rewired(prog)
    uni = uniform_dims(simple)
    return [
        uni[op.results[0]]
        if len(op.results) == 1
        and (op.primitive in prim.ELEMENTWISE or _is_outer_product(op, simple))
        else frozenset()
        for op in simple.ops
    ]


def merged_scalings(prog: Program, const: list[bool]) -> set[int]:
    """Ops XLA merges into the next one: a multiply or divide by a constant scalar whose only
    reader is another (`(g / 2) * 0.1` is one multiply by 0.05)."""
    uses = prog.uses()
    producers = prog.producers()
    outputs = set(prog.outputs)  # not `is_output`: a `rewired` program outputs merged values
    out = set()
    for op in prog.ops:
        fold = not _scales_by_computed_splat(op, prog, const)
        inner = _scaled_operand(op, prog, const, fold)
        if inner is None or inner in outputs or len(uses[inner]) != 1:
            continue
        p = producers[inner]
        if p is not None and _scaled_operand(prog.ops[p], prog, const, fold) is not None:
            out.add(p)
    return out


def _scales_by_computed_splat(op: Op, prog: Program, const: list[bool]) -> bool:
    """Whether `op` is `s * x` or `x * s` with `s` a constant splat that XLA's simplifier meets
    as a broadcast of no scalar constant (`_computed_splat`). Such a scaling folds a scaling of
    its other operand from either side, and from either side of its own (`s * (c * x)` and
    `(c * x) * s` are `x * (s * c)`), where a broadcast scalar constant folds only in the fixed
    order `_scaled_operand` keeps. Measured on [24] (one multiply each, not two): `s * (2 *
    x)`, `s * (x / 3)`, `(splat(1/3) * x) * s`, `s` a splat of `sum(full((1,), 1/3))`, of
    `sum(full((2,), 1/5))` or of `full((1,), 1/3)`; `(s * x) * 3` stays two (the scaling by
    `s` is the inner one), as does `s * (x * sin(x))` (no constant inside). Fuzz seed 19
    #1334: the gradient of `var(x @ w, axis=0, keepdims=True)`, `sum(ct) / 3 * (2 * d)`, is
    one multiply by 0.667 (72 flops predicted, 66 compiled; 66 now)."""
    if op.primitive != "mul" or len(op.operands) != 2:
        return False
    a, b = op.operands
    for s, x in ((a, b), (b, a)):
        if const[s] and not const[x] and prog.values[s].rank and _computed_splat(prog, s):
            return True
    return False


def _computed_splat(prog: Program, vid: int) -> bool:
    """Whether `vid` spreads a single element (`_constant_splat`) that XLA's simplifier meets as
    no scalar constant: a one-element array, or a scalar computed from a constant array.
    `toast_core.apply.shard` constrains every array value, so a constant computation through
    one (a `var`'s cotangent: `sum(select(n > 0, 1 / n, 0)[None] / n)`) is folded only after
    partitioning, once the simplifier has matched the splat; one of scalars alone (a `var` over
    a whole axis: `select(n > 0, 1.0, 0.0) / n`) is folded before (seed 19 #703: the gradient
    of `var(v[4], axis=0)` keeps `0.25 * (2 * d)`, two multiplies)."""
    producers = prog.producers()
    while prog.values[vid].size != 1:
        p = producers[vid]
        if p is None or prog.ops[p].primitive not in _SPLAT_PIECES or not prog.ops[p].operands:
            return False
        vid = prog.ops[p].operands[0]
    todo, seen = [vid], set()
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if not _unconstrained(prog, v):
            return True
        p = producers[v]
        if p is not None:
            todo.extend(prog.ops[p].operands)
    return False


def _scaled_operand(op: Op, prog: Program, const: list[bool], fold: bool = True) -> int | None:
    """The operand `x` of `x * c`, `c * x` or `x / c` with `c` a constant scalar, else None.

    `fold`: as a scaling that folds with another (`(x * c1) * c2` -> `x * (c1 * c2)`), where a
    constant splat that is an array of the program (`broadcast_in_dim` of a constant: a
    mean's cotangent `1 / N`) scales only from the right. `toast_core.apply.shard` constrains
    every array value, so XLA's simplifier meets the splat behind a sharding custom call before
    partitioning, and afterwards only its `(A * broadcast(C1)) * broadcast(C2)` rule, whose
    operand order is fixed, folds it; a scalar constant is broadcast unconstrained and folds on
    either side. Measured on [5, 4, 4] under a replicated plan on 2x4: `(x * -0.5) * s` and
    `(x * s) * 3` are one multiply, `s * (x * -0.5)` and `(s * x) * 3` two, `s` a splat of
    1 / 80 (fuzz seed 19 #3031: `mean(rsqrt(v * v + 1))`'s gradient `s * (-0.5 * d)`, the
    `-0.5 * d` kept in two fusions, 0.94 of XLA's flops). Moved onto a smaller broadcast
    (`moved_to_smaller`, `fold=False`) it scales from either side: that rewrite matches its
    operands in any order (measured the same way: `(s * x) * y[:, None]` on [16, 8] is 144
    flops, as `(x * s) * y[:, None]`)."""
    if op.primitive not in ("mul", "div") or len(op.operands) != 2:
        return None
    a, b = op.operands

    def scalar_const(v: int) -> bool:
        # A scaling by one is an identity (`_forwarded` drops it): nothing to merge into.
        if not const[v]:
            return False
        source = v if prog.values[v].rank == 0 else _constant_splat(prog, v)
        return source is not None and _literal(prog, source) != 1.0

    if scalar_const(b) and not const[a]:
        return a
    if op.primitive == "mul" and scalar_const(a) and not const[b]:
        return b if not fold or _unconstrained(prog, a) else None
    return None


def _unconstrained(prog: Program, vid: int) -> bool:
    """Whether `toast_core.apply.shard` leaves value `vid` without a sharding constraint: a
    scalar or a literal (it constrains every other value)."""
    v = prog.values[vid]
    return v.rank == 0 or v.role == "literal"


#: Call names of `jax.checkpoint` bodies: their recomputation sits behind an optimization
#: barrier on TPU and GPU, so XLA's CSE does not merge it with the forward it repeats.
REMAT_CALLS = frozenset({"remat", "remat2", "checkpoint"})


def _in_remat(op: Op) -> bool:
    return not REMAT_CALLS.isdisjoint(op.call_path)


def barred(prog: Program) -> tuple[Program, dict[int, int]]:
    """(`prog` with each `jax.checkpoint` body reading its inputs through an optimization
    barrier, {barrier value: the value it passes}). JAX lowers a differentiated checkpoint
    (prevent_cse, the default) as `optimization_barrier(inputs)` then the body; one it does
    not differentiate, or with prevent_cse=False, has no barrier (`trace.UNBARRED`). XLA's
    simplifier and CSE see a barrier's results as opaque values: a body input made outside the
    body (anything but a literal: a primal, the loss's cotangent splat) is read through a new
    value of its shape (ids after `prog`'s), one per body and input; a body is a run of
    consecutive ops in such a call (two in a row read as one).

    Measured on jaxlib 0.10.2: SGD on `mean(checkpoint(gelu(x @ w)))` multiplies the
    recomputed `0.5 * (1 + tanh)` by the cotangent 1/n in two steps inside the body (the
    splat is a barrier's output, not a constant) where the forward folds them; x[64, 128],
    w[128, 96]: 4,927,488 flops counted, XLA 4,921,344 (4,915,200 folded through the barrier;
    the 6,144 left: XLA shares `x * x` between `x ** 3` and the derivative's `x ** 2`).
    XLA:CPU expands the barriers after its CSE and runs CSE again only after fusion, where it
    merges equal fusions alone: the recomputed dot of a small matmul ([5, 2] @ [2, 3]) with
    the forward's, not one that YNN fused with its readers ([64, 128] @ [128, 96]); the model
    counts the recomputation (TPU and GPU keep the barriers until after scheduling)."""
    if not any(_in_remat(op) for op in prog.ops):
        return prog, {}
    producers = prog.producers()
    values = list(prog.values)
    run = [-1] * len(prog.ops)
    sources: dict[int, int] = {}
    through: dict[tuple[int, int], int] = {}
    ops = []
    for op in prog.ops:
        if not _in_remat(op):
            ops.append(op)
            continue
        i = op.index
        run[i] = run[i - 1] if i and run[i - 1] >= 0 else i
        operands = []
        for v in op.operands:
            p = producers[v]
            if prog.values[v].role == "literal" or (p is not None and run[p] == run[i]):
                operands.append(v)
                continue
            b = through.get((run[i], v))
            if b is None:
                b = through[(run[i], v)] = len(values)
                val = prog.values[v]
                values.append(Value(b, val.shape, val.dtype, "intermediate", f"barrier#{b}"))
                sources[b] = v
            operands.append(b)
        ops.append(_with_operands(op, tuple(operands)))
    return replace(prog, values=tuple(values), ops=tuple(ops)), sources


def rewired(prog: Program, barriers: bool = True) -> Program:
    """`prog` with every read of a value XLA's simplifier or CSE pass replaces redirected to the
    value it equals; the ops that made them are left unread (dead). Same ops, values and ids
    (the rules: `_rewired`). `barriers`: whether the `jax.checkpoint` bodies read their inputs
    through optimization barriers (`barred`, gone from the result), as JAX lowers them."""
    if not barriers:
        return _rewired(prog)[0]
    return unbarred(*rewired_behind_barriers(prog), prog)


@_per_program
def rewired_behind_barriers(prog: Program) -> tuple[Program, dict[int, int]]:
    """(`barred(prog)` rewired, {barrier value: the value it passes, as rewired}): what XLA's
    simplifier and CSE see while the checkpoint bodies' barriers stand (all of TPU's and
    GPU's pipeline; XLA:CPU's until fusion)."""
    work, sources = barred(prog)
    simple, canon = _rewired(work)
    return simple, {b: canon[v] for b, v in sources.items()}


def unbarred(simple: Program, sources: dict[int, int], prog: Program) -> Program:
    """The ops of `simple` (from `rewired_behind_barriers(prog)`) reading the values their
    barriers pass, with `prog`'s values: the program the barriers' expansion leaves."""
    if not sources:
        return simple
    ops = tuple(
        _with_operands(op, tuple(sources.get(v, v) for v in op.operands))
        if any(v in sources for v in op.operands)
        else op
        for op in simple.ops
    )
    return replace(prog, ops=ops, outputs=simple.outputs)


def cse_repeats(prog: Program) -> list[int]:
    """Per value of `prog`, the earlier value with the same primitive, params and (rewired)
    operands that XLA's CSE merges it into, or itself (`_rewired`'s common subexpressions
    alone; the checkpoint bodies behind their barriers, `barred`, merge with nothing outside)."""
    work, _ = barred(prog)
    _, canon = _rewired(work)
    producers = work.producers()
    out = list(range(len(prog.values)))
    for op in prog.ops:
        for r in op.results:
            c = canon[r]
            producer = producers[c] if c != r else None
            if producer is not None and work.ops[producer].primitive == op.primitive:
                out[r] = c
    return out


def _rewired(prog: Program) -> tuple[Program, list[int]]:
    """(`prog` rewired, per value the value it equals). Same ops, values and ids.

    * **Identities** (`_forwarded`): `x + 0`, `x - 0`, `x * 1`, `x / 1`, `max(x, x)`,
      `min(x, x)`, `max(x, -inf)`, `min(x, inf)`, `select(p, x, x)` are `x` (`jnp.where(x > 0.1, x, x)` computes nothing, its
      compare is dead too; `jax.nn.softplus(x)` is `logaddexp(x, 0)`, whose `x - 0` and `x + 0`
      cost nothing: measured 6 flops per element, not 8). A select whose predicate is a scalar
      of literals alone is its chosen case (`constant_scalars`: `jnp.var`'s ddof guard).
    * **Common subexpressions**: an op with the same primitive and params as an earlier one, on
      the same operands (in either order for a commutative op: `_commuted_key`; once earlier
      repeats are merged, so a repeated chain goes whole;
      literals equal by dtype, shape and value) is that op: `jnp.clip(v, -.5, .5)` written
      twice, or `gelu(x)` evaluated in two places, is computed once. Region boundaries do not
      merge (each loop or branch body reads its own inputs, so nothing in two bodies merges),
      except a loop repeating an earlier one whole: same operands, condition and body
      (`prim.LOOP_IDENTITY`) is one `while` to XLA's CSE, and its body ops and results are the
      first loop's (`_same_loop`).
      Behind barriers (`barred`), a `jax.checkpoint` body's recomputation merges with nothing
      outside it.
    * **A scan of one step** is inlined (XLA's while-loop simplifier): its body reads the
      initial carry and consts themselves, so `0.5 * c + x` on a zero initial carry is `x`
      (fuzz seed 18 #1129, a one-step `_decay_scan` beside two dots: 1.22 of XLA's flops).
    * **`stop_gradient`** is its operand: JAX lowers it to nothing, so what reads it reads the
      operand in the HLO (fuzz seed 18 #250: a dropout read by an output's `expand_dims` and,
      through `stop_gradient`, by a `while_loop` is computed once, as for any value a loop
      reads; counted in both fusions it was 1.24 of XLA's flops on [64]). So is a **`copy`**
      (JAX lowers it to its operand; `jax.nn.gelu(x, approximate=False)` ends in one): seen
      through, a GELU read by a softmax's max and its shift `exp(x - max)` is computed once,
      as XLA does (fuzz seed 19 #155, read through the copy it was duplicated with erfc's
      expansion into both fusions: 2.0 of XLA's flops).
    * **Scalings in a row** (`_past_scalings`): `(x * c1) * c2` reads `x` (XLA's simplifier
      folds the constants), whether or not `x * c1` has other readers.
    * **The square of an abs** (`_squared_past_abs`): `abs(A) * abs(A)` reads `A`.
    * **Products of scalings of one element** (`_reassociated_product`): `(A * c1) * (B * c2)`
      reads `A` and `B * c2`.
    * **Sorts of rows of one element** (`_sorts_rows_of_one`) are their operands: an argsort
      along a size-1 dim is its iota, a constant.
    * **Reductions of size-1 dims** (`_reshaping_reduction`) are reshapes (the one op whose
      primitive changes): a layout op fused into its readers' loops, not a fusion root.
    """
    canon = list(range(len(prog.values)))
    literal_key: dict = {}
    for v in prog.values:
        if v.role == "literal":
            canon[v.id] = literal_key.setdefault((v.name, v.dtype, v.shape), v.id)
    scalars = constant_scalars(prog)
    splats = _splats(prog, scalars)
    first: dict = {}
    ops = []
    boundaries = prim.REGION_BOUNDARIES
    const = constant_values(prog)
    uses = prog.uses()
    mirror = None  # (last op index, offset back to the loop it repeats): a merged while loop
    for op in prog.ops:
        operands = _past_scalings(op, tuple(map(canon.__getitem__, op.operands)), ops, prog, const)
        operands = _squared_past_abs(op, operands, ops, prog)
        op, operands = _reassociated_product(op, operands, ops, prog, const)
        op = _reshaping_reduction(op, prog) or op
        operands = _clamped_through(op, operands, ops, prog, const) or operands
        folded = _scatter_into_addend(op, operands, ops, prog, splats, uses)
        if folded is not None:
            op, operands = folded, folded.operands
        ops.append(_with_operands(op, operands) if operands != op.operands else op)
        if mirror is not None and op.index <= mirror[0]:
            for r, r0 in zip(op.results, prog.ops[op.index - mirror[1]].results):
                canon[r] = canon[r0]
            continue
        if op.param(prim.LOOP_IDENTITY) is not None and op.param("length") != 1:
            try:
                earlier = first.setdefault((op.primitive, op.params, operands), op.index)
            except TypeError:  # a param that does not hash: never merged
                earlier = op.index
            if earlier != op.index:
                mirror = _same_loop(prog, earlier, op.index)
        if op.primitive == prim.SCAN_START and op.param("length") == 1:
            # XLA inlines a loop of one trip: the body reads the initial carry (and consts)
            n = int(op.param("num_consts", 0)) + int(op.param("num_carry", 0))
            for r, v in zip(op.results[:n], operands[:n]):
                canon[r] = v
        if not op.results or op.primitive in boundaries:
            continue
        if _sorts_rows_of_one(op, prog):
            for r, x in zip(op.results, operands):
                canon[r] = x
            continue
        same = _forwarded(op, operands, prog, splats, scalars)
        if same is not None:
            canon[op.results[0]] = same
            continue
        key = (
            _splat_dot_key(op, operands, prog)
            or _commuted_key(op, operands, prog)
            or (op.primitive, op.params, operands)
        )
        try:
            earlier = first.setdefault(key, op.index)
        except TypeError:  # a param that does not hash: never merged
            continue
        if earlier != op.index:
            for r, r0 in zip(op.results, prog.ops[earlier].results):
                canon[r] = canon[r0]
    outputs = tuple(canon[v] for v in prog.outputs)
    return replace(prog, ops=tuple(ops), outputs=outputs), canon


def _same_loop(prog: Program, first: int, second: int) -> tuple[int, int] | None:
    """(the index of the end op closing the loop opened at `second`, `second - first`) when
    that loop repeats the one opened at `first` op for op (same operands, condition and body,
    `prim.LOOP_IDENTITY`), else None: XLA's CSE merges the two `while`s, so the second's body
    ops and results are the first's (fuzz seed 19 #690: two identical `while_loop`s on one
    input compile to one loop; the model counted the body and counter twice, 1.24 of XLA's
    flops). Loops that differ in trip count or body differ in their identity and stay apart."""
    ends = [_loop_end(prog, first), _loop_end(prog, second)]
    if None in ends or ends[0] - first != ends[1] - second or ends[0] >= second:
        return None
    offset = second - first
    for i in range(second, ends[1] + 1):
        a, b = prog.ops[i - offset], prog.ops[i]
        if a.primitive != b.primitive or len(a.results) != len(b.results):
            return None
    return ends[1], offset


_LOOP_ENDS = {prim.WHILE_START: prim.WHILE_END, prim.SCAN_START: prim.SCAN_END}


def _loop_end(prog: Program, start: int) -> int | None:
    opens, closes = prog.ops[start].primitive, _LOOP_ENDS[prog.ops[start].primitive]
    depth = 0
    for op in prog.ops[start:]:
        depth += (op.primitive == opens) - (op.primitive == closes)
        if depth == 0:
            return op.index
    return None


#: The param `_scatter_into_addend` sets on the scatter it puts at an add's place: the op's
#: work is the scatter's, not the add's (`_rewired_work_factors`).
INTO_ADDEND = "into_addend"


def _scatter_into_addend(
    op: Op, operands: tuple[int, ...], ops: list[Op], prog: Program, splats, uses
):
    """`x + scatter_add(zeros, i, u)` as XLA's simplifier rewrites it, `scatter_add(x, i, u)`
    (the scatter read by that add alone): the op at the add's place, reading `x`, `i` and `u`;
    the scatter of zeros is left unread. The add's flops are gone, and `x` is the scatter's
    operand, a buffer, not a value fused into the loops reading the sum (measured: the gradient
    of `mean(take_along_axis(c, i, 0)) + mean(cummin(c, 1))`, `c = cummax(x, 0)` on x[2, 2], is
    82 flops: the cummin's backward once, in the fusion making the scatter's operand; on x[12, 6]
    the model counted it in each fusion of the cummax's backward, 1.26 of XLA's flops; fuzz seed
    19 #99's class). The op keeps the scatter's work, one combine per update (`INTO_ADDEND`):
    the gradient of `sum(take_along_axis(w, i, 0)) + sum(tanh(w * x))` on w[32, 8] counts
    1,408 flops, not 1,664 with the add (fuzz seed 19 #294)."""
    if op.primitive not in ("add", "add_any") or len(operands) != 2 or len(op.results) != 1:
        return None
    producers = prog.producers()
    shape = prog.values[op.results[0]].shape
    for k in (0, 1):
        p = producers[operands[k]]
        if p is None:
            continue
        scatter = ops[p]  # as rewired so far
        if (
            scatter.primitive == "scatter-add"
            and len(scatter.operands) == 3
            and splats.get(scatter.operands[0]) == 0
            and len(uses[operands[k]]) == 1
            and prog.values[operands[1 - k]].shape == shape
            and prog.values[operands[k]].dtype == prog.values[op.results[0]].dtype
        ):
            reading = (operands[1 - k], *scatter.operands[1:])
            params = (*scatter.params, (INTO_ADDEND, True))
            return replace(
                scatter, index=op.index, operands=reading, results=op.results, params=params
            )
    return None


def _clamped_through(op: Op, operands: tuple[int, ...], ops: list[Op], prog: Program, const):
    """The operands of `op`, the outer op of `min(max(x, lo), hi)` or `max(min(x, hi), lo)`
    with constant scalar bounds (`jnp.clip`), as XLA's simplifier makes it: `clamp(lo, x, hi)`,
    reading `x` itself (one flop per element, as the outer op counts), the inner op left to
    its other readers, if any (the clip's gradient reads both):
    measured, `grad(mean(cumlogsumexp(clip(v, -.5, .5))))` on v[5] computes the clamp in 9
    fusions and `max(v, -.5)` only in the one computing the clip's gradient, 330 flops; 370
    counted with the max in all 9; `max(min(x, .5), -.5)` beside `min(x, .5) + 1`: the min once).
    An inner op read by the outer one alone is then dead (`clamps` says so of the program as
    traced). None when `op` is not such an outer op."""
    inner_name = {"min": "max", "max": "min"}.get(op.primitive)
    if inner_name is None or len(operands) != 2:
        return None
    producers = prog.producers()
    for k in (0, 1):
        inner_value, bound = operands[k], operands[1 - k]
        if not const[bound] or prog.values[bound].rank != 0:
            continue
        p = producers[inner_value]
        if p is None or ops[p].primitive != inner_name:
            continue
        x = _bounded_operand(ops[p], prog, const)
        if x is not None:
            return (x, bound) if k == 0 else (bound, x)
    return None


def _sorts_rows_of_one(op: Op, prog: Program) -> bool:
    """Whether `op` sorts along a dim of size 1, which XLA removes: each result is its operand
    (measured on XLA:CPU: `take_along_axis(x, argsort(x, axis=3), axis=3)` of x[16, 4, 16, 1]
    counts 0 flops: the argsort is its iota, a constant, so are the index normalization and the
    take's mask; predicted 7,200, fuzz seed 18 #741)."""
    if op.primitive != "sort" or not op.operands or len(op.results) != len(op.operands):
        return False
    shape = prog.values[op.operands[0]].shape
    return bool(shape) and shape[op.param("dimension", 0)] == 1


def _reshaping_reduction(op: Op, prog: Program) -> Op | None:
    """A `reshape` in place of reduction `op` when every dim it reduces has size 1, else None.

    XLA's simplifier rewrites such a reduce as a reshape (a bitcast), so nothing makes it a
    fusion root: `log_softmax` along a size-1 dim is one loop (`x - max(x)` is `x - x`), where
    the model had a max's and a sum's fusion each computing the producers again (measured on
    XLA:CPU: `log_softmax(tanh(x[1, 64]) * 2, axis=0)` counts 192 flops, predicted 256; fuzz
    seed 18 #224 and #353, `log_softmax(jnp.take(x, i[1]), axis=0)`: the take's mask and
    index normalization in three fusions, 19 flops of 9)."""
    if op.primitive not in prim.FUSED_REDUCTIONS or len(op.results) != 1 or not op.operands:
        return None
    shape = prog.values[op.operands[0]].shape
    axes = op.param("axes", ())
    if not axes or any(shape[a] != 1 for a in axes):
        return None
    new = prog.values[op.results[0]].shape
    return replace(
        op,
        primitive="reshape",
        params=(("new_sizes", new), ("dimensions", None), ("sharding", None)),
    )


#: Ops that pass a spread scalar on as a spread of the same scalar (XLA's simplifier folds a
#: transpose or reshape of a broadcast into the broadcast).
_SPLAT_PASSING = frozenset(
    {"broadcast_in_dim", "transpose", "reshape", "copy", "expand_dims", "squeeze"}
)


def _splat_source(prog: Program, vid: int) -> int | None:
    """The scalar value `vid` spreads when it is a broadcast of one (through `_SPLAT_PASSING`
    ops), else None."""
    producers = prog.producers()
    while prog.values[vid].size != 1 or prog.values[vid].rank:
        p = producers[vid]
        if p is None or prog.ops[p].primitive not in _SPLAT_PASSING or not prog.ops[p].operands:
            return None
        vid = prog.ops[p].operands[0]
    return vid


#: Layout ops whose pieces of a splat are splats of the same scalar: a concatenate's cotangent
#: is a `split` of its own (a stack's an `unstack`), a slice's a `slice` (XLA's simplifier
#: rewrites a slice of a broadcast as a broadcast).
_SPLAT_PIECES = _SPLAT_PASSING | {"split", "slice", "unstack"}


def _constant_splat(prog: Program, vid: int) -> int | None:
    """The scalar constant `vid` spreads (through `_SPLAT_PIECES` ops), else None: XLA sees a
    broadcast of a scalar, which its simplifier folds into a scaling as it does the scalar
    (measured: SGD on `mean(concatenate([p * x, x]))`, the loss's cotangent split in two,
    `p - 0.1 * (c * x)` is one multiply by `0.1 * c`: 128 flops on [8, 8], not 192)."""
    producers = prog.producers()
    while prog.values[vid].rank and prog.values[vid].size != 1:
        p = producers[vid]
        if p is not None and _scaled_splat(prog.ops[p], prog):
            return vid  # a splat of a scalar XLA folds, whose value the program does not hold
        if p is None or prog.ops[p].primitive not in _SPLAT_PIECES or not prog.ops[p].operands:
            return None
        vid = prog.ops[p].operands[0]
    return vid


def _scaled_splat(op: Op, prog: Program) -> bool:
    """Whether `op` multiplies or divides a constant splat by a scalar constant (`c * broadcast
    (1 / N)`: an `erf`'s derivative `2 / sqrt(pi)` times a mean's cotangent): XLA's simplifier
    multiplies the scalars and broadcasts the product, a splat again (fuzz seed 19 #503)."""
    if op.primitive not in ("mul", "div") or len(op.operands) != 2:
        return False
    a, b = (prog.values[v] for v in op.operands)
    if a.rank == 0 and b.rank and op.primitive == "mul":
        return _constant_splat(prog, b.id) is not None
    return b.rank == 0 and a.rank > 0 and _constant_splat(prog, a.id) is not None


def spread_dot_other(op: Op, prog: Program) -> int:
    """For a dot_general one of whose operands is a spread scalar (`_splat_source`), the other
    operand's value id, else -1. Where the dot contracts nothing of size > 1 on a device (a cut
    batch dim of the weight gradient `x.T @ broadcast(1/N)`), XLA multiplies that operand's
    shard by the scalar and broadcasts the product: one flop per element of the shard, not per
    result element (measured on jaxlib 0.10.2: Adam on `mean(x[8, 8] @ w[8, 12])`, data
    parallel on 8 devices, 8 flops for the gradient on each, not 96; fuzz seed 18 #480)."""
    if op.primitive != "dot_general" or len(op.operands) != 2:
        return -1
    for splat, other in (op.operands, op.operands[::-1]):
        if _splat_source(prog, splat) is not None:
            return other
    return -1


def _splat_dot_key(op: Op, operands: tuple[int, ...], prog: Program) -> tuple | None:
    """A CSE key for a dot_general one of whose operands is a spread scalar `s`: each result
    element is `s` times a sum of the other operand's elements, so the dot is fixed by `s`,
    the other operand, its side, its contracted dims (as a set) and batch dims (in order) and
    the result's shape, whichever dims of the spread operand it pairs them with. XLA's
    simplifier folds the transposes of the broadcast into it, and CSE then merges two such dots
    (measured on jaxlib 0.10.2: the gradient of `mean(einsum("abc,aec->bce", v, v))` computes
    the dot of the cotangent with `v` once, for both operands, and adds it to itself: 6,558
    flops for v[5, 7, 6], where two dots counted 9,498; fuzz seed 16 #768, 1.15 of XLA's
    flops). None for any other op."""
    if op.primitive != "dot_general" or len(operands) != 2 or len(op.results) != 1:
        return None
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    for side, (splat, other) in enumerate((operands, operands[::-1])):
        s = _splat_source(prog, splat)
        if s is None:
            continue
        contract, batch = (rc, rb) if side == 0 else (lc, lb)
        # a matmul (no batch dims, operands of rank <= 2) is not canonicalized by XLA:CPU's dot
        # decomposer, so no transpose folds into its broadcast: dots contracting different
        # dims of the spread operand stay two (fuzz seed 18 #54, the gradient of w @ w.T)
        plain = not lb and all(prog.values[v].rank <= 2 for v in operands)
        own = ((lc, rc), prog.values[splat].shape) if plain else ()
        rest = tuple((k, v) for k, v in op.params if k != "dimension_numbers")
        shape = prog.values[op.results[0]].shape
        return (
            "dot_splat",
            s,
            other,
            side,
            tuple(sorted(contract)),
            tuple(batch),
            shape,
            own,
            rest,
        )
    return None


#: Elementwise ops whose operands commute, by the HLO opcode they lower to (`add_any`, the
#: cotangent sum, is an `add`). The transpose of `v * v` makes `ct * v` and `v * ct`, one op in
#: XLA (fuzz seed 18 #725, an accumulated SGD step of `x / (1 + v * v)`: `add(m, m)`).
_COMMUTATIVE = {"add": "add", "add_any": "add", "mul": "mul", "max": "max", "min": "min"}
_COMMUTATIVE.update({"and": "and", "or": "or", "xor": "xor"})


def _commuted_key(op: Op, operands: tuple[int, ...], prog: Program) -> tuple | None:
    """A CSE key that ignores operand order, for ops XLA's CSE merges whichever way round their
    operands come: commutative elementwise ops (`x * y` and `y * x`), and a dot_general without
    free dims on either side (each operand's dims all batch or contracted, as in `x . y`,
    `einsum("ab,ab->a")`), which XLA:CPU rewrites as a multiply and a reduce (measured on
    jaxlib 0.10.2: `(x * y, y * x)` costs 64 flops on [64], not 128; `(dot(x, y), dot(y, x))`
    127, not 254; a matvec or matmul with its operands swapped stays two dots; fuzz seed 18
    #305). None for any other op."""
    if len(operands) != 2 or len(op.results) != 1:
        return None
    if op.primitive in _COMMUTATIVE:
        return ("commuted", _COMMUTATIVE[op.primitive], op.params, tuple(sorted(operands)))
    if op.primitive != "dot_general":
        return None
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    ranks = [prog.values[v].rank for v in operands]
    if ranks != [len(lc) + len(lb), len(rc) + len(rb)]:
        return None
    rest = tuple((k, v) for k, v in op.params if k != "dimension_numbers")
    sides = sorted([(operands[0], tuple(lc), tuple(lb)), (operands[1], tuple(rc), tuple(rb))])
    # the pairing of dims is kept: the i-th contracted (batch) dims of both sides go together
    return ("commuted_dot", tuple(sides), rest)


def _past_scalings(op: Op, operands: tuple[int, ...], ops: list[Op], prog: Program, const):
    """`operands` of `op` with a scaling's scaled operand read past the scalings by constant
    scalars that made it: XLA's simplifier rewrites `(x * c1) * c2` and `(x / c1) * c2` as
    `x * (c1 * c2)`, leaving `x * c1` to its other readers (measured: `(x / 2 * 0.1, x / 2)`
    computes each output from x in its own loop, 2 flops per element: the `x / 2` read by two
    loops is not computed in both). `ops` holds the ops before `op`, already rewired."""
    if op.primitive not in ("mul", "div"):
        return operands
    op = _with_operands(op, operands)
    fold = not _scales_by_computed_splat(op, prog, const)
    inner = _scaled_operand(op, prog, const, fold)
    if inner is None:
        return operands
    producers = prog.producers()
    source = inner
    while (p := producers[source]) is not None:
        nxt = _scaled_operand(ops[p], prog, const, fold)
        if nxt is None:
            break
        source = nxt
        fold = True
    if source == inner:
        return operands
    return tuple(source if v == inner else v for v in operands)


def _squared_past_abs(op: Op, operands: tuple[int, ...], ops: list[Op], prog: Program):
    """`operands` of a square (`a * a` of one value, `square`, `integer_pow(a, 2)`: all
    `multiply(a, a)` in the HLO) of a real `abs` read past the abs: XLA's simplifier rewrites
    `abs(A) * abs(A)` as `A * A`, leaving the abs to its other readers, or dead (measured,
    jaxlib 0.10.2 CPU, `a = abs(x)` on [8, 8]: `a * a` is 64 flops, not 128; with `a + 2` out
    too, 256, the abs in one loop, not two: fuzz seed 19 #550, `rsqrt(v * v + 1)` of an abs
    also scattered into, 1.13 of XLA's flops). It matches one abs instruction read twice:
    `abs(x) * abs(x)` written as two abs ops (merged by CSE after the simplifier) keeps both
    (measured, 320 flops on the case above). `ops` holds the ops before `op`, rewired."""
    squares = (op.primitive == "mul" and len(op.operands) == 2 and len(set(op.operands)) == 1) or (
        op.primitive == "square" or (op.primitive == "integer_pow" and int(op.param("y", 0)) == 2)
    )
    if not squares or len(set(operands)) != 1:
        return operands
    p = prog.producers()[operands[0]]
    if p is None or ops[p].primitive != "abs" or len(ops[p].operands) != 1:
        return operands
    (inner,) = ops[p].operands
    if "complex" in str(prog.values[inner].dtype):
        return operands
    return tuple(inner for _ in operands)


def _reassociated_product(op: Op, operands: tuple[int, ...], ops: list[Op], prog: Program, const):
    """(`op`, `operands`) with a product of two scalings by constant scalars, `(A * c1) *
    (B * c2)`, of one element read as XLA's simplifier rewrites it, `(A * B) * (c1 * c2)`: the
    op reads `A` and `B * c2` (two multiplies per copy, as XLA's two), marked `REASSOCIATED`,
    a scaling XLA's effectively-unary test passes (`fusion._more_than_unary`); `A * c1` is left
    to its other readers. The rule matches `HloConstant` scalings only, so only where the
    constant splat is a literal: of one element (a scalar, or `[1]`, whose broadcast of the
    constant XLA folds); on larger arrays it is a broadcast, and the product stays as written.
    Measured (jaxlib 0.10.2 CPU, `v = (x * 0.25) * ((1 + y) * 0.5)` with `v`, `erf(v)` and
    `sin(v)` out): 9 flops on `[1]`, `[1, 1]` and `[]` (the add and both multiplies in each of
    three loops), 3 with `v` the only output, 64 on `[16]` (four ops once); `v = x * ((1 + y)
    * 0.5)`, 3 on `[1]`. Fuzz seed 19 #1020: `gelu(mean(x, keepdims=True))`, whose `x * cdf`
    is `(sum * 0.25) * (0.5 * (1 + tanh))`, computed with the add in three loops (46 of 52)."""
    if op.primitive != "mul" or len(operands) != 2 or len(op.results) != 1:
        return op, operands
    if prog.values[op.results[0]].size != 1:
        return op, operands
    producers = prog.producers()
    inner = []
    for v in operands:
        p = producers[v]
        x = _scaled_operand(ops[p], prog, const) if p is not None else None
        if x is None:
            return op, operands
        inner.append(x)
    reading = (inner[0], operands[1])
    return Op(
        op.index,
        op.primitive,
        reading,
        op.results,
        (*op.params, (REASSOCIATED, True)),
        op.source,
        op.name_stack,
        op.call_path,
        op.trip_count,
        op.region_depth,
    ), reading


def cpu_only_repeats(prog: Program) -> list[int]:
    """Ops of `jax.checkpoint` recomputations that XLA merges with the forward they repeat when
    no barrier stands before them (`rewired(barriers=False)`): in the program
    `toast_core.apply.shard` replays (the bodies inlined), as `validate.cpu_flops` counts it.
    A diagnostic; the model counts them, as TPU and GPU run them."""
    target = live_ops(rewired(prog))
    cpu = live_ops(rewired(prog, barriers=False))
    return [i for i, (t, c) in enumerate(zip(target, cpu)) if t and not c]


def _literal(prog: Program, vid: int) -> float | None:
    """The value of a scalar literal (`lit(0.0)`), else None."""
    v = prog.values[vid]
    if v.role != "literal" or v.rank:
        return None
    try:
        return float(v.name[4:-1])
    except ValueError:
        return None


#: (left, right) neutral operand of each binary op: `0 + x`, `x + 0`, `x - 0`, `1 * x`...
_NEUTRAL = {
    "add": (0.0, 0.0),
    "add_any": (0.0, 0.0),
    "sub": (None, 0.0),
    "mul": (1.0, 1.0),
    "div": (None, 1.0),
}
#: The bound that `max` and `min` ignore: `max(x, -inf)` (the `initial=-inf` of softmax's,
#: log_softmax's and logsumexp's max) is `x`.
_UNBOUNDED = {"max": float("-inf"), "min": float("inf")}


#: The primitives `_forwarded` may find an identity (any other op is asked nothing more).
_MAY_FORWARD = (
    frozenset(_NEUTRAL)
    | frozenset(_UNBOUNDED)
    | {"max", "min", "select_n", "stop_gradient", "copy", "copy_p", "dot_general", "abs"}
)

#: Ops that spread or pass a constant scalar unchanged: `broadcast_in_dim(1.0)` then `copy` is
#: how `jax.grad` seeds the cotangent of a `sum`.
_SPREADS = frozenset({"broadcast_in_dim", "copy"})


#: The init value a reduction of an empty array is: what XLA's simplifier spreads instead.
_EMPTY_REDUCTION = {
    "reduce_sum": 0.0,
    "reduce_max": float("-inf"),
    "reduce_min": float("inf"),
    "reduce_prod": 1.0,
}


def _number(value) -> float | None:
    """A folded scalar as a number; None for a predicate (`True * x` is no identity)."""
    return None if value is None or isinstance(value, bool) else float(value)


def _splats(prog: Program, scalars: dict[int, float | bool]) -> dict[int, float]:
    """Values that are a constant scalar (a literal, or one folded from literals:
    `constant_scalars`) spread unchanged (`broadcast_in_dim 1.0`, a copy of one), with that
    scalar: XLA's simplifier sees through the broadcast, so `x * [1.0, ...]` is `x` as
    `x * 1.0` is, and it folds the constants first: `jax.random.uniform`'s
    `u * (maxval - minval) + minval` with its default bounds, `f32[1]` broadcasts of the
    converted literals 1 and 0, is `u` (measured: the uniform draw of an f32[16] counts 813
    flops, the threefry bits and 5 per element; fuzz seed 18 #229, a dropout, counted 2 more
    per element).

    An add, subtract or multiply of two such values is one too (XLA folds it to a constant):
    the gradient of a parameter read only through `stop_gradient` is a broadcast of 0, so
    SGD's `p - 0.1 * g` is `p - 0`, which is `p` (fuzz seed 18 #319, a `while_loop` over
    `stop_gradient(w)` under SGD: 53 flops predicted, XLA 50). Also a reduction of an empty
    array that XLA folds (`_empty_reduction_kept`), its init value spread, and a pad of it by
    that same value: the cotangent of a one-sided edge pad's empty side, whose add XLA drops
    (measured: the SGD step of `mean(jnp.pad(p[8, 8], ((1, 0), (0, 0)), mode="edge"))` is 336
    flops, 400 with the add; on [4, 6, 5] with ((0, 0), (1, 0), (0, 0)), 880, not 1000). So is
    any pad of an empty array: the cotangent of a scan tree's empty piece, whose adds XLA drops
    (`grad(mean(cummin(v, 0)))` on v[2, 4]: 60 flops, 72 with its two adds)."""
    out: dict[int, float] = {
        v: x for v, x in ((v, _number(x)) for v, x in scalars.items()) if x is not None
    }
    folded: set[int] = set()  # the spread folded empty reductions

    def value(vid: int) -> float | None:
        return out[vid] if vid in out else _literal(prog, vid)

    for op in prog.ops:
        if op.primitive == prim.SCAN_START and op.param("length") == 1:  # inlined (`rewired`)
            n = int(op.param("num_consts", 0)) + int(op.param("num_carry", 0))
            for r, v in zip(op.results[:n], op.operands[:n]):
                if value(v) is not None:
                    out[r] = value(v)
            continue
        if len(op.results) != 1 or not op.operands:
            continue
        (r,) = op.results
        src = op.operands[0]
        if op.primitive in _SPREADS and len(op.operands) == 1:
            val = value(src)
            if val is not None:
                out[r] = val
                if src in folded:
                    folded.add(r)
        elif op.primitive in _FOLDED and len(op.operands) == 2:
            x, y = map(value, op.operands)
            if x is not None and y is not None:
                out[r] = _FOLDED[op.primitive](x, y)
        elif (
            op.primitive in _EMPTY_REDUCTION
            and prog.values[src].size == 0
            and not _empty_reduction_kept(prog, src)
        ):
            out[r] = _EMPTY_REDUCTION[op.primitive]
            folded.add(r)
        elif op.primitive == "pad" and prog.values[src].size == 0 and len(op.operands) == 2:
            pad = value(op.operands[1])  # an empty array padded: its padding value spread
            if pad is not None:
                out[r] = pad
        elif op.primitive == "pad" and src in folded and _literal(prog, op.operands[1]) == out[src]:
            out[r] = out[src]
            folded.add(r)
    return out


#: Binary ops whose result on two spread literals `_splats` folds.
_FOLDED = {"add": float.__add__, "sub": float.__sub__, "mul": float.__mul__}


def _forwarded(
    op: Op,
    operands: tuple[int, ...],
    prog: Program,
    splats: dict[int, float],
    scalars: dict[int, float | bool] | None = None,
) -> int | None:
    """The operand an identity op equals (see `rewired`), else None. `scalars`: the folded
    scalars (`constant_scalars`), for a select whose predicate is one."""
    if op.primitive not in _MAY_FORWARD or len(op.results) != 1:
        return None

    def scalar(vid: int) -> float | None:  # a scalar literal, or one spread unchanged
        return splats[vid] if vid in splats else _literal(prog, vid)

    shape = prog.values[op.results[0]].shape
    if op.primitive in ("stop_gradient", "copy", "copy_p") and len(operands) == 1:
        return operands[0]
    if op.primitive in _NEUTRAL and len(operands) == 2:
        left, right = _NEUTRAL[op.primitive]
        a, b = operands
        if right is not None and scalar(b) == right and prog.values[a].shape == shape:
            return a
        if left is not None and scalar(a) == left and prog.values[b].shape == shape:
            return b
    elif op.primitive == "dot_general" and len(operands) == 2:
        return _scaled_by_one(op, operands, prog, scalar)
    elif op.primitive in ("max", "min") and len(operands) == 2 and operands[0] == operands[1]:
        return operands[0]
    elif op.primitive in _UNBOUNDED and len(operands) == 2:
        a, b = operands
        if scalar(b) == _UNBOUNDED[op.primitive] and prog.values[a].shape == shape:
            return a
        if scalar(a) == _UNBOUNDED[op.primitive] and prog.values[b].shape == shape:
            return b
    elif op.primitive == "select_n" and len(operands) > 2 and len(set(operands[1:])) == 1:
        return operands[1]
    elif op.primitive == "select_n" and scalars is not None:
        case = chosen_case(_with_operands(op, operands), scalars)
        if case is not None and prog.values[case].shape == shape:
            return case
    elif op.primitive == "abs" and len(operands) == 1:
        return operands[0] if _non_negative(prog, operands[0], scalar) else None
    return None


#: Ops whose results are never negative as XLA's simplifier sees them (`IsNonNegative`):
#: `square` and `integer_pow(x, 2)` lower to `multiply(x, x)`.
_NON_NEGATIVE = frozenset({"abs", "exp", "iota", "square"})


def _non_negative(prog: Program, vid: int, scalar, depth: int = 16) -> bool:
    """Whether XLA's simplifier proves value `vid` non-negative (`AlgebraicSimplifier::
    IsNonNegative`, which makes `abs` of it the value itself): an abs, exp, iota, `x * x`, a
    constant scalar >= 0 (`scalar`: a literal or a folded one, spread or not), a broadcast of
    one, a max of which either operand is, a min or select of which all are, a power of one
    (measured: `log1p(abs(abs(x)))` on 8 devices, 32 flops per device for one abs; counting
    both said 64, fuzz seed 19 #1255)."""
    v = prog.values[vid]
    if "complex" in str(v.dtype) or depth <= 0:
        return False
    value = scalar(vid)
    if value is not None:
        return value == value and copysign(1.0, value) > 0  # not NaN nor -0.0
    p = prog.producers()[vid]
    if p is None:
        return False
    op = prog.ops[p]
    kind, operands = op.primitive, op.operands
    if kind in _NON_NEGATIVE:
        return True
    if kind == "integer_pow":
        return op.param("y") == 2
    if kind == "mul":
        return len(operands) == 2 and operands[0] == operands[1]
    if kind in ("broadcast_in_dim", "pow", "stop_gradient", "copy", "copy_p"):
        return bool(operands) and _non_negative(prog, operands[0], scalar, depth - 1)
    if kind == "max":
        return any(_non_negative(prog, x, scalar, depth - 1) for x in operands)
    if kind == "min":
        return all(_non_negative(prog, x, scalar, depth - 1) for x in operands)
    if kind == "select_n":
        return all(_non_negative(prog, x, scalar, depth - 1) for x in operands[1:])
    return False


def _scaled_by_one(op: Op, operands: tuple[int, ...], prog: Program, scalar) -> int | None:
    """The other operand of a dot_general of a scalar 1.0 and an array (no dim contracted or
    batched), which XLA's simplifier makes a multiply by a broadcast 1.0, an identity: the
    cotangent seed of a scalar output (`jnp.einsum("a,a->", u, v)`'s gradient is
    `dot_general(1.0, v)`) costs nothing (fuzz seed 19 #294: 96 of the 130 flops over XLA's
    1,268)."""
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    if lc or rc or lb or rb:
        return None
    shape = prog.values[op.results[0]].shape
    a, b = operands
    for one, other in ((a, b), (b, a)):
        if not prog.values[one].shape and scalar(one) == 1.0:
            if prog.values[other].shape == shape:
                return other
    return None


def clamps(prog: Program, const: list[bool]) -> set[int]:
    """Inner ops of `min(max(x, lo), hi)` or `max(min(x, hi), lo)` with constant scalar bounds
    (`jnp.clip`): XLA's simplifier makes the pair one `clamp`, one flop per element (measured:
    `jnp.clip(x[16, 32], -0.5, 0.5)` counts 512)."""
    uses = prog.uses()
    producers = prog.producers()
    outputs = set(prog.outputs)  # not `is_output`: a `rewired` program outputs merged values
    out = set()
    pairs = {"min": "max", "max": "min"}
    for op in prog.ops:
        inner_name = pairs.get(op.primitive)
        bounded = _bounded_operand(op, prog, const) if inner_name else None
        if bounded is None or len(uses[bounded]) != 1 or bounded in outputs:
            continue
        p = producers[bounded]
        if p is not None and prog.ops[p].primitive == inner_name:
            if _bounded_operand(prog.ops[p], prog, const) is not None:
                out.add(p)
    return out


def moved_to_smaller(
    prog: Program,
    const: list[bool],
    partitioned: bool = False,
    local_shapes: dict[int, tuple[int, ...]] | None = None,
) -> dict[int, float]:
    """Ops XLA's simplifier moves onto a smaller array, with the fraction of their work left:

    * a negation read only by a sum is taken after it (`sum(-x)` is `-sum(x)`: measured
      `jnp.sum(-x[64, 8], axis=1)` counts 448 + 64; a max is not rewritten);
    * a multiply by a constant scalar read only by multiplies whose other operand is a broadcast
      (and divisions by a spread divisor, multiplies by its reciprocal) scales each broadcast's
      source instead (`(2 * x[64, 8]) * y[64][:, None]` counts 512 + 64:
      the gradient of a variance, `2 * (x - m) * g`); so does one whose other operand has
      size-1 dims the multiply broadcasts (lax's implicit broadcasting: the gradient of
      `sum(softmax(x, 0) ** 2)`, `(2 * p) * r[None]`, scales the [12, 8] `r`, measured 17,184
      flops on [16, 12, 8], where scaling `p` counted 20,160); so does one read by an outer
      product (a dot_general with no contracted or batch dims) whose other operand is a single
      element: XLA's simplifier makes that dot a multiply by the broadcast element, and the
      scaling moves onto it (`_outer_of_one`).

    `partitioned`: the program is compiled for more than one device. XLA's SPMD pipeline then
    keeps such a division a real divide (the gradient's `g / s`, on any sharding, replicated
    too) with the scaling unmoved in its loop, while a multiply's loop still scales the
    broadcast's source: the scaling counts the mean over its readers (measured: the softmax
    gradient above on 8 devices, sharded 8 ways along dim 0: softmax on axis 1 2,336 flops
    per device, moved everywhere 2,176, nowhere 2,528; on axis 0, 2,784: 2,616 and 2,976).

    `local_shapes`: one device's shapes of the values, where the partitioned program's
    simplifier meets an outer product's single element (`_outer_of_one`).
    """
    uses = prog.uses()
    producers = prog.producers()
    outputs = set(prog.outputs)
    out: dict[int, float] = {}
    for op in prog.ops:
        if len(op.results) != 1 or op.results[0] in outputs:
            continue
        r = op.results[0]
        readers = uses[r]
        size = prog.values[r].size
        if not readers or not size:
            continue
        if _scaled_operand(op, prog, const, fold=False) is not None:
            if all(_outer_of_one(prog.ops[o], k, prog, const, local_shapes) for o, k in readers):
                local = (local_shapes or {}).get(r, prog.values[r].shape)
                if prod(local) > 1:  # the one multiply left per outer product: one element
                    out[op.index] = 1 / prod(local)
                continue
            sources = [
                _broadcast_factor_size(prog.ops[o], k, prog, producers, const, partitioned)
                for o, k in readers
            ]
            # partitioned: each reader is its own loop, the division's with the scaling unmoved
            moved = sum(sources) / len(sources) if partitioned and None not in sources else None
            if moved is None and None not in sources:
                moved = max(sources)
            if moved is not None and moved < size:
                out[op.index] = moved / size
            continue
        if len(readers) != 1:
            continue
        reader = prog.ops[readers[0][0]]
        if op.primitive == "neg" and reader.primitive == "reduce_sum":
            out[op.index] = prog.values[reader.results[0]].size / size
    return out


def _outer_of_one(
    reader: Op, k: int, prog: Program, const: list[bool], local_shapes: dict | None
) -> bool:
    """Whether `reader` is an outer product (a dot_general with no contracted or batch dims)
    whose operand other than `k` is one non-constant element (on one device, `local_shapes`).
    XLA's simplifier makes such a dot a multiply of operand `k` by the broadcast element, and
    `(a * c) * broadcast(b)` is `a * broadcast(b * c)` (`AlgebraicSimplifierVisitor::
    HandleMultiply`): a scaling of operand `k` costs one flop (measured: the gradient of
    `mean(erf(x[1] @ w[1, 8]))` wrt `w` scales `x`, 33 flops; fuzz seed 19 #503, `x[3]` cut
    3 ways, 169 flops, not 183 with `exp(-v * v) * 2 / sqrt(pi) / 8` scaled on [8]). With
    more elements both operands are broadcasts and the scaling stays (`x[3]`: 96 flops)."""
    if reader.primitive != "dot_general" or len(reader.operands) != 2:
        return False
    (contracted, _), (batch, _) = reader.param("dimension_numbers")
    if contracted or batch:
        return False
    other = reader.operands[1 - k]
    if other == reader.operands[k] or const[other]:
        return False
    return prod((local_shapes or {}).get(other, prog.values[other].shape)) == 1


def _broadcast_factor_size(
    reader: Op, k: int, prog: Program, producers, const: list[bool], partitioned: bool = False
) -> int | None:
    """When `reader` multiplies its operand `k` by a broadcast (a `broadcast_in_dim`, size-1
    dims it broadcasts, or the reciprocal of a spread divisor: `div` by it is a multiply once
    XLA has rewritten it), the elements the broadcast is made from; else None. Not a broadcast
    of constants: XLA's rewrite `(a * c) * broadcast(b)` -> `a * broadcast(b * c)` wants `b`
    non-constant (`AlgebraicSimplifierVisitor::HandleMultiply`); two constants fold or stay two
    multiplies (`_scaled_operand`)."""
    if len(reader.operands) != 2 or reader.operands[0] == reader.operands[1]:
        return None
    if reader.primitive == "div" and k == 0:
        if partitioned:
            return prog.values[reader.operands[0]].size
        return spread_divisor_elements(reader, prog) or None
    if reader.primitive != "mul":
        return None
    other = reader.operands[1 - k]
    if const[other]:
        return None
    p = producers[other]
    if p is not None and prog.ops[p].primitive == "broadcast_in_dim":
        return prog.values[prog.ops[p].operands[0]].size
    return prog.values[other].size  # size-1 dims the multiply broadcasts, else as large


def masking_converts(prog: Program) -> set[int]:
    """Conversions of a predicate to numbers read only by multiplies: XLA's simplifier rewrites
    `convert(p) * x` as `select(p, x, 0)`, so the convert costs nothing (measured: `(x > 0)
    .astype(f32) * x` on `x[32, 32]` counts 2048, compare and select; `jax.nn.one_hot(i, 6) * 1.5`
    a compare and a select per element, fuzz seed 14 #984). A convert with another reader (an
    add) is computed for it and counted."""
    uses = prog.uses()
    outputs = set(prog.outputs)
    out = set()
    for op in prog.ops:
        if op.primitive != "convert_element_type" or len(op.operands) != 1:
            continue
        if prog.values[op.operands[0]].dtype not in ("bool", "pred"):
            continue
        r = op.results[0]
        readers = uses[r]
        if readers and r not in outputs and all(prog.ops[i].primitive == "mul" for i, _ in readers):
            out.add(op.index)
    return out


def _bounded_operand(op: Op, prog: Program, const: list[bool]) -> int | None:
    """The operand `x` of a binary op whose other operand is a constant scalar, else None."""
    if len(op.operands) != 2:
        return None
    a, b = op.operands
    if const[b] and prog.values[b].rank == 0 and not const[a]:
        return a
    if const[a] and prog.values[a].rank == 0 and not const[b]:
        return b
    return None


def _with_operands(op: Op, operands: tuple[int, ...]) -> Op:
    """`op` reading `operands` (`dataclasses.replace` is ten times slower: 40k ops per program)."""
    return Op(
        op.index,
        op.primitive,
        operands,
        op.results,
        op.params,
        op.source,
        op.name_stack,
        op.call_path,
        op.trip_count,
        op.region_depth,
    )


def work_factors(prog: Program) -> list[float]:
    """Per op, the fraction of its jaxpr flops XLA still computes: 0 when dead (an identity and a
    repeat of an earlier op included: `rewired`), constant, merged into the next scaling or into
    a clamp, the broadcast core's share on broadcasts, else 1."""
    behind, sources = rewired_behind_barriers(prog)
    live = live_ops(unbarred(behind, sources, prog))
    return _rewired_work_factors(behind, live)


def _pruned(prog: Program, live: list[bool]) -> Program:
    """`prog` with its dead ops reading nothing (a dead reader is in no fusion and does not
    count as a reader)."""
    return replace(
        prog, ops=tuple(op if live[op.index] else _with_operands(op, ()) for op in prog.ops)
    )


def _rewired_work_factors(
    prog: Program,
    live: list[bool],
    pruned: Program | None = None,
    uni: list[frozenset[int]] | None = None,
    partitioned: bool = False,
    local_shapes: dict[int, tuple[int, ...]] | None = None,
) -> list[float]:
    """`work_factors` of a program already `rewired`, whose `live_ops` are `live` (and whose
    `_pruned` program and `uniform_dims` are `pruned` and `uni`, when the caller has them;
    `local_shapes`: one device's shapes, where given, for `moved_to_smaller`)."""
    const = constant_values(prog)
    if uni is None:
        uni = uniform_dims(prog)
    # Scalings and clamps merge when their inner op has one reader: a dead one (a repeat that
    # CSE removed) does not count.
    if pruned is None:
        pruned = _pruned(prog, live)
    merged = merged_scalings(pruned, const) | clamps(pruned, const) | masking_converts(pruned)
    moved = moved_to_smaller(pruned, const, partitioned, local_shapes)
    divided = divided_divisions(pruned, const)
    ones = _splats_of_one(prog)
    folded = folded_broadcast_sums(pruned, const, uni)
    out = []
    for op in prog.ops:
        if op.index in folded:
            out.append(0.0)
        elif op.index in moved and live[op.index]:
            # a uniform result is computed on its core, which may be smaller still
            u = uni[op.results[0]] if op.primitive in prim.ELEMENTWISE else frozenset()
            core = _core_fraction(prog.values[op.results[0]].shape, u) if u else 1.0
            out.append(min(moved[op.index], core))
        elif live[op.index] and op.primitive in prim.CUMULATIVE and const[op.operands[0]]:
            out.append(constant_scan_fraction(op, prog))
        elif (
            not live[op.index]
            or op.index in merged
            or (op.results and False not in map(const.__getitem__, op.results))
            or (op.primitive == "gather" and len(op.operands) > 1 and const[op.operands[1]])
        ):
            out.append(0.0)  # a gather at constant indices: its fill mask is a constant
        elif ones and _is_outer_product(op, prog) and not ones.isdisjoint(op.operands):
            out.append(0.0)  # a multiply by a broadcast 1: its other operand, broadcast
        elif op.param(INTO_ADDEND):  # an add that is a scatter now: its updates' combines
            out.append(op_flops(op, prog) / max(prog.values[op.results[0]].size, 1))
        elif (dot := _spread_dot_product_fraction(op, prog, uni)) is not None:
            out.append(dot)
        elif op.primitive in prim.ELEMENTWISE or _is_outer_product(op, prog):
            # a special function on a broadcast: its core (`executions` adds the whole part)
            u = _expanded_on_broadcast(op, prog, uni) or uni[op.results[0]]
            core = _core_fraction(prog.values[op.results[0]].shape, u)
            out.append(core * (1 + divided.get(op.index, 0)))
        elif op.primitive in prim.REDUCTIONS:
            out.append(_reduction_fraction(op, prog, uni))
        else:
            out.append(1.0)
    return out


def folded_broadcast_sums(prog: Program, const: list[bool], uni) -> set[int]:
    """Sums over broadcast dims alone that XLA's simplifier folds into the scaling reading them.
    `reduce(broadcast(a))` over `N` broadcast elements is `a * N` (`_reduction_fraction`), and
    a constant scaling of it (a divide by `c` is a multiply by `1 / c`) merges with that
    multiply, `a * (N * c)`, the constants folded in float32: the sum is no work of its own
    (when the scaling is its only reader), and the scaling none either when `N * c` is 1, a
    multiply by 1 (measured on XLA:CPU: `mean(broadcast(tanh(a[4])) -> [4, n], axis=1)` counts
    no flops for n = 2, 3, 7, 32, 49, 100, 4 for n = 41 and 47, whose float32 `n * (1 / n)` is
    not 1; the sum times 0.25 for n = 2, 4; fuzz seed 19 #734, the mean loss of a broadcast
    mean: 2 flops XLA does not count). `prog` is `rewired` and `_pruned`; `uni` its
    `uniform_dims`. The ops to count nothing for."""
    uses = prog.uses()
    outputs = set(prog.outputs)
    out: set[int] = set()
    for op in prog.ops:
        if op.primitive != "reduce_sum" or len(op.results) != 1 or not op.operands:
            continue
        src, (r,) = prog.values[op.operands[0]], op.results
        axes = set(op.param("axes", ()))
        if not axes or not axes <= uni[src.id] or r in outputs or len(uses[r]) != 1:
            continue
        reader = prog.ops[uses[r][0][0]]
        if _scaled_operand(reader, prog, const) != r:
            continue
        out.add(op.index)
        other = next(v for v in reader.operands if v != r)
        source = other if not prog.values[other].rank else _constant_splat(prog, other)
        c = _literal(prog, source) if source is not None else None
        if c is None or (reader.primitive == "div" and c == 0.0):
            continue
        scale = np.float32(1.0) / np.float32(c) if reader.primitive == "div" else np.float32(c)
        if np.float32(prod(src.shape[d] for d in axes)) * scale == np.float32(1.0):
            out.add(reader.index)
    return out


def _splats_of_one(prog: Program) -> frozenset[int]:
    """Arrays that are a constant 1.0 spread (`_splats`, read on through the layout ops of
    `_SPLAT_PIECES`), as an outer product may read them: the cotangent seed of a `sum`, or of a
    mean of one element. XLA's simplifier rewrites a dot that contracts nothing of size > 1 as
    a multiply of its two operands broadcast to the result (`_is_outer_product`), and `A * 1`
    with a broadcast 1 as `A` (`HandleMultiply` looks through the broadcast), so the dot costs
    nothing: the SGD step of `sum(x[5] @ w[5, 3])` counts 20 flops, the update alone, not 25;
    of `mean(x[5] @ w[5, 1])` 10, not 15 (fuzz seed 19 #1534, 24 predicted of XLA's 19, and
    #734). A scalar 1.0 read by a dot of the same shape is forwarded already (`_scaled_by_one`)."""
    if not any(op.primitive == "dot_general" for op in prog.ops):
        return frozenset()
    one = {v for v, x in _splats(prog, constant_scalars(prog)).items() if x == 1.0 and v >= 0}
    for op in prog.ops:
        if op.primitive in _SPLAT_PIECES and op.operands and op.operands[0] in one:
            one.update(op.results)
    return frozenset(v for v in one if prog.values[v].rank)


def flop_executions(prog: Program) -> list[float]:
    """Per op, how many times XLA counts its jaxpr flops in one execution of its region: the
    loop fusions that compute it (`fusion.fusion_copies`) times `work_factors`, both on the
    `rewired` program (a repeat's readers read the op it repeats); of a `cond`, the branch
    with the most flops (`cond_branches`)."""
    return executions(prog)[0]


def transcendental_executions(prog: Program) -> list[float]:
    """`flop_executions` for transcendentals: of a `cond`, the branch with the most of them."""
    return executions(prog)[1]


def executions(
    prog: Program,
    unfused: frozenset[int] = frozenset(),
    copied: frozenset[int] = frozenset(),
    reciprocals_out: dict[int, float] | None = None,
    partitioned: bool = False,
    stored: frozenset[int] = frozenset(),
    barriers: bool = True,
    local_shapes: dict[int, tuple[int, ...]] | None = None,
    fused_dots: frozenset[int] = frozenset(),
    collected: frozenset[tuple[int, int]] = frozenset(),
    recopied: frozenset[int] = frozenset(),
) -> tuple[list[float], list[float]]:
    """(`flop_executions`, `transcendental_executions`) of `prog`, sharing the work they have
    in common (the rewiring, liveness and fusions: two seconds of the evaluator's set-up at
    GPT-3 175B when done twice).

    `unfused`: reductions the backend compiles apart from their operands' producers, which it
    then stores (XLA:CPU's tree reductions, a partitioned reduce of local size-1 dims that is
    an all-reduce: `toast_core.apply.validate.cpu_flops`); none in the cost model itself.
    `copied`: values the dots reading them read through a layout copy (XLA:CPU's;
    `fusion.fusion_work`). `reciprocals_out`, when given, receives per division by a spread
    divisor the share of its jaxpr flops that is the divisor's reciprocal, computed once
    (the cost model counts it on the divisor's shard, not the division's). `partitioned`: compiled
    for more than one device (`moved_to_smaller`). `stored`: values the backend computes once
    and stores though the model would fuse them into each reader (XLA:CPU's library-call
    outputs: `toast_core.apply.validate._library_shifts`). `barriers`: whether the `jax.checkpoint`
    bodies read their inputs through optimization barriers (`barred`), as JAX lowers them; not
    in the program `toast_core.apply.shard` replays, whose bodies are inlined: XLA's simplifier
    and CSE see through them there, and merge each recomputation with the forward.
    `local_shapes`: one device's shapes of the values, where XLA's fusion tests see them
    (`fusion.fusion_work`) and its simplifier finds dot products (`dot_products.as_sums`: fuzz
    seed 19 #887, a dot of w[4, 8] cut to [1, 8] per device); none in the cost model itself.
    `collected`: (value, op) pairs, a value that a collective of the partitioned program reads
    whole for that op (an all-gather before an op reading a cut dim whole; `toast_core.apply.
    validate.cpu_flops`): a collective fuses nothing, so the value is a buffer, its producer a
    fusion root, computed once there unless XLA duplicates it into its other readers
    (`fusion._duplicable`), and the op reads the collective's result, not the value
    (`_read_after_collectives`); none in the cost model itself. `recopied`: `copied` values
    that dots read through copies in several groupings (`fusion.fusion_work`)."""
    from toast_core.cost.flops import op_flops, op_transcendentals

    # the simplifier's work behind the checkpoint bodies' barriers, the fusions without them
    behind, sources = rewired_behind_barriers(prog) if barriers else (rewired(prog, False), {})
    simple = unbarred(behind, sources, prog)
    live = live_ops(simple)  # a dead reader (a repeat, an identity) is in no fusion
    uni = uniform_dims(behind) if local_shapes is None else uniform_dims_on(behind, local_shapes)
    factors = _rewired_work_factors(
        behind, live, _pruned(behind, live), uni, partitioned, local_shapes
    )
    spread = _spread_on_device(uni[: len(prog.values)], local_shapes)
    # the dot products are the reductions XLA makes of them (`dot_products.as_sums`), on one
    # device's shapes where given: a dot whose free dims are cut to 1 there is one
    simple = as_sums(_pruned(simple, live), _operand_shapes(simple, local_shapes))
    if collected:
        collected = _collected_as_read(prog, simple, collected)
        simple, spread = _read_after_collectives(simple, spread, collected)
    if fused_dots:
        fuses = [fusible(op, simple) or op.index in fused_dots for op in simple.ops]
        is_mat = materialized(simple, fuses)
        for i in fused_dots:
            for r in simple.ops[i].results:
                is_mat[r] = True
    else:
        is_mat = materialized(simple)
    for i in unfused:
        for v in simple.ops[i].operands:
            is_mat[v] = True
    producers = simple.producers()
    apart = set(unfused)  # a stored value's op is a fusion of its own, read by every reader
    for v in stored:
        is_mat[v] = True
        if producers[v] is not None:
            apart.add(producers[v])
    for v, _ in collected:  # read by no fusion: the readers that do not duplicate it read it
        is_mat[v] = True
        p = producers[v]
        if p is not None and not _duplicable(simple, simple.ops[p], spread, local_shapes):
            apart.add(p)
    roots: list = []
    copies, expanded = fusion_work(
        simple,
        is_mat,
        spread,
        frozenset(apart),
        frozenset(copied),
        roots_out=roots,
        local_shapes=local_shapes,
        apart_on_broadcast={
            op.index: EXPANDED_APART_ON_BROADCAST[op.primitive]
            for op in simple.ops
            if live[op.index] and _expanded_on_broadcast(op, simple, uni)
        },
        fused_dots=frozenset(fused_dots),
        recopied=frozenset(recopied),
    )
    fuses = [fusible(op, simple) and op.index not in apart for op in simple.ops]
    kept = lambda op: _kept_once(op, simple, spread)  # noqa: E731
    more = lambda op: not _duplicable(simple, op, spread)  # noqa: E731
    for i, c in gather_copies(
        simple, roots, fuses, kept, more, frozenset(copied), local_shapes
    ).items():  # masks, indices
        copies[i] = c
    for i, c in convert_copies(simple, roots).items():  # a mask's multiplies are selects
        copies[i] = c
    each = [c * w for c, w in zip(copies, factors)]
    split_exps = []  # erfc's exp, shared with its gradient, in a fusion apart from erfc's
    for i, chain, exps in erfc_gradient_exps(simple, live):  # merged into erfc's by XLA's CSE
        for c in chain + exps:
            each[c] = 0.0
        if any(_root_op(simple, r) != i for c in chain for r in roots[c] - roots[i]):
            split_exps.append((i, chain))
    each_flops = list(each)
    for i, chain in split_exps:  # erfc's `-(x * x)` computed again in its exp's fusion
        n = op_flops(simple.ops[i], simple)
        each_flops[i] += sum(op_flops(simple.ops[c], simple) for c in chain) / n * factors[i]
    for op in simple.ops:  # a special function on a broadcast: its selects on the whole result
        f = expanded_factors(op, simple, uni) if live[op.index] else None
        if f is not None and factors[op.index]:
            each_flops[op.index] = copies[op.index] * f[0]
            each[op.index] = copies[op.index] * f[1]
    for i, readers in expanded.items():  # a special function's cheap part, in each reader
        each_flops[i] += expanded_extra_copies(simple.ops[i].primitive, readers) * factors[i]
    for op in simple.ops:  # a divisor's reciprocal is computed once, its multiply per copy
        if op.primitive == "div" and copies[op.index] >= 1 and len(op.operands) == 2:
            reciprocal = spread_divisor_elements(op, simple)
            n = simple.values[op.results[0]].size
            if reciprocal:
                c = copies[op.index]
                each_flops[op.index] = (c * n + reciprocal) / (n + reciprocal) * factors[op.index]
                if reciprocals_out is not None and factors[op.index]:
                    reciprocals_out[op.index] = reciprocal / (n + reciprocal) * factors[op.index]
        elif op.primitive in prim.SCATTERS and copies[op.index] > 1 and op.results:
            # a one-window scatter's bounds test is computed once, its select per copy
            test = one_window_test_flops(op, simple)
            total = op_flops(op, simple)
            if test and total:
                c = copies[op.index]
                each_flops[op.index] = (c * (total - test) + test) / total * factors[op.index]
    return (
        _costliest_branches(prog, each_flops, op_flops),
        _costliest_branches(prog, each, op_transcendentals),
    )


def _spread_on_device(
    uni: list[frozenset[int]], local_shapes: dict[int, tuple[int, ...]] | None
) -> list[bool]:
    """Per value, whether XLA's fusion meets it as a broadcast of a smaller array: uniform along
    some dim (`uniform_dims`) that is longer than 1 on one device (`local_shapes`, where given).
    Uniform only along dims cut to one element per device, a value is as large as its core
    there: the partitioned broadcast adds size-1 dims, a bitcast after XLA's simplifier, and
    fusion reads it as an array like any (fuzz seed 19 #1267: Adam's `0.9 * m + 0.1 * g`, `g`
    spread along a dim cut to one column per device, is stored and read by the update, not
    computed again there: 681 flops compiled, 782 predicted with it duplicated)."""
    if not local_shapes:
        return [bool(u) for u in uni]
    return [
        any(local_shapes[v][d] > 1 for d in u) if u and v in local_shapes else bool(u)
        for v, u in enumerate(uni)
    ]


def _collected_as_read(
    prog: Program, simple: Program, collected: frozenset[tuple[int, int]]
) -> frozenset[tuple[int, int]]:
    """`collected` (value, op) pairs of `prog` as the op reads them in `simple` (its rewired
    form, same ops and ids): the value the simplifier put in the collected value's operand
    slot. The partitioner gathers what the op reads after XLA's simplifier, so a value it
    replaced (a `copy`, a CSE repeat) is gathered as the value it equals, whose producer is
    then the stored buffer (fuzz seed 19 #1340: `v = gelu(x)` (erfc), `concatenate([v, tanh(v)])`
    along x's cut dim, JAX's copy of `v` all-gathered: XLA stores `v` once, its erfc in one
    loop read by the gather, the tanh and a subtraction, 138 flops; 406 predicted with the
    erfc's cheap part expanded into all three readers)."""
    out = set()
    for v, o in collected:
        before = prog.ops[o].operands if o < len(prog.ops) else ()
        after = simple.ops[o].operands if o < len(simple.ops) else ()
        if v in before and len(after) == len(before):
            out.update((after[k], o) for k, x in enumerate(before) if x == v)
        else:
            out.add((v, o))
    return frozenset(out)


def _read_after_collectives(
    prog: Program, spread: list[bool], collected: frozenset[tuple[int, int]]
) -> tuple[Program, list[bool]]:
    """`prog` with each op of `collected` (value, op) reading, instead of the value, a new input
    of its shape: the collective's result, which no fusion of the value's producer makes (an
    all-gather's result read by a `pad`: measured, `v = tanh(x) * 2` gathered for a pad and
    read by `sum(v * v)` computes the multiply in the gather's loop and the sum's, not the
    pad's); and `spread` extended over the new values (none spread)."""
    values, ops = list(prog.values), list(prog.ops)
    spread = list(spread) + [False] * (len(values) - len(spread))
    for v, o in sorted(collected):
        if o >= len(ops) or v not in ops[o].operands:
            continue
        new = replace(values[v], id=len(values), role="input", output_name=None, updates=None)
        values.append(new)
        spread.append(False)
        operands = tuple(new.id if x == v else x for x in ops[o].operands)
        ops[o] = replace(ops[o], operands=operands)
    return replace(prog, values=tuple(values), ops=tuple(ops)), spread


def erfc_gradient_exps(prog: Program, live: list[bool]) -> list[tuple[int, list[int], list[int]]]:
    """Per live `erfc(x)` whose operand `x` is read by `exp(-(x * x))` (erfc's gradient,
    `-2 / sqrt(pi) * exp(-x * x)`): (erfc, [the square, its negation], [the exps]). XLA expands
    erfc with that same expression, and its CSE merges the two: one exp per element, in erfc's
    own count (`flops_measured.EXPANDED`), and so are the square and negation. Where the
    gradient's fusion is none of erfc's (its loop, a reader it is expanded into, its exp's
    fusion apart), XLA splits the shared exp from erfc's loop into a fusion of its own, which
    computes `-(x * x)` again: erfc counts their flops once more (`simplify.executions`; a
    GELU whose erfc XLA:CPU stores for a library reduction, 62 per element). Measured: `grad(sum(erfc(x) * x))`
    on f32[16, 32], one loop, is 63 flops and 1 transcendental per element (erfc's 60 and the
    gradient's three multiplies and adds); likewise exact GELU's value and gradient (141 and 1,
    erfc in two loops; fuzz seed 19 #926 counted the square, the negation and the exp again)."""
    uses = prog.uses()
    out = []
    for op in prog.ops:
        if op.primitive != "erfc" or not live[op.index]:
            continue
        for sq, _ in uses[op.operands[0]]:
            if not _squares(prog.ops[sq], op.operands[0]):
                continue
            for ng, _ in uses[prog.ops[sq].results[0]]:
                if prog.ops[ng].primitive != "neg":
                    continue
                exps = [e for e, _ in uses[prog.ops[ng].results[0]]]
                exps = [e for e in exps if prog.ops[e].primitive == "exp"]
                if exps:
                    out.append((op.index, [sq, ng], exps))
    return out


def _squares(op: Op, vid: int) -> bool:
    """Whether `op` is `vid * vid` (`square`, `integer_pow` by 2, or a multiply by itself)."""
    if op.primitive == "square":
        return True
    if op.primitive == "integer_pow":
        return op.param("y") == 2
    return op.primitive == "mul" and tuple(op.operands) == (vid, vid)


def _operand_shapes(prog: Program, local_shapes: dict | None):
    """`dot_products.as_sums`'s `local_shape(op, pos)` over one device's `local_shapes` (value id
    -> shape), None (the program's own shapes) without them."""
    if not local_shapes:
        return None

    def local_shape(op: int, pos: int) -> tuple:
        v = prog.ops[op].operands[pos]
        return local_shapes.get(v, prog.values[v].shape)

    return local_shape


def _costliest_branches(prog: Program, executions: list[float], count) -> list[float]:
    out = list(executions)
    for branches in cond_branches(prog):
        work = [sum(count(prog.ops[i], prog) * out[i] for i in b) for b in branches]
        kept = max(range(len(branches)), key=work.__getitem__)
        for k, b in enumerate(branches):
            for i in b if k != kept else ():
                out[i] = 0.0
    return out


def cond_branches(prog: Program) -> list[list[list[int]]]:
    """Per `cond`, the op indices of each branch body (innermost conds first).

    XLA's `HloCostAnalysis` prices a conditional as its costliest branch (the maximum of each
    property over the branches), not their sum: `flop_executions` keeps the branch with the most
    flops, `transcendental_executions` the one with the most transcendentals (measured: `lax.cond(p, lambda t: 2 * t + 1, lambda t: t * t * t,
    x[16, 32])` counts 1,024 for the branches, not 2,048). That is also the honest price of a
    step: one branch runs."""
    out: list[list[list[int]]] = []
    stack: list[list[list[int]]] = []  # open conds: their branches so far
    for op in prog.ops:
        if op.primitive == prim.COND_START:
            if op.param("branch", 0) == 0:
                stack.append([])
            stack[-1].append([])
            continue
        if op.primitive == prim.COND_END:
            out.append(stack.pop())
            continue
        for branches in stack:
            branches[-1].append(op.index)
    return out


# --- uniform dims, per primitive ----------------------------------------------------------------


#: Elementwise ops XLA expands early into several ops, not run on a tile's source (measured on
#: `f(tile(x[6, 8], (1, 2)))`: digamma, lgamma, polygamma, erfc, erf_inv and rem count the
#: whole tile; logistic, sign and round the source; fuzz seed 14 #291, a digamma, fell from 1.01
#: to 0.56 of XLA's flops when counted on the source).
_NOT_SUNK = (prim.EXPANDED_TRANSCENDENTAL - {"logistic"}) | {"rem"}


def tiled_copies(prog: Program, uni) -> dict[int, tuple[tuple, int]]:
    """Values XLA computes once per tile, not once per element: per value, (the tiling: result
    shape and the tiled dims with their repeats, the number of copies). Each device runs it on
    its own block of the tile, so how much that saves depends on the strategy: priced in the
    CPU comparison (`validate.cpu_flops`), not in the model's own count.

    XLA lowers `tile(x, reps)` to a reshape of a broadcast. Its reshape mover sinks that reshape
    below the ops that read it, all of them or none: each must be elementwise with every other
    operand the same reshape (or a splat), and the value must not be an output; the moved
    reshape then sits on each op's result and moves on from there (measured, jaxlib 0.10.2 CPU,
    `t = tile(x[6, 8], (2, 1))`: `(exp(t), sin(t))` counts 96 transcendentals, `(exp(t), t @ w)`
    and `(exp(t), t)` 144 and 96 flops of a full `exp`, `t * 2 + t` 192 flops: the add reads
    `t * 2`, not yet the reshape, so `t` stays; `a = exp(t)` read by `sin` and a dot runs `exp`
    on `x`, `sin` on the tile). The simplifier then sinks the broadcast below each moved op whose
    non-splat operands are all such broadcasts of one element type: a select of a predicate
    moves with the reshape but runs on the whole tile (fuzz seed 19 #944, `log1p(abs(tile(v)))`:
    the abs, its compare, add and divide on `v`, the gradient's selects on the tile). A reduction
    over none of the tiled dims that is the value's only reader keeps the tiling
    (`exp(sum(exp(tile(x[6, 8], (2, 1))), axis=1))` counts 6 exponentials after the sum, not 12;
    beside another reader, `sum(t, axis=1)` counts 84 flops and keeps the other on the tile); one
    over every tiled dim reads the broadcast itself and stops no other reader (`(exp(t), sum(t))`
    counts 48 exponentials: a mean loss of a tiled output).
    A dim of `x` of size 1, or along which `x` is already uniform, is a plain broadcast
    (`uniform_dims`), not a tiled dim. Special functions XLA expands first (`_NOT_SUNK`) stop
    the reshape (digamma's gradient: fuzz seed 14 #291)."""
    values = prog.values
    uses = prog.uses()
    outputs = set(prog.outputs)
    reshaped: dict[int, tuple[tuple, int]] = {}  # where a tile's reshape sits (its tiling)
    core: set[int] = set()  # values computed on the tile's source
    for op in prog.ops:
        if op.primitive == "tile" and len(op.results) == 1:
            src = values[op.operands[0]]
            dims = tuple(
                (d, k)
                for d, (n, k) in enumerate(zip(src.shape, op.param("reps", ())))
                if k > 1 and n > 1 and d not in uni[src.id]
            )
            if dims:
                reshaped[op.results[0]] = (
                    (values[op.results[0]].shape, dims),
                    prod(k for _, k in dims),
                )
                core.add(op.results[0])
    passed: set[int] = set()  # reshapes moved below all their readers
    while True:
        waiting = [v for v in reshaped if v not in passed]
        moves = {}
        for v in waiting:
            for o, _ in uses[v]:
                if o not in moves:
                    moves[o] = _reshape_move(prog.ops[o], prog, uni, reshaped, passed, core)
        moves = {o: m for o, m in moves.items() if m is not None}
        blocked = True
        while blocked:  # a reshape moves below all its readers or none
            blocked = False
            for v in waiting:
                readers = {o for o, _ in uses[v]}
                if readers & moves.keys() and (v in outputs or not readers <= moves.keys()):
                    for o in readers & moves.keys():
                        del moves[o]
                    blocked = True
        if not moves:
            break
        for o, (tiling, on_core) in moves.items():
            op = prog.ops[o]
            passed.update(v for v in op.operands if v in reshaped)
            if tiling is None:
                continue
            reshaped[op.results[0]] = tiling
            if on_core:
                core.add(op.results[0])
    return {v: reshaped[v] for v in core}


def _reshape_move(op: Op, prog: Program, uni, reshaped, passed, core) -> tuple | None:
    """(the result's tiling, whether it runs on the tile's source) when XLA's reshape mover
    sinks a tile's reshape below `op` (`tiled_copies`); (None, False) for a reduction over every
    tiled dim, which the simplifier makes read the broadcast whole (no reshape left to move, and
    none in the way of the other readers'); else None."""
    values = prog.values
    if len(op.results) != 1:
        return None
    r = op.results[0]
    if op.primitive in prim.REDUCTIONS:
        v = op.operands[0] if op.operands else None
        if v not in reshaped or v in passed:
            return None
        (_, dims), copies = reshaped[v]
        axes, tiled = set(op.param("axes", ())), {d for d, _ in dims}
        if tiled <= axes:
            return None, False  # reduces the broadcast itself: in full, and no obstacle
        if axes & tiled or len({o for o, _ in prog.uses()[v]}) != 1:
            return None
        kept = [d for d in range(values[v].rank) if d not in axes]
        where = {d: i for i, d in enumerate(kept)}
        return ((values[r].shape, tuple((where[d], k) for d, k in dims)), copies), v in core
    if op.primitive not in prim.ELEMENTWISE or op.primitive in _NOT_SUNK:
        return None
    keys, kinds, on_core = set(), set(), True
    for v in op.operands:
        val = values[v]
        if val.rank == 0 or _is_splat(val, uni[v]):
            continue
        if v not in reshaped or v in passed:
            return None
        keys.add(reshaped[v])
        kinds.add(val.dtype)
        on_core = on_core and v in core
    if len(keys) != 1:
        return None
    tiling = next(iter(keys))
    if values[r].shape != tiling[0][0]:
        return None
    return tiling, on_core and len(kinds) == 1


def _is_splat(val, uniform: frozenset[int]) -> bool:
    """A value uniform along every dim longer than 1: a scalar spread (`broadcast_in_dim`)."""
    return all(d in uniform for d, n in enumerate(val.shape) if n > 1)


def tiled_operand(op: Op, tiled) -> tuple[int, tuple] | None:
    """(operand index, tiling) of an op XLA runs on a tile's source (`tiled_copies`): an
    elementwise op whose result is tiled, or a reduction of a tiled value over none of its
    tiled dims (measured: `sum(exp(tile(x[6, 8], (2, 1))), axis=1)` counts 42 flops, not 84);
    else None."""
    if op.primitive in prim.REDUCTIONS:
        v = op.operands[0] if op.operands else None
        if v not in tiled or op.results[0] not in tiled:
            return None
        (_, dims), _ = tiled[v]
        return None if set(op.param("axes", ())) & {d for d, _ in dims} else (0, tiled[v][0])
    if len(op.results) != 1 or op.results[0] not in tiled:
        return None
    key = tiled[op.results[0]][0]
    for j, v in enumerate(op.operands):
        if v in tiled and tiled[v][0] == key:
            return j, key
    return None


def _scalar_or(prog: Program, vid: int, uni) -> frozenset[int] | None:
    """Uniform dims of an operand; None for a scalar (uniform along every dim)."""
    return None if prog.values[vid].rank == 0 else uni[vid]


def _elementwise_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    """Dims along which every non-scalar operand is uniform. An operand of size 1 along a dim the
    result has larger is broadcast there by the op itself (jax's elementwise ops take size-1
    dims: `a[..., None] * b` multiplies `f32[4, 3, 1]` by `f32[1, 1, 5]`), so it is uniform
    along it as XLA sees it.

    Operands broadcast along different dims make a full array: XLA's simplifier moves an
    elementwise op before the broadcasts only when its non-scalar operands are broadcasts along
    the same dims (operands broadcast from a scalar aside), and does not split off the dims they
    share (measured on f32 [32, 2, 16, 4], `b = broadcast(a[2, 16, 4])`: `tanh(b)` and `b + b2`
    count 128, `b - b.max(axis=2, keepdims=True)`, uniform along dims {0} and {0, 2}, 4,096 +
    the max; `log_softmax(b, axis=2)` 16,248 flops, where the core counted 624: fuzz seed 16
    #285, 0.53 of XLA's flops).

    A select whose predicate is such a broadcast (not a splat) is computed in full when a value
    it selects is one too: the sunk op's non-splat operands must have one element type, and the
    predicate's is `pred` (measured: `jnp.where(b > 0, b, 0.01 * b)` with `b` a [24, 8, 16]
    broadcast of `x[8, 16]`, a leaky relu, counts 128 + 128 + 3,072 flops, and a sum over dim 0
    of such a select 2,944 more; with a splat predicate, or splat values, the select runs on the
    core: fuzz seed 18 #253, predicted 0.12 of XLA's flops)."""
    values = prog.values
    shape = values[op.results[0]].shape
    wide = frozenset(d for d, n in enumerate(shape) if n > 1)
    sets, splats = [], []
    if op.primitive == "select_n" and _mixed_type_broadcasts(op, prog, uni, wide):
        return frozenset()
    if _expanded_on_broadcast(op, prog, uni):
        return frozenset()  # its selects run on the whole result
    for v in op.operands:
        vshape = values[v].shape
        if not vshape:  # a scalar: uniform along every dim (`_scalar_or`)
            continue
        s = uni[v]
        if len(vshape) == len(shape):
            s = s | {d for d, n in enumerate(vshape) if n == 1 and shape[d] > 1}
        if not s:  # the intersection is empty: most ops, whose operands are no broadcasts
            return frozenset()
        if wide <= s:  # a splat, broadcast from a scalar: no constraint
            splats.append(frozenset(s))
        else:
            sets.append(frozenset(s) & wide)
    if not sets:
        return frozenset.intersection(*splats) if splats else frozenset()
    if any(s != sets[0] for s in sets[1:]):
        return frozenset()
    return sets[0]


def _expanded_on_broadcast(op: Op, prog: Program, uni) -> frozenset[int]:
    """The uniform dims of the operand of a special function XLA expands with selects
    (`flops_measured.EXPANDED_ON_BROADCAST`) when that operand is a broadcast but not a splat
    (its core is then larger than one element); else empty."""
    if op.primitive not in EXPANDED_ON_BROADCAST or len(op.operands) != 1:
        return frozenset()
    val = prog.values[op.operands[0]]
    u = uni[op.operands[0]]
    if not u or not val.shape or all(d in u for d, n in enumerate(val.shape) if n > 1):
        return frozenset()
    return u


def expanded_factors(op: Op, prog: Program, uni) -> tuple[float, float] | None:
    """For a special function on a broadcast (`_expanded_on_broadcast`), the fractions of its
    flops and of its transcendentals XLA counts: part on the core, the selects (and what follows
    them) on the whole result (`flops_measured.EXPANDED_ON_BROADCAST`); else None."""
    u = _expanded_on_broadcast(op, prog, uni)
    if not u:
        return None
    fraction = _core_fraction(prog.values[op.operands[0]].shape, u)
    out = []
    for (core, whole), per_element in zip(
        EXPANDED_ON_BROADCAST[op.primitive], EXPANDED[op.primitive]
    ):
        out.append((core * fraction + whole) / per_element if per_element else 0.0)
    return out[0], out[1]


def _mixed_type_broadcasts(op: Op, prog: Program, uni, wide: frozenset[int]) -> bool:
    """A select's predicate and one of its values are both broadcasts that are not splats."""

    def non_splat(v: int) -> bool:
        val = prog.values[v]
        if not val.shape:
            return False
        s = uni[v]
        if len(val.shape) == len(prog.values[op.results[0]].shape):
            s = s | {d for d, n in enumerate(val.shape) if n == 1 and d in wide}
        return bool(s) and not wide <= s

    return non_splat(op.operands[0]) and any(non_splat(v) for v in op.operands[1:])


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


def _slice_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    """A slice of a broadcast is a broadcast of the slice of its core (XLA's simplifier moves the
    broadcast past the slice), along every dim it keeps longer than one (measured on jaxlib
    0.10.2, `b` a [8, 4, 16] broadcast of `x[4, 16]`: `b[:4] * b[4:]` and `2 * b[:4]` count 64
    flops, `b[:, :2] * b[:, 2:]` 32; 256 each when the slices were priced in full)."""
    shape = prog.values[op.results[0]].shape
    return frozenset(d for d in uni[op.operands[0]] if shape[d] > 1)


def _pad_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    """A pad stays a broadcast along the dims it does not pad (XLA's simplifier moves the
    broadcast past the pad: the gradient of `mean(p[2:])` on [8, 8] pads an [8] core)."""
    config = op.param("padding_config", ())
    return frozenset(
        d
        for d in uni[op.operands[0]]
        if config[d][0] <= 0 and config[d][1] <= 0 and not config[d][2]
    )


def _dot_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    """Only an outer product (nothing contracted of size > 1) stays a broadcast: XLA rewrites it
    into an elementwise multiply of its two operands broadcast to the result."""
    if not _is_outer_product(op, prog):
        return frozenset()
    lhs_side, rhs_side = _outer_operand_uniform(op, prog, uni)
    return lhs_side & rhs_side


def _tile_uniform(op: Op, prog: Program, uni) -> frozenset[int]:
    """A tile repeats a size-1 dim as a broadcast does, and keeps the operand's uniform dims
    (seed 21 #40 tiles a broadcast)."""
    src = prog.values[op.operands[0]]
    reps = op.param("reps", ())
    return frozenset(
        d for d, (n, k) in enumerate(zip(src.shape, reps)) if d in uni[src.id] or (n == 1 and k > 1)
    )


_UNIFORM_RULES = {
    "broadcast_in_dim": _broadcast_uniform,
    "tile": _tile_uniform,
    "transpose": _transpose_uniform,
    "reshape": _reshape_uniform,
    "squeeze": _reshape_uniform,
    "expand_dims": _reshape_uniform,
    "dot_general": _dot_uniform,
    "pad": _pad_uniform,
    "slice": _slice_uniform,
    **{name: _reduction_uniform for name in prim.REDUCTIONS},
}


# --- remaining work -------------------------------------------------------------------------------


def _is_outer_product(op: Op, prog: Program) -> bool:
    """A dot_general that contracts nothing, or only dims of size 1: XLA's simplifier rewrites
    it as a multiply of two broadcasts (measured on jaxlib 0.10.2: SGD on `mean(x[1, 8] @
    w[8, 12])`, whose weight gradient `x.T @ broadcast(1/12)` contracts the batch dim of size
    1, multiplies `x` by `1/12` and the learning rate, 8 flops each, and broadcasts: 316 flops
    in all, where a full outer product and scaling counted 492)."""
    if op.primitive != "dot_general":
        return False
    (lc, _), _ = op.param("dimension_numbers")
    lhs = prog.values[op.operands[0]].shape
    return all(lhs[d] == 1 for d in lc)


def _outer_operand_uniform(op: Op, prog: Program, uni) -> tuple[frozenset[int], frozenset[int]]:
    """For an outer product `[batch..., lhs free..., rhs free...]` (its contracted dims of
    size 1 dropped): the result dims along which each operand, broadcast to the result, is
    uniform."""
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    lhs, rhs = prog.values[op.operands[0]], prog.values[op.operands[1]]
    lfree = [d for d in range(lhs.rank) if d not in lb and d not in lc]
    rfree = [d for d in range(rhs.rank) if d not in rb and d not in rc]
    nb = len(lb)
    l_out = {d: nb + i for i, d in enumerate(lfree)} | {d: i for i, d in enumerate(lb)}
    r_out = {d: nb + len(lfree) + i for i, d in enumerate(rfree)} | {d: i for i, d in enumerate(rb)}
    rank = nb + len(lfree) + len(rfree)
    lhs_side = set(range(rank)) - set(l_out.values()) | {
        l_out[d] for d in uni[lhs.id] if d in l_out
    }
    rhs_side = set(range(rank)) - set(r_out.values()) | {
        r_out[d] for d in uni[rhs.id] if d in r_out
    }
    return frozenset(lhs_side), frozenset(rhs_side)


def _core_fraction(shape: tuple[int, ...], uniform: frozenset[int]) -> float:
    return 1.0 / prod(shape[d] for d in uniform) if uniform else 1.0


def _spread_dot_product_fraction(op: Op, prog: Program, uni) -> float | None:
    """The share of its flops that XLA runs of a dot product (`dot_products.is_dot_product`)
    whose operands are both uniform along some of the same dims, else None. XLA's simplifier
    rewrites the dot into `reduce(multiply(x, y))`, computes the multiply of two broadcasts on
    their common core, and then folds the sum as it folds any (`_reduction_fraction`): over
    broadcast dims alone it is a multiply of the core by their count. Measured (jaxlib 0.10.2
    CPU): `einsum("a,a->", b, b)` with `b` a scalar's broadcast to [32] is `s * s * 32`, 2
    flops, not 63 (fuzz seed 19 #857, 1.49 of XLA's flops); `ab,ab->b` on two broadcasts of
    [4] to [32, 4] 8, `ab,ab->` 131 (the multiply's 4, and the sum over both kinds in full);
    one operand spread, `a,a->` still 63."""
    if op.primitive != "dot_general" or len(op.operands) != 2 or _is_outer_product(op, prog):
        return None
    lhs, rhs = (prog.values[v] for v in op.operands)
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    free = lambda v, c, b: [n for d, n in enumerate(v.shape) if d not in c and d not in b]  # noqa: E731
    if any(n != 1 for n in free(lhs, lc, lb) + free(rhs, rc, rb)):
        return None  # a dot with a free dim stays a dot
    ul, ur = uni[lhs.id], uni[rhs.id]
    batch = [(lhs.shape[i], i in ul and j in ur) for i, j in zip(lb, rb)]
    summed = [(lhs.shape[i], i in ul and j in ur) for i, j in zip(lc, rc)]
    if not any(both and n > 1 for n, both in batch + summed):
        return None
    core_out = prod(n for n, both in batch if not both)
    core = core_out * prod(n for n, both in summed if not both)
    k = prod(n for n, _ in summed)
    if all(both or n == 1 for n, both in summed):
        fold = core_out  # a sum over broadcast dims alone: the core times their count
    elif any(both and n > 1 for n, both in summed):
        fold = prod(n for n, _ in batch) * (k - 1)  # over both kinds: in full
    else:
        fold = core - core_out
    full = op_flops(op, prog)
    return (core + fold) / full if full else None


def _reduction_fraction(op: Op, prog: Program, uni) -> float:
    """A reduction over dims that are all broadcast is a multiply of the core (a sum); a max or
    min over them is nothing when the operand is a spread scalar, and is computed in full
    otherwise: XLA's simplifier folds `reduce(broadcast(x))` into a multiply for an add only
    (measured, jaxlib 0.10.2 CPU: the max of `broadcast(a[64]) -> [64, 32]` over dim 1 counts
    1,984 flops, of `broadcast(x[3, 2]) -> [16, 3, 2]` over dim 0 90, of a scalar's broadcast 0;
    fuzz seed 16 #81, a softmax over a broadcast dim, predicted 0.44 of XLA's flops). One over
    none of them folds the core of its operand into the core of its result; one over both kinds
    is computed in full: XLA's simplifier does not split it (measured, the sum of
    `broadcast(a[32]) -> [16, 32]` over both dims: 511 flops, over dim 0: 32, over dim 1: 31;
    fuzz seed 14 #1426, the mean of a broadcast, predicted 725 of 1,217)."""
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
        if op.primitive in ("reduce_max", "reduce_min") and core_in > 1:
            return 1.0
        flops = core_out if op.primitive in ("reduce_sum", "reduce_prod") else 0
    elif axes & u:
        return 1.0
    else:
        flops = core_in - core_out
    return flops / base
