"""Incremental evaluation: price a state from a nearby state's cached evaluation.

A search step shards one unit: it changes the masks of a few fine classes and leaves the rest of
the strategy as it was. Only what touches those fine classes can change price:

* **Compute**: the ops whose work divides over a changed fine class (`Layout.op_work_fine`), and
  the ops that read or write a value whose local size changed (`Evaluator.op_values`).
* **Communication**: every collective of the model belongs to one value - the partial sums of a
  reduction site, the reshards of a value at its cut uses (deduplicated per value and target
  layout), the gathers of replicate factors and the halos of permute factors on its uses. So the
  communication time is a sum over values, and a value's share depends only on its own dims, the
  dims of its uses and the reduction factor that produces it (`_comm_fines`). A step re-prices the
  values whose share can move, by running the evaluator's own `_collective_arrays` on those
  values' sites only (`_SitesOf`): one pricing code, so a change there reaches both paths.
* **Memory**: the live range of a value whose local size changed, and the resharded copies of the
  re-priced values, are taken out of the parent's timeline deltas and put back at their new size.

`Incremental.score` keeps the last few evaluations (an LRU) and prices a state from the cached
one whose masks differ least (usually its parent in the tree, or the previous rollout step); when
too much changed it evaluates in full. Numbers agree with `Evaluator.score` to rounding
(tests/test_incremental.py checks 1e-12 relative over random sequences of legal actions).

Worked example: on GPT-2 small (5,258 ops, 477 fine classes) sharding a weight's output dim on
`model` touches a few dozen ops and values of each layer; the parent's arrays are copied and only
those entries recomputed.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from toast_core.cost.model import Evaluator, Score

#: Cached evaluations kept (each holds a few arrays of the program's size).
CACHE_SIZE = 8
#: Beyond this fraction of values re-priced, a full evaluation is as cheap.
FULL_FRACTION = 0.1
#: Restricted views of the evaluator kept (`Incremental._view`), each a few small arrays.
VIEWS_KEPT = 512


@dataclass(slots=True)
class _Cached:
    """What a delta needs of one evaluated state."""

    masks: np.ndarray
    fine_logdeg: np.ndarray  # [fine]: log2 of the shard count of each fine class
    value_local: np.ndarray  # [values]: per-device bytes
    t: np.ndarray  # [ops]: roofline time
    comm_v: np.ndarray  # [values]: bandwidth seconds owed to each value
    coll: tuple  # every collective (kind, mesh axes, V, op, value, site), for the latency
    delta: np.ndarray  # [ops + 2]: live-bytes timeline deltas
    res_value: np.ndarray  # resharded copies: value, first and last reader, bytes
    res_lo: np.ndarray
    res_hi: np.ndarray
    res_bytes: np.ndarray
    score: Score


class _SitesOf:
    """The evaluator seen through a subset of values: its collective sites restricted to those
    values, everything else (coefficients, layouts, memos of pure functions) shared. Lets the
    evaluator's own `_collective_arrays` and `_reshards` price a few values."""

    def __init__(self, ev: Evaluator, inc: _Tables, values: np.ndarray) -> None:
        self._ev = ev
        self._last_reshards = None
        if not hasattr(ev, "_site_static"):
            ev._combine_setup()
        red = inc.red_of.take(values)
        self.red_op, self.red_fine = ev.red_op[red], ev.red_fine[red]
        self.red_value, self.red_rs = ev.red_value[red], ev.red_rs[red]
        self._red_site = ev._red_site[red]
        sites = inc.sites_of.take(values)
        self.site_vf, self.site_uf = ev.site_vf[sites], ev.site_uf[sites]
        self.site_value, self.site_op = ev.site_value[sites], ev.site_op[sites]
        rep, per = inc.rep_of.take(values), inc.per_of.take(values)
        self.rep, self._rep_site = ev.rep[rep], ev._rep_site[rep]
        self.rep_before = ev.rep_before[rep]
        self.per, self._per_site = ev.per[per], ev._per_site[per]

    def __getattr__(self, name):
        return getattr(self._ev, name)

    _collective_arrays = Evaluator._collective_arrays
    _reshards = Evaluator._reshards
    _compute_reshards = Evaluator._compute_reshards


