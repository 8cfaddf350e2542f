"""Sparse incidence of values and ops over fine classes, built once per analysis.

The legality check and the cost model both ask, for every value and every operand use, "which fine
classes (and so which mesh axes) does it hold?". Precomputing that as sparse matrices turns each strategy
evaluation into a few sparse mat-vecs, which is what lets the search evaluate thousands of
strategies per second.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

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
    indptr[1:] = np.cumsum(list(map(len, rows)))
    indices = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(indptr[-1]))
    data = np.ones(len(indices), dtype=np.float64)
    m = sp.csr_matrix((data, indices, indptr), shape=(len(rows), n_cols))
    m.sum_duplicates()
    return m


@per_analysis(max_keys=1)
def layout(ana: Analysis) -> Layout:
    """The incidence matrices of `ana`, built once per analysis (see `memo.py`).

    Written with `map` over Python lists rather than generators: a 40k-op program has a quarter
    of a million atoms, each visited three times."""
    # Python ints: indexing a list is far cheaper per atom than indexing the array.
    fine_of = ana.fine_of_atom.tolist().__getitem__
    nda = ana.nda

    def dims_fine(dims) -> tuple[tuple[int, ...], ...]:
        return tuple([tuple(map(fine_of, atoms)) for atoms in dims])

    value_dim_fine = tuple(map(dims_fine, nda.value_atoms))
    use_dim_fine = dict(zip(nda.use_atoms.keys(), map(dims_fine, nda.use_atoms.values())))
    flat = chain.from_iterable
    value_rows = [list(flat(dims)) for dims in value_dim_fine]
    use_keys = tuple(sorted(use_dim_fine))
    use_rows = [list(flat(use_dim_fine[k])) for k in use_keys]
    # Region boundaries (scan_start...) do no work; replicate factors do not divide it.
    kind = nda.atom_kind
    work_rows = [
        []
        if op.primitive in REGION_BOUNDARIES
        else [fine_of(a) for a in atoms if kind[a] != "replicate"]
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
