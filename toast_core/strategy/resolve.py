"""Resolving conflict options into the named dims a strategy assigns mesh axes to.

Choosing option o of conflict K cuts its M-edges; a named dim whose atom graph falls apart splits
into smaller named dims, each its own decision. They are named after their parent: cutting the
attention conflict on `N3` yields `N3.0` (the Q side, with x's sequence dim) and `N3.1` (the gathered
K side). A named dim that does not split keeps its name.

Everything is computed on *fine classes* (the components left when every candidate edge is cut), so
a resolution is a small union-find over fine classes, cached per set of options.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toast_core.analysis import Analysis
from toast_core.errors import StrategyError, bad_value


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
    cuts: frozenset[int]

    def index(self, name: str) -> int:
        for i, d in enumerate(self.dims):
            if d.name == name:
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
            raise StrategyError(bad_value("options", item, "(conflict id, option index) pairs")) from None
        conflict = ana.conflict(k)
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


def resolve(ana: Analysis, options=()) -> Resolution:
    """The named dims after cutting the M-edges of the chosen options (cached)."""
    opts = normalize_options(ana, options)
    key = ("resolve", opts)
    if key in ana.cache:
        return ana.cache[key]
    cuts = frozenset(e for k, o in opts for e in ana.conflicts[k].options[o].cuts)
    n = ana.n_fine
    parent = np.arange(n)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    fine = ana.fine_of_atom
    for eid in ana.candidate_edges.tolist():
        if eid in cuts:
            continue
        e = ana.nda.medges[eid]
        a, b = find(int(fine[e.value_atom])), find(int(fine[e.use_atom]))
        if a != b:
            parent[max(a, b)] = min(a, b)
    roots = np.array([find(i) for i in range(n)], dtype=np.int64)
    by_root: dict[int, list[int]] = {}
    for f in range(n):
        by_root.setdefault(int(roots[f]), []).append(f)
    per_parent: dict[int, list[list[int]]] = {}
    for members in sorted(by_root.values(), key=lambda m: m[0]):
        per_parent.setdefault(int(ana.fine_dim[members[0]]), []).append(members)
    dims: list[ResolvedDim] = []
    fine_to_dim = np.zeros(n, dtype=np.int64)
    for p in sorted(per_parent):
        parts = per_parent[p]
        for k, members in enumerate(parts):
            name = f"N{p}" if len(parts) == 1 else f"N{p}.{k}"
            for f in members:
                fine_to_dim[f] = len(dims)
            dims.append(ResolvedDim(name, p, int(ana.named_dims[p].size), tuple(members)))
    res = Resolution(opts, tuple(dims), fine_to_dim, cuts)
    ana.cache[key] = res
    return res