class _Groups:
    """Row indices grouped by an integer key (CSR): `take(keys)` concatenates their groups."""

    def __init__(self, keys: np.ndarray, n_keys: int) -> None:
        order = np.argsort(keys, kind="stable")
        self.rows = order.astype(np.int64)
        self.indptr = np.zeros(n_keys + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys, minlength=n_keys), out=self.indptr[1:])

    def take(self, keys: np.ndarray) -> np.ndarray:
        if not len(keys):
            return np.zeros(0, dtype=np.int64)
        lo, hi = self.indptr[keys], self.indptr[keys + 1]
        n = hi - lo
        total = int(n.sum())
        if not total:
            return np.zeros(0, dtype=np.int64)
        # Positions lo[k] .. hi[k]-1 for every k, without a Python loop.
        starts = np.repeat(lo - np.cumsum(n) + n, n)
        return self.rows[starts + np.arange(total)]


class _Tables:
    """What a delta looks up, per evaluator: sites grouped by value, incidences by row."""

    def __init__(self, ev: Evaluator) -> None:
        self.ev = ev
        prog = ev.ana.program
        n_values, n_ops = len(prog.values), len(prog.ops)
        self.n_values = n_values
        self.red_of = _Groups(ev.red_value, n_values)
        self.sites_of = _Groups(ev.site_value, n_values)
        self.rep_of = _Groups(ev.rep[:, 1], n_values)
        self.per_of = _Groups(ev.per[:, 1], n_values)
        lay = ev.lay
        n_fine = ev.ana.n_fine
        # [fine, values]: the values whose local size a fine class changes, and the values whose
        # collectives it can change (see the module essay).
        self.fine_values = _Rows(lay.value_fine.T)
        self.fine_comm_values = _Rows(self._comm_fines(n_fine).T)
        self.fine_ops = _Rows(lay.op_work_fine.T)
        self.value_ops = _Rows(ev.op_values.T)  # [values, ops]: ops reading or writing
        self.value_fine, self.op_work_fine = _Rows(lay.value_fine), _Rows(lay.op_work_fine)
        self.op_values = _Rows(ev.op_values)
        self.live_pos = np.full(n_values, -1, dtype=np.int64)
        self.live_pos[ev.live_ids] = np.arange(len(ev.live_ids))
        self.n_ops = n_ops
        self.full_limit = FULL_FRACTION * n_values

    def _comm_fines(self, n_fine: int) -> sp.csr_matrix:
        """[values, fine]: fine classes a value's collectives depend on: its own dims, the dims
        of its uses, the reduction factors producing it, the factors of its uses."""
        ev, lay = self.ev, self.ev.lay
        rows, cols = [], []
        v_of_use = np.array([ev.ana.program.ops[o].operands[p] for o, p in lay.use_keys])
        use = lay.use_fine.tocoo()
        rows.append(v_of_use[use.row]), cols.append(use.col)
        val = lay.value_fine.tocoo()
        rows.append(val.row), cols.append(val.col)
        rows.append(ev.red_value), cols.append(ev.red_fine)
        rows.append(ev.rep[:, 1]), cols.append(ev.rep[:, 2])
        rows.append(ev.per[:, 1]), cols.append(ev.per[:, 2])
        r = np.concatenate([np.asarray(x, dtype=np.int64) for x in rows])
        c = np.concatenate([np.asarray(x, dtype=np.int64) for x in cols])
        m = sp.csr_matrix((np.ones(len(r)), (r, c)), shape=(len(ev.ana.program.values), n_fine))
        m.sum_duplicates()
        return m


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def incremental_tables(ev: Evaluator) -> _Tables:
    """The tables of `ev`, built once (a pure function of the evaluator)."""
    with _TABLES_LOCK:
        hit = _TABLES.get(ev)
    if hit is None:
        hit = _Tables(ev)
        with _TABLES_LOCK:
            _TABLES[ev] = hit
    return hit


