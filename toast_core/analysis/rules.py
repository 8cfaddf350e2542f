"""Factor rules: one small function per primitive, in a registry keyed by primitive name.

Each rule receives the op and the shapes of its operands and results and returns an `OpFactors`
(see `factors.py`). Rules describe relations, never decisions. Rule cases are kept alphabetical
within each family. A primitive without a rule gets `fallback_rule` (every dim its own
`replicate` factor, so no named dim crosses the op and a sharded operand is gathered) and the
analysis reports a diagnostic.

This module holds the registry and the elementwise, layout, contraction, reduction, creation and
linear-algebra rules; `rules_indexing.py` (slicing, padding, gather, scatter), `rules_window.py`
(pooling), `rules_random.py` (bits and keys) and `rules_region.py` (scan, while, cond) register
theirs on import.
"""

from __future__ import annotations

from collections.abc import Callable

from toast_core.analysis.factors import FactorBuilder, OpFactors, mixed_radix_groups, split_dim
from toast_core.ir import primitives as prim
from toast_core.ir.program import Op

Rule = Callable[[Op, list, list], OpFactors]
RULES: dict[str, Rule] = {}
#: `@rule("name", ...)` registers a factor rule; a name registered twice raises.
rule = prim.registrar(RULES, "factor rules")


def factors_of(op: Op, operand_shapes: list, result_shapes: list) -> OpFactors:
    """The op's factors by its rule, or the conservative fallback for unknown primitives."""
    fn = RULES.get(op.primitive)
    if fn is None:
        return fallback_rule(op, operand_shapes, result_shapes)
    return fn(op, operand_shapes, result_shapes)


def fallback_rule(op: Op, operand_shapes: list, result_shapes: list) -> OpFactors:
    """Every dim its own `replicate` factor: nothing is linked across the op, a sharded operand is
    all-gathered before it, and its work is never divided, so sharding across a primitive we do
    not model can only look expensive, never free (always safe, never clever)."""
    return FactorBuilder(operand_shapes, result_shapes).build(fallback=True)


# --- elementwise ---------------------------------------------------------------------------------


@rule(*sorted(prim.ELEMENTWISE))
def elementwise_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Result dim d ~ dim d of every operand of the same rank (rank-0 operands broadcast).

    Multi-result elementwise ops (optimization_barrier) pair result i with operand i.
    """
    fb = FactorBuilder(operand_shapes, result_shapes)
    if len(result_shapes) > 1:
        for i, shape in enumerate(result_shapes):
            for d, size in enumerate(shape):
                fb.shared(size, operands=[(i, d)], results=[(i, d)])
        return fb.build()
    out = result_shapes[0]
    for d, size in enumerate(out):
        slots = [
            (i, d) for i, s in enumerate(operand_shapes) if len(s) == len(out) and s[d] == size
        ]
        fb.shared(size, operands=slots, results=[(0, d)])
    return fb.build()


# --- layout: broadcast, reshape, squeeze, transpose, rev ----------------------------------------


@rule("broadcast_in_dim")
def broadcast_in_dim_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Kept dims link to their result dims; new and size-1-expanded dims get fresh factors."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    dims = op.param("broadcast_dimensions", ())
    for j, d in enumerate(dims):
        if operand_shapes[0][j] == result_shapes[0][d]:
            fb.shared(result_shapes[0][d], operands=[(0, j)], results=[(0, d)])
    return fb.build()


@rule("reshape")
def reshape_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Mixed-radix alignment: `[8, 32] -> [8, 4, 8]` is `([i, (j, k)]) -> ([i, j, k])`.

    Groups of dims whose factorizations do not nest (`[2, 3] -> [3, 2]`) cannot be expressed: the
    operand side needs replication there and the result gets fresh factors.
    """
    fb = FactorBuilder(operand_shapes[:1], result_shapes)
    a, b = tuple(operand_shapes[0]), tuple(result_shapes[0])
    for ga, gb, refined in mixed_radix_groups(a, b):
        if refined is None:
            for d in ga:
                fb.set_operand(0, d, fb.factor(a[d], "replicate"))
            continue
        fs = [fb.factor(s) for s in refined]
        pos = 0
        for d, part in zip(ga, split_dim([a[d] for d in ga], refined)):
            fb.set_operand(0, d, *fs[pos : pos + len(part)])
            pos += len(part)
        pos = 0
        for d, part in zip(gb, split_dim([b[d] for d in gb], refined)):
            fb.set_result(0, d, *fs[pos : pos + len(part)])
            pos += len(part)
    built = fb.build()
    # Dynamic-shape operands of reshape (rare) are extra operands without dims that matter.
    extra = tuple(tuple(() for _ in s) for s in operand_shapes[1:])
    return OpFactors(built.sizes, built.kinds, built.operands + extra, built.results)


