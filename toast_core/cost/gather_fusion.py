"""How many times XLA computes a gather's fill mask and its index arithmetic.

A gather in fill mode (`jnp.take`, `take_along_axis`: `mode=FILL_OR_DROP`) is, in XLA, a raw
gather followed by cheap elementwise work: the index normalization jax emits before it
(`where(i < 0, i + n, i)`), a bounds test of each index and a select of each gathered element.
That work is fused into every loop that reads the gathered value, like any cheap producer, and
the index normalization also into the fusion of the raw gather itself when that stands apart
(read by several loops), and into each scatter reading the same index (the gather's gradient).
The cost model's fusion pass (`fusion.fusion_work`) sees a gather as a non-fusible op computed
once, and its index arithmetic as a stored value computed once; this module counts the copies.

Measured on XLA:CPU (jaxlib 0.10.2), fuzz seed 16 #304: `v4 = take_along_axis(x, i, axis=1)`
read by a silu loop and by `v4 * w` (itself read by a sort and by a second gather), and
`v9 = take_along_axis(v4 * w, argsort(v4 * w))` read by a min and a convolution: the first mask
is computed in 3 loop fusions and its index normalization in 4 (those and the raw gather's),
the second's in 2 and 3; the model counted one of each (0.62 of XLA's flops). An SGD step on
`mean(take_along_axis(x * w, i, axis=0))`: the index normalization in 3 fusions (the loss's
mask, and the index, with the iotas XLA concatenates for the batching dims, once for the
gather and once for the scatter-add of its gradient).
"""

from __future__ import annotations

from math import prod

from toast_core.cost.flops import op_flops
from toast_core.cost.fusion import _true_rank, gather_root, path_blocked
from toast_core.ir import primitives as prim
from toast_core.ir.program import Program

_INDEXED = prim.SCATTERS | {"gather"}
#: Readers that read a value through XLA:CPU's layout copy when it is `copied`.
_COPYING = frozenset({"dot_general", "conv_general_dilated"})


def _copy_read(prog: Program, o: int, position: int, r: int, local_shapes) -> tuple:
    """The copy through which dot `o` reads value `r` as its operand `position`: dots reading
    it in one grouping of its dims (unit dims left out) share one copy, a bitcast when the
    grouping keeps its row-major order (`cpu_buffers._grouping` None), a transposed copy
    otherwise. Measured: fuzz seed 19 #241, `take_along_axis(...)` of [1, 2, 32, 32] read by
    `v @ w` and by its weight gradient, both as [64, 32]: XLA:CPU computes the gather and its
    mask in one `select_bitcast_fusion` that both dots read (33,258 flops under Adam with w
    split 4 ways; 53,738 counted with the mask in one fusion per dot). A convolution reads
    through a copy of its own."""
    # Imported here: cpu_buffers builds on fusion, which this module imports.
    from toast_core.cost.cpu_buffers import _grouping

    reader = prog.ops[o]
    if reader.primitive != "dot_general":
        return (o,)
    shape = (local_shapes or {}).get(r, prog.values[r].shape)
    contracted, batch = (d[position] for d in reader.param("dimension_numbers"))
    grouping = _grouping(shape, batch, contracted, position)
    if grouping is None:  # a bitcast: the groups of dims, whichever side each is on
        wide = [d for d in range(len(shape)) if shape[d] != 1]
        b = tuple(d for d in batch if shape[d] != 1)
        c = tuple(d for d in contracted if shape[d] != 1)
        free = tuple(d for d in wide if d not in batch and d not in contracted)
        return ("bitcast", b, frozenset({free, c}))
    return ("copy", grouping)


def _batched(op) -> bool:
    """Whether a gather or scatter has batching dims (`take_along_axis`): XLA rewrites them as
    iotas concatenated to the index, a value of its own that gathers and scatters on the same
    index share (CSE), so the raw gather's index is computed apart from its mask."""
    dn = op.param("dimension_numbers")
    return bool(dict(dn).get("operand_batching_dims")) if isinstance(dn, tuple) else False


