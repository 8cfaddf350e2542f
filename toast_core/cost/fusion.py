"""XLA-style loop fusion, as far as the cost model needs it.

XLA fuses chains of elementwise and layout ops into loops, so only some values touch HBM (they are
*materialized*), and a cheap producer read by several fusions is fused into each of them and
computed once per fusion: the compiled program executes more elementwise flops than the jaxpr has.
On a GPT train step that duplication is a third of the non-matmul flops `cost_analysis()` counts
(the backward fusions recompute the forward's bias adds, GELU and layer-norm terms), and more of the
per-device flops once the matmuls are sharded and those replicated terms are not.

Expensive producers (most transcendentals, divisions, reductions) are never duplicated: XLA keeps
one copy and reads its result.
"""

from __future__ import annotations

import weakref
from math import prod

from toast_core.cost.flops import spread_divisor_elements
from toast_core.cost.flops_measured import EXPANDED_ON_BROADCAST
from toast_core.cost.fusion_indexing import IndexingCounts
from toast_core.ir import primitives as prim
from toast_core.ir.program import Program

#: Reductions XLA fuses with the elementwise ops feeding them (as fusion roots).
_REDUCTIONS = prim.FUSED_REDUCTIONS | prim.ARG_REDUCTIONS

#: Random bits: TPU and GPU lower `threefry2x32` unrolled, to integer adds, xors and shifts that
#: XLA fuses with the counters feeding them and the mask reading them, so the bits never reach HBM
#: (the CPU's rolled 5-trip loop is a JAX compile-time shortcut for the CPU alone, and the judge
#: prices it as the fused op: `toast_core.apply.hlo_compute`). The hash is computed once, not
#: duplicated into each reader.
RANDOM_BITS = frozenset({"random_bits", "threefry2x32"})

#: JAX's stacking primitives, which XLA lowers to fusible layout ops: `stack` to a concatenate
#: of reshaped operands, `unstack` to slices, `tile` to a broadcast and a reshape (fuzz seed 14
#: #623: a stack's cotangent, unstacked and added to the tanh's gradient, was two 3 KiB buffers
#: in the model and none in XLA's buffer assignment, where one loop fusion reads the scalar
#: cotangent; seed 23 #84, a tile, 0.61 -> 1.00). `split` too: JAX lowers it to one slice per
#: piece, each fused into its readers (the cotangent's chain read through the pieces of the
#: splits of a cummax's backward is computed in each fusion reading a piece: fuzz seed 19
#: #551, cummax then gelu, 0.70 -> 0.97 of XLA's flops; its empty pieces are constants,
#: `_fusion_work_roots`).
STACKING = frozenset({"stack", "unstack", "tile", "split"})

#: Ops XLA fuses into loops: elementwise maps (a `bitcast_convert_type` reinterprets each element,
#: as XLA's elementwise bitcast-convert does), layout changes, reductions and random bits.
FUSIBLE = (
    prim.ELEMENTWISE
    | prim.FUSIBLE_LAYOUT
    | STACKING
    | _REDUCTIONS
    | RANDOM_BITS
    | {"bitcast_convert_type"}
)


def fusible(op, prog: Program) -> bool:
    """Whether XLA fuses `op` into loops: a `FUSIBLE` primitive, or a dot_general that contracts
    nothing of size > 1 (an outer product, `[12, 1] @ [1, 8]`), which XLA's simplifier rewrites
    as a multiply of two broadcasts before fusion: a cheap elementwise op, fused and duplicated
    like one (measured: a train step whose `x[12, 1] @ w[1, 8]` feeds the loss and the
    gradient computes the product in both fusions)."""
    if op.primitive in FUSIBLE:
        return True
    if op.primitive != "dot_general" or not op.operands:
        return False
    (lc, _), _ = op.param("dimension_numbers")
    lhs = prog.values[op.operands[0]].shape
    return all(lhs[d] == 1 for d in lc)


#: Fusible ops XLA computes once even when several fusions read them (measured: exp, log, tanh,
#: sqrt, logistic, divisions... are kept once; sin, cos and tan are duplicated like cheap ops).
NOT_DUPLICATED = (
    (prim.TRANSCENDENTAL - prim.DUPLICATED_TRANSCENDENTAL)
    | prim.EXPANDED_TRANSCENDENTAL
    | {"div"}
    | _REDUCTIONS
    | RANDOM_BITS
)


def materialized(prog: Program, fuses: list[bool] | None = None) -> list[bool]:
    """Whether each value is written to and read from HBM: a value made by a fusible op and read
    only by fusible ops stays in registers. Program inputs and outputs, and values a non-fusible op
    makes or reads, are materialized. `fuses` [ops]: whether each op fuses, when a backend fuses
    more than `fusible` says (XLA:CPU's dot products: `cpu_buffers.dot_product_fused`)."""
    producers = prog.producers()
    uses = prog.uses()
    outputs = set(prog.outputs)  # of the program as given (a `simplify.rewired` one too)
    fuses = _fusible_ops(prog) if fuses is None else fuses
    out = []
    for v in prog.values:
        p = producers[v.id]
        if p is None or v.id in outputs or not fuses[p]:
            out.append(True)
            continue
        readers = uses[v.id]
        out.append(not readers or not all(fuses[o] for o, _ in readers))
    return out


#: id(program) -> (weak reference to it, `_fusible_ops` of it): the passes of one evaluator
#: build (`materialized`, `fusion_copies`, `fused_away`...) ask each op 300k times at GPT-3 175B.
_FUSIBLE_MEMO: dict[int, tuple[weakref.ref, list[bool]]] = {}


def _fusible_ops(prog: Program) -> list[bool]:
    """Per op, whether XLA fuses it (`fusible`), computed once per program (read-only)."""
    hit = _FUSIBLE_MEMO.get(id(prog))
    if hit is not None and hit[0]() is prog:
        return hit[1]
    out = [fusible(op, prog) for op in prog.ops]
    if len(_FUSIBLE_MEMO) >= 8:
        _FUSIBLE_MEMO.clear()
    _FUSIBLE_MEMO[id(prog)] = (weakref.ref(prog), out)
    return out


def fusion_copies(
    prog: Program, is_materialized: list[bool], spread: list[bool] | None = None
) -> list[int]:
    """How many times each op is computed: once per fusion that contains it (`fusion_work`)."""
    return fusion_work(prog, is_materialized, spread)[0]


def fusion_work(
    prog: Program,
    is_materialized: list[bool],
    spread: list[bool] | None = None,
    unfused: frozenset[int] = frozenset(),
    copied: frozenset[int] = frozenset(),
    roots_out: list | None = None,
    local_shapes: dict[int, tuple[int, ...]] | None = None,
    apart_on_broadcast: dict[int, int] | None = None,
    fused_dots: frozenset[int] = frozenset(),
    recopied: frozenset[int] = frozenset(),
) -> tuple[list[int], dict[int, int]]:
    """(copies, expanded): how many times each op is computed, once per fusion that contains
    it; and, for each special function XLA expands into many HLO ops (erfc, digamma: `prim.
    EXPANDED_TRANSCENDENTAL`) whose cheap part is fused into several readers, the number of
    fusions reading it (its expensive part, the exp and divisions, is computed once: its
    transcendentals count once; `flops_measured.expanded_extra_copies` says how much of its
    flops each further reader recomputes).

    `spread` [values]: those XLA's simplifier leaves as a broadcast of a smaller array
    (`simplify.uniform_dims`), which an effectively-unary test does not count as an input.

    An op whose result is materialized is the root of its own fusion; a cheap op is fused into
    the fusions of all its fusible readers as well. An op XLA does not duplicate (`NOT_DUPLICATED`) roots its own
    fusion only when several fusions read it: read by one, XLA fuses it into that one like any
    op, and its cheap producers with it, unless that one reads it into more elements
    (`_expensive_reused`). `gelu(x, approximate=False)`'s gradient is one loop
    fusion with the erfc expansion inside; counting erfc apart counted the `x / sqrt(2)` feeding
    both it and the exp twice. A reduction fuses into its one reader's loop too (logsumexp's
    `log(sum(exp(x - m))) + m` is one fusion: its `m` is computed once), unless that loop writes
    more elements than it makes (`_widens`); several reductions of one result shape can share
    that loop. A division by a spread divisor is a multiply once XLA's simplifier
    has rewritten it (`_is_reciprocal_multiply`), duplicated like one. Walking the
    (topologically ordered) ops backwards, each op's set of fusion roots is the union of its
    readers' sets.

    `unfused`: ops (fusible ones, reductions) to take as not fused with what they read: those
    the backend compiles apart (`simplify.executions`). `copied`: values that the dots or
    convolutions reading them read through a layout copy the backend makes (XLA:CPU), a loop
    fusion like any other reader: a cheap op making one is computed in that copy and in each
    fusion reading it, as when all its readers fuse (fuzz seed 15 #855: `min(a, b) * w` read by
    `einsum('abc,bz->acz')` and a tile, computed in both).

    `roots_out`: a list that receives, per op, the fusions computing it (for
    `gather_fusion.gather_copies`).

    `local_shapes` [value id -> shape]: the shapes one device computes on, where they differ
    from the program's (a partitioned program's shards), for the tests XLA makes on the HLO it
    fuses (`_unfused_path`); the program's own shapes when None.

    `apart_on_broadcast` [op -> n]: special functions run on a broadcast, whose expensive parts
    are n fusions of their own however few read the result (`EXPANDED_APART_ON_BROADCAST`):
    each reads the function's operand, so the cheap ops making it are computed there again.

    `recopied`: `copied` values that dots read through copies in several groupings (on one
    device's shapes: `toast_core.apply.validate._copied_in_several_groupings`), a loop fusion
    each: a cheap producer is computed in a second copy too, as for a dot reading the value on
    both sides (`_copied_for_both_sides`).
    """
    fuses = _fusible_ops(prog)
    if unfused:
        fuses = [f and i not in unfused for i, f in enumerate(fuses)]
    if fused_dots:
        fuses = [f or i in fused_dots for i, f in enumerate(fuses)]
    fuses, is_materialized, gather_own = _with_fused_gathers(prog, fuses, is_materialized)
    costly = _costly_cones(prog, is_materialized, spread)
    reads_apart = _apart_roots(apart_on_broadcast or {})
    walk = (prog, fuses, is_materialized, gather_own, spread, copied, reads_apart, fused_dots)
    roots, expanded = _fusion_work_roots(*walk, costly, local_shapes, recopied)
    stored = _stored_apart(prog, roots, fuses, spread)
    if stored:
        # A costly op rooted in a fusion of its own is a stored buffer: cheap work reading it
        # is not costly (softmax's `e / sum(e)` with `e = exp(x - max)` read by a sum and the
        # division, `e` stored: the reciprocal multiply is recomputed in each reader).
        is_stored = list(is_materialized)
        for v in stored:
            is_stored[v] = True
        again = _costly_cones(prog, is_stored, spread)
        if again != costly:
            roots, expanded = _fusion_work_roots(*walk, again, local_shapes, recopied)
    if roots_out is not None:
        roots_out[:] = roots
    return [1 if i in expanded else len(r) for i, r in enumerate(roots)], expanded


