"""The max-flow graph of a conflict's cut, built from a precomputed CSR pattern, is the matrix
`scipy.sparse.csr_matrix` builds from coordinates (same entries, same order, duplicates summed),
so the cuts found (and the analysis) are unchanged by the faster construction."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from toast_core.analysis.conflicts import ClassGraph


def _reference(g: ClassGraph, src, snk, cap) -> sp.csr_matrix:
    n = g.n + 2
    s, t = n - 2, n - 1
    rows = np.r_[g.eu, g.ev, np.full(len(src), s), snk]
    cols = np.r_[g.ev, g.eu, src, np.full(len(snk), t)]
    data = np.r_[cap, cap, np.full(len(src), g.BIG), np.full(len(snk), g.BIG)]
    return sp.csr_matrix((data.astype(np.int32), (rows, cols)), shape=(n, n))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n_atoms=st.integers(2, 25), m=st.integers(1, 50))
def test_flow_graph_equals_coordinate_construction(seed, n_atoms, m):
    rng = np.random.default_rng(seed)
    ends = rng.integers(0, n_atoms, size=(m, 2)) * 3 + 5  # parallel and reversed edges too
    g = ClassGraph(np.arange(m), ends, rng.uniform(1, 1e6, size=m), 100.0)
    cap = g.cap.copy()
    cap[rng.integers(0, m)] = g.BIG  # a blocked edge
    nodes = rng.permutation(g.n)
    k = int(rng.integers(2, g.n + 1)) if g.n >= 2 else 2
    half = max(1, k // 2)
    src, snk = nodes[:half], nodes[half:k]
    if not len(snk):
        return
    got, want = g.flow_graph(src, snk, cap), _reference(g, src, snk, cap)
    assert np.array_equal(got.indptr, want.indptr)
    assert np.array_equal(got.indices, want.indices)
    assert np.array_equal(got.data, want.data)


def test_min_cut_of_a_chain_is_its_cheapest_edge():
    # atoms 0 - 1 - 2 - 3 with bytes 500, 100, 900: the cut between 0 and 3 is the middle edge.
    ends = np.array([[0, 1], [1, 2], [2, 3]])
    g = ClassGraph(np.arange(3), ends, np.array([500.0, 100.0, 900.0]), 1.0)
    value, near_sources, near_sinks = g.min_cuts({0}, {3})
    assert value == 100 and near_sources == near_sinks == frozenset({1})