class Incremental:
    """Scores fine-class masks like `ev.score`, re-pricing only what differs from a cached state.
    One per search (its cache is not locked); the tables it reads are shared per evaluator."""

    def __init__(self, ev: Evaluator, cache_size: int = CACHE_SIZE) -> None:
        self.ev = ev
        self.tab = incremental_tables(ev)
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, _Cached] = OrderedDict()
        self._views: dict[bytes, _SitesOf] = {}
        self.full_evaluations = 0
        self.delta_evaluations = 0

    # -- public --------------------------------------------------------------------------------

    def score(self, masks: np.ndarray, parent: np.ndarray | None = None) -> Score:
        """The score of `masks`, from the cached evaluation of `parent` (masks) when given and
        cached, else of the nearest cached state, else in full."""
        key = masks.tobytes()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit.score
        base = None
        if parent is not None:
            base = self._cache.get(parent.tobytes())
        if base is None:
            base = self._nearest(masks)
        entry = None
        if base is not None:
            entry = self._delta(base, masks)
        if entry is None:
            entry = self._full(masks)
        self._cache[key] = entry
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return entry.score

    # -- internals -----------------------------------------------------------------------------

    def _nearest(self, masks: np.ndarray) -> _Cached | None:
        best, best_n = None, None
        for entry in reversed(self._cache.values()):
            n = int(np.count_nonzero(entry.masks != masks))
            if best_n is None or n < best_n:
                best, best_n = entry, n
                if n <= 1:
                    break
        return best

    def _full(self, masks: np.ndarray) -> _Cached:
        self.full_evaluations += 1
        ev = self.ev
        fine_logdeg, value_local, op_logdeg = ev._local(masks)
        _, _, _, t = ev._compute(value_local, op_logdeg)
        comm_v, coll = self._comm_per_value(ev, masks, value_local)
        delta = np.zeros(self.tab.n_ops + 2)
        b = value_local[ev.live_ids]
        np.add.at(delta, ev.born, b)
        np.add.at(delta, ev.dies, -b)
        r = ev._reshards(masks)
        res_bytes = value_local[r.value] * r.buffer
        np.add.at(delta, r.lo, res_bytes)
        np.add.at(delta, r.hi + 1, -res_bytes)
        return self._finish(
            masks, fine_logdeg, value_local, t, comm_v, coll, delta, r.value, r.lo, r.hi, res_bytes
        )

    def _comm_per_value(self, view, masks, value_local):
        """(bandwidth seconds per value, the collectives as arrays). Bandwidth adds up over
        values; latency is paid once per combined op, so it is priced over all collectives."""
        ev = self.ev
        coll = view._collective_arrays(masks, value_local)
        kinds, ms, vs, _, vals, sites = coll
        times = ev.c1[kinds, ms] * vs * ev.site_trip[sites]
        out = np.bincount(vals, weights=times, minlength=self.tab.n_values)
        return out.astype(np.float64, copy=False), coll

    def _delta(self, base: _Cached, masks: np.ndarray) -> _Cached | None:
        ev = self.ev
        changed = np.flatnonzero(base.masks != masks)
        if not len(changed):
            return base
        # Values whose collectives may move; values whose local size moved.
        comm_vals = self.tab.fine_comm_values.cols(changed)
        if len(comm_vals) > self.tab.full_limit:
            return None
        self.delta_evaluations += 1
        fine_logdeg = base.fine_logdeg.copy()
        bits = ev.axes.bits(masks[changed])
        fine_logdeg[changed] = bits.T @ ev.log2n
        size_vals = self.tab.fine_values.cols(changed)
        value_local = base.value_local.copy()
        if len(size_vals):
            logdeg = self.tab.value_fine.matvec(size_vals, fine_logdeg)
            value_local[size_vals] = ev.nbytes[size_vals] * np.exp2(-logdeg)
            size_vals = size_vals[value_local[size_vals] != base.value_local[size_vals]]
        # Compute: ops dividing work over a changed fine, ops touching a resized value.
        ops = self.tab.fine_ops.cols(changed)
        if len(size_vals):
            ops = np.union1d(ops, self.tab.value_ops.cols(size_vals))
        t = base.t.copy()
        if len(ops):
            t[ops] = self._op_times(ops, value_local, fine_logdeg)
        # Communication of the values it may move (collectives scale with local sizes too).
        comm_v = base.comm_v.copy()
        coll = base.coll
        res = (base.res_value, base.res_lo, base.res_hi, base.res_bytes)
        delta = base.delta.copy()
        if len(comm_vals):
            view = self._view(comm_vals)
            comm_v[comm_vals] = 0.0
            moved, new = self._comm_per_value(view, masks, value_local)
            comm_v += moved
            stay = ~np.isin(coll[4], comm_vals)
            coll = tuple(np.concatenate([a[stay], b]) for a, b in zip(coll, new))
            # Resharded copies of those values: out with the old, in with the new.
            touched = np.zeros(self.tab.n_values, dtype=bool)
            touched[comm_vals] = True
            old = touched[base.res_value]
            np.add.at(delta, base.res_lo[old], -base.res_bytes[old])
            np.add.at(delta, base.res_hi[old] + 1, base.res_bytes[old])
            r = view._reshards(masks)
            new_bytes = value_local[r.value] * r.buffer
            np.add.at(delta, r.lo, new_bytes)
            np.add.at(delta, r.hi + 1, -new_bytes)
            keep = ~old
            res = (
                np.concatenate([base.res_value[keep], r.value]),
                np.concatenate([base.res_lo[keep], r.lo]),
                np.concatenate([base.res_hi[keep], r.hi]),
                np.concatenate([base.res_bytes[keep], new_bytes]),
            )
        # Live ranges of resized values.
        pos = self.tab.live_pos[size_vals]
        pos = pos[pos >= 0]
        if len(pos):
            vids = ev.live_ids[pos]
            change = value_local[vids] - base.value_local[vids]
            np.add.at(delta, ev.born[pos], change)
            np.add.at(delta, ev.dies[pos], -change)
        return self._finish(masks, fine_logdeg, value_local, t, comm_v, coll, delta, *res)

    def _view(self, values: np.ndarray) -> _SitesOf:
        """The evaluator restricted to `values` (memoized: a search shards the same units again
        and again, so the same sets of values come back)."""
        key = values.tobytes()
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= VIEWS_KEPT:
                self._views.pop(next(iter(self._views)))
            view = self._views[key] = _SitesOf(self.ev, self.tab, values)
        return view

    def _op_times(self, ops, value_local, fine_logdeg) -> np.ndarray:
        """`Evaluator._compute`'s roofline time, for some ops only (same formula, same order)."""
        ev = self.ev
        share = np.exp2(-self.tab.op_work_fine.matvec(ops, fine_logdeg))
        flops_local, trans_local = ev.op_flops[ops] * share, ev.op_trans[ops] * share
        bytes_local = self.tab.op_values.matvec(ops, value_local) * ev.trip[ops]
        return np.maximum(
            (flops_local + trans_local) / ev.peak_flops, bytes_local / ev.hw.hbm_bytes_per_s
        )

    def _finish(
        self, masks, fine_logdeg, value_local, t, comm_v, coll, delta, rv, rlo, rhi, rb
    ) -> _Cached:
        ev = self.ev
        compute_s = float(t.sum())
        kinds, ms, vs, ops, _, sites = coll
        comm_s = float(comm_v.sum()) + ev.latency_s(kinds, ms, vs, ops, sites)
        timeline = np.cumsum(delta)[: self.tab.n_ops]
        persistent = float(value_local[ev.persistent_ids].sum())
        peak = persistent + (float(timeline.max()) if len(timeline) else 0.0)
        step = compute_s + (1.0 - ev.overlap) * comm_s
        score = Score(step, compute_s, comm_s, peak, peak <= ev.capacity_bytes)
        return _Cached(
            masks.copy(), fine_logdeg, value_local, t, comm_v, coll, delta, rv, rlo, rhi, rb, score
        )