def _added_into_scatter(prog: Program, op, uses) -> bool:
    """Whether `op` is `scatter_add(a, i, u) + b`, the scatter read by that add alone, which
    XLA's simplifier rewrites as `scatter_add(a + b, i, u)`: the add is the root of the fusion
    making the scatter's operand (where `b`'s cheap producers are computed once), and the
    scatter's result is the buffer the add's readers read, not a value fused into each.
    Measured on [24, 8]: `(sin(x) + zeros.at[i].add(u)) + tanh(x)` read by three sums is one
    `sin + tanh` fusion then the scatter, 1,353 flops (1,737 with the add in each sum's loop);
    fuzz seed 19 #1654, a batchnorm's output read by a checkpointed `sin * tanh` and a `take`:
    the checkpoint's backward was counted in each of 5 fusions of the normalization's gradient
    (1.32 of XLA's flops; 1.00 now)."""
    from toast_core.cost.simplify import INTO_ADDEND  # simplify builds on this module

    if op.primitive not in ("add", "add_any") or len(op.operands) != 2 or len(op.results) != 1:
        return False
    producers = prog.producers()
    shape = prog.values[op.results[0]].shape
    for v in op.operands:
        p = producers[v]
        if p is None or prog.ops[p].primitive != "scatter-add" or len(uses[v]) != 1:
            continue
        scatter = prog.ops[p]
        base = producers[scatter.operands[0]] if scatter.operands else None
        # A scatter of zeros is one the simplifier has put at an add's place already
        # (`INTO_ADDEND`), or one it could not (read by several ops before XLA's CSE merged
        # them: `(a + s) + b` written three times stays as written).
        into = scatter.param(INTO_ADDEND) or (
            base is not None and prog.ops[base].primitive != "broadcast_in_dim"
        )
        if into and prog.values[v].shape == shape:
            return True
    return False


def _stored_apart(prog: Program, roots, fuses, spread) -> list[int]:
    """Values of fusible ops XLA keeps once (`_kept_once`) that root a fusion of their own, read
    by other fusions: they are stored buffers, whatever `materialized` says (it sees only
    non-fusible readers)."""
    out = []
    for op in prog.ops:
        i = op.index
        if fuses[i] and roots[i] == frozenset((i,)) and _kept_once(op, prog, spread):
            out.extend(op.results)
    return out


def _apart_roots(apart_on_broadcast: dict[int, int]) -> dict[int, frozenset[int]]:
    """Per special function on a broadcast (`fusion_work`'s `apart_on_broadcast`), the
    placeholder roots (below zero, in the op's slots as `EXPANDED_APART`'s) of its expensive
    parts' fusions."""
    return {
        i: frozenset(-(i * 64 + j + 1) for j in range(n))
        for i, n in apart_on_broadcast.items()
        if n
    }


def _fusion_work_roots(
    prog,
    fuses,
    is_materialized,
    gather_own,
    spread,
    copied,
    reads_apart,
    fused_dots,
    costly,
    local_shapes=None,
    recopied=frozenset(),
):
    """Per op, the fusions computing it, and the special functions expanded into several
    readers (`fusion_work`'s walk, given the costly cones). `reads_apart` [op -> placeholder roots]:
    fusions that read an op's operands but compute none of the op (`_apart_roots`)."""
    uses = prog.uses()
    roots: list[frozenset[int]] = [frozenset()] * len(prog.ops)
    # Per fusion root, op indices and the placeholder roots below zero (a gather's own fusion,
    # a special function's expensive parts) alike: a list indexed by those raised IndexError
    # (fuzz seed 53 #28, a reduction read by a take_along's gather fusion).
    expanded: dict[int, int] = {}
    self_only = frozenset()
    holds_reduction: dict[int, tuple[int, ...]] = {}  # per fusion root: its reductions' shape
    reused_apart: set[int] = set()  # expensive ops rooted alone for a reuse further on
    indexing = IndexingCounts(prog)
    for op in reversed(prog.ops):
        # An empty result is a constant to XLA (its simplifier replaces any op making one):
        # computed in no fusion, stored nowhere, and its readers read nothing through it (the
        # levels of a scan of 2^k elements leave empty pieces: `grad(sum(sin(cummax(x))))` on
        # x[16] is 946 flops, 863 predicted with them read, 1,043 with the splits fused too).
        if op.results and not any(prog.values[r].size for r in op.results):
            continue
        mat = any(is_materialized[r] for r in op.results if prog.values[r].size)
        if not fuses[op.index] or op.index in fused_dots or _added_into_scatter(prog, op, uses):
            roots[op.index] = frozenset((op.index,))
            continue
        reading = [
            _gather_reading(prog, o, pos, roots, gather_own) if o in gather_own else roots[o]
            for r in op.results
            if prog.values[r].size
            for o, pos in uses[r]
            if fuses[o]
        ]
        if reads_apart:  # a special function's expensive parts read its operands apart
            reading += [reads_apart[o] for r in op.results for o, _ in uses[r] if o in reads_apart]
        if op.index in gather_own and not _fills(op):
            roots[op.index] = frozenset((gather_own[op.index],))
            continue
        readers = reading[0] if len(reading) == 1 else frozenset().union(*reading)
        self_only = frozenset((op.index,))
        if not _kept_once(op, prog, spread):
            # A cheap op is fused into every fusion reading it, and also computed in its own
            # when a non-fusible op or the output reads it (`x * 0.5 + 0.1` read by a dot and a
            # multiply: XLA computes it for the dot and again inside the multiply's loop;
            # `_recomputing_readers` says where).
            if mat and not readers and _copied_and_read_directly(prog, op, copied, fuses):
                # Stored for a dot reading it as it is, and computed again in the layout copy
                # another dot reads (a placeholder root: the copy's loop fusion).
                roots[op.index] = self_only | frozenset((_copy_root(op.index),))
            elif not readers or (mat and _is_loop_carry(prog, op, uses)):
                roots[op.index] = self_only
            elif mat and _read_through_copies(prog, op, copied, fuses):
                unfused_path = len(readers) > 1 and _unfused_path(
                    prog, op, roots, local_shapes, reused_apart
                )
                roots[op.index] = self_only if unfused_path else self_only | readers
            elif mat:
                roots[op.index] = self_only | _recomputing_readers(
                    prog, op, roots, spread, fuses, local_shapes
                )
            elif len(readers) > 1 and _unfused_path(prog, op, roots, local_shapes, reused_apart):
                roots[op.index] = self_only
            else:
                roots[op.index] = readers
            if (
                mat
                and _read_through_copies(prog, op, copied, fuses)
                and (op.results[0] in recopied or _copied_for_both_sides(prog, op, fuses))
            ):
                roots[op.index] |= frozenset((_copy_root(op.index),))
            if not costly[op.index]:
                roots[op.index] = indexing.limit(op, roots[op.index], roots)
            continue
        own = mat or len(readers) > 1
        through_copies = (
            mat
            and _read_through_copies(prog, op, copied, fuses)
            and not _copied_and_read_directly(prog, op, copied, fuses)
        )
        if op.primitive in prim.EXPANDED_TRANSCENDENTAL and (
            (
                (not mat or through_copies or _dots_read_reshaped(prog, op, fuses))
                and len(readers) + mat > 1
                and not path_blocked(prog, op, roots, local_shapes, reused_apart)
            )
            or _widened_by_its_reader(prog, op, mat, readers, roots, uses, local_shapes)
        ):
            # Its cheap producers go with its cheap part into every reader, and into each
            # fusion of an expensive part (`EXPANDED_APART`): placeholder roots, below zero.
            # Stored for dots that read it reshaped, it is one more fusible reader; so is the
            # layout copy XLA:CPU makes for dots that read it through one (fuzz seed 19 #11:
            # digamma read by `einsum('abc,bz->acz')` and a multiply is expanded into the
            # copy's loop and the multiply's, nothing stores it; 0.84 of XLA's flops once).
            expanded[op.index] = len(readers) + mat
            apart = EXPANDED_APART.get(op.primitive, 0)
            placeholders = frozenset(-(op.index * 64 + j + 1) for j in range(apart))
            own = frozenset((_copy_root(op.index),)) if through_copies else self_only
            roots[op.index] = readers | placeholders | (own if mat else frozenset())
            continue
        if (
            not own
            and len(readers) == 1
            and _expensive_reused(prog, op, readers, roots, uses, local_shapes)
        ):
            own = True
            reused_apart.add(op.index)
        if op.primitive in prim.ARG_REDUCTIONS:
            # An argmax is a variadic reduce (value and index) that its reader reads through a
            # get-tuple-element, which XLA:CPU does not loop-fuse (`CpuInstructionFusion::
            # ShouldFuse`, `CanBeLoopFused`): it is a fusion of its own, whatever reads it
            # (`take_along_axis(abs(x), argmax(abs(x)))`: the abs in the argmax's fusion and in
            # the gather's, 1,376 flops on [16, 8]; 1,248 counted once).
            own = True
        if not own and op.primitive in _REDUCTIONS and readers:
            # Reductions of one result shape read by one loop are siblings XLA fuses together
            # (`sum(e) + sum(e * 3)`, `e = x * 2 + 1` on [16, 32]: 2,559 flops, `e` once;
            # `mean(gelu(x)) + mean(pad(gelu(x)))` 33,889, the erfc once: fuzz seed 18 #8, 2.0
            # of XLA's flops, and #896, #968, #1181). One of another shape stays apart, as
            # does one read into more elements on its way, save by a pad (`_reused_on_the_way`:
            # `sum(e, 0)[None] + sum(e, 1)[:, None]`: 3,536, `e` twice), or one read by a loop
            # that is itself a reduction.
            # Not modelled: XLA also fuses a reduction feeding another
            # (`sum(sum(e, 1) * 2) + sum(e)`: 2,063, `e` once); allowing every shape made seed
            # 18 #602, a cumprod's gradient, 0.92 -> 0.86 of XLA's flops.
            (root,) = readers
            shape = prog.values[op.results[0]].shape
            held = holds_reduction.get(root)
            own = (
                (held is not None and held != shape)
                or prog.ops[_root_op(prog, root)].primitive in _REDUCTIONS
                or _reused_on_the_way(prog, op, root, roots, uses, local_shapes)
                or _all_reduced(prog, op, local_shapes)
            )
            if not own:
                holds_reduction[root] = shape
        roots[op.index] = self_only if own or not readers else readers
        if own and op.primitive in _REDUCTIONS:
            holds_reduction[op.index] = prog.values[op.results[0]].shape
    return roots, expanded