@rule("squeeze")
def squeeze_rule(op, operand_shapes, result_shapes) -> OpFactors:
    fb = FactorBuilder(operand_shapes, result_shapes)
    kept = [d for d, s in enumerate(operand_shapes[0]) if d not in set(op.param("dimensions", ()))]
    for j, d in enumerate(kept):
        fb.shared(operand_shapes[0][d], operands=[(0, d)], results=[(0, j)])
    return fb.build()


@rule("expand_dims")
def expand_dims_rule(op, operand_shapes, result_shapes) -> OpFactors:
    fb = FactorBuilder(operand_shapes, result_shapes)
    new = set(op.param("dimensions", ()))
    kept = [d for d in range(len(result_shapes[0])) if d not in new]
    for j, d in enumerate(kept):
        fb.shared(result_shapes[0][d], operands=[(0, j)], results=[(0, d)])
    return fb.build()


@rule("transpose")
def transpose_rule(op, operand_shapes, result_shapes) -> OpFactors:
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, src in enumerate(op.param("permutation", ())):
        fb.shared(result_shapes[0][d], operands=[(0, src)], results=[(0, d)])
    return fb.build()


@rule("rev")
def rev_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Reversed dims can stay sharded if shards swap places (a collective-permute)."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    flipped = set(op.param("dimensions", ()))
    for d, size in enumerate(result_shapes[0]):
        kind = "permute" if d in flipped else "pass"
        fb.shared(size, kind, operands=[(0, d)], results=[(0, d)])
    return fb.build()


@rule("tile")
def tile_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`tile(x[D], reps=(r,)) -> [r * D]` is `([d]) -> ([(r, d)])`: the result dim is r copies of
    the operand dim, so its minor sub-factor is the operand's dim and the major one is new (what
    broadcast + reshape, XLA's lowering of tile, give)."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, (size, reps) in enumerate(zip(operand_shapes[0], op.param("reps", ()))):
        f = fb.factor(size)
        fb.set_operand(0, d, f)
        fb.set_result(0, d, fb.factor(reps), f)
    return fb.build()


@rule("stack")
def stack_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`stack([x[A, B]] * n, axis=1) -> [A, n, B]`: every other dim is shared by all operands and
    the result; the new dim is the result's own (as `concatenate`'s result dim)."""
    axis = op.param("axis", 0)
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, size in enumerate(operand_shapes[0]):
        rd = d if d < axis else d + 1
        fb.shared(size, operands=[(i, d) for i in range(len(operand_shapes))], results=[(0, rd)])
    return fb.build()


@rule("unstack")
def unstack_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`unstack(x[A, n, B], axis=1) -> n x [A, B]`: the unstacked dim must be whole (jax's own
    sharding rule refuses it sharded); every other dim is shared by the operand and all results."""
    axis = op.param("axis", 0)
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, size in enumerate(operand_shapes[0]):
        if d == axis:
            fb.set_operand(0, d, fb.factor(size, "replicate"))
            continue
        rd = d if d < axis else d - 1
        fb.shared(size, operands=[(0, d)], results=[(i, rd) for i in range(len(result_shapes))])
    return fb.build()


