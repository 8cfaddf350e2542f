"""How XLA partitions `concatenate`, `split` and `slice` along a sharded dim.

The factor rules make the concatenated dim of `concatenate`'s operands and the sliced dim of
`split`/`slice`'s operand *replicate* factors: sharding them forces the operand whole before the
op. XLA's SPMD partitioner does not all-gather there (measured on the U-Net skip concatenates and
the GNS message concatenates, xla/service/spmd/spmd_partitioner.cc):

* **concatenate** along a dim sharded on mesh axes M: every sharded operand is resharded by an
  all-to-all that moves M to another dim, the operands are concatenated locally, and the result is
  resharded to what its users want: an all-to-all moving M back onto the concatenated dim when
  that dim is sharded on M, or an all-gather over M (of the whole result) when it is replicated.
  `A[B, C_model] ++ B[B, C_model] -> R[B, 2C_model]`: all-to-all of A and of B (each its local
  bytes), all-to-all of R; where a gather would move every operand whole.
* **split** / **slice** along a dim sharded n ways on M, into results sharded n ways on M: a
  windowed read with collective-permutes of halos between shards (`halo.py`), far less than the
  operand.
* **strided slice** `x[start::stride]` (start < stride) along a dim sharded n ways on M whose
  shards hold a multiple of the stride: each shard takes its own elements, so a result sharded
  on M needs nothing and a result whole there is an all-gather of the *result* (measured on
  f32[dim, 4], dim 4..16, n 2..8, stride 2..4: all-gather bytes = result bytes, or none).

This module finds those sites once per analysis (static facts: dims, offsets, fine classes); the
evaluator picks the collectives per strategy from the mesh axes of the fine classes involved
(`Evaluator._collective_arrays`). Anything else (a concatenate with no other dim the shards can
move to, a strided slice, a result sharded differently) keeps the gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GATHER", "CONCAT", "SLICE", "STRIDE", "ConcatSliceSites", "concat_slice_sites"]

#: Styles of a replicate-factor site (a row of `Evaluator.rep`).
GATHER, CONCAT, SLICE, STRIDE = 0, 1, 2, 3


@dataclass(frozen=True)
class ConcatSliceSites:
    """Per replicate row: style, room (the largest other dim of a concatenate's operand, where
    the shards can move) and piece list id (-1: none); the slice pieces; the concatenate
    results."""

    style: np.ndarray  # [rep row]
    room: np.ndarray  # [rep row]
    pieces_id: np.ndarray  # [rep row]
    # pieces[k]: ((result value, result fine, dim size, start, size), ...) of one sliced use
    pieces: tuple
    # [row]: (op, result value, result fine of the concatenated dim, operand fine (-1: the
    # operands' dim has size 1, no factor), room)
    cat: np.ndarray


def _single_fine(dims, d: int) -> int:
    """The fine class of dim d when it has exactly one (no reshape sub-factors), else -1."""
    fines = dims[d] if d < len(dims) else ()
    return int(fines[0]) if len(fines) == 1 else -1


def _sliced_pieces(op, pos: int, d: int, dim_size: int, lay) -> tuple | None:
    """(result value, result fine, dim size, start, size) of each piece a split / slice takes
    out of dim d (of `dim_size` elements) of its operand, or None when it is not a plain
    unit-stride slice of d."""
    if pos != 0:
        return None
    if op.primitive == "split" and op.param("axis", 0) == d:
        out, start = [], 0
        for vid, size in zip(op.results, (int(s) for s in op.param("sizes", ()))):
            out.append((vid, _single_fine(lay.value_dim_fine[vid], d), dim_size, start, size))
            start += size
        return tuple(out)
    if op.primitive == "slice":
        strides = op.param("strides", None)
        if strides is not None and any(int(s) != 1 for s in strides):
            return None
        lo, hi = op.param("start_indices", ()), op.param("limit_indices", ())
        if d >= len(lo):
            return None
        vid = op.results[0]
        start, size = int(lo[d]), int(hi[d]) - int(lo[d])
        return ((vid, _single_fine(lay.value_dim_fine[vid], d), dim_size, start, size),)
    return None


def _strided_piece(op, pos: int, d: int, dim_size: int, lay) -> tuple | None:
    """((result value, result fine, dim size, start, size), stride) of a `x[start::stride]`
    along dim d (stride > 1, start < stride, through the end of the dim, the dim a multiple of
    the stride), else None."""
    if pos != 0 or op.primitive != "slice":
        return None
    strides = op.param("strides", None)
    if strides is None or d >= len(strides) or int(strides[d]) <= 1:
        return None
    stride = int(strides[d])
    start, limit = int(op.param("start_indices")[d]), int(op.param("limit_indices")[d])
    vid = op.results[0]
    size = len(range(start, limit, stride))
    if start >= stride or dim_size % stride or size * stride != dim_size:
        return None
    return (vid, _single_fine(lay.value_dim_fine[vid], d), dim_size, start, size), stride


def concat_slice_sites(ana, lay, rep_rows: list[tuple[int, int, int, int, int]]):
    """Static facts for the replicate rows `rep_rows` (op, value, fine, position, dim)."""
    prog = ana.program
    style = np.full(len(rep_rows), GATHER, dtype=np.int64)
    room = np.ones(len(rep_rows), dtype=np.int64)
    pieces_id = np.full(len(rep_rows), -1, dtype=np.int64)
    pieces: list[tuple] = []
    cat: dict[int, tuple] = {}
    for k, (opi, vid, f, pos, d) in enumerate(rep_rows):
        op = prog.ops[opi]
        shape = prog.values[vid].shape
        if op.primitive == "concatenate" and op.param("dimension", 0) == d:
            others = [int(s) for e, s in enumerate(shape) if e != d]
            style[k], room[k] = CONCAT, max(others, default=1)
            res = op.results[0]
            rf = _single_fine(lay.value_dim_fine[res], d)
            if opi not in cat and rf >= 0:
                cat[opi] = (opi, res, rf, f, room[k])
            continue
        got = _sliced_pieces(op, pos, d, int(shape[d]), lay)
        if got is None:
            got = _strided_piece(op, pos, d, int(shape[d]), lay)
            if got is not None and got[0][1] >= 0:
                style[k], room[k], pieces_id[k] = STRIDE, got[1], len(pieces)
                pieces.append(got[0:1])
            continue
        if any(p[1] < 0 for p in got):
            continue
        style[k], pieces_id[k] = SLICE, len(pieces)
        pieces.append(got)
    # A concatenate of size-1 dims, and a `stack` (XLA: a concatenate of reshaped operands),
    # have no replicate row: their operands are whole there by construction; the result may
    # still be sharded there (operand fine -1).
    for opi, op in enumerate(prog.ops):
        if op.primitive not in ("concatenate", "stack") or opi in cat:
            continue
        d, res = op.param("dimension", op.param("axis", 0)), op.results[0]
        rf = _single_fine(lay.value_dim_fine[res], d)
        if rf >= 0:
            shape = prog.values[res].shape
            others = [int(s) for e, s in enumerate(shape) if e != d]
            cat[opi] = (opi, res, rf, -1, max(others, default=1))
    return ConcatSliceSites(
        style=style,
        room=room,
        pieces_id=pieces_id,
        pieces=tuple(pieces),
        cat=np.array(list(cat.values()), dtype=np.int64).reshape(-1, 5),
    )