def _all_reduced(prog: Program, op, local_shapes: dict | None) -> bool:
    """Whether reduction `op` folds a dim cut across devices (its operand's local extent along a
    reduced axis is shorter than the whole): the partitioner all-reduces each device's partial
    result, and the loop reading it reads the all-reduce's. XLA's simplifier merges `reduce(a) +
    reduce(b)` into one reduce of `a + b` (the siblings of `_fusion_work_roots`), not two
    all-reduced sums, which stay fusions of their own (measured: `value_and_grad(mean(g) +
    mean(min(g, 0.3)))`, `g` an exact GELU of f32[16, 32], data-parallel on 2 devices: 57,347
    flops, erfc's expansion in both sums' loops; fuzz seed 19 #926, the means of an exact
    GELU's min and of a difference, 0.81 of XLA's flops with the sums merged)."""
    if not local_shapes or not op.operands:
        return False
    local = local_shapes.get(op.operands[0])
    if local is None:
        return False
    shape = prog.values[op.operands[0]].shape
    return any(local[d] < shape[d] for d in op.param("axes", ()) or ())


def _with_fused_gathers(
    prog: Program, fuses: list[bool], is_materialized: list[bool]
) -> tuple[list[bool], list[bool], dict[int, int]]:
    """(`fuses`, `is_materialized`, gather fusions) with gathers taken as the loop fusions XLA
    makes of them, for counting work (measured on XLA:CPU):

    * a gather of one index vector is a dynamic-slice, a cheap loop op XLA fuses into each fusion
      reading it, with the cheap ops making its operand and index, computed there over their
      whole shape (fuzz seed 16 #16: `v = x * x` on [8], read by a division and by `v[i]`, which
      a stack and a `where` read, is computed in three loops, 24 flops, not 8);
    * a gather of several is a fusion of its own (the gather fusion, in the third value: gather
      op -> placeholder root) that the cheap ops making its operand and indices fuse into; in
      fill mode (`jnp.take`) its out-of-bounds mask, with the index normalization feeding it, is
      fused into each reader instead (`take(x * 2 + 1, i)` read by a sum and a max: the affine
      map once, the mask and `where(i < 0, i + n, i)` in each reader's loop, 154 flops).

    A scatter of one update window is a cheap loop op like a dynamic-slice (`_in_loop_fusion`).
    A value stored only because a gather reads or makes it is then not stored. Flops only:
    `materialized` and the memory model keep their own view (`_fused_into_gathers`)."""
    gathers = [op for op in prog.ops if _in_loop_fusion(op, prog)]
    if not gathers:
        return fuses, is_materialized, {}
    fuses = list(fuses)
    own: dict[int, int] = {}
    for op in gathers:
        fuses[op.index] = True
        indices = prog.values[op.operands[1]].shape
        if op.primitive == "gather" and prod(indices[:-1]) > 1:
            own[op.index] = gather_root(prog, op.index)
    producers = prog.producers()
    uses = prog.uses()
    outputs = set(prog.outputs)
    touched = {v for op in gathers for v in op.operands}
    touched |= {op.results[0] for op in gathers if op.index not in own or _fills(op)}
    is_materialized = list(is_materialized)
    for v in touched:
        p = producers[v]
        if not is_materialized[v] or p is None or v in outputs or prog.values[v].is_output:
            continue
        readers = uses[v]
        if fuses[p] and readers and all(fuses[o] for o, _ in readers):
            is_materialized[v] = False
    return fuses, is_materialized, own


def gather_root(prog: Program, i: int) -> int:
    """The placeholder root (below zero, below `EXPANDED_APART`'s ids) of the fusion of its own
    that gather `i` of several index vectors is (`_with_fused_gathers`)."""
    return -(len(prog.ops) * 64 + i + 1)


def _in_loop_fusion(op, prog: Program) -> bool:
    """A gather, or a scatter of one update window: XLA makes it a dynamic-update-slice that
    its reader loops compute in place, each with its select and combine (fuzz seed 31 #37:
    `v.at[:, :, :, i[1]].add(u)` read by a multiply and a slice: both loops select and add).
    A dead one (`simplify._pruned` leaves it reading nothing) is in no loop."""
    if not op.results or len(op.operands) < 2:
        return False
    if op.primitive == "gather":
        return True
    if op.primitive not in prim.SCATTERS:
        return False
    indices = prog.values[op.operands[1]].shape
    return not indices or prod(indices[:-1]) == 1


def _fills(op) -> bool:
    return "FILL" in str(op.param("mode", ""))


def _gather_reading(prog: Program, o: int, position: int, roots, own: dict[int, int]):
    """The fusions computing an operand of gather `o` (`_with_fused_gathers`): those of the
    gather for a dynamic-slice; for a gather of several index vectors its own fusion, and for
    the indices of a fill-mode one each fusion its mask is in as well."""
    if o not in own:
        return roots[o]
    if position == 1 and _fills(prog.ops[o]) and roots[o] != frozenset((o,)):
        return roots[o] | frozenset((own[o],))
    return frozenset((own[o],))


#: Fusions of its own that each expensive part (exp, log, a division) of a special function
#: gets when XLA duplicates its cheap part into several readers: each reads the function's
#: operand, so the cheap ops making it are computed there again (measured: `f(x * 2 + 1)`
#: read by two loops against `f(x)`; erfc computes `x * 2 + 1` five times: in the two
#: readers, in its exp's and its two divisions' fusions).
EXPANDED_APART = {
    "asinh": 2,
    "atanh": 2,
    "bessel_i0e": 2,
    "bessel_i1e": 2,
    "digamma": 2,
    "erf_inv": 1,
    "erfc": 3,
    "igamma": 14,
    "igamma_grad_a": 19,
    "igammac": 14,
    "lgamma": 1,
    "polygamma": 7,
    "random_gamma_grad": 19,
    "regularized_incomplete_beta": 12,
    "sinh": 2,
    "zeta": 8,
}

#: Fusions of its own that each expensive part of a special function run on a broadcast gets
#: however few fusions read its result (`fusion_work`'s `apart_on_broadcast`; the selects and
#: what follows them run on the whole result: `flops_measured.EXPANDED_ON_BROADCAST`). XLA
#: fuses no expensive producer into a consumer that reuses its elements
#: (`CpuInstructionFusion::ShouldFuse`), and that loop reads the core through the broadcast:
#: the exp and divisions stay apart, each reading the operand's core, where the cheap ops
#: making it are computed again. On the plain operand they fuse into the one loop (`erfc(sin(
#: x))` on f32[64]: one sine). Measured as the sines of `f(broadcast(sin(x)))`, x f32[64] to
#: [64, 4], over 64, less one: erfc 3 (4 sines; fuzz seed 19 #1071, a gelu of a transposed
#: broadcast, 0.93 of XLA's flops with the gelu's `-x / sqrt(2)` computed once), digamma 1.
EXPANDED_APART_ON_BROADCAST = {
    "acosh": 2,
    "asinh": 2,
    "atanh": 2,
    "bessel_i0e": 2,
    "bessel_i1e": 2,
    "digamma": 1,
    "erf_inv": 1,
    "erfc": 3,
    "lgamma": 0,
    "sinh": 3,
}
if set(EXPANDED_APART_ON_BROADCAST) != set(EXPANDED_ON_BROADCAST):
    raise AssertionError(sorted(set(EXPANDED_APART_ON_BROADCAST) ^ set(EXPANDED_ON_BROADCAST)))


def _widened_by_its_reader(
    prog: Program, op, mat: bool, readers, roots, uses, local_shapes=None
) -> bool:
    """Whether special function `op`, not stored, is read by one loop fusion that reads it into
    more elements than it has (a broadcast on the way: an outer-product weight gradient
    `f(x)[:, None] * w`). XLA fuses no expensive producer (a divide, log, exp) into a consumer
    that reuses its elements (`CpuInstructionFusion::ShouldFuse`: "Fusion is not profitable"
    when `is_expensive(producer)` and `ReusesOperandElements`), as for a reduction
    (`_reused_on_the_way`): the expansion's exp, log and divisions stay in fusions of their
    own (`EXPANDED_APART`) and its cheap part goes into the reader, split as for several
    readers but with one (`flops_measured.expanded_extra_copies`). The cheap part stays on the
    function's own shape there, the broadcast after it. Measured on f32[32] into [32, 8]:
    `digamma(x * x + 1)[:, None] * w` 3,104 flops (2,656 counted as one fusion), erfc 2,560
    (2,240), lgamma 2,560 (1,984), polygamma 3,136 (2,592); fuzz seed 19 #1258, #1525."""
    if mat or len(readers) != 1:
        return False
    (root,) = readers
    return root >= 0 and _reused_on_the_way(prog, op, root, roots, uses, local_shapes)


def _expensive_reused(prog: Program, op, readers, roots, uses, local_shapes=None) -> bool:
    """Whether expensive elementwise `op` (an exp, a log, a division: kept once,
    `_kept_once`), read by the one loop fusion `readers`, is read there into more elements
    than it has (`_reused_on_the_way`): XLA:CPU fuses no expensive producer into a consumer
    that reuses its elements (`CpuInstructionFusion::ShouldFuse`, "Fusion is not
    profitable"), so it roots a fusion of its own, with its cheap producers, as it does for
    several readers. An outer-product weight gradient `(g * exp(v))[:, None] * x[None, :]`
    (a multiply of two broadcasts in the HLO) reads the exp so: measured, the erfc feeding
    `exp(erfc(v))` is computed in the exp's fusion and again in each other fusion reading it
    (fuzz seed 19 #724, 0.74 of XLA's flops when the exp was fused into the weight
    gradient's loop). Reductions (`_REDUCTIONS`, their own rule), special functions (their
    expansion's rule) and random bits (no one expensive op) aside."""
    if op.primitive in _REDUCTIONS or op.primitive in RANDOM_BITS:
        return False
    if op.primitive in prim.EXPANDED_TRANSCENDENTAL:
        return False
    (root,) = readers
    return root >= 0 and _reused_on_the_way(prog, op, root, roots, uses, local_shapes)