def gather_copies(
    prog: Program,
    roots: list[frozenset[int]],
    fuses: list[bool],
    kept_once,
    more_than_unary=None,
    copied: frozenset[int] = frozenset(),
    local_shapes: dict[int, tuple[int, ...]] | None = None,
) -> dict[int, int]:
    """Per op whose count differs from `fusion_work`'s: a fill-mode gather's copies (its mask's
    flops, `flops.gather_flops`: one per loop fusion reading its result, one for all readers
    that do not fuse and the output), and those of the cheap ops that compute only the indices
    of gathers and scatters (the sum, over those, of the fusions computing each index: a
    gather's mask copies, plus one for the raw gather when it stands apart, plus one per
    scatter). `kept_once(op)`: ops XLA never duplicates (`fusion._kept_once`); `more_than_unary(op)`:
    whether `op` reads more than one array (`fusion._more_than_unary`), which XLA does not
    duplicate into a gather. `copied`: values that dots and convolutions read through a layout
    copy (XLA:CPU's, `fusion.fusion_work`), a loop fusion like any other reader: one per shape
    the dots read it in (`_copy_read`, on one device's `local_shapes`).

    A mask as large as the result is fused into the readers only when all of them can take it:
    when one does not (a convolution or a sort reading the gathered value itself, or the
    output), XLA stores the gathered value with its mask applied, computed once (fuzz seed 16
    #315: `take_along_axis` read by a min's loops, a max and a convolution, one fusion computes
    the mask). A gather reading it takes it (`_gathered`), unless a path to that gather is not
    fused: the mask's select reads two arrays, so XLA duplicates it only when it fuses on every
    path to its readers (`fusion.path_blocked`, XLA's `CanFuseOnAllPaths`):
    `take_along_axis(v, argmax(v, 0))` computes it once (the argmax's index is not fused into its reader; fuzz seed 19 #920).
    Judged too for a batched gather (`_batched`: `take_along_axis` on more than a vector) read
    by several ops: XLA makes its raw gather [rows, 1, ...] and reshapes that to the value's
    shape before the mask's select, so the select's readers are the value's, and a path through
    a reduction kept apart stores it once: `v * sum(v, 0)` on v[4, 16] is 560 flops (1,200
    counted in each reader), a softmax of it 700; fuzz seed 19 #1452, a `take_along_axis`
    read by a softmax's max and shift and a concatenate, 79,108 (142,596 counted).
    Not judged for other gathers without a gather reader: on v[8] `v * sum(v, 0)` computes it
    once too (71 flops, 151 counted), but a gradient's (fuzz seed 19 #614,
    `exp(dot(v + v, v))` under SGD) is fused into every reader: there XLA's select makes
    [8, 1], reshaped to v[8] by one bitcast that all readers read, so the select has one
    user and passes `CanFuseOnAllPaths` whatever lies past the bitcast (the simplifier sinks
    that bitcast past a lone reader, as in `v * sum(v, 0)`; not modelled).
    A mask broadcast along the result's offset dims (`jnp.take`) is a unary select to XLA,
    duplicated into every fusion reading it and stored once more for the readers that do not
    fuse and the output (`_unary_mask`). Scalar readers count once per scalar fusion
    (`_scalar_fusion`)."""
    uses = prog.uses()
    outputs = set(prog.outputs)
    out: dict[int, int] = {}
    # A stored cheap result that gathers read as their operand, and something else reads too:
    # each gather's fusion computes it again (measured: `x * w` read by a sort and a `jnp.take`
    # counts 2 x 128 flops on [16, 8]; read by the take alone, 128).
    into: dict[int, frozenset[int]] = {}
    for op in prog.ops:
        if len(op.results) != 1 or not fuses[op.index] or kept_once(op) or more_than_unary is None:
            continue
        readers = uses[op.results[0]]
        gathers = frozenset(o for o, k in readers if prog.ops[o].primitive == "gather" and k == 0)
        if gathers and len(readers) > len(gathers) and not more_than_unary(op):
            into[op.index] = frozenset().union(*(_gather_fusions(prog, g, roots) for g in gathers))
            out[op.index] = len(roots[op.index] | into[op.index])
    # The cheap ops fused into such a value's own fusion go with it into each gather's (measured:
    # `(one_hot(i[2], 4) * 1.5)` read by `x[:, j]` and a scatter-add computes its compare in
    # both fusions, 48 flops, counted 40; fuzz seed 18 #49), up to an op XLA keeps once: that
    # one is stored, and what makes it stays in its fusion alone (measured: `c * tanh(gelu(v) /
    # c)` read by a `take` and a scatter-add, the multiply in both fusions, the GELU once: 55
    # flops, counted 75 with the GELU in both; fuzz seed 19 #1645).
    going: dict[int, frozenset[int]] = {}  # per cheap op: the hosts it goes with
    for op in reversed(prog.ops) if into else ():
        if op.index in into or not fuses[op.index] or kept_once(op):
            continue
        hosts = frozenset(
            h
            for h in roots[op.index] & into.keys()
            if any(o == h or h in going.get(o, ()) for r in op.results for o, _ in uses[r])
        )
        if hosts:
            going[op.index] = hosts
            out[op.index] = len(roots[op.index].union(*(into[h] for h in hosts)))
    reach: dict[int, int] = {}  # per terminal gather or scatter: the fusions computing its index
    for op in prog.ops:
        if op.primitive not in _INDEXED or len(op.operands) < 2:
            continue
        if op.primitive in prim.SCATTERS:
            reach[op.index] = 1 + (len(roots[op.index]) if _one_window(op, prog) else 0)
            continue
        if op.results and op_flops(op, prog) == 0 and _own_fusion(op, prog):
            reach[op.index] = 1  # no mask: its index is computed in its own fusion alone
            continue
        if not op.results or op_flops(op, prog) == 0:
            continue
        (r,) = op.results[:1]
        readers = uses[r]
        if not readers and r not in outputs:
            continue
        through_copy = [
            o
            for o, _ in readers
            if not fuses[o] and r in copied and prog.ops[o].primitive in _COPYING
        ]
        stored = (
            r in outputs
            or prog.values[r].is_output
            or any(
                not fuses[o] and not _gathered(prog, o, k)
                for o, k in readers
                if o not in through_copy
            )
        )
        unary = _unary_mask(op, prog)
        blocked = not unary and (
            stored
            or (
                (
                    any(_gathered(prog, o, k) for o, k in readers)
                    or (len({o for o, _ in readers}) > 1 and _batched(op))
                )
                and path_blocked(prog, op, roots)
            )
        )
        if blocked:  # stored with its mask, which the reader that does not fuse reads
            mask = 1
        else:
            ctx = frozenset().union(
                *(
                    _with_gathers(o, roots, into, kept_once(prog.ops[o]))
                    for o, _ in readers
                    if fuses[o]
                ),
                *(_gather_fusions(prog, o, roots) for o, k in readers if _gathered(prog, o, k)),
            )
            # Reductions to a scalar (a loss's `mean(a) + mean(b)`) are one fusion in XLA, which
            # computes the mask once for all of them (fuzz seed 16 #207: a gathered value read
            # by a concatenate, an add and a transpose, each then averaged into the loss).
            ctx = frozenset(_scalar_fusion(prog, c, uses, fuses, kept_once) for c in ctx)
            copies = {
                _copy_read(prog, o, k, r, local_shapes) for o, k in readers if o in through_copy
            }
            # a unary mask is also stored once for the readers that do not fuse (`_unary_mask`)
            if stored:
                stored = _stored_forms(prog, op, readers, outputs, fuses, through_copy)
            mask = max(1, len(ctx) + len(copies) + int(stored))
        out[op.index] = mask
        idx = op.operands[1]
        shared = (
            _batched(op)
            and sum(1 for o, k in uses[idx] if prog.ops[o].primitive in _INDEXED and k == 1) > 1
        )
        reach[op.index] = mask + int(mask > 1 or shared)
    if not reach:
        return out
    # The cheap ops whose results only gathers and scatters read as indices (through one another).
    terminals: list[frozenset[int] | None] = [None] * len(prog.ops)
    for op in reversed(prog.ops):
        if op.primitive in _INDEXED or not fuses[op.index] or kept_once(op):
            continue
        ts: set[int] = set()
        ok = bool(op.results)
        for r in op.results:
            if r in outputs or prog.values[r].is_output or not uses[r]:
                ok = False
                break
            for o, k in uses[r]:
                if o in reach and k == 1:
                    ts.add(o)
                elif terminals[o] is not None:
                    ts |= terminals[o]
                else:
                    ok = False
                    break
            if not ok:
                break
        if ok and ts:
            terminals[op.index] = frozenset(ts)
            out[op.index] = sum(reach[t] for t in ts)
    return out


