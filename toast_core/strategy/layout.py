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
    return _csr_of(indices, indptr, n_cols)


def _csr_of(indices: np.ndarray, indptr: np.ndarray, n_cols: int) -> sp.csr_matrix:
    """Row i holds `indices[indptr[i]:indptr[i + 1]]`, each counted once per occurrence."""
    data = np.ones(len(indices), dtype=np.float64)
    m = sp.csr_matrix((data, indices, indptr), shape=(len(indptr) - 1, n_cols))
    m.sum_duplicates()
    return m


def _nested(items: list, dim_starts: np.ndarray, starts: np.ndarray) -> list:
    """`items` cut into dims at the offsets `dim_starts`, and those dims into groups (a value's
    or a use's) at `starts`: the layout of `NdaResult`'s atom tables."""
    b = dim_starts.tolist()
    dims = [tuple(items[x:y]) for x, y in zip(b, b[1:])]
    g = starts.tolist()
    return [tuple(dims[x:y]) for x, y in zip(g, g[1:])]


def _gathered_rows(flat: np.ndarray, starts: np.ndarray, order: np.ndarray):
    """(indices, indptr) of the rows `flat[starts[u]:starts[u + 1]]` for u in `order`."""
    lengths = np.diff(starts)[order]
    indptr = np.zeros(len(order) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(lengths)
    offset = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1], lengths)
    return flat[np.repeat(starts[:-1][order], lengths) + offset], indptr


@per_analysis(max_keys=1)
def layout(ana: Analysis) -> Layout:
    """The incidence matrices of `ana`, built once per analysis (see `memo.py`).

    The fine classes of the atom tables are looked up at once in NumPy, then cut into dims and
    values (or uses); the incidence rows are read straight off the tables: a 40k-op program has
    a quarter of a million atoms."""
    # Python ints: indexing a list is far cheaper per atom than indexing the array.
    fine_of = ana.fine_of_atom.tolist().__getitem__
    nda = ana.nda
    value_slot_fine = ana.fine_of_atom[nda.value_slots[:, 3]]
    use_slot_fine = ana.fine_of_atom[nda.use_atom]
    value_dim_fine = tuple(_nested(value_slot_fine.tolist(), nda.value_dim_atoms, nda.value_dims))
    use_keys_in_order = list(zip(nda.use_op.tolist(), nda.use_position.tolist()))
    use_dim_fine = dict(
        zip(use_keys_in_order, _nested(use_slot_fine.tolist(), nda.use_dim_atoms, nda.use_dims))
    )
    use_keys = tuple(sorted(use_dim_fine))
    # Row ranges of each value's (use's) atoms in the tables; uses in `use_keys` order.
    value_fine = _csr_of(
        value_slot_fine.astype(np.int64), nda.value_dim_atoms[nda.value_dims], ana.n_fine
    )
    use_starts = nda.use_dim_atoms[nda.use_dims]
    if len(use_keys) == len(use_keys_in_order):
        order = np.lexsort((nda.use_position, nda.use_op))
        use_idx, use_ptr = _gathered_rows(use_slot_fine.astype(np.int64), use_starts, order)
        use_fine = _csr_of(use_idx, use_ptr, ana.n_fine)
    else:  # a use listed twice: its last entry, as the dict keeps
        flat = chain.from_iterable
        use_fine = _csr([list(flat(use_dim_fine[k])) for k in use_keys], ana.n_fine)
    # Region boundaries (scan_start...) do no work; replicate factors do not divide it (nor,
    # in the cost model, the cuts of a broadcast's dims: `cost.work_rows`).
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
        value_fine=value_fine,
        use_fine=use_fine,
        use_keys=use_keys,
        op_work_fine=_csr(work_rows, ana.n_fine),
        value_dim_fine=value_dim_fine,
        use_dim_fine=use_dim_fine,
        split_dims=split_dims,
        split_fines=split_fines,
        split_owners=tuple((v, d) for v, d, _ in split_dims),
    )