def _dots_read_reshaped(prog: Program, op, fuses) -> bool:
    """Whether `op`'s result, not an output, is stored only for dots that read it with no free
    dim (each dim contracted or batch): XLA reads such an operand through a loop fusion, into
    which it fuses a special function's expansion like into any loop, and duplicates it into
    the other fusible readers. A vector `v @ w` gets a unit free dim from the dot decomposer, a
    bitcast (fuzz seed 16 #1036: `erfc(x)` read by `einsum('a,az->z')` and, through the
    outer-product gradient, by the SGD update: expanded in both fusions, 0.60 of XLA's flops
    counted once); `einsum('ab,ab->b')` becomes a multiply and a reduce (seed 16 #230, a
    digamma read so and by its gradient: 0.90). A dot reading the value with a free dim reads
    the stored result itself, and XLA computes the expansion once (`erfc(x) @ x` beside
    `erfc(x) * 2 + x`: its final select reads several arrays)."""
    if len(op.results) != 1:
        return False
    (r,) = op.results
    if prog.values[r].is_output or r in prog.outputs:
        return False
    for o, pos in prog.uses()[r]:
        if fuses[o]:
            continue
        reader = prog.ops[o]
        if reader.primitive != "dot_general":
            return False
        (lc, rc), (lb, rb) = reader.param("dimension_numbers")
        if len((lc, rc)[pos]) + len((lb, rb)[pos]) != len(prog.values[r].shape):
            return False
    return True


def _read_through_copies(prog: Program, op, copied: frozenset[int], fuses) -> bool:
    """Whether `op`'s result is stored only for readers that read it through a layout copy
    (`copied`): not an output, and every reader that does not fuse is a dot or a convolution."""
    if not copied or len(op.results) != 1 or op.results[0] not in copied:
        return False
    (r,) = op.results
    if prog.values[r].is_output or r in prog.outputs:
        return False
    return all(fuses[o] or prog.ops[o].primitive in prim.MATMULS for o, _ in prog.uses()[r])


def _copy_root(op: int) -> int:
    """The placeholder root (below zero) of the loop fusion making `op`'s result in a dot's
    layout: the last of `op`'s 64 slots (`_root_op` maps it back to `op`; the other slots are an
    expanded special function's, which is never a copied cheap op)."""
    return -(op * 64 + 63 + 1)


def _copied_and_read_directly(prog: Program, op, copied: frozenset[int], fuses) -> bool:
    """Whether `op`'s result, read only by dots and convolutions (`_read_through_copies`), is
    read by one dot through a layout copy and by another as it is: XLA:CPU then computes the
    value twice, once into its own buffer and once fused into the copy (measured: gradients of
    `mean(gelu(einsum('abc,cz->abz', x, w2) @ w4))`, x f32[2, 4, 4]: the gelu gradient's
    chain is in `add_bitcast_fusion` for the input-gradient dot and again in
    `copy_bitcast_fusion` for the weight-gradient dot, contracted over (0, 1): 1,810 flops, of
    which 512 in that second copy; fuzz seed 17 #575, 0.72 of XLA's without it)."""
    if not _read_through_copies(prog, op, copied, fuses):
        return False
    # Imported here: cpu_buffers builds on this module.
    from toast_core.cost.cpu_buffers import _grouping

    (r,) = op.results
    shape = prog.values[r].shape
    direct = copying = False
    for o, pos in prog.uses()[r]:
        reader = prog.ops[o]
        if fuses[o] or reader.primitive != "dot_general":
            continue
        (lc, rc), (lb, rb) = reader.param("dimension_numbers")
        contracted = (lc, rc)[pos]
        if not contracted or all(shape[d] == 1 for d in contracted):
            direct = True  # an outer product: a multiply reading the value
            continue
        if _grouping(shape, (lb, rb)[pos], contracted, pos) is None:
            direct = True
        else:
            copying = True
    return direct and copying


def _copied_for_both_sides(prog: Program, op, fuses) -> bool:
    """Whether a dot reads `op`'s result on both sides, each through a layout copy (`_grouping`
    not None) and with free and contracted dims on each: XLA:CPU's dot decomposer copies it
    twice, each side in its own order (`batch, free, contracted` on the left, `batch,
    contracted, free` on the right), and a cheap producer is computed in both copies
    (measured on jaxlib 0.10.2: `einsum("abc,dbc->acd", v, v)` with `v = minimum(x, 0.3)` of
    x[8, 6, 20] copies `v` into [20, 8, 6] and [20, 6, 8], each computing the minimum: 17,280
    flops, not 16,320; also "abc,adc->bd"; fuzz seed 18 #97)."""
    # Imported here: cpu_buffers builds on this module.
    from toast_core.cost.cpu_buffers import _grouping

    (r,) = op.results
    shape = prog.values[r].shape
    if len(_conv_copy_orders(prog, r, fuses)) > 1:
        return True
    for o, pos in prog.uses()[r]:
        reader = prog.ops[o]
        if pos != 0 or fuses[o] or reader.primitive != "dot_general" or reader.operands[1] != r:
            continue
        dims = reader.param("dimension_numbers")
        both = True
        for side in (0, 1):
            contracted, batch = dims[0][side], dims[1][side]
            c = [d for d in contracted if shape[d] != 1]
            free = [d for d in range(len(shape)) if d not in contracted and d not in batch]
            if not c or not [d for d in free if shape[d] != 1]:
                both = False
            elif _grouping(shape, batch, contracted, side) is None:
                both = False
        if both:
            return True
    return False


def _conv_copy_orders(prog: Program, r: int, fuses) -> set[tuple[int, ...]]:
    """The dim orders, other than its own, in which convolutions read value `r` (`cpu_buffers.
    conv_operand_copies`): XLA:CPU makes one transposed copy per order, a loop fusion that
    computes a cheap producer again (measured: SGD on a `conv_general_dilated` with dimension
    numbers ('CWN', 'WOI', 'WCN'): the output's cotangent, read by the input-gradient and the
    weight-gradient convolutions in two orders, is computed in `transpose_copy_fusion` and
    `transpose_copy_fusion.1`, 39,936 flops each; fuzz seed 19 #760, 0.74 of XLA's flops).
    Only in the entry computation: the pass that inserts the transposes (`ConvCanonicalization`)
    walks no loop body or branch, whose convolutions read their operands as they are (seed 19
    #1513, a convolution's gradients in a `while_loop`: no copy in XLA's HLO)."""
    shape = prog.values[r].shape
    own = tuple(d for d in range(len(shape)) if shape[d] != 1)
    orders = set()
    for o, pos in prog.uses()[r]:
        reader = prog.ops[o]
        if fuses[o] or reader.primitive != "conv_general_dilated" or pos > 1:
            continue
        if reader.region_depth:  # XLA:CPU's ConvCanonicalization visits the entry alone
            continue
        wide = tuple(d for d in conv_read_order(reader, pos) if shape[d] != 1)
        if wide != own:
            orders.add(wide)
    return orders


def conv_read_order(conv, pos: int) -> tuple[int, ...]:
    """The dim order in which XLA:CPU's convolution reads its operand `pos` (0: the input,
    batch, spatial dims, features; 1: the kernel, spatial dims, input and output features)."""
    specs = dict(conv.param("dimension_numbers"))
    (lb, lf, *ls), (ro, ri, *rs) = specs["lhs_spec"], specs["rhs_spec"]
    return (lb, *ls, lf) if pos == 0 else (*rs, ri, ro)


def _is_loop_carry(prog: Program, op, uses) -> bool:
    """Whether a result of `op` is a loop body's carry out (read by the scan's or while's end
    in a carry slot): XLA computes it once, in the fusion that writes the carry, and its other
    readers in the body read that buffer (measured: a scan cell `c = 0.5 * c + x` with
    `ys = sin(c)` or `ys = c * 2` counts the multiply and add once per body; fuzz seed 41 #55,
    predicted 13 flops of 11 when its readers recomputed it)."""
    for r in op.results:
        for o, j in uses[r]:
            end = prog.ops[o]
            if end.primitive == prim.SCAN_END and j < int(end.param("num_carry", 0)):
                return True
            if end.primitive == prim.WHILE_END and j < len(end.operands) // 2:
                return True
    return False


def _kept_once(op, prog: Program, spread: list[bool] | None = None) -> bool:
    """Whether XLA computes `op` once however many fusions read it (`NOT_DUPLICATED`), a
    division by a spread divisor aside (`_is_reciprocal_multiply`). A negative integer power
    is a division in the HLO (`1 / (x * x)`), kept once like one (fuzz seed 19 #548: the
    `v / (1 + v * v)` gradient's `integer_pow(1 + v * v, -2)` is computed in one fusion that
    the reshaped dot operand's loop and the outer product's read)."""
    if op.primitive == "integer_pow" and int(op.param("y", 0)) < 0:
        return True
    return op.primitive in NOT_DUPLICATED and not _is_reciprocal_multiply(op, prog, spread)


def _is_reciprocal_multiply(op, prog: Program, spread: list[bool] | None = None) -> bool:
    """Whether `op` is a floating-point division XLA's simplifier rewrites as a multiply by a
    reciprocal computed on the small side: `x / c` with `c` a constant, `x / broadcast(b)`
    (softmax's normalization), `x / s` with `s` smaller than the result (`flops.div_flops`
    counts the reciprocal). A multiply is cheap: XLA fuses it into every fusion that reads it
    (measured: `s = x / y[:, None]` read by `s * 2` and `s + x` is computed in both loops,
    260 flops on [4, 16], not 196; a softmax read by two loops, 111 on [16], not 95)."""
    if op.primitive != "div" or len(op.operands) != 2 or not op.results:
        return False
    if not prog.values[op.results[0]].dtype.startswith(("float", "bfloat")):
        return False
    d = op.operands[1]
    if prog.values[d].role in ("literal", "constant"):
        return True
    if spread is not None and spread[d]:
        return True
    return spread_divisor_elements(op, prog) > 0


