"""Scalar pricing of a restricted view's communication: the incremental evaluator's hot path.

A search step re-prices the collectives of a few values (`incremental._SitesOf`: on GPT-2 small
about 12 reshard sites and 8 reduction rows). `Evaluator._collective_arrays` and
`_compute_reshards` price them with some hundred NumPy calls on arrays of that length, so the
calls' overhead is nearly all the time. `ScalarView` prices the same view with Python ints and
floats over tables built once per view: the same bits, the same arithmetic in the same order
(IEEE products and sums of Python floats are NumPy's float64 ones), the same listing order, so
its arrays are the NumPy path's bit for bit (tests/test_view_comm.py holds it to that).

It covers the common view, whose values have reduction rows and reshard sites only (at most
`SCALAR_ROWS` of them); a view with replicate, permute or concatenate rows, or a reduction read
by a split alone (`red_split`), has no `ScalarView` (`scalar_view` returns None). A state in
which some site needs XLA's permuting reshard (an "odd" site, `Evaluator._exact_reshard`) is
priced by the NumPy path too (`price` returns None): those layouts are rare and their memo
lives there. What a view's reshards and reduction rows come to is kept per view, keyed by the
masks each reads (a search meets the same neighbourhoods again).

Worked example: sharding an MLP weight's output dim on `model` re-prices its value's
reduction row (an all-reduce over `model` of the matmul's partial sum when the contracting dim is
sharded) and the reshard sites of its uses: per site a handful of integer ORs decide whether the
value is gathered (a mesh axis the value holds and the use does not) or moved (an all-to-all).
"""

from __future__ import annotations

import threading
from operator import itemgetter

import numpy as np

from toast_core.cost.model import A2A, AG, AR, RS
from toast_core.cost.reshard_keys import classify, group_by_key

#: Reshard keys as `Evaluator._compute_reshards` builds them: value, gathered axes, moved axes.
_VALUE_SHIFT, _GATHER_SHIFT = 20, 8
#: Views with more reshard sites and reduction rows than this keep the NumPy path, whose
#: per-call overhead no longer dominates (GPT-2 small's views: about 20).
SCALAR_ROWS = 64
#: A site's (op, op holding it, backward?), as `reshard_keys.group_by_key` reads them.
_SPAN_FIELDS = itemgetter(3, 4, 5)
#: Reshard and reduction-row results kept per view, by the masks they read.
MEMO_KEPT = 32