# --- contractions and convolutions --------------------------------------------------------------


@rule("dot_general")
def dot_general_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`[b, m, k] x [b, k, n] -> [b, m, n]`: batch and free dims pass, contracting dims reduce."""
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    lhs, rhs = operand_shapes[0], operand_shapes[1]
    fb = FactorBuilder(operand_shapes, result_shapes)
    out = 0
    for dl, dr in zip(lb, rb):
        fb.shared(lhs[dl], operands=[(0, dl), (1, dr)], results=[(0, out)])
        out += 1
    for d in range(len(lhs)):
        if d not in lc and d not in lb:
            fb.shared(lhs[d], operands=[(0, d)], results=[(0, out)])
            out += 1
    for d in range(len(rhs)):
        if d not in rc and d not in rb:
            fb.shared(rhs[d], operands=[(1, d)], results=[(0, out)])
            out += 1
    for dl, dr in zip(lc, rc):
        fb.shared(lhs[dl], "reduction", operands=[(0, dl), (1, dr)])
    return fb.build()


@rule("conv_general_dilated")
def conv_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Batch passes; input features contract with the kernel's; output features pass.

    Spatial dims, as in Shardy's rule (each input spatial dim is windows x window size):
    * output as large as the input (SAME padding, stride 1): input ~ output, shardable with a halo
      exchange (permute); the small kernel dim is replicated;
    * kernel as large as the input (the weight gradient `conv(x, dy) -> dW[kh, kw, ...]`): input ~
      kernel as a reduction (each device sums the windows of its rows, up to a halo); the small
      output dim (the window offsets) is its own factor;
    * otherwise (strides, VALID padding, dilations) both input and kernel dims are replicated.
    Grouped convolutions link only batch dims.
    """
    dn = dict(op.param("dimension_numbers"))
    lhs_spec, rhs_spec, out_spec = dn["lhs_spec"], dn["rhs_spec"], dn["out_spec"]
    lhs, rhs, out = operand_shapes[0], operand_shapes[1], result_shapes[0]
    fb = FactorBuilder(operand_shapes, result_shapes)
    grouped = op.param("feature_group_count", 1) != 1 or op.param("batch_group_count", 1) != 1
    if op.param("batch_group_count", 1) == 1:
        fb.shared(lhs[lhs_spec[0]], operands=[(0, lhs_spec[0])], results=[(0, out_spec[0])])
    if not grouped:
        fb.shared(lhs[lhs_spec[1]], "reduction", operands=[(0, lhs_spec[1]), (1, rhs_spec[1])])
        fb.shared(rhs[rhs_spec[0]], operands=[(1, rhs_spec[0])], results=[(0, out_spec[1])])
    for sl, so, sr in zip(lhs_spec[2:], out_spec[2:], rhs_spec[2:]):
        if lhs[sl] == out[so]:
            fb.shared(out[so], "permute", operands=[(0, sl)], results=[(0, so)])
            fb.set_operand(1, sr, fb.factor(rhs[sr], "replicate"))
        elif lhs[sl] == rhs[sr]:
            fb.shared(lhs[sl], "reduction", operands=[(0, sl), (1, sr)])
        else:
            fb.set_operand(0, sl, fb.factor(lhs[sl], "replicate"))
            fb.set_operand(1, sr, fb.factor(rhs[sr], "replicate"))
    return fb.build()


# --- reductions and scans -----------------------------------------------------------------------