#: Readers that compute a stored cheap result again in their own loop (`_recomputing_readers`).
_RECOMPUTING = prim.ELEMENTWISE | _REDUCTIONS | prim.FUSIBLE_LAYOUT | STACKING | {"dot_general"}


def _recomputing_readers(
    prog: Program,
    op,
    roots: list[frozenset[int]],
    spread=None,
    fuses=None,
    local_shapes=None,
) -> frozenset[int]:
    """The fusions that recompute a stored cheap result rather than read it: those that read
    it: elementwise ops, reductions, outer products, and layout ops (XLA fuses the
    producer into the copy a transpose, reshape or slice makes; measured: `v = x * 2 + 1` read
    by a dot and, transposed, reshaped, expanded or sliced, by an output is computed twice:
    fuzz seed 15 #46 and #58), whether or not they hold
    costly work themselves: XLA decides on the producer alone. None either when the op reads
    more than one array (`_more_than_unary`): XLA duplicates a producer that some consumer
    cannot fuse only when it is effectively unary, as a second input read again would raise
    the bytes read (`InstructionFusion::ComputeGloballyUnfusible`; momentum SGD's
    `m' = beta * m + g`, an output read by the update `p - lr * m'`, is stored once and read,
    and so are Adam's moments, read by the update's division and square root; but a moment
    whose gradient is a broadcast is recomputed there, fuzz seed 14 #1668). On one device's
    `local_shapes` where given (`fusion_work`).

    A result stored only for dots that read it with no free dim (`_dots_read_reshaped`) is
    read there through the dot decomposer's bitcast, a loop fusion like any reader: XLA can
    fuse it into every consumer on every path, so it duplicates it whatever it reads, unless
    a path is blocked (`path_blocked`; measured: `v = x * y` read by `einsum('a,az->z', v,
    w)` and `v * y` is computed in both loops, 121 flops on [11]; fuzz seed 19 #517, 0.92 of
    XLA's flops counted once).

    Costly work under it does not matter (once the costly op has several readers, XLA stores
    it and duplicates the cheap ops after it, as `ShouldFuse` refuses only the expensive
    producer itself): `tanh(x) * 2 + 1` read by the output, `* 3` and `sin` is computed in
    all three loops, tanh once apart (112 flops on [16]; fuzz seed 19 #779, 0.92 of XLA's
    flops counted once). A costly op reading two arrays is refused by `_duplicable` already
    (`gelu(x)`'s final `x * (1 + tanh(...))`)."""
    fuses_given = fuses is not None
    fuses = _fusible_ops(prog) if fuses is None else fuses
    if (
        not _duplicable(prog, op, spread, local_shapes)
        and not (
            fuses_given
            and _dots_read_reshaped(prog, op, fuses)
            and not path_blocked(prog, op, roots, local_shapes)
        )
        and not _stacked_and_fused_on_all_paths(prog, op, roots, fuses, local_shapes)
    ):
        return frozenset()
    uses = prog.uses()
    return frozenset().union(
        *(
            roots[o]
            for r in op.results
            for o, _ in uses[r]
            if prog.ops[o].primitive in _RECOMPUTING and fuses[o] and not _folded_transpose(prog, o)
        )
    )


def _stacked_and_fused_on_all_paths(
    prog: Program, op, roots: list[frozenset[int]], fuses, local_shapes=None
) -> bool:
    """Whether `op`, stored only as a scan step's stacked output (a `scan_end` ys slot), is read
    otherwise by fusions that recompute it (`_RECOMPUTING`) on paths that are all fused: XLA
    duplicates even a producer of several arrays then. Its stacked write is a dynamic-update-
    slice of the step's element, a loop fusion like any reader, so every user of the producer
    can fuse it on every path, the exemption of `InstructionFusion::ComputeGloballyUnfusible`
    (`CanFuseOnAllPaths`); a producer a non-fusible op or the loop's carry tuple reads is kept
    once. Measured: the backward scan of `c = 0.5 * c + x; ys = sin(c)` computes the scalar
    `add_any = g + ct * cos(c)` in the dynamic-update-slice's fusion and in the carry's `* 0.5`
    fusion (fuzz seed 19 #382, 2x2x2 search: 19 of XLA's 23 flops with it counted once, 21 with
    it duplicated; the other two are the reversed scan's index `n - 1 - i`, computed in each of
    those fusions, not modelled), and so on f32[16, 8] in seed 19 #69's backward scan."""
    if not op.results:
        return False
    uses = prog.uses()
    outputs = set(prog.outputs)
    stacked = False
    for r in op.results:
        if r in outputs:
            return False
        for o, j in uses[r]:
            reader = prog.ops[o]
            if reader.primitive == prim.SCAN_END:
                n_carry = int(reader.param("num_carry", 0))
                if not n_carry <= j < len(reader.operands) - n_carry:
                    return False  # a carry slot: the loop's tuple reads it
                stacked = True
            elif reader.primitive not in _RECOMPUTING or not fuses[o] or _folded_transpose(prog, o):
                return False
    return stacked and not path_blocked(prog, op, roots, local_shapes, stacked_writes=True)


def _folded_transpose(prog: Program, i: int) -> bool:
    """Whether op `i` is a transpose that only dots read: XLA folds it into their dimension
    numbers (`TransposeFolding`), so nothing computes it (measured: `v = x * 2 + 1` read by a
    dot and, transposed, by another is computed once)."""
    op = prog.ops[i]
    if op.primitive != "transpose":
        return False
    uses = prog.uses()
    readers = [o for r in op.results for o, _ in uses[r]]
    return bool(readers) and all(prog.ops[o].primitive == "dot_general" for o in readers)


#: Beyond this many ops between a producer and its readers, `_unfused_path` gives up (and the
#: producer is duplicated as before): the walk stays linear in practice on large programs.
_PATH_WALK_LIMIT = 512


def _unfused_path(
    prog: Program,
    op,
    roots: list[frozenset[int]],
    local_shapes: dict | None = None,
    apart=frozenset(),
) -> bool:
    """Whether XLA keeps a cheap producer read by several fusions in one fusion of its own,
    computed once: it reads more than one array (`_more_than_unary`) and more elements than it
    makes, and some path from it to one of its readers runs through an op that is not fused into
    the next one (a reduction kept apart, a non-fusible op): XLA duplicates such a producer only
    when it can fuse it into all its consumers on all paths (`InstructionFusion::
    ComputeGloballyUnfusible` / `CanFuseOnAllPaths`). The gradient of `abs(log_softmax(x))`:
    the `sign(shifted - log(sum))` term feeds the `dx` sum and, through that sum and a broadcast,
    the same final fusion; XLA computes it once (fusion of [64, 8]: 6592 flops, where duplicating
    it counted 10624). A path is fused when each op on it is fused into all the fusions its
    successor is in (`roots[x]` contains the successor's).

    A path through another op that no fusion takes in (a scatter of several windows, a sort, a
    loop) is blocked: fuzz seed 19 #434, erfc read by `v = x / (1 + e * e)` and by the
    gradient, `v` reaching the gradient through a scatter: XLA computes erfc once (1.76 of
    XLA's flops when duplicated). When a path runs through a matmul (a transformer's
    layer-norm terms read by the forward and again by the backward), nothing is judged and the
    producer stays duplicated as before, which matches XLA:CPU's count of the GPT train step
    (201.3 M flops; judging those paths too fell to 197.9 M, under by 1.7 %).

    Judged on `local_shapes` (`fusion_work`) where given: XLA tests the HLO of one device.
    `apart`: see `path_blocked`."""
    if _duplicable(prog, op, local_shapes=local_shapes) or not op.results:
        return False
    return path_blocked(prog, op, roots, local_shapes, apart)


def _duplicable(
    prog: Program, op, spread: list[bool] | None = None, local_shapes: dict | None = None
) -> bool:
    """Whether XLA may duplicate `op` into consumer fusions whatever else reads it: the two
    early exits of `InstructionFusion::ComputeGloballyUnfusible`. Either it reads at most one
    array as large as its result (`_more_than_unary`, XLA's `EffectivelyAtMostUnary`), or its
    distinct operands hold no more elements than its result: a second read of the same
    input adds no traffic (`producer->unique_operands()`). In the HLO every operand of an
    elementwise op has the result's shape (lax's implicit broadcasts are broadcast ops there),
    so an elementwise op passes the second test only when it reads a single array, as `x * x`
    does (fuzz seed 19 #2018: `v = x * x` read by a subtraction and a cumsum's reduce-window
    is computed in both, 1,231 flops; counted once, 1,167). On one device's `local_shapes`
    where given (`fusion_work`)."""
    if not _more_than_unary(prog, op, spread, local_shapes):
        return True
    if not op.results:
        return False
    size = lambda v: prod(_shape_of(prog, v, local_shapes))  # noqa: E731
    made = sum(map(size, op.results))
    unique = set(op.operands)
    if op.primitive in prim.ELEMENTWISE:  # each operand as large as the result
        return made == 0 or len(unique) <= 1
    return sum(map(size, unique)) <= made