class _Rows:
    """A CSR matrix read by rows without scipy's per-call overhead (a delta reads a few hundred
    rows of several matrices, thousands of times a second)."""

    def __init__(self, m: sp.csr_matrix) -> None:
        m = m.tocsr()
        m.sort_indices()
        self.indptr = m.indptr.astype(np.int64)
        self.indices = m.indices.astype(np.int64)
        self.data = m.data.astype(np.float64)
        self.n_cols = m.shape[1]

    def _positions(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.indptr[rows], self.indptr[rows + 1]
        n = hi - lo
        total = int(n.sum())
        starts = np.repeat(lo - np.cumsum(n) + n, n)
        return starts + np.arange(total), n

    def cols(self, rows: np.ndarray) -> np.ndarray:
        """Sorted distinct columns holding an entry in any of `rows`."""
        if len(rows) == 1:
            r = int(rows[0])
            return self.indices[self.indptr[r] : self.indptr[r + 1]]
        pos, _ = self._positions(rows)
        hit = np.zeros(self.n_cols, dtype=bool)
        hit[self.indices[pos]] = True
        return np.flatnonzero(hit)

    def matvec(self, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        """`(M @ x)[rows]`, summed in the order scipy's CSR mat-vec sums (so bit-identical)."""
        pos, n = self._positions(rows)
        owner = np.repeat(np.arange(len(rows)), n)
        return np.bincount(
            owner, weights=self.data[pos] * x[self.indices[pos]], minlength=len(rows)
        )
