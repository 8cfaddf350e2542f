"""Resolving conflict options into the named dims a strategy assigns mesh axes to.

Choosing option o of conflict K cuts its M-edges; a named dim whose atom graph falls apart splits
into smaller named dims, each its own decision. They are named after their parent: cutting the
attention conflict on `N3` yields `N3.0` (the Q side, with x's sequence dim) and `N3.1` (the gathered
K side). A named dim that does not split keeps its name.

Everything is computed on *fine classes* (the components left when every candidate edge is cut), so
a resolution is a small union-find over fine classes, cached per set of options.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from toast_core.analysis import Analysis
from toast_core.errors import StrategyError, ToastError, bad_value
from toast_core.strategy.memo import per_analysis

RESOLUTION_CACHE_SIZE = 2048


@dataclass(frozen=True, slots=True)
class ResolvedDim:
    """A named dim after cuts: the unit a strategy assigns mesh axes to."""

    name: str
    parent: int
    size: int
    fine: tuple[int, ...]


@dataclass(frozen=True)
class Resolution:
    options: tuple[tuple[int, int], ...]
    dims: tuple[ResolvedDim, ...]
    fine_to_dim: np.ndarray  # fine class -> index into dims

    @cached_property
    def names(self) -> dict[str, int]:
        """Named dim name -> index into dims."""
        return {d.name: i for i, d in enumerate(self.dims)}

    @cached_property
    def _parts(self) -> dict[int, tuple[ResolvedDim, ...]]:
        out: dict[int, list[ResolvedDim]] = {}
        for d in self.dims:
            out.setdefault(d.parent, []).append(d)
        return {p: tuple(ds) for p, ds in out.items()}

    def parts(self, parent: int) -> tuple[ResolvedDim, ...]:
        """The parts of named dim `parent` under these options, in order (an index: a strategy
        of a 96-layer model names hundreds of named dims, each looked up in thousands of parts)."""
        return self._parts.get(parent, ())

    def index(self, name: str) -> int:
        i = self.names.get(name)
        if i is not None:
            return i
        raise StrategyError(
            bad_value("named dim", name, "a named dim of this analysis and its chosen options")
        )

    def by_name(self, name: str) -> ResolvedDim:
        return self.dims[self.index(name)]


def normalize_options(ana: Analysis, options) -> tuple[tuple[int, int], ...]:
    """Checks (conflict, option) pairs and returns them sorted; one option per conflict."""
    pairs = dict()
    items = options.items() if isinstance(options, dict) else options
    for item in items:
        try:
            k, o = item
        except (TypeError, ValueError):
            raise StrategyError(
                bad_value("options", item, "(conflict id, option index) pairs")
            ) from None
        try:
            conflict = ana.conflict(k)
        except ToastError as exc:
            raise StrategyError(str(exc)) from None
        if not isinstance(o, int | np.integer) or not 0 <= int(o) < len(conflict.options):
            raise StrategyError(
                bad_value(
                    f"options[{conflict.name}]",
                    o,
                    f"an option index 0..{len(conflict.options) - 1} of {conflict.name}",
                )
            )
        if conflict.id in pairs and pairs[conflict.id] != int(o):
            raise StrategyError(
                f"conflict {conflict.name} resolved twice: options {pairs[conflict.id]} and {o}"
            )
        pairs[conflict.id] = int(o)
    return tuple(sorted(pairs.items()))


class _Resolver:
    """The resolutions of one analysis: candidate cut ends computed once, and a bounded LRU of
    resolutions keyed by option set (a long search visits many). Safe to share between threads:
    entries are pure functions of their keys and the LRU is locked."""

    def __init__(self, ana: Analysis) -> None:
        fine = ana.fine_of_atom
        edges = ana.candidate_edges.tolist()
        # The fine classes of each candidate edge's (value atom, use atom): M-edge table
        # columns 6 and 7.
        atoms = ana.nda.medge_table[np.array(edges, dtype=np.int64), 6:8]
        self.ends = fine[atoms].astype(np.int64).reshape(-1, 2)
        row = {e: i for i, e in enumerate(edges)}
        self.option_rows = {
            (c.id, o.index): np.array([row[e] for e in o.cuts], dtype=np.int64)
            for c in ana.conflicts
            for o in c.options
        }
        self.lru: OrderedDict = OrderedDict()
        self.lock = threading.Lock()


@per_analysis(max_keys=1)
def _resolver(ana: Analysis) -> _Resolver:
    return _Resolver(ana)


def resolve(ana: Analysis, options=()) -> Resolution:
    """The named dims after cutting the M-edges of the chosen options (memoized per analysis)."""
    opts = normalize_options(ana, options)
    r = _resolver(ana)
    with r.lock:
        hit = r.lru.get(opts)
        if hit is not None:
            r.lru.move_to_end(opts)
            return hit
    res = _resolve(ana, r, opts)
    with r.lock:
        r.lru[opts] = res
        if len(r.lru) > RESOLUTION_CACHE_SIZE:
            r.lru.popitem(last=False)
    return res


def _resolve(ana: Analysis, r: _Resolver, opts) -> Resolution:
    n = ana.n_fine
    ends, option_rows = r.ends, r.option_rows
    keep = np.ones(len(ana.candidate_edges), dtype=bool)
    for k, o in opts:
        keep[option_rows[(k, o)]] = False
    graph = sp.csr_matrix((np.ones(int(keep.sum())), (ends[keep, 0], ends[keep, 1])), shape=(n, n))
    _, labels = csgraph.connected_components(graph, directed=False)
    # Parts of each named dim, ordered by parent, then by their first fine class.
    _, first = np.unique(labels, return_index=True)  # first fine class of each label
    order = np.lexsort((first, ana.fine_dim[first]))
    parents = ana.fine_dim[first][order]
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    fine_to_dim = rank[labels]
    by_dim = np.argsort(fine_to_dim, kind="stable")
    bounds = np.searchsorted(fine_to_dim[by_dim], np.arange(len(order) + 1))
    n_parts = np.bincount(parents, minlength=len(ana.named_dims))
    dims: list[ResolvedDim] = []
    k_of: dict[int, int] = {}
    for i, p in enumerate(parents.tolist()):
        k = k_of.get(p, 0)
        k_of[p] = k + 1
        name = f"N{p}" if n_parts[p] == 1 else f"N{p}.{k}"
        fines = tuple(by_dim[bounds[i] : bounds[i + 1]].tolist())
        dims.append(ResolvedDim(name, p, int(ana.named_dims[p].size), fines))
    return Resolution(opts, tuple(dims), fine_to_dim)