def path_blocked(
    prog: Program,
    op,
    roots: list[frozenset[int]],
    local_shapes: dict | None = None,
    apart=frozenset(),
    stacked_writes: bool = False,
) -> bool:
    """Whether some path of fusible ops from `op` to one of its readers runs through an op that
    is not fused into the next one (`_unfused_path`, without its tests on `op` itself: a special
    function's expansion ends in a select of several arrays whatever `op` reads). An expensive
    op in `apart` (`_expensive_reused`: rooted alone because a loop further on reads it into
    more elements) blocks the edge to its reader only when that reader does so itself: XLA's
    all-paths test (`CanFuseOnAllPaths`) asks `ShouldFuse` of each edge, before fusion (fuzz
    seed 19 #316: the exact GELU's erfc, read through `tanh(gelu(x) / c)`, is computed in the
    tanh's fusion and in two others; 0.61 of XLA's flops when that edge blocked it).

    `stacked_writes`: a `scan_end` reading `op` stands for the dynamic-update-slices that write
    it into the stacked outputs, which read nothing else on a path from it: no path to judge
    (`_stacked_and_fused_on_all_paths`)."""
    if not op.results:
        return False
    uses = prog.uses()
    direct = sorted(
        {
            o
            for r in op.results
            for o, _ in uses[r]
            if not (stacked_writes and prog.ops[o].primitive == prim.SCAN_END)
        }
    )
    if not direct:
        return False
    last = direct[-1]
    # Forward from `op` to the last reader: the ops on a path from it.
    seen = {op.index}
    frontier = [op.index]
    while frontier:
        nxt = []
        for i in frontier:
            for r in prog.ops[i].results:
                for o, _ in uses[r]:
                    if o <= last and o not in seen:
                        seen.add(o)
                        nxt.append(o)
        if len(seen) > _PATH_WALK_LIMIT:
            return False
        frontier = nxt
    # Every edge x -> y on such a path into a direct reader must be fused: x's fusions include y's.
    producers = prog.producers()
    blocked = False
    for c in direct:
        stack, back = [c], {c}
        while stack:
            y = stack.pop()
            for v in prog.ops[y].operands:
                x = producers[v]
                if x is None or x == op.index or x not in seen or x in back:
                    continue
                if not fusible(prog.ops[x], prog) and not _in_loop_fusion(prog.ops[x], prog):
                    if prog.ops[x].primitive in prim.MATMULS:
                        return False  # see the docstring: not measured to hold across matmuls
                    blocked = True  # a scatter, a sort, a loop: its reader cannot fuse it
                elif prog.ops[x].primitive in _REDUCTIONS:
                    blocked = blocked or _reduction_edge_blocked(prog, x, uses, local_shapes)
                elif x in apart:
                    # rooted alone for a reuse further on (`_expensive_reused`): XLA's test
                    # asks of this edge only whether `y` itself reuses its elements
                    blocked = blocked or any(
                        prog.values[r].size > prog.values[v].size
                        for r in prog.ops[y].results
                        for v in prog.ops[x].results
                    )
                elif not roots[y] <= roots[x]:
                    blocked = True
                back.add(x)
                stack.append(x)
    return blocked


def _reduction_edge_blocked(prog: Program, x: int, uses, local_shapes: dict | None = None) -> bool:
    """Whether XLA's all-paths test (`CanFuseOnAllPaths`, asked before any fusion) finds the
    edge out of reduction `x` unfusible. The reduction is expensive, so that edge is unfusible
    when fusing would duplicate it (several readers) or when its reader reads each element
    several times (makes more elements: a broadcast, or an elementwise op with implicit size-1
    broadcasting, as the HLO's broadcast before it does). Its reader in the HLO is the first op
    past keepdims reshapes and annotations (`_VANISHING`); an expensive op of the same size
    (`_kept_once`: the log of `log(sum(exp(shifted)))`) passes the test on to its own reader.
    A keepdims reshape that cheap ops of its size read stays a bitcast, which they may
    duplicate: logsumexp's `where(isfinite(max), max, 0)` reads the max so, and XLA computes
    the softplus feeding it both in the max's fusion and in the exp's (fuzz seed 18 #516).

    A reduction read once by a loop of its own size is fusible in that test, though fusion
    later keeps it apart: `var(leaky_relu(x), axis=0)`'s `mean / n` is a multiply before the
    broadcast, and XLA computes the leaky ReLU both in the mean's fusion and in the centred
    squares' (x[2, 2, 2, 1]: 80 flops, 57 when it was counted once; fuzz seed 18 #163, 0.77
    of XLA's flops). A softmax's max broadcast into `x * y - max` stays blocked (tests/
    test_flops_norm.py), and so does log_softmax's `shifted - log(sum)`."""
    if _library_call(prog, prog.ops[x]) or prog.ops[x].primitive in prim.ARG_REDUCTIONS:
        return True  # an argmax's get-tuple-element is no loop op (`_fusion_work_roots`)
    if _keeps_unit_dims(prog, prog.ops[x], local_shapes):
        return len({o for r in prog.ops[x].results for o, _ in uses[r]}) > 1
    size = sum(prog.values[r].size for r in prog.ops[x].results)

    def widens(o: int) -> bool:
        return sum(prog.values[r].size for r in prog.ops[o].results) > size

    def passes(o: int) -> bool:
        op = prog.ops[o]
        return op.primitive in _VANISHING or op.primitive in _SIZE_KEEPING_LAYOUT

    at, expensive = x, True
    while True:
        readers = {o for r in prog.ops[at].results for o, _ in uses[r]}
        if expensive and len(readers) > 1:
            return True  # fusing would duplicate it
        if not readers:
            return False
        if all(map(widens, readers)):
            return True  # read through broadcasts (a keepdims reshape folds into them)
        if len(readers) > 1:
            return False  # a bitcast read by cheap ops: duplicating it costs nothing
        (at,) = readers
        expensive = _kept_once(prog.ops[at], prog)
        if not expensive and not passes(at):
            return False


def _keeps_unit_dims(prog: Program, op, local_shapes: dict | None) -> bool:
    """Whether reduction `op` reduces a dim longer than 1 of an operand that keeps a dim of size
    1 (on one device's `local_shapes` where given). XLA's simplifier reduces such an operand
    through a bitcast without the unit dims and bitcasts the result back: the reduction's
    reader in the HLO is that bitcast, which reuses no element, and the broadcast after it is
    a cheap op; so the all-paths test (`_reduction_edge_blocked`) passes where a broadcast
    reading the reduction itself fails it (`CpuInstructionFusion::ShouldFuse`: an expensive
    producer into a consumer that reuses its elements). Measured: `g - max(g, -1,
    keepdims=True)`, `g` an exact GELU, duplicates `g` into the max's fusion and the
    subtraction's on f32[1, 2] and [2, 1, 2] (137.5 flops per element), computes it once on
    [2, 2] (65.5); fuzz seed 19 #155, that softmax on f32[8, 2] cut to [1, 2] on 8 devices,
    0.50 of XLA's flops with `g` once."""
    if not op.operands:
        return False
    shape = _shape_of(prog, op.operands[0], local_shapes)
    axes = set(op.param("axes", ()) or ())
    return any(shape[d] > 1 for d in axes) and any(
        n == 1 for d, n in enumerate(shape) if d not in axes
    )


def _library_call(prog: Program, op) -> bool:
    """Whether XLA:CPU hands reduction `op` to its kernel library (a float sum, max or min of
    at least `cpu_buffers.LIBRARY_REDUCE_MIN_ELEMENTS` elements: a `__ynn_fusion` custom
    fusion), a call no producer fuses into: a producer it reads is stored, not copied into the
    fusions of the reduction's readers. The zoo GPT's residual adds feeding a LayerNorm
    ([8, 32, 64] per device) are each computed once in XLA's HLO, their mean a `__ynn_fusion`;
    counting them in each fusion took its predicted/XLA flops from 1.013 to 1.018 (data
    parallel on 8). Sizes are the program's (global unless the program is a device's)."""
    from toast_core.cost.cpu_buffers import is_library_reduction  # cpu_buffers imports fusion

    return bool(op.operands) and is_library_reduction(prog, op, prog.values[op.operands[0]].size)


#: Layout ops that keep a reduction's elements as they are (keepdims): bitcasts in the HLO.
_SIZE_KEEPING_LAYOUT = frozenset({"broadcast_in_dim", "reshape", "expand_dims", "squeeze"})


#: Ops between a softmax's max and its shift `x - max` that XLA's simplifier leaves as the
#: max's broadcast: keepdims reshapes, `stop_gradient`, the `max(-inf, m)` of `initial=-inf`.
_MAX_PASSING = frozenset({"broadcast_in_dim", "reshape", "expand_dims", "stop_gradient", "max"})


def _feeds_max_and_exp_shift(prog: Program, op) -> bool:
    """Whether a cheap op feeds both a max reduction and the shift `exp(x - max)` of that max,
    as a softmax's scores do: XLA:CPU computes such a producer once and stores it, though
    duplicating it is otherwise free (`CpuInstructionFusion::ComputeGloballyUnfusible`: a copy
    recomputed with FMA contraction could exceed the max it was taken over by an ulp, which
    exp makes inf). The masked scores `where(causal, s, -1e9)` read by the softmax's max and
    exp are one buffer in XLA's buffer assignment (tests/test_memory_fusion.py).

    Used for buffers only, not for flops: jaxlib 0.10.2's XLA:CPU duplicates an
    effectively-unary producer into the max's fusion and the exp's all the same (measured on
    [64, 8]: `softmax(x * 2)`, `softmax(x - b[:, None])`, `softmax(log_softmax(x))` compute the
    producer in both loops; fuzz seed 17 #994, a log_softmax read by top-k routing's softmax,
    0.85 -> 0.95 of XLA's flops). A producer reading two arrays (`x * y`, `where(x > 0, x, c)`)
    is computed once, for `_unfused_path`'s reason."""
    if len(op.results) != 1:
        return False
    (r,) = op.results
    uses = prog.uses()
    maxima = {
        prog.ops[o].results[0]
        for o, k in uses[r]
        if prog.ops[o].primitive == "reduce_max" and k == 0
    }
    if not maxima:
        return False
    producers = prog.producers()
    for o, _ in uses[r]:
        shift = prog.ops[o]
        if shift.primitive != "sub" or not any(
            prog.ops[e].primitive == "exp" for x in shift.results for e, _ in uses[x]
        ):
            continue
        for x in shift.operands:
            for _ in range(8):  # back through the max's broadcast to the max itself
                if x in maxima:
                    return True
                p = producers[x]
                if p is None or prog.ops[p].primitive not in _MAX_PASSING:
                    break
                x = max(prog.ops[p].operands, key=lambda v: prog.values[v].size)
    return False


#: The param `simplify._reassociated_product` sets on a product of two scalings of one element,
#: `(A * c1) * (B * c2)`, that XLA computes as `(A * B) * (c1 * c2)`: a scaling, which XLA's
#: effectively-unary test passes (`_more_than_unary`).
REASSOCIATED = "reassociated"

#: Annotations JAX lowers to nothing (or XLA removes before fusion): `_more_than_unary` looks
#: through them (softmax's `stop_gradient(max)` reaches the fusion as a broadcast).
_VANISHING = prim.NO_OP_ELEMENTWISE - {"optimization_barrier"}


def _shape_of(prog: Program, v: int, local_shapes: dict | None) -> tuple[int, ...]:
    """Value `v`'s shape on one device (`local_shapes`), else the program's."""
    shape = prog.values[v].shape
    return shape if local_shapes is None else local_shapes.get(v, shape)