def _unary_mask(op, prog: Program) -> bool:
    """Whether fill-mode gather `op`'s mask select is effectively unary to XLA: its mask, one
    per index vector, is broadcast along the result's offset dims, and a broadcast operand does
    not count in XLA's test (`InstructionFusion::EffectivelyAtMostUnary`), so the select reads
    one array (the raw gather's) and is duplicated into every fusion reading it, as any cheap
    unary op, besides the one stored for the readers that do not fuse (a dot) and the output.
    That needs a broadcast adding a dim of size > 1: along size-1 offset dims only (and with
    no offset dims, `take_along_axis`) it is a bitcast, a second array, and the all-paths test
    (`CanFuseOnAllPaths`) keeps the select once when a reader cannot fuse it. Measured on
    XLA:CPU: fuzz seed 19 #1112, `v4 = jnp.take(x[24, 16], i[4], axis=1)` read by a dot and by
    `v4 * v4`: the mask's select (96 flops) is in the dot operand's fusion and in the
    multiply's, and the index normalization in those and the raw gather's (2,148 flops; 2,016
    counting each once)."""
    indices = prog.values[op.operands[1]].shape
    batch = _true_rank(indices[:-1]) if indices else 0
    return _true_rank(prog.values[op.results[0]].shape) > batch


def _stored_forms(prog: Program, op, readers, outputs, fuses, through_copy) -> int:
    """How many stored fusions compute a unary fill mask (`_unary_mask`) for the readers that
    do not fuse and the output: one, but two when XLA's gather puts the index's batch dims
    first and transposes the result into jax's order (`jnp.take(x, i, axis=1)`): a dot folds
    that transpose into its dimension numbers and reads the select as the gather makes it,
    and any other (a while loop's state, the output) reads it transposed, a fusion of its own
    (fuzz seed 19 #1104: `v = jnp.take(x, i, axis=1)` read by a loop, a dot and a
    `while_loop`: the mask in three fusions, 580 flops; 536 with two)."""
    dots = {o for o, k in readers if not fuses[o] and prog.ops[o].primitive == "dot_general"}
    others = (
        op.results[0] in outputs
        or prog.values[op.results[0]].is_output
        or any(not fuses[o] and not _gathered(prog, o, k) and o not in dots for o, k in readers)
    )
    dots -= set(through_copy)
    return 1 + int(bool(dots) and others and _transposed_result(op, prog))


