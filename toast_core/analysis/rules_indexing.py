"""Factor rules for ops that index: slicing, concatenation, padding, gather and scatter.

Sliced, concatenated and split dims change size, so the operand side needs the whole dim
(`replicate`); padded dims exchange halos (`permute`), except interior padding, which XLA cannot
partition (see `pad_rule`); gather and scatter follow Shardy's rules with the masked variant for
embedding lookups.
"""

from __future__ import annotations

import math

from toast_core.analysis.factors import FactorBuilder, OpFactors
from toast_core.analysis.rules import rule
from toast_core.ir import primitives as prim

# --- slicing, concatenation, padding ------------------------------------------------------------


def _same_size_or_replicate(fb: FactorBuilder, operand: int, result: int) -> None:
    for d, size in enumerate(fb.operand_shapes[operand]):
        if fb.result_shapes[result][d] == size:
            fb.shared(size, operands=[(operand, d)], results=[(result, d)])
        else:
            fb.set_operand(operand, d, fb.factor(size, "replicate"))


@rule("concatenate")
def concatenate_rule(op, operand_shapes, result_shapes) -> OpFactors:
    dim = op.param("dimension", 0)
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, size in enumerate(result_shapes[0]):
        if d == dim:
            for i, s in enumerate(operand_shapes):
                fb.set_operand(i, d, fb.factor(s[d], "replicate"))
        else:
            fb.shared(size, operands=[(i, d) for i in range(len(operand_shapes))], results=[(0, d)])
    return fb.build()


@rule("split")
def split_rule(op, operand_shapes, result_shapes) -> OpFactors:
    axis = op.param("axis", 0)
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, size in enumerate(operand_shapes[0]):
        if d == axis:
            fb.set_operand(0, d, fb.factor(size, "replicate"))
        else:
            fb.shared(size, operands=[(0, d)], results=[(i, d) for i in range(len(result_shapes))])
    return fb.build()


@rule("slice", "dynamic_slice")
def slice_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Unsliced dims pass; sliced dims (size changes) need the operand whole."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    _same_size_or_replicate(fb, 0, 0)
    return fb.build()


@rule("dynamic_update_slice")
def dynamic_update_slice_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Operand and result pass; an update dim smaller than the operand's must be replicated."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, size in enumerate(operand_shapes[0]):
        if operand_shapes[1][d] == size:
            fb.shared(size, operands=[(0, d), (1, d)], results=[(0, d)])
        else:
            fb.shared(size, operands=[(0, d)], results=[(0, d)])
            fb.set_operand(1, d, fb.factor(operand_shapes[1][d], "replicate"))
    return fb.build()


@rule("pad")
def pad_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Unpadded dims pass; a padded dim is resharded with a halo exchange (permute).

    A dim with interior padding (`[4] -> [8]` putting a zero between elements: the gradient of
    `x[::2]`, of `cummax`, of `associative_scan`) must be whole on both sides: XLA's partitioner
    computes wrong values or fails its HLO verifier when the result is sharded there
    (`xla_limits.KNOWN_XLA_LIMITATIONS["pad-interior-sharded-result"]`), and is correct when the
    operand is gathered and the result replicated. So the operand dim is `replicate` and the
    result dim gets no factor: never sharded; its readers slice it locally.
    """
    config = op.param("padding_config", ())
    fb = FactorBuilder(operand_shapes, result_shapes)
    for d, size in enumerate(operand_shapes[0]):
        lo, hi, interior = tuple(config[d]) if d < len(config) else (0, 0, 0)
        if (lo, hi, interior) == (0, 0, 0):
            fb.shared(size, operands=[(0, d)], results=[(0, d)])
        elif interior:
            fb.set_operand(0, d, fb.factor(size, "replicate"))
            fb.unshardable("r", 0, d)
        else:
            fb.set_operand(0, d, fb.factor(size, "permute"))
    return fb.build()


# --- gather and scatter -------------------------------------------------------------------------


@rule("gather")
def gather_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Embedding lookup `table[V, D], ids[B, S, 1] -> [B, S, D]`.

    Result batch dims link to the index dims; offset dims link to whole operand dims. An indexed
    operand dim with slice size 1 uses the masked rule (each device looks up its own rows, zeros the
    rest, then the partial results are summed): a reduction factor. Other indexed dims replicate.
    """
    dn = dict(op.param("dimension_numbers"))
    slice_sizes = op.param("slice_sizes", ())
    operand, indices = operand_shapes[0], operand_shapes[1]
    out = result_shapes[0]
    offset_dims = tuple(dn.get("offset_dims", ()))
    collapsed = set(dn.get("collapsed_slice_dims", ()))
    op_batch = tuple(dn.get("operand_batching_dims", ()))
    idx_batch = tuple(dn.get("start_indices_batching_dims", ()))
    start_index_map = set(dn.get("start_index_map", ()))
    fb = FactorBuilder(operand_shapes, result_shapes)
    index_dims = [d for d in range(len(indices) - 1)]  # last indices dim is the index vector
    batch_out = [d for d in range(len(out)) if d not in offset_dims]
    for od, idim in zip(batch_out, index_dims):
        slots = [(1, idim)]
        if idim in idx_batch:
            slots.append((0, op_batch[idx_batch.index(idim)]))
        fb.shared(out[od], operands=slots, results=[(0, od)])
    window = [d for d in range(len(operand)) if d not in collapsed and d not in set(op_batch)]
    for od, wd in zip(offset_dims, window):
        if slice_sizes[wd] == operand[wd] and wd not in start_index_map:
            fb.shared(out[od], operands=[(0, wd)], results=[(0, od)])
    for d in range(len(operand)):
        if fb.operands[0][d] or d in set(op_batch):
            continue
        masked = d in start_index_map and slice_sizes[d] == 1
        fb.set_operand(0, d, fb.factor(operand[d], "reduction" if masked else "replicate"))
    return fb.build()