def _more_than_unary(
    prog: Program, op, spread: list[bool] | None = None, local_shapes: dict | None = None
) -> bool:
    """Whether `op` reads more than one array as large as its result: operands of lower rank,
    scalars and values spread from them (broadcasts, iotas, and the values XLA's simplifier
    turns into broadcasts, `spread`) do not count, as in XLA's effectively-unary test; nor do an
    outer product's (`fusible`: XLA rewrites it as a multiply of two broadcasts). Adam on a
    weight whose gradient is a broadcast (`mean(einsum("a,az->z", x, w))`: `x * 1/Z` spread
    along z): `0.9 * m + 0.1 * g` reads `m` and a broadcast, so XLA computes each moment both
    in its output's fusion and again in the update's (fuzz seed 14 #1668: 932 of 1,144).

    Ranks are true ranks (`_true_rank`, dims of size > 1), as XLA counts them: an operand with
    size-1 dims the op broadcasts (log_softmax's `shifted - log(sum)[..., None]`, lax's
    implicit size-1 broadcasting) is a broadcast in the HLO, not a second array (measured:
    `exp(v - max(v))` with `v = x - b[:, None]` computes `v` in both loops).

    With `local_shapes` (`fusion_work`), on one device's shapes: a broadcast that adds only
    dims of local size 1 there is a bitcast after XLA's simplifier, a second array like any
    (measured: `y = x - mean(x, 0)` read by `sum(y * y, 0)` and `y * s`, x[8, 24] with dim 0
    cut 8 ways: 144 flops per device, `y` computed once; duplicated it counted 192).

    A scalar op's scalar operands are arrays to the test (rank 0, as its result's), but for
    constants: measured on scalars (jaxlib 0.10.2 CPU), `v = x * ((1 + y) * 0.5)` read by the
    output, `erf(v)` and `sin(v)` is computed once (3 flops), as on `[1]`.

    A product of two scalings of one element (`REASSOCIATED`) is a scaling to XLA, its last op a
    multiply by a constant, which the test does not count: XLA duplicates it into each reader.
    """
    if op.primitive == "dot_general" or op.param(REASSOCIATED):
        return False
    shape_of = lambda v: _shape_of(prog, v, local_shapes)  # noqa: E731
    rank = _true_rank(shape_of(op.results[0])) if op.results else 0
    producers = prog.producers()
    # a scalar operand of a scalar op is an input like any, but for a constant (XLA's test
    # passes an effective scalar constant), not a broadcast
    scalar_op = bool(op.results) and not shape_of(op.results[0])
    arrays = 0
    for v in op.operands:
        if scalar_op and prog.values[v].role in ("literal", "constant"):
            continue
        p = producers[v]
        while p is not None and prog.ops[p].primitive in _VANISHING and prog.ops[p].operands:
            p = producers[prog.ops[p].operands[0]]  # gone from the HLO XLA tests
        if p is not None and prog.ops[p].primitive == "iota":
            continue
        if p is not None and prog.ops[p].primitive == "broadcast_in_dim":
            src = prog.ops[p].operands[0]
            if local_shapes is None or prod(shape_of(src)) < prod(shape_of(v)):
                continue
        if spread is not None and spread[v]:
            continue
        shape = shape_of(v)
        if (shape or scalar_op) and _true_rank(shape) >= rank:
            arrays += 1
    return arrays > 1


def _true_rank(shape: tuple[int, ...]) -> int:
    """The dims of size > 1, as XLA's effectively-unary test counts rank (`ShapeUtil::
    TrueRank`)."""
    return sum(1 for d in shape if d > 1)


def _costly_cones(
    prog: Program, is_materialized: list[bool], spread: list[bool] | None = None
) -> list[bool]:
    """Per op: whether it, or a fusible producer feeding it through values that stay in
    registers, is work XLA does not duplicate (`NOT_DUPLICATED`); work on constants alone (a
    mean's `1 / N`) is folded, not costly.

    Costly work does not reach an op through an operand smaller than its result (a broadcast,
    an implicit size-1 broadcast): XLA does not fuse an expensive
    producer into a consumer that reuses its elements (`InstructionFusion`'s
    `ReusesOperandElements` test), so that producer is stored and the cheap op reading its
    broadcast is duplicated like any other. Measured on [4, 8, 16]: `v = x - log(c)[None]` read
    by the output and `sum(v)` is computed in both loops (1,535 flops, predicted 1,023), as is
    a `log_softmax` (its `- log(sum(exp))[None]`) read by a `cond` and its predicate's sum
    (fuzz seed 18 #171: 4,353, predicted 3,329); `v = x * tanh(y)`, same shapes, once."""
    producers = prog.producers()
    const = [v.role in ("literal", "constant") for v in prog.values]
    out = [False] * len(prog.ops)
    fuses = _fusible_ops(prog)
    for op in prog.ops:
        if op.operands and all(const[x] for x in op.operands):
            for r in op.results:
                const[r] = True
            continue
        if not fuses[op.index]:
            continue
        size = prog.values[op.results[0]].size if op.results else 0
        out[op.index] = _kept_once(op, prog, spread) or any(
            out[p]
            for x in op.operands
            if not is_materialized[x]
            and (p := producers[x]) is not None
            and prog.values[x].size >= size
        )
    return out


def fused_away(prog: Program, is_materialized: list[bool]) -> list[bool]:
    """Whether each value never exists as a buffer: XLA fuses its producer into its readers'
    loops, which compute it in registers from the producer's operands. Only values a fusible op
    makes and only fusible ops read (not `is_materialized`) can be, and of those two kinds are:

    * expansions (broadcasts, iota masks, upcasts: a value larger than what it is recomputed
      from), fused into every reader however many: the causal mask `where(tril(ones(S, S))[None,
      None], scores, -inf)` broadcast to [B, H, S, S] never exists, forward or backward, only
      the [S, S] one (measured with `memory_analysis()`; tests/test_memory_fusion.py);
    * a value that one fusion alone computes (one reader, or readers all fused into the same
      one), other than a reduction's result read by a wider loop or another reduction
      (`_widens`: a softmax's max is a buffer): an elementwise chain is one loop. Adam's update `p - lr * (m / c1) /
      (sqrt(v / c2) + eps)` writes only the new parameters (a train step's temporaries were 324
      bytes where counting each [24, 16] intermediate predicted 7.7 KB), and `var(x)`'s centred
      squares exist only inside its reduction (XLA: one 4-byte temporary).

    A cheap value read by several fusions is fused away too when XLA duplicates it into each of
    them, as `fusion_copies` counts its flops: it reads one array (`_more_than_unary`), or no
    path to its readers leaves the fusions (`_unfused_path`), and it is not a softmax's scores
    (`_feeds_max_and_exp_shift`); an elementwise op, not a layout one (fuzz #623's stack
    `[v3, tanh(v3)]` read by the loss and its gradient is one buffer in XLA). BatchNorm's `z - mean`, `* rsqrt(var)`, `* gamma + beta`,
    each [32, 64] per device under megatron on 2x4, are recomputed from the matmul's `z` inside
    the relu, the loss's and every gradient fusion (XLA's temporaries: one [32, 64] at a time
    beside z; counting them as buffers predicted 1.49 of XLA's bytes, 1.12 without); so is
    `1 + x * x` read by a forward division and its gradient's (measured: no buffer). An
    expensive value (a division, an exp) read by several fusions stays a buffer. A fused
    value's operands stay live until its last reader instead (the cost model's liveness).
    XLA:CPU stores some of them all the same, for the library reductions that read them
    (`cpu_buffers.library_reduction_inputs`, the CPU view only).
    """
    expansion = _expansions(prog, is_materialized)
    roots = _fusion_roots(prog, is_materialized, expansion)
    out = [False] * len(prog.values)
    uses = prog.uses()
    fuses = _fusible_ops(prog)
    folded = sums_of_broadcasts(prog)
    for op in prog.ops:
        if _fused_into_gathers(prog, op, uses, fuses) or _update_slice_fused(prog, op, uses, fuses):
            out[op.results[0]] = True
            continue
        if folded[op.index]:
            (r,) = op.results
            out[r] = not is_materialized[r] and bool(uses[r])
            continue
        if op.index in roots[op.index] or not fuses[op.index]:
            continue  # roots its own fusion: its result is a buffer
        for r in op.results:
            out[r] = not is_materialized[r] and bool(uses[r])
    return out


def sums_of_broadcasts(prog: Program) -> list[bool]:
    """Per op, whether it is a sum over dims along which its operand is a broadcast
    (`simplify.uniform_dims`) or of size 1, which XLA's simplifier folds into a multiply of the
    broadcast's source by the count (a reshape for unit dims): a cheap elementwise op, fused
    into its readers like one, not a reduction rooting a fusion of its own. A sum over unit dims
    alone only when its operand is a scalar's broadcast: of any other array it is a bitcast of
    a buffer XLA stores (fuzz seed 19 #3: a gradient's [1, 32] summed over its unit dim for
    the outer product making the weight's, XLA's `bitcast_bitcast_fusion` f32[32, 1]). The
    gradient of a loss summing `mean(broadcast(v))` terms is such sums of a scalar's broadcasts (fuzz seed 19 #98: four of them, 64 bytes each
    in the model's block, none in XLA's 16-byte one, 1.92 of XLA's bytes)."""
    from toast_core.cost.simplify import uniform_dims  # simplify builds on this module

    out = [False] * len(prog.ops)
    uni = None
    for op in prog.ops:
        if op.primitive != "reduce_sum" or len(op.results) != 1 or not op.operands:
            continue
        uni = uniform_dims(prog) if uni is None else uni
        x = op.operands[0]
        shape = prog.values[x].shape
        axes = set(op.param("axes", ()))
        wide = {d for d, n in enumerate(shape) if n > 1}
        out[op.index] = (
            bool(axes)
            and all(d in uni[x] or shape[d] == 1 for d in axes)
            and bool(axes & uni[x] & wide or wide <= uni[x])
        )
    return out


def _update_slice_fused(prog: Program, op, uses, fuses) -> bool:
    """Whether XLA fuses a scatter of one update window into the loops reading its result, so
    that it never gets a buffer: XLA makes it a dynamic-update-slice (`_in_loop_fusion`), which
    its loop fusion takes as a producer, each reader selecting the updated elements as it reads
    (`sum(x.at[:, i].add(u))` on x[8, 16]: one `dynamic-update-slice_reduce_fusion` reading x,
    no [8, 16] temporary; fuzz seed 19 #240, data parallel on 8: the 1 KiB scatter-add result
    was most of the model's 1.35 of XLA's bytes). Not when a reader is no loop (a dot), nor for
    an output. A tree-split reduction reading it stores it all the same (`cpu_buffers.
    tree_reduced_operands`: x[64, 16], XLA copies x and updates the copy in place)."""
    if op.primitive not in prim.SCATTERS or not _in_loop_fusion(op, prog) or len(op.results) != 1:
        return False
    (r,) = op.results
    readers = uses[r]
    return (
        bool(readers)
        and not prog.values[r].is_output
        and r not in prog.outputs
        and all(fuses[o] for o, _ in readers)
    )