def _transposed_result(op, prog: Program) -> bool:
    """Whether gather `op`'s result, in XLA's order (the index's batch dims first, then the
    offset dims), reaches jax's order by a transpose that moves a dim of size > 1."""
    offset = tuple(dict(op.param("dimension_numbers")).get("offset_dims", ()))
    shape = prog.values[op.results[0]].shape
    order = [d for d in range(len(shape)) if d not in offset] + sorted(offset)
    moved = [d for d in order if shape[d] > 1]
    return moved != sorted(moved)


def _with_gathers(o: int, roots, into: dict[int, frozenset[int]], kept: bool) -> frozenset[int]:
    """The fusions computing op `o`: its own (`roots`), and the gathers' fusions that compute
    again a stored cheap value it makes, or one it is fused into (`into`; fuzz seed 19 #435: a
    fill mask read by the broadcast of `v[..., None] * w`, which a loop and a gather fusion
    both compute, is computed in both, 4,290 flops; 3,010 counted once)."""
    hosts = frozenset() if kept else roots[o] & into.keys()
    return roots[o].union(into.get(o, frozenset()), *(into[h] for h in hosts))


def _gathered(prog: Program, o: int, position: int) -> bool:
    """Whether op `o` reads its `position` operand as a gather's operand: XLA fuses a fill-mode
    gather's mask into the fusion of a gather reading the gathered value, like into any loop
    (`fusion._with_fused_gathers`; fuzz seed 19 #1149: `v3 = take_along_axis(x, i)` read by
    `take_along_axis(v3, j)`, `v3[k]` and a multiply computes its mask in 4 fusions, and its
    index normalization in those and the raw gather's, 7,558 flops; 2,950 counted once)."""
    return position == 0 and prog.ops[o].primitive == "gather"