@rule(*sorted(prim.REDUCTIONS | prim.ARG_REDUCTIONS))
def reduce_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`reduce_sum` over dim 1 is `([i, j]) -> ([i]) reduction={j}`."""
    axes = set(op.param("axes", ()))
    fb = FactorBuilder(operand_shapes, result_shapes)
    out = 0
    for d, size in enumerate(operand_shapes[0]):
        if d in axes:
            fb.shared(size, "reduction", operands=[(0, d)])
        else:
            fb.shared(size, operands=[(0, d)], results=[(0, out)])
            out += 1
    return fb.build()


@rule(*sorted(prim.CUMULATIVE))
def cumulative_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """The cumulative dim must be whole at the op (replicate) and lines up with the result's:
    `cumsum` over dim 1 is `([i, j]) -> ([i, j])` with j replicated (Shardy: j a permutation)."""
    axis = op.param("axis", 0)
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, size in enumerate(operand_shapes[0]):
        kind = "replicate" if d == axis else "pass"
        fb.shared(size, kind, operands=[(0, d)], results=[(0, d)])
    return fb.build()


@rule("sort")
def sort_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """The sorted dim must be whole on every device (replicate) and lines up with the results'
    sorted dim, as in Shardy; other dims pass through all operands and results."""
    dim = op.param("dimension", len(operand_shapes[0]) - 1)
    fb = FactorBuilder(operand_shapes, result_shapes)
    n = len(operand_shapes)
    for d, size in enumerate(operand_shapes[0]):
        kind = "replicate" if d == dim else "pass"
        fb.shared(
            size, kind, operands=[(i, d) for i in range(n)], results=[(i, d) for i in range(n)]
        )
    return fb.build()


@rule("approx_top_k")
def approx_top_k_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """The reduced (last) dim is whole on every device; other dims pass to both results
    (measured: f32[8, 32, 8] sharded on dim 0 over 8 devices compiles with no collective)."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    last = len(operand_shapes[0]) - 1
    for d, size in enumerate(operand_shapes[0]):
        if d == last:
            fb.set_operand(0, d, fb.factor(size, "replicate"))
        else:
            fb.shared(size, operands=[(0, d)], results=[(i, d) for i in range(len(result_shapes))])
    return fb.build()


@rule("top_k")
def top_k_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Every dim `replicate`: XLA's SPMD partitioner has no handler for the `topk` instruction, so
    it gathers the whole operand, runs top_k undivided on every device and slices the results
    (jax 0.10.2, before any backend pass: f32[8, 32, 8] sharded on dim 0 or 1 over 8 devices
    compiles to an all-gather of the full f32[8, 32, 8], then `topk`, then dynamic-slices)."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, size in enumerate(operand_shapes[0]):
        fb.set_operand(0, d, fb.factor(size, "replicate"))
    for i, shape in enumerate(result_shapes):
        for d, size in enumerate(shape):
            fb.set_result(i, d, fb.factor(size, "replicate"))
    return fb.build()


# --- creation ------------------------------------------------------------------------------------


@rule(*sorted(prim.CREATION))
def fresh_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Creates new data: result dims are fresh factors linked to nothing."""
    return FactorBuilder(operand_shapes, result_shapes).build()


# --- linear algebra ------------------------------------------------------------------------------


@rule("cholesky", "triangular_solve", "lu", "qr", "eigh", "svd", "schur", "eig")
def linalg_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Batch dims pass through; the two matrix dims must be whole."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    batch = len(operand_shapes[0]) - 2
    for d in range(max(batch, 0)):
        size = operand_shapes[0][d]
        ops = [(i, d) for i, s in enumerate(operand_shapes) if len(s) > d and s[d] == size]
        res = [(i, d) for i, s in enumerate(result_shapes) if len(s) > d and s[d] == size]
        fb.shared(size, operands=ops, results=res)
    for i, s in enumerate(operand_shapes):
        for d in range(max(batch, 0), len(s)):
            fb.set_operand(i, d, fb.factor(s[d], "replicate"))
    return fb.build()


# Rules kept in their own modules register on import.
from toast_core.analysis import (  # noqa: E402, F401
    rules_indexing,
    rules_random,
    rules_region,
    rules_window,
)
