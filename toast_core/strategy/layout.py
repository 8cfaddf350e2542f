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
from toast_core.strategy.memo import per_analysis


@dataclass(frozen=True, eq=False)
class Layout:
    value_fine: sp.csr_matrix  # [values, fine]: atoms of each value (counts)
    use_fine: sp.csr_matrix  # [uses, fine]: atoms of each operand use (counts)
    use_keys: tuple[tuple[int, int], ...]  # row -> (op, position)
    op_work_fine: sp.csr_matrix  # [ops, fine]: atoms that divide an op's work (no replicate)
    value_dim_fine: tuple[tuple[tuple[int, ...], ...], ...]  # value -> dim -> fine classes
    use_dim_fine: dict  # (op, position) -> dim -> fine classes
    split_dims: tuple[tuple[int, int, tuple[int, ...]], ...]  # (value, dim, fines) with >1 fine
    split_fines: np.ndarray  # [split dims, widest split]: their fine classes (pad: n_fine)
    split_owners: tuple[tuple[int, int], ...]  # split dim -> (value, dim)


def _csr(rows: list[list[int]], n_cols: int) -> sp.csr_matrix:
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(r) for r in rows])
    indices = np.fromiter((c for r in rows for c in r), dtype=np.int64, count=int(indptr[-1]))
    data = np.ones(len(indices), dtype=np.float64)
    m = sp.csr_matrix((data, indices, indptr), shape=(len(rows), n_cols))
    m.sum_duplicates()
    return m


@per_analysis(max_keys=1)
def layout(ana: Analysis) -> Layout:
    """The incidence matrices of `ana`, built once per analysis (see `memo.py`)."""
    fine = ana.fine_of_atom.tolist()  # Python ints: indexing a list is far cheaper per atom
    nda = ana.nda
    value_dim_fine = tuple(
        tuple(tuple(fine[a] for a in atoms) for atoms in dims) for dims in nda.value_atoms
    )
    use_dim_fine = {
        key: tuple(tuple(fine[a] for a in atoms) for atoms in dims)
        for key, dims in nda.use_atoms.items()
    }
    value_rows = [[f for d in dims for f in d] for dims in value_dim_fine]
    use_keys = tuple(sorted(use_dim_fine))
    use_rows = [[f for d in use_dim_fine[k] for f in d] for k in use_keys]
    # Region boundaries (scan_start...) do no work; replicate factors do not divide it.
    work_rows = [
        []
        if op.primitive in REGION_BOUNDARIES
        else [fine[a] for a in atoms if nda.atom_kind[a] != "replicate"]
        for op, atoms in zip(ana.program.ops, nda.op_atoms)
    ]
    split_dims = tuple(
        (vid, d, fines)
        for vid, dims in enumerate(value_dim_fine)
        for d, fines in enumerate(dims)
        if len(fines) > 1
    )
    width = max((len(f) for _, _, f in split_dims), default=0)
    split_fines = np.full((len(split_dims), width), ana.n_fine, dtype=np.int64)
    for i, (_, _, f) in enumerate(split_dims):
        split_fines[i, : len(f)] = f
    return Layout(
        value_fine=_csr(value_rows, ana.n_fine),
        use_fine=_csr(use_rows, ana.n_fine),
        use_keys=use_keys,
        op_work_fine=_csr(work_rows, ana.n_fine),
        value_dim_fine=value_dim_fine,
        use_dim_fine=use_dim_fine,
        split_dims=split_dims,
        split_fines=split_fines,
        split_owners=tuple((v, d) for v, d, _ in split_dims),
    )
