"""Sparse incidence of values and ops over fine classes, built once per analysis.

The legality check and the cost model both ask, for every value and every operand use, "which fine
classes (and so which mesh axes) does it hold?". Precomputing that as sparse matrices turns each strategy
evaluation into a few sparse mat-vecs, which is what lets the search evaluate thousands of
strategies per second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from toast_core.analysis import Analysis
from toast_core.ir.primitives import REGION_BOUNDARIES


@dataclass(frozen=True, eq=False)
class Layout:
    value_fine: sp.csr_matrix  # [values, fine]: atoms of each value (counts)
    use_fine: sp.csr_matrix  # [uses, fine]: atoms of each operand use (counts)
    use_keys: tuple[tuple[int, int], ...]  # row -> (op, position)
    op_work_fine: sp.csr_matrix  # [ops, fine]: atoms that divide an op's work (no replicate)
    value_dim_fine: tuple[tuple[tuple[int, ...], ...], ...]  # value -> dim -> fine classes
    use_dim_fine: dict  # (op, position) -> dim -> fine classes
    split_dims: tuple[tuple[int, int, tuple[int, ...]], ...]  # (value, dim, fines) with >1 fine


def _csr(rows: list[list[int]], n_cols: int) -> sp.csr_matrix:
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(r) for r in rows])
    indices = np.fromiter((c for r in rows for c in r), dtype=np.int64, count=int(indptr[-1]))
    data = np.ones(len(indices), dtype=np.float64)
    m = sp.csr_matrix((data, indices, indptr), shape=(len(rows), n_cols))
    m.sum_duplicates()
    return m


def layout(ana: Analysis) -> Layout:
    """The incidence matrices of `ana` (cached on the analysis)."""
    if "layout" in ana.cache:
        return ana.cache["layout"]
    fine = ana.fine_of_atom
    nda = ana.nda
    value_dim_fine = tuple(
        tuple(tuple(int(fine[a]) for a in atoms) for atoms in dims) for dims in nda.value_atoms
    )
    use_dim_fine = {
        key: tuple(tuple(int(fine[a]) for a in atoms) for atoms in dims)
        for key, dims in nda.use_atoms.items()
    }
    value_rows = [[f for d in dims for f in d] for dims in value_dim_fine]
    use_keys = tuple(sorted(use_dim_fine))
    use_rows = [[f for d in use_dim_fine[k] for f in d] for k in use_keys]
    # Region boundaries (scan_start...) do no work; replicate factors do not divide it.
    work_rows = [
        []
        if op.primitive in REGION_BOUNDARIES
        else [int(fine[a]) for a in atoms if nda.atom_kind[a] != "replicate"]
        for op, atoms in zip(ana.program.ops, nda.op_atoms)
    ]
    split_dims = tuple(
        (vid, d, fines)
        for vid, dims in enumerate(value_dim_fine)
        for d, fines in enumerate(dims)
        if len(fines) > 1
    )
    out = Layout(
        value_fine=_csr(value_rows, ana.n_fine),
        use_fine=_csr(use_rows, ana.n_fine),
        use_keys=use_keys,
        op_work_fine=_csr(work_rows, ana.n_fine),
        value_dim_fine=value_dim_fine,
        use_dim_fine=use_dim_fine,
        split_dims=split_dims,
    )
    ana.cache["layout"] = out
    return out


def axis_bits(masks: np.ndarray, n_axes: int) -> np.ndarray:
    """[n_axes, n] 0/1 matrix: bit a of each mask."""
    return ((masks[None, :] >> np.arange(n_axes)[:, None]) & 1).astype(np.float64)


def double_axis_slots(
    matrix: sp.csr_matrix, masks: np.ndarray, n_axes: int
) -> list[tuple[int, int]]:
    """(row, axis) pairs where a row (value or op) would hold one mesh axis twice."""
    bits = axis_bits(masks, n_axes)
    out = []
    for a in range(n_axes):
        counts = matrix @ bits[a]
        for row in np.flatnonzero(counts > 1.5).tolist():
            out.append((row, a))
    return out


def strided_dims(lay: Layout, masks: np.ndarray, fine_size: np.ndarray, ways: np.ndarray):
    """(value, dim) pairs where a minor sub-factor is sharded while a more major one is not
    fully split: that would be a strided layout, which no PartitionSpec expresses."""
    if not lay.split_dims:
        return []
    fines, owners = _split_arrays(lay, len(masks))
    m = np.append(masks, 0)[fines]  # [split dims, sub-factors]
    sizes = np.append(fine_size, 1)[fines]
    whole = ways[m] == sizes  # the sub-factor is completely split
    # A sub-factor k > 0 may be sharded only if every more major one is completely split.
    major_whole = np.logical_and.accumulate(whole, axis=1)
    bad = (m[:, 1:] != 0) & ~major_whole[:, :-1]
    return [owners[i] for i in np.flatnonzero(bad.any(axis=1)).tolist()]


def _split_arrays(lay: Layout, n_fine: int):
    """Split dims padded into [dim, sub-factor] fine-class arrays (pad = n_fine, mask 0)."""
    cached = getattr(lay, "_split_cache", None)
    if cached is None:
        width = max(len(f) for _, _, f in lay.split_dims)
        fines = np.full((len(lay.split_dims), width), n_fine, dtype=np.int64)
        for i, (_, _, f) in enumerate(lay.split_dims):
            fines[i, : len(f)] = f
        cached = (fines, [(v, d) for v, d, _ in lay.split_dims])
        object.__setattr__(lay, "_split_cache", cached)
    return cached