class ScalarView:
    """A restricted view's reduction rows and reshard sites as Python tables (see the module
    essay); `price` gives what `Incremental._comm_of` computes on a miss."""

    def __init__(self, view) -> None:
        ev = view._ev
        n_fine = ev.ana.n_fine
        self.real = int(ev.real_axes)
        self.ways = [float(w) for w in ev.mask_ways.tolist()]
        self.n_bits = [int(b) for b in ev.n_bits.tolist()]
        self.c1 = ev.c1.tolist()
        self.n_ops = int(ev.n_ops)
        # Every fine class read, and the local position of each in `fines`.
        value_uses, use_fines, table = ev._use_fine_table()
        scan_rows = []
        for row in view.red_scan.tolist():
            chain = []
            for vid in row:
                if vid < 0:
                    continue
                uses = range(int(value_uses[vid]), int(value_uses[vid + 1]))
                chain.append([table[use_fines[u] : use_fines[u + 1]].tolist() for u in uses])
            scan_rows.append(chain)
        wanted = set(view.red_fine.tolist())
        wanted.update(f for chain in scan_rows for uses in chain for fs in uses for f in fs)
        vf, uf = view.site_vf.tolist(), view.site_uf.tolist()
        for site in vf + uf:
            wanted.update(f for dim in site for f in dim if f < n_fine)
        self.fines = np.array(sorted(wanted), dtype=np.int64)
        pos = {f: i for i, f in enumerate(self.fines.tolist())}
        # Values read (their local bytes), by local position.
        values = sorted(set(view.red_value.tolist()) | set(view.site_value.tolist()))
        self.values = np.array(values, dtype=np.int64)
        vpos = {v: i for i, v in enumerate(values)}
        self.view_values = view.values.tolist()
        self._view_pos = {v: i for i, v in enumerate(self.view_values)}
        trip = [float(t) for t in ev.site_trip.tolist()]
        # Reduction rows: (fine position, op, value, value position, combiner site, trips,
        # scatter chain as [value][use][fine positions]).
        self.rows = [
            (
                pos[f],
                o,
                v,
                vpos[v],
                s,
                trip[s],
                [[[pos[x] for x in fs] for fs in uses] for uses in chain],
            )
            for f, o, v, s, chain in zip(
                view.red_fine.tolist(),
                view.red_op.tolist(),
                view.red_value.tolist(),
                view._red_site.tolist(),
                scan_rows,
            )
        ]
        # Reshard sites: per dim the positions of its value's and its use's sub-factor fine
        # classes (padding dropped: it holds no mesh axis, so it adds nothing to any OR, and a
        # gather over no axes multiplies the buffer by 1.0 and lists no collective).
        ops, site_values = view.site_op.tolist(), view.site_value.tolist()
        use_site = ev._use_site(view.site_op, view.site_value).tolist()
        backward = ev._is_backward[view.site_op].tolist()
        is_mat = ev._is_mat[view.site_value].tolist()
        moves = ev._moves[view.site_op].tolist()
        self.sites = []
        for i, (v_dims, u_dims) in enumerate(zip(vf, uf)):
            dims = [
                (
                    tuple(pos[f] for f in vd if f < n_fine),
                    tuple(pos[f] for f in ud if f < n_fine),
                )
                for vd, ud in zip(v_dims, u_dims)
            ]
            while dims and not dims[-1][0] and not dims[-1][1]:
                dims.pop()
            v = site_values[i]
            self.sites.append(
                (
                    dims,
                    v,
                    vpos[v],
                    ops[i],
                    int(view.site_hold[i]),
                    bool(backward[i]),
                    use_site[i],
                    trip[use_site[i]],
                    is_mat[i] and moves[i],
                )
            )
        self.site_ids = view.site_ids.tolist()
        # What the reshards and the reduction rows read: memo keys (`price`).
        self.site_key = _getter(
            sorted({p for site in self.sites for d in site[0] for p in d[0] + d[1]})
        )
        self.row_key = _getter(
            sorted(
                {row[0] for row in self.rows}
                | {p for row in self.rows for uses in row[6] for fs in uses for p in fs}
            )
        )
        self._reshard_memo: dict = {}
        self._row_memo: dict = {}
        self._lock = threading.Lock()

    def price(self, masks: np.ndarray, value_local: np.ndarray) -> tuple | None:
        """`Incremental._comm_of`'s result for this view under `masks`: (bandwidth seconds of
        each view value, collectives [5, n] and their V, resharded copies [5, n] and their
        bytes, reads of those copies [3, n] and their extra bytes); None when a site needs the
        NumPy path (an odd reshard)."""
        mk = masks[self.fines].tolist()
        key = self.site_key(mk)
        resh = self._reshard_memo.get(key)
        if resh is None:
            resh = self._remember(self._reshard_memo, key, self._reshards(mk))
        if not resh:
            return None
        key = self.row_key(mk)
        rows = self._row_memo.get(key)
        if rows is None:
            rows = self._remember(self._row_memo, key, self._rows(mk))
        vl = value_local[self.values].tolist()
        reshards, r_i, reads, read_i = resh
        # Every collective as the NumPy path lists them: all-reduces, reduce-scatters, then
        # each reshard's gathers and all-to-all; only those that move data are kept.
        kinds, ms, vs, ops, vals, sites, trips = [], [], [], [], [], [], []
        for kind, col in ((AR, 1), (RS, 2)):
            for row in rows:
                m = row[col]
                _, o, v, vp, site, trip, _ = self.rows[row[0]]
                local = vl[vp]
                if m and local > 0:
                    kinds.append(kind)
                    ms.append(m)
                    vs.append(local)
                    ops.append(o)
                    vals.append(v)
                    sites.append(site)
                    trips.append(trip)
        res_bytes = []
        for v, vp, op, use_site, trip, colls, buffer in reshards:
            local = vl[vp]
            for kind, m, factor in colls:
                x = local * factor
                if m and x > 0:
                    kinds.append(kind)
                    ms.append(m)
                    vs.append(x)
                    ops.append(op)
                    vals.append(v)
                    sites.append(use_site)
                    trips.append(trip)
            res_bytes.append(local * buffer)
        read_bytes = [vl[vp] * grown for vp, grown in reads]
        # Each view value's bandwidth seconds, summed in listing order (as `np.bincount`).
        c1 = self.c1
        per_value: dict[int, float] = {}
        for k, m, v, value, trip in zip(kinds, ms, vs, vals, trips):
            per_value[value] = per_value.get(value, 0.0) + c1[k][m] * v * trip
        n = len(kinds)
        # A few values owe bandwidth among the view's many: placed, not listed one by one.
        per_view = np.zeros(len(self.view_values))
        pos = self._view_pos
        for value, x in per_value.items():
            i = pos.get(value)
            if i is not None:
                per_view[i] = x
        return (
            per_view,
            np.array([kinds, ms, ops, vals, sites], dtype=np.int64).reshape(5, n),
            np.array(vs, dtype=np.float64),
            r_i,
            np.array(res_bytes, dtype=np.float64),
            read_i,
            np.array(read_bytes, dtype=np.float64),
        )

    def _remember(self, memo: dict, key, value):
        """`value`, kept in `memo` under `key` (the oldest entry dropped beyond `MEMO_KEPT`;
        locked: searches on one evaluator share its views)."""
        with self._lock:
            if len(memo) >= MEMO_KEPT:
                memo.pop(next(iter(memo)))
            memo[key] = value
        return value

    def _rows(self, mk: list) -> list:
        """(row, all-reduce axes, reduce-scatter axes) of every reduction row whose fine class
        holds mesh axes: a reduce-scatter over the axes every consumer down the row's chain
        shards on (`Evaluator._scan_common`), an all-reduce over the rest."""
        real = self.real
        out = []
        for i, row in enumerate(self.rows):
            m = mk[row[0]]
            if not m:
                continue
            common = 0
            for uses in row[6]:
                both = -1
                for fs in uses:
                    held = 0
                    for p in fs:
                        held |= mk[p]
                    both &= held
                common |= both
            scatter = m & common
            out.append((i, m & ~scatter & real, scatter & real))
        return out

    def _reshards(self, mk: list) -> tuple | bool:
        """The view's distinct reshards under masks `mk` (a function of its sites' masks
        alone): per reshard (value, its position, first reading op, combiner site, trips,
        collectives as (kind, mesh axes, V / local bytes), new buffer / local bytes), the
        copies as [5, n] value, first and last reader, last forward and first backward reader,
        the reads of grown copies as (value position, growth) and [3, n] op, value, global
        site. False when some site needs the NumPy path (an odd reshard)."""
        real, ways, n_bits = self.real, self.ways, self.n_bits
        active = []  # (key, site, gathered axes per dim, moved axes), in site order
        for s, site in enumerate(self.sites):
            vms, ums = [], []
            diff = 0
            for vd, ud in site[0]:
                vm = 0
                for p in vd:
                    vm |= mk[p]
                um = 0
                for p in ud:
                    um |= mk[p]
                vms.append(vm)
                ums.append(um)
                diff |= (vm ^ um) & real
            if not diff:
                continue
            kinds = classify(vms, ums, real, n_bits)
            if kinds is None:  # odd: the NumPy path prices it
                return False
            gather, moved, gathered = kinds
            if not (gather | moved):
                continue
            key = (site[1] << _VALUE_SHIFT) | (gather << _GATHER_SHIFT) | moved
            active.append((key, s, gathered, moved))
        # Distinct reshards in key order, each with its readers' span.
        sites = self.sites
        groups = group_by_key(active, lambda s: _SPAN_FIELDS(sites[s]), self.n_ops)
        order = sorted(groups)
        reshards, spans, buffers = [], [], {}
        for key in order:
            first, lo, hi, fwd, bwd, gathered, moved = groups[key]
            site = self.sites[first]
            colls, grown = [], 1.0  # the gathers, last dim first, each over what the
            for g in reversed(gathered):  # ones before it grew; then the all-to-all
                grown = grown * ways[g]
                if g:
                    colls.append((AG, g & real, grown))
            if moved:
                colls.append((A2A, moved & real, grown * ways[moved]))
            reshards.append((site[1], site[2], site[3], site[6], site[7], colls, grown))
            spans.append((site[1], lo, hi, fwd, bwd))
            buffers[key] = grown
        reads, read_i = [], []
        for key, s, _, _ in active:
            grown = buffers[key] - 1.0
            site = self.sites[s]
            if grown > 0 and site[8]:
                reads.append((site[2], grown))
                read_i.append((site[3], site[1], self.site_ids[s]))
        r_i = np.array(spans, dtype=np.int64).reshape(len(spans), 5).T
        read_i = np.array(read_i, dtype=np.int64).reshape(len(read_i), 3).T
        return reshards, np.ascontiguousarray(r_i), reads, np.ascontiguousarray(read_i)


def _getter(positions: list[int]):
    """A function of the mask list giving the masks at `positions` (a memo key)."""
    if not positions:
        return lambda mk: ()
    get = itemgetter(*positions)
    return get if len(positions) > 1 else lambda mk: (get(mk),)


def scalar_view(view) -> ScalarView | None:
    """The `ScalarView` of a restricted view (built once, kept on it), or None when the view has
    rows it does not cover (see the module essay)."""
    hit = view.__dict__.get("_scalar")
    if hit is None:
        covered = (
            len(view.site_ids) + len(view.red_op) <= SCALAR_ROWS
            and not len(view.rep)
            and not len(view.per)
            and not len(view.cat)
            and not (view.red_split[:, 0] >= 0).any()
        )
        hit = ScalarView(view) if covered else False
        view.__dict__["_scalar"] = hit
    return hit or None