def _gather_fusions(prog: Program, g: int, roots: list[frozenset[int]]) -> frozenset[int]:
    """The fusions in which gather `g` computes its operand: its own (`fusion.
    _with_fused_gathers`'s placeholder root) for several index vectors, else those of its
    readers' loops (a dynamic-slice). A cheap operand that the gather's readers and others read
    fuses into those fusions already (`roots`): counted once each (fuzz seed 19 #233:
    `take_along_axis(abs(x), i)` beside `x - abs(x)` computes the abs twice, 9,728 flops, not
    11,776)."""
    if _own_fusion(prog.ops[g], prog):
        return frozenset((gather_root(prog, g),))
    return roots[g]


def _own_fusion(op, prog: Program) -> bool:
    """Whether gather `op` is a fusion of its own (several index vectors, `fusion.
    _with_fused_gathers`), into which XLA fuses the cheap ops making its index, as into each
    scatter reading that index too (measured on XLA:CPU: `x.at[:, i].add(tanh(x[:, i]))`
    normalizes `i` (`where(i < 0, i + n, i)`) in the gather's fusion and again for the
    scatter, 30 flops on [4, 8] with 3 indices, not 21; fuzz seed 17 #870, #1419). A gather of
    one index vector is a dynamic-slice in its readers' loops, which `fusion_work` counts."""
    indices = prog.values[op.operands[1]].shape
    return op.primitive == "gather" and prod(indices[:-1]) > 1


def _one_window(op, prog: Program) -> bool:
    """Whether scatter `op` updates one window (a dynamic-update-slice in its readers' loops,
    `fusion._in_loop_fusion`): XLA tests the window's bounds in a fusion of its own and
    computes the update in each loop, both with the index normalization (measured on XLA:CPU:
    `x.at[i].set(tanh(x[i]))` with one index normalizes it twice, fuzz seed 17 #812)."""
    indices = prog.values[op.operands[1]].shape
    return not indices or prod(indices[:-1]) == 1


def _scalar_fusion(prog: Program, c: int, uses, fuses, kept_once) -> int:
    """The scalar loop fusion root `c` ends in (a placeholder below zero for itself when it is
    none): XLA fuses a scalar result into its one scalar reader, so scalar roots in one chain
    are one fusion, the loss's `mean(a) + mean(b)` (fuzz seed 16 #207). The chain stops at an
    op with several readers (expensive, XLA keeps it apart rather than duplicate it; cheap, it
    is duplicated into each) and at an output: a gradient's scalars (fuzz seed 19 #614,
    `exp(dot(v + v, v))` under SGD: the exp read by the loss and the gradient, the loss, the
    updated scalar weight) are three fusions, each computing the mask again (565 flops)."""
    if not _to_scalar(prog, c):
        return c
    at = c
    while True:
        readers = {o for r in prog.ops[at].results for o, _ in uses[r]}
        outputs = any(prog.values[r].is_output for r in prog.ops[at].results)
        if len(readers) != 1 or outputs:
            return -1 - at
        (o,) = readers
        if not fuses[o] or not _to_scalar(prog, o):
            return -1 - at
        at = o


def _to_scalar(prog: Program, i: int) -> bool:
    """Whether op `i` (a fusion root; a placeholder below zero is none) makes scalars only: a
    reduction to a scalar, or the scalar arithmetic a reduction fused into (`mean(a) + ...`)."""
    if i < 0:
        return False
    op = prog.ops[i]
    return bool(op.results) and all(prog.values[r].rank == 0 for r in op.results)