@rule(*sorted(prim.SCATTERS))
def scatter_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`operand[V, D] .at[ids].add(updates[B, S, D])`: operand and result pass everywhere (each
    device applies the updates that land in its rows); update scatter dims link to index dims as
    reduction factors (they are combined into the operand; for a plain overwriting `scatter`,
    replicate); update window dims link to whole operand dims.

    A scatter with a single update window reads its indexed operand dims whole (no factor): XLA
    partitions that case wrongly when they are sharded (`xla_limits.py`); its result dims may
    still be sharded.
    """
    dn = dict(op.param("dimension_numbers"))
    operand, indices, updates = operand_shapes[0], operand_shapes[1], operand_shapes[2]
    window_dims = tuple(dn.get("update_window_dims", ()))
    inserted = set(dn.get("inserted_window_dims", ()))
    op_batch = tuple(dn.get("operand_batching_dims", ()))
    idx_batch = tuple(dn.get("scatter_indices_batching_dims", ()))
    combine = "reduction" if op.primitive in prim.COMBINING_SCATTERS else "replicate"
    fb = FactorBuilder(operand_shapes, result_shapes)
    # One update window (a dynamic-update-slice in disguise): XLA gets an indexed dim that is
    # sharded at the scatter wrong (`xla_limits.SCATTER_ONE_WINDOW_INDEXED_SHARDED`), so that
    # operand dim is read whole (no factor: the use is resharded to replicated, a gather when
    # the value is sharded) and the result dim gets a factor of its own.
    whole = set(dn.get("scatter_dims_to_operand_dims", ())) if _one_window(indices) else set()
    operand_f = []
    for d, size in enumerate(operand):
        if d in whole:
            fb.unshardable("o", 0, d)
            operand_f.append(None)
        else:
            operand_f.append(fb.shared(size, operands=[(0, d)], results=[(0, d)]))
    scatter_dims = [d for d in range(len(updates)) if d not in window_dims]
    index_dims = [d for d in range(len(indices) - 1)]
    for ud, idim in zip(scatter_dims, index_dims):
        if idim in idx_batch:
            f = operand_f[op_batch[idx_batch.index(idim)]]
            fb.set_operand(1, idim, f)
            fb.set_operand(2, ud, f)
        else:
            # Updates along a scatter dim all land in the one operand: sharding that dim leaves
            # each device with a partial result to combine, like a reduction; a plain `scatter`
            # (overwrite) has no combiner, so that dim must be whole (as in Shardy).
            fb.shared(updates[ud], combine, operands=[(1, idim), (2, ud)])
    window = [d for d in range(len(operand)) if d not in inserted and d not in set(op_batch)]
    for ud, wd in zip(window_dims, window):
        if updates[ud] == operand[wd] and operand_f[wd] is not None:
            fb.set_operand(2, ud, operand_f[wd])
        else:
            fb.set_operand(2, ud, fb.factor(updates[ud], "replicate"))
    return fb.build()


def _one_window(indices: tuple[int, ...]) -> bool:
    """Whether a scatter's indices `[..., index_vector]` hold a single index vector."""
    return math.prod(indices[:-1]) == 1