def _fused_into_gathers(prog: Program, op, uses, fuses) -> bool:
    """Whether XLA fuses a cheap op into the gathers that alone read its result, so that it
    never gets a buffer: XLA's loop fusion takes a gather as a consumer (the gather reads only
    the elements its indices pick, computed in its loop), though not an expensive producer,
    whose elements a gather may read again (`NOT_DUPLICATED`). The gathered array
    `take(tile(x, (1, 1, 2)), i, axis=2)` is one fusion reading x (fuzz seed 14 #606: the
    [1, 8, 16] tile was 512 of the model's 896 bytes, none of XLA's 460), and so is a gather's
    index arithmetic (`where(i < 0, i + n, i)` broadcast to [k, 1]). The cost model still
    counts the flops and bytes as if the result were stored: memory only."""
    if not fuses[op.index] or op.primitive in NOT_DUPLICATED or len(op.results) != 1:
        return False
    (r,) = op.results
    readers = uses[r]
    return (
        bool(readers)
        and not prog.values[r].is_output
        and all(prog.ops[o].primitive == "gather" for o, _ in readers)
    )


def _expansions(prog: Program, is_materialized: list[bool]) -> list[bool]:
    """Per op: whether XLA duplicates it into each reader because its result is larger than what
    it is recomputed from (through chains of such values)."""
    source_bytes = [0.0] * len(prog.values)  # bytes a fused value is recomputed from
    fused = [False] * len(prog.values)
    out = [False] * len(prog.ops)
    fuses = _fusible_ops(prog)
    for op in prog.ops:
        if not fuses[op.index] or op.primitive in NOT_DUPLICATED:
            continue
        src = sum(source_bytes[x] if fused[x] else prog.values[x].nbytes for x in op.operands)
        for r in op.results:
            if not is_materialized[r] and src < prog.values[r].nbytes:
                fused[r], source_bytes[r], out[op.index] = True, src, True
    return out


def _fusion_roots(
    prog: Program, is_materialized: list[bool], expansion: list[bool]
) -> list[frozenset[int]]:
    """For each op, the ops whose fusions compute it (itself when it roots its own fusion, and
    its result is a buffer): ops with a materialized result, and reductions read by a wider
    loop or another reduction, root their own; an expansion is fused into all its readers'
    fusions, any other op only when they are one."""
    uses = prog.uses()
    fuses = _fusible_ops(prog)
    roots: list[frozenset[int]] = [frozenset()] * len(prog.ops)
    for op in reversed(prog.ops):
        reading = [roots[o] for r in op.results for o, _ in uses[r]]
        readers = reading[0] if len(reading) == 1 else frozenset().union(*reading)
        own = (
            not fuses[op.index]
            or any(is_materialized[r] for r in op.results)
            or (
                len(readers) > 1
                and not expansion[op.index]
                and (
                    op.primitive in NOT_DUPLICATED
                    or op.primitive not in prim.ELEMENTWISE  # a stack read twice is stored
                    or _unfused_path(prog, op, roots)
                    or _feeds_max_and_exp_shift(prog, op)
                )
            )
            or (op.primitive in _REDUCTIONS and _widens(prog, op, readers))
        )
        roots[op.index] = frozenset((op.index,)) if own or not readers else readers
    return roots


def _widens(prog: Program, op, readers: frozenset[int]) -> bool:
    """Whether a reduction's reader fusion writes more elements than the reduction makes: XLA
    then keeps the reduction apart (a softmax's max read by the [B, S, V] subtraction would be
    recomputed per element), as it does when the reader is another reduction; else it computes
    the reduction inside the reader's loop (a loss `mean(a) + mean(b)` is one fusion with both
    reductions inside: XLA:CPU's buffer assignment, one scalar temporary)."""
    size = max(prog.values[r].size for r in op.results)
    return any(
        prog.ops[root].primitive in _REDUCTIONS or prog.values[r].size > size
        for root in map(lambda x: _root_op(prog, x), readers)
        for r in prog.ops[root].results
    )


#: Ops that write each element of an operand once however many elements they make (XLA's
#: `ReusesOperandElements` is false for them).
_PLACES_ONCE = frozenset({"pad", "concatenate", "stack"})


def _places_once(reader, position: int, prog: Program, local_shapes=None) -> bool:
    """Whether `reader` writes each element of its operand at `position` once (`_PLACES_ONCE`),
    or is a scatter of one update window reading its operand or its updates, its result cut
    as its operand: XLA makes it a dynamic-update-slice, whose `ReusesOperandElements` is false
    for both (its start indices alone are reused). `x.at[:, i].add(tanh(x[:, i]))` fuses the
    tanh into the update's loop with the slice of `x` it reads (measured, jaxlib 0.10.2 CPU,
    `x = y * 2` on [7, 3, 4]: 157 flops, the multiply once; rooting the tanh apart computed it
    there again, 241: fuzz seed 19 #505, 1.050 of XLA's flops; #728, #550, data parallel). A
    result cut where its operand is whole is each device's dynamic-slice of the whole update,
    and the tanh stays apart, its producers computed again there (seed 19 #1582,
    `v.at[i].set(tanh(v[i]))`, `v` whole and the result cut on 2x2x2: the multiply making `v`
    in two fusions)."""
    if reader.primitive in _PLACES_ONCE:
        return True
    if reader.primitive not in prim.SCATTERS or position == 1:
        return False
    if not _in_loop_fusion(reader, prog):
        return False
    if not local_shapes:
        return True
    (r,), v = reader.results, reader.operands[0]
    return local_shapes.get(r, prog.values[r].shape) == local_shapes.get(v, prog.values[v].shape)


def _reused_on_the_way(prog: Program, op, root: int, roots, uses, local_shapes=None) -> bool:
    """Whether an op of the reader loop `root` reads reduction `op`'s result, or a value made
    from it in that loop, into more elements than that value has, other than by padding it.
    XLA does not fuse an expensive producer into a consumer that reuses its elements
    (`ReusesOperandElements`): a broadcast does, so the reduction stays apart
    (`var(leaky_relu(x), axis=0)`: the mean is broadcast into `h - mean`, whose squares the
    second sum reduces to the mean's shape; XLA computes the leaky ReLU in the mean's fusion
    and in the sum's, x[16, 32]: 5,120 flops; 3,585 when the mean shared the sum's loop: fuzz
    seed 18 #163). A pad places each element once, and XLA fuses the reduction into the padded
    loop, however many more elements it writes (the gradient of
    `jnp.pad(p, ((1, 2), (0, 0)), mode="edge")`: the sum of the two edge rows' cotangents,
    padded into p's, is computed in that loop with the split it reads, 312 flops on [8, 8]).
    So does a concatenate (`jnp.stack([g, tanh(g)])`: the tanh is fused into the stack's loop;
    tests/test_flops_indexing.py, 181 flops where rooting it apart counted 216)."""
    stack, seen = [op.index], {op.index}
    while stack:
        i = stack.pop()
        for r in prog.ops[i].results:
            size = prog.values[r].size
            for o, pos in uses[r]:
                if o in seen or root not in roots[o]:
                    continue
                reader = prog.ops[o]
                if reader.primitive == "dot_general" and _dot_reuses(prog, reader, pos):
                    return True
                if not _places_once(reader, pos, prog, local_shapes) and any(
                    prog.values[v].size > size for v in reader.results
                ):
                    return True
                seen.add(o)
                stack.append(o)
        if len(seen) > _PATH_WALK_LIMIT:  # the walk stays linear on large programs
            return _widens(prog, op, frozenset((root,)))
    return False


def _dot_reuses(prog: Program, dot, pos: int) -> bool:
    """Whether a fused dot (an outer product, a fused matrix-vector dot) reads each element of
    operand `pos` more than once: the other operand has a free dim over 1 (XLA's
    `ReusesOperandElements` for a dot; the matrix of a matrix-vector product is read once). Its
    result can be smaller than the operand all the same, contracted on other devices (fuzz
    seed 19 #575: `concatenate([v, tanh(v)])` contracted over dim 0 cut to one row per device
    with w[8, 3]: each row is read three times, and XLA keeps the tanh in a fusion of its own)."""
    if len(dot.operands) != 2:
        return False
    (contracted, batch) = (d[1 - pos] for d in dot.param("dimension_numbers"))
    other = prog.values[dot.operands[1 - pos]].shape
    return any(n > 1 for d, n in enumerate(other) if d not in contracted and d not in batch)


def _root_op(prog: Program, root: int) -> int:
    """The op whose fusion a root of `fusion_work` is: itself, or for a placeholder root below
    zero, the gather owning that fusion (`_with_fused_gathers`) or the special function whose
    expensive part it computes (`EXPANDED_APART`)."""
    if root >= 0:
        return root
    k = -root - 1
    n = len(prog.ops) * 64
    return k - n if k >= n else k // 64


#: Layout ops that only merge or split dims, or add or drop unit dims, in row-major order: the
#: element order is unchanged, so XLA emits them as `bitcast`s (views) of a dense operand.
_VIEW_LAYOUT = frozenset({"reshape", "squeeze", "expand_dims"})


def bitcasts(prog: Program, is_materialized: list[bool]) -> list[bool]:
    """Whether each op is a view of a buffer, moving no bytes: a row-major reshape (no
    `dimensions` permutation) from a materialized operand to a materialized result. XLA's
    algebraic simplifier turns such a reshape into a bitcast whenever the layouts allow, and with
    the row-major layouts XLA assigns they always do; per device the same holds, the local shards merging and splitting alike (a
    reshape whose sharding does not divide the same way is resharded first, priced as
    communication). Its readers read the operand's buffer, as the producer wrote it. A reshape of
    a fused value is the root of that fusion and writes its result; a reshape read only by
    fusions is their read of the operand: both move bytes."""
    out = []
    for op in prog.ops:
        out.append(
            op.primitive in _VIEW_LAYOUT
            and op.param("dimensions") is None
            and len(op.operands) == 1
            and is_materialized[op.operands[0]]
            and all(is_materialized[r] for r in op.results)
        )
    return out
