"""Incremental evaluation: price a state from a nearby state's cached evaluation.

A search step shards one unit: it changes the masks of a few fine classes and leaves the rest of
the strategy as it was. Only what touches those fine classes can change price:

* **Compute**: the ops whose work divides over a changed fine class (`Layout.op_work_fine`), and
  the ops that read or write a value whose local size changed (`Evaluator.op_values`), and the
  ops reading a resharded copy of a re-priced value (an FSDP matmul reads the gathered weight:
  `Evaluator._reshard_reads`), their sums redone in the evaluator's order.
* **Communication**: every collective of the model belongs to one value - the partial sums of a
  reduction site, the reshards of a value at its cut uses (deduplicated per value and target
  layout), the gathers of replicate factors and the halos of permute factors on its uses. So the
  communication time is a sum over values, and a value's share depends only on its own dims, the
  dims of its uses and the reduction factor that produces it (`_comm_fines`). A step re-prices the
  values whose share can move, by running the evaluator's own `_collective_arrays` on those
  values' sites only (`_SitesOf`), or, for the common small view, its transcription into
  Python ints and floats (`view_comm.ScalarView`: NumPy's per-call overhead was most of a
  step). tests/test_view_comm.py holds the two to the same bits: a change to the pricing of
  reductions or reshards must reach both.
* **Memory**: the live range of a value whose local size changed, and the resharded copies of the
  re-priced values, are taken out of the parent's timeline deltas and put back at their new size.

A search changes the same units again and again, so two things are memoized: what a set of
changed fine classes touches, whatever their masks (`_Plan`: the values, ops and live ranges, with
the rows of the incidences its mat-vecs read, and the restricted view; kept per evaluator, so the
next search on it starts with them), and, per search, the communication of each restricted view,
keyed by the masks of the fine classes it reads (`Incremental._comm_of`): a greedy
step scores the same shards from the new state, and a unit whose neighbourhood the step left
alone gets its collectives back without pricing them. On a miss, the view's reshards are looked
up by the masks of its sites' fine classes alone (fewer than the view reads), and a full
evaluation, a pure function of its masks, is kept for the next time the same masks come back
under other conflict options or remat policies (`FULLS_KEPT`). A delta is not memoized that
way: the order of its collectives and its timeline's sums follow its base.

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

from toast_core.cost.model import SCALAR_KEPT_PER_VIEW, Evaluator, Score, _added
from toast_core.cost.remat import hold_barrier_inputs, shorten_lifetimes
from toast_core.cost.view_comm import scalar_view
from toast_core.strategy.remat import remat_effect

#: Cached evaluations kept (each holds a few arrays of the program's size).
CACHE_SIZE = 8
#: Beyond this fraction of values re-priced, a full evaluation is as cheap.
FULL_FRACTION = 0.1
#: Restricted views of the evaluator kept (`Incremental._view`), each a few small arrays.
VIEWS_KEPT = 512
#: Communication results kept per restricted view (`Incremental._comm_of`).
COMM_KEPT = 64
#: Full evaluations kept by their masks (`Incremental._full`): a search prices the same masks in
#: full again, under other conflict options or remat policies, once the LRU has let them go
#: (GPT-2 small: a quarter of its full evaluations, most within 16 of the last).
FULLS_KEPT = 16
#: Up to this many reads of resharded copies, a step re-sums them in Python (`_reread`).
SCALAR_READS = 64
#: Delta plans kept (`Incremental._plan`), one per set of changed fine classes.
PLANS_KEPT = 4096


@dataclass(slots=True)
class _Cached:
    """What a delta needs of one evaluated state."""

    masks: np.ndarray
    fine_logdeg: np.ndarray  # [fine]: log2 of the shard count of each fine class
    value_local: np.ndarray  # [values]: per-device bytes
    t: np.ndarray  # [ops]: roofline time
    comm_v: np.ndarray  # [values]: bandwidth seconds owed to each value
    # Every collective, for the latency: [5, n] kind, mesh axes, op, value, site; [n] V.
    coll_i: np.ndarray
    coll_v: np.ndarray
    delta: np.ndarray  # [ops + 2]: live-bytes timeline deltas
    # Resharded copies: [5, n] value, first and last reader, last forward and first backward
    # reader (`_Reshards.fwd_hi`, `bwd_lo`: remat splits a copy's life there); [n] bytes.
    res_i: np.ndarray
    res_bytes: np.ndarray
    # Uses reading a resharded copy (`Evaluator._reshard_reads`): [3, n] op, value, global
    # site; [n] extra bytes; and [ops] their sums per op (`Evaluator._read_extra`).
    read_i: np.ndarray
    read_bytes: np.ndarray
    read_extra: np.ndarray
    persistent: float  # bytes of the persistent values
    score: Score


@dataclass(slots=True)
class _Plan:
    """What changing a set of fine classes touches, whatever their new masks: the values whose
    collectives may move (with their restricted view and as a mask over values), the values
    whose local size may move, the ops whose time may move, and the live ranges of those
    values."""

    comm_vals: np.ndarray
    view: _SitesOf | None
    touched: np.ndarray  # [values] bool: comm_vals
    size_vals: np.ndarray
    size_vals_bytes: np.ndarray  # their global bytes
    size_logdeg: _Gathered  # rows `size_vals` of value_fine
    ops: np.ndarray
    op_share: _Gathered  # rows `ops` of op_work_fine
    op_bytes: _Gathered  # rows `ops` of op_values
    op_flops: np.ndarray  # of `ops`: flops, transcendentals, trip counts
    op_trans: np.ndarray
    op_trip: np.ndarray
    live_ids: np.ndarray
    born_dies: np.ndarray  # live_ids' births then deaths
    persistent: bool  # whether a persistent value may change size


class _SitesOf:
    """The evaluator seen through a subset of values: its collective sites restricted to those
    values, everything else (coefficients, layouts, memos of pure functions) shared. Lets the
    evaluator's own `_collective_arrays` and `_reshards` price a few values."""

    def __init__(self, ev: Evaluator, inc: _Tables, values: np.ndarray) -> None:
        if not hasattr(ev, "_site_static"):
            ev._combine_setup()
        # The evaluator's data attributes, found without `__getattr__` (pricing a view reads
        # dozens per call); the restricted ones below override theirs. (Only `_last_reshards`
        # is ever rebound on an evaluator, and a view keeps its own.)
        self.__dict__.update(vars(ev))
        self._ev = ev
        self.values = values
        self._last_reshards = None
        # The evaluator's tables of its own rows, not these.
        self.__dict__.pop("_scan_tab", None)
        self.__dict__.pop("_site_lists_memo", None)
        self._scalar_kept = SCALAR_KEPT_PER_VIEW
        red = inc.red_of.take(values)
        self.red_op, self.red_fine = ev.red_op[red], ev.red_fine[red]
        self.red_value, self.red_scan = ev.red_value[red], ev.red_scan[red]
        self.red_split = ev.red_split[red]
        self.red_arg_operand, self.red_arg_ratio = ev.red_arg_operand[red], ev.red_arg_ratio[red]
        self._red_site = ev._red_site[red]
        sites = inc.sites_of.take(values)
        self.site_ids = sites  # the evaluator's index of each of these sites
        self.site_vf, self.site_uf = ev.site_vf[sites], ev.site_uf[sites]
        self.site_value, self.site_op = ev.site_value[sites], ev.site_op[sites]
        self.site_hold = ev.site_hold[sites]
        rep, per = inc.rep_of.take(values), inc.per_of.take(values)
        self.rep, self._rep_site = ev.rep[rep], ev._rep_site[rep]
        self.rep_before = ev.rep_before[rep]
        self.rep_piece_fines = ev.rep_piece_fines[rep]
        self.rep_operand_fines = ev.rep_operand_fines[rep]
        self.per, self._per_site = ev.per[per], ev._per_site[per]
        cat = inc.cat_of.take(values)
        self.cat, self._cat_site = ev.cat[cat], ev._cat_site[cat]
        self.cat_operands = ev.cat_operands[cat]
        # Everything `_collective_arrays` and `_reshards` read of a state, for these values, is
        # the masks of these fine classes (`_Tables._comm_fines`): their results are memoized
        # by those masks, per search (`Incremental._comm_of`).
        self.fines = inc.value_comm_fines.cols(values)
        # What `_compute_reshards` reads of a state for these sites: the masks of these fine
        # classes (a subset of `fines`; its results are memoized by them, `Incremental._comm_of`).
        site_fines = np.union1d(self.site_vf.ravel(), self.site_uf.ravel())
        self.site_fines = site_fines[site_fines < ev.ana.n_fine]  # not the padding class

    def __getattr__(self, name):
        return getattr(self._ev, name)

    _collective_arrays = Evaluator._collective_arrays
    _replicate_collectives = Evaluator._replicate_collectives
    _arg_reduction_gathers = Evaluator._arg_reduction_gathers
    _whole_operand_halos = Evaluator._whole_operand_halos
    _concat_result_collectives = Evaluator._concat_result_collectives
    _reshards = Evaluator._reshards
    _compute_reshards = Evaluator._compute_reshards
    _scalar_reshards = Evaluator._scalar_reshards
    _numpy_reshards = Evaluator._numpy_reshards
    _site_lists = Evaluator._site_lists
    _scalar_memo = Evaluator._scalar_memo
    _scan_common = Evaluator._scan_common
    _scan_table = Evaluator._scan_table


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
        self.cat_of = _Groups(ev.cat[:, 1], n_values)
        lay = ev.lay
        n_fine = ev.ana.n_fine
        # [fine, values]: the values whose local size a fine class changes, and the values whose
        # collectives it can change (see the module essay).
        self.fine_values = _Rows(lay.value_fine.T)
        comm_fines = self._comm_fines(n_fine)
        self.fine_comm_values = _Rows(comm_fines.T)
        self.value_comm_fines = _Rows(comm_fines)
        self.fine_ops = _Rows(ev.op_work_fine.T)
        self.value_ops = _Rows(ev.op_values.T)  # [values, ops]: ops reading or writing
        self.value_fine, self.op_work_fine = _Rows(lay.value_fine), _Rows(ev.op_work_fine)
        self.op_values = _Rows(ev.op_values)
        self.live_pos = np.full(n_values, -1, dtype=np.int64)
        self.live_pos[ev.live_ids] = np.arange(len(ev.live_ids))
        self.is_persistent = np.zeros(n_values, dtype=bool)
        self.is_persistent[ev.persistent_ids] = True
        self.n_ops = n_ops
        self.full_limit = FULL_FRACTION * n_values
        # What a set of changed fine classes touches (`Incremental._plan`) and the restricted
        # views (`Incremental._view`): pure functions of the evaluator and their keys, so every
        # search on this evaluator shares them (a search meets the same units as the last one).
        self.plans: dict[bytes, _Plan | int] = {}  # a set too large: its number of values
        self.views: dict[bytes, _SitesOf] = {}
        self.lock = threading.Lock()

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
        # A partial sum reduce-scattered down a chain of size-1 reshapes (scatter_chain.py)
        # depends on the dims of the uses of every value of the chain.
        use_row = {key: i for i, key in enumerate(lay.use_keys)}
        uses = ev.ana.program.uses()
        use_fine = lay.use_fine.tocsr()
        for value, scan in zip(ev.red_value.tolist(), ev.red_scan.tolist()):
            for other in scan:
                if other < 0 or other == value:
                    continue
                for u in uses[other]:
                    fines = use_fine.indices[
                        use_fine.indptr[use_row[u]] : use_fine.indptr[use_row[u] + 1]
                    ]
                    rows.append(np.full(len(fines), value)), cols.append(fines)
        rows.append(ev.rep[:, 1]), cols.append(ev.rep[:, 2])
        rows.append(ev.per[:, 1]), cols.append(ev.per[:, 2])
        # A concatenate's result reshard follows its operand's mesh axes; a split / slice
        # piece's halos follow its result's (concat_slice.py).
        cat = ev.cat[ev.cat[:, 3] >= 0]
        rows.append(cat[:, 1]), cols.append(cat[:, 3])
        for value, pid in ev.rep[ev.rep[:, 5] >= 0][:, [1, 5]].tolist():
            for _, result_fine, *_ in ev.rep_pieces[pid]:
                rows.append([value]), cols.append([result_fine])
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
        self._comm_memos: dict[_SitesOf, dict[bytes, tuple]] = {}  # per view (`_comm_of`)
        self._reshard_memos: dict[_SitesOf, dict[bytes, object]] = {}  # per view (`_comm_of`)
        self._remats: dict[tuple, tuple] = {}
        self.full_evaluations = 0
        # Full evaluations by masks (FULLS_KEPT): one is a pure function of its masks (unlike a
        # delta, whose orders and sums follow its base), so a repeat gets the same arrays back.
        self._fulls: OrderedDict[bytes, _Cached] = OrderedDict()
        self.delta_evaluations = 0
        self.comm_hits = self.comm_misses = 0
        self._op_scratch = np.zeros(self.tab.n_ops, dtype=bool)  # all False between uses

    # -- public --------------------------------------------------------------------------------

    def score(self, masks: np.ndarray, parent: np.ndarray | None = None) -> Score:
        """The score of `masks`, from the cached evaluation of `parent` (masks) when given and
        cached, else of the nearest cached state, else in full."""
        return self._entry(masks, parent).score

    def score_remat(
        self, masks: np.ndarray, remat: tuple, parent: np.ndarray | None = None
    ) -> Score:
        """`Evaluator.score(masks, remat)`: the sharding priced as `score` prices it (from a
        cached state), then remat's recomputed work, its collectives run again and the split
        lifetimes on top of that evaluation's arrays, as `Evaluator.score` adds them. A state
        far from every cached one is priced by `Evaluator.score` at once (cheaper than a full
        evaluation kept for deltas: such a state, a rollout's end, is seldom a parent)."""
        if not remat:
            return self._entry(masks, parent).score
        ev = self.ev
        entry = self._entry(masks, parent, full=False)
        if entry is None:
            self.full_evaluations += 1
            return ev.score(masks, remat)
        eff, twice, lived = self._remat_of(remat)
        compute_s = entry.score.compute_s
        if len(eff.twice_ops):
            compute_s += float(entry.t[eff.twice_ops].sum())
        comm_s = entry.score.comm_s
        again = twice[entry.coll_i[2]]
        if again.any():
            kinds, ms, ops, _, sites = entry.coll_i[:, again]
            vs = entry.coll_v[again]
            bandwidth_s = float((ev.c1[kinds, ms] * vs * ev.site_trip[sites]).sum())
            comm_s += bandwidth_s + ev.latency_s(kinds, ms, vs, ops, sites)
        delta = entry.delta.copy()
        res_i = entry.res_i
        if res_i.shape[1]:  # a copy read by a remat'd block and by the backward: made twice
            split = ev._remat_block_ops(remat)[res_i[1]] & (res_i[3] >= 0)
            split &= res_i[4] > res_i[3] + 1
            if split.any():
                np.add.at(delta, res_i[3, split] + 1, -entry.res_bytes[split])
                np.add.at(delta, res_i[4, split], entry.res_bytes[split])
        held = entry.value_local * ev._in_memory
        shorten_lifetimes(delta, held, lived)
        hold_barrier_inputs(delta, entry.value_local, eff, ev._is_fused, ev._producer)
        if len(eff.values):
            vals, new, old = ev._remat_liveness(eff)
            np.add.at(delta, new + 1, -held[vals])
            np.add.at(delta, old + 1, held[vals])
        timeline = np.add.accumulate(delta[: self.tab.n_ops])  # `np.cumsum`, minus its wrapper
        peak = entry.persistent + (float(timeline.max()) if len(timeline) else 0.0)
        step = compute_s + (1.0 - ev.overlap) * comm_s
        return Score(step, compute_s, comm_s, peak, peak <= ev.capacity_bytes)

    # -- internals -----------------------------------------------------------------------------

    def _remat_of(self, remat: tuple):
        """(the `RematEffect` of remat policies, [ops] whether each op runs twice, the effect
        with its extensions after their values' own lives as `Evaluator._memory` takes it),
        memoized."""
        hit = self._remats.get(remat)
        if hit is None:
            eff = remat_effect(self.ev.remat, remat)
            twice = np.zeros(self.tab.n_ops, dtype=bool)
            twice[eff.twice_ops] = True
            hit = self._remats[remat] = (eff, twice, self.ev._after_own_life(eff))
        return hit

    def _entry(
        self, masks: np.ndarray, parent: np.ndarray | None, full: bool = True
    ) -> _Cached | None:
        """The cached evaluation of `masks` (`score`), made and cached when missing; None when
        that takes a full evaluation and `full` is False."""
        key = masks.tobytes()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        base = None
        if parent is not None:
            base = self._cache.get(parent.tobytes())
        if base is None:
            base = self._nearest(masks)
        entry = None
        if base is not None:
            entry = self._delta(base, masks)
        if entry is None:
            if not full:
                return None
            entry = self._full(masks)
        self._cache[key] = entry
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return entry

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
        key = masks.tobytes()
        hit = self._fulls.get(key)
        if hit is not None:
            self._fulls.move_to_end(key)
            return hit
        entry = self._evaluate_full(masks)
        self._fulls[key] = entry
        if len(self._fulls) > FULLS_KEPT:
            self._fulls.popitem(last=False)
        return entry

    def _evaluate_full(self, masks: np.ndarray) -> _Cached:
        self.full_evaluations += 1
        ev = self.ev
        fine_logdeg, value_local, op_logdeg = ev._local(masks)
        r = ev._reshards(masks)
        read_op, read_value, read_site, read_bytes = ev._reshard_reads(r, value_local)
        read_extra = np.bincount(read_op, weights=read_bytes, minlength=self.tab.n_ops)
        _, _, _, t = ev._compute(value_local, op_logdeg, read_extra)
        comm_v, (coll_i, coll_v) = self._comm_per_value(ev, masks, value_local)
        b = value_local[ev.live_ids]
        res_bytes = value_local[r.value] * r.buffer
        delta = _added(
            self.tab.n_ops + 2, [ev.born, ev.dies, r.lo, r.hi + 1], [b, -b, res_bytes, -res_bytes]
        )
        res_i = np.array([r.value, r.lo, r.hi, r.fwd_hi, r.bwd_lo])
        persistent = float(value_local[ev.persistent_ids].sum())
        return self._finish(
            masks,
            fine_logdeg,
            value_local,
            t,
            comm_v,
            coll_i,
            coll_v,
            delta,
            res_i,
            res_bytes,
            np.array([read_op, read_value, read_site]),
            read_bytes,
            read_extra,
            persistent,
        )

    def _comm_per_value(self, view, masks, value_local):
        """(bandwidth seconds per value, the collectives as arrays: [5, n] kind, mesh axes, op,
        value, site and [n] V). Bandwidth adds up over values; latency is paid once per combined
        op, so it is priced over all collectives."""
        ev = self.ev
        kinds, ms, vs, ops, vals, sites = view._collective_arrays(masks, value_local)
        times = ev.c1[kinds, ms] * vs * ev.site_trip[sites]
        out = np.bincount(vals, weights=times, minlength=self.tab.n_values)
        return out.astype(np.float64, copy=False), (np.array([kinds, ms, ops, vals, sites]), vs)

    def _delta(self, base: _Cached, masks: np.ndarray) -> _Cached | None:
        ev = self.ev
        changed = (base.masks != masks).nonzero()[0]
        if not len(changed):
            return base
        plan = self._plan(changed)
        if plan is None:
            return None
        self.delta_evaluations += 1
        fine_logdeg = base.fine_logdeg.copy()
        fine_logdeg[changed] = ev._fine_logdeg(masks[changed])
        # Local sizes, then the roofline time of every op that may move (an op whose inputs
        # kept their sizes gets its old time again: same formula, same order).
        value_local = base.value_local.copy()
        if len(plan.size_vals):
            logdeg = plan.size_logdeg.matvec(fine_logdeg)
            value_local[plan.size_vals] = plan.size_vals_bytes * np.exp2(-logdeg)
        # Communication of the values it may move (collectives scale with local sizes too);
        # the timeline's changes are gathered (index, bytes) and added in one pass, in the
        # order they were listed.
        comm_v, coll_i, coll_v = base.comm_v, base.coll_i, base.coll_v
        res_i, res_bytes = base.res_i, base.res_bytes
        read_i, read_bytes, read_extra = base.read_i, base.read_bytes, base.read_extra
        reread = None  # ops whose reads of resharded copies changed
        at, add = [], []
        comm_vals = plan.comm_vals
        if len(comm_vals):
            moved, new_i, new_v, r_i, new_bytes, new_read_i, new_read_bytes = self._comm_of(
                plan.view, masks, value_local
            )
            comm_v = comm_v.copy()
            comm_v[comm_vals] = moved + 0.0  # as `= 0.0` then `+= moved` (distinct values)
            stay = ~plan.touched[coll_i[3]]
            coll_i = np.concatenate([coll_i[:, stay], new_i], axis=1)
            coll_v = np.concatenate([coll_v[stay], new_v])
            # Resharded copies of those values: out with the old, in with the new.
            old = plan.touched[res_i[0]]
            old_i, old_bytes = res_i[:, old], res_bytes[old]
            at += [old_i[1], old_i[2] + 1, r_i[1], r_i[2] + 1]
            add += [-old_bytes, old_bytes, new_bytes, -new_bytes]
            keep = ~old
            res_i = np.concatenate([res_i[:, keep], r_i], axis=1)
            res_bytes = np.concatenate([res_bytes[keep], new_bytes])
            # Uses reading those values' resharded copies read them at their new size.
            old = plan.touched[read_i[1]]
            if old.any() or new_read_i.shape[1]:
                ops = np.concatenate([read_i[0, old], new_read_i[0]])
                keep = ~old
                read_i = np.concatenate([read_i[:, keep], new_read_i], axis=1)
                read_bytes = np.concatenate([read_bytes[keep], new_read_bytes])
                read_extra, reread = self._reread(ops, read_i, read_bytes, read_extra)
        # The roofline time of every op that may move (an op whose inputs kept their sizes gets
        # its old time again: same formula, same order), and of the ops re-reading copies.
        t = base.t.copy()
        if len(plan.ops):
            t[plan.ops] = self._op_times(plan, value_local, fine_logdeg, read_extra)
        if reread is not None and len(reread):
            # Usually the plan's ops already (a reader of a value whose size or use changed).
            seen = self._op_scratch
            seen[plan.ops] = True
            reread = reread[~seen[reread]]
            seen[plan.ops] = False
            if len(reread):
                t[reread] = self._reread_times(reread, value_local, fine_logdeg, read_extra)
        # Live ranges of resized values (a value that kept its size adds 0).
        if len(plan.live_ids):
            change = value_local[plan.live_ids] - base.value_local[plan.live_ids]
            at.append(plan.born_dies)
            add += [change, -change]
        delta = base.delta.copy()
        if at:
            np.add.at(delta, np.concatenate(at), np.concatenate(add))
        persistent = base.persistent
        if plan.persistent:
            persistent = float(value_local[ev.persistent_ids].sum())
        return self._finish(
            masks,
            fine_logdeg,
            value_local,
            t,
            comm_v,
            coll_i,
            coll_v,
            delta,
            res_i,
            res_bytes,
            read_i,
            read_bytes,
            read_extra,
            persistent,
        )

    def _reread(self, ops, read_i, read_bytes, base_extra):
        """(bytes each op reads beyond its operands, the ops among `ops` whose such bytes
        changed) after the reads of resharded copies became `read_i` / `read_bytes`: the sums of
        `ops` are redone from their reads in site order, as `Evaluator._read_extra` sums them
        (so bit-identical: each op's reads added to 0.0 one by one, as `np.bincount` adds);
        every other op's reads are the parent's. A handful of reads (`SCALAR_READS`) are summed
        with Python floats, more with NumPy."""
        if read_i.shape[1] > SCALAR_READS:
            return self._reread_numpy(ops, read_i, read_bytes, base_extra)
        ops = sorted(set(ops.tolist()))
        wanted = set(ops)
        read_op, _, read_site = read_i.tolist()
        sel = [j for j, op in enumerate(read_op) if op in wanted]
        sel.sort(key=read_site.__getitem__)  # stable: equal sites keep their order
        nbytes = read_bytes.tolist()
        sums = dict.fromkeys(ops, 0.0)
        for j in sel:
            sums[read_op[j]] += nbytes[j]
        extra = base_extra.copy()
        old = base_extra[ops].tolist() if ops else []
        changed = []
        for op, before in zip(ops, old):
            now = sums[op]
            extra[op] = now
            if now != before:
                changed.append(op)
        return extra, np.array(changed, dtype=np.int64)

    def _reread_numpy(self, ops, read_i, read_bytes, base_extra):
        """`_reread` for many reads, in NumPy calls."""
        hit = self._op_scratch
        hit[ops] = True
        sel = hit[read_i[0]].nonzero()[0]
        hit[ops] = False
        ops = np.unique(ops)
        sel = sel[np.argsort(read_i[2, sel], kind="stable")]
        sums = np.bincount(read_i[0, sel], weights=read_bytes[sel], minlength=self.tab.n_ops)
        extra = base_extra.copy()
        extra[ops] = sums[ops]
        return extra, ops[extra[ops] != base_extra[ops]]

    def _reread_times(self, ops, value_local, fine_logdeg, read_extra) -> np.ndarray:
        """`Evaluator._compute`'s roofline time of `ops` (same formula, same order)."""
        ev, tab = self.ev, self.tab
        share = np.exp2(-tab.op_work_fine.matvec(ops, fine_logdeg))
        flops_local, trans_local = ev.op_flops[ops] * share, ev.op_trans[ops] * share
        bytes_local = (tab.op_values.matvec(ops, value_local) + read_extra[ops]) * ev.trip[ops]
        return ev._roofline(flops_local, trans_local, bytes_local)

    def _plan(self, changed: np.ndarray) -> _Plan | None:
        """What a delta touches when the fine classes `changed` change, whatever their masks
        (memoized: a search changes the same units again and again); None when that is too
        much for a delta (more than `full_limit` values to re-price: such a set is remembered by
        its size only, so a caller that raises the limit gets its plan made)."""
        key = changed.tobytes()
        tab = self.tab
        plan = tab.plans.get(key)
        if plan is not None:
            n = len(plan.comm_vals) if isinstance(plan, _Plan) else plan
            if n > tab.full_limit:
                return None
            if isinstance(plan, _Plan):
                return plan
        comm_vals = tab.fine_comm_values.cols(changed)
        plan = self._make_plan(changed, comm_vals) if len(comm_vals) <= tab.full_limit else None
        with tab.lock:
            if len(tab.plans) >= PLANS_KEPT:
                tab.plans.pop(next(iter(tab.plans)))
            tab.plans[key] = len(comm_vals) if plan is None else plan
        return plan

    def _make_plan(self, changed: np.ndarray, comm_vals: np.ndarray) -> _Plan:
        """The `_Plan` of `changed`, whose collectives may move on the values `comm_vals`."""
        tab, ev = self.tab, self.ev
        size_vals = tab.fine_values.cols(changed)
        ops = tab.fine_ops.cols(changed)
        if len(size_vals):
            ops = np.union1d(ops, tab.value_ops.cols(size_vals))
        touched = np.zeros(tab.n_values, dtype=bool)
        touched[comm_vals] = True
        pos = tab.live_pos[size_vals]
        pos = pos[pos >= 0]
        view = self._view(comm_vals) if len(comm_vals) else None
        return _Plan(
            comm_vals,
            view,
            touched,
            size_vals,
            ev.nbytes[size_vals],
            tab.value_fine.gather(size_vals),
            ops,
            tab.op_work_fine.gather(ops),
            tab.op_values.gather(ops),
            ev.op_flops[ops],
            ev.op_trans[ops],
            ev.trip[ops],
            ev.live_ids[pos],
            np.concatenate([ev.born[pos], ev.dies[pos]]),
            bool(tab.is_persistent[size_vals].any()),
        )

    def _comm_of(self, view: _SitesOf, masks: np.ndarray, value_local: np.ndarray) -> tuple:
        """The communication of `values` under `masks`: (bandwidth seconds of each value, their
        collectives, their resharded copies as value, first and last reader, bytes, the uses
        reading those copies as op, value, global site, extra bytes). Memoized per
        set of values by the masks of the fine classes it reads (the values' local sizes are a
        function of those too): a greedy descent tries the same units from states that differ
        elsewhere, and a rollout meets the same neighbourhoods again."""
        key = masks[view.fines].tobytes()
        memo = _memo_of(self._comm_memos, view)
        hit = memo.get(key)
        if hit is None:
            fast = scalar_view(view)
            hit = fast.price(masks, value_local) if fast is not None else None
            if hit is None:
                hit = self._price_view(view, masks, value_local)
            if len(memo) >= COMM_KEPT:
                memo.pop(next(iter(memo)))
            memo[key] = hit
            self.comm_misses += 1
        else:
            self.comm_hits += 1
        return hit

    def _price_view(self, view: _SitesOf, masks: np.ndarray, value_local: np.ndarray) -> tuple:
        """`_comm_of`'s result by the evaluator's own NumPy pricing run on the view (what
        `view_comm.ScalarView` reproduces for the common view)."""
        # The reshards read fewer fine classes than the rest (`_SitesOf.site_fines`): a
        # state that moved only a reduction's or a size's classes finds them here, and
        # hands them to the view's one-entry memo, which its `_collective_arrays` reads.
        site_key = masks[view.site_fines].tobytes()
        r_memo = _memo_of(self._reshard_memos, view)
        r = r_memo.get(site_key)
        if r is not None:
            view._last_reshards = (masks.tobytes(), r)
        moved, (new_i, new_v) = self._comm_per_value(view, masks, value_local)
        if r is None:
            r = view._reshards(masks)
            if len(r_memo) >= COMM_KEPT:
                r_memo.pop(next(iter(r_memo)))
            r_memo[site_key] = r
        r_i = np.array([r.value, r.lo, r.hi, r.fwd_hi, r.bwd_lo])
        read_op, read_value, read_site, read_bytes = self.ev._reshard_reads(r, value_local)
        read_i = np.array([read_op, read_value, view.site_ids[read_site]])
        res_bytes = value_local[r.value] * r.buffer
        return (moved[view.values], new_i, new_v, r_i, res_bytes, read_i, read_bytes)

    def _view(self, values: np.ndarray) -> _SitesOf:
        """The evaluator restricted to `values` (memoized: a search shards the same units again
        and again, so the same sets of values come back)."""
        key = values.tobytes()
        views = self.tab.views
        view = views.get(key)
        if view is None:
            view = _SitesOf(self.ev, self.tab, values)
            with self.tab.lock:
                if len(views) >= VIEWS_KEPT:
                    views.pop(next(iter(views)))
                views[key] = view
        return view

    def _op_times(self, plan: _Plan, value_local, fine_logdeg, read_extra) -> np.ndarray:
        """`Evaluator._compute`'s roofline time, for the plan's ops (same formula, same order)."""
        share = np.exp2(-plan.op_share.matvec(fine_logdeg))
        flops_local, trans_local = plan.op_flops * share, plan.op_trans * share
        bytes_local = (plan.op_bytes.matvec(value_local) + read_extra[plan.ops]) * plan.op_trip
        return self.ev._roofline(flops_local, trans_local, bytes_local)

    def _finish(self, masks, *state) -> _Cached:
        """The cached state and its score; `state` is `_Cached`'s fields after `masks`, in order,
        up to `persistent`."""
        ev = self.ev
        _, _, t, comm_v, coll_i, coll_v, delta, *_, persistent = state
        compute_s = float(t.sum())
        kinds, ms, ops, _, sites = coll_i
        comm_s = float(comm_v.sum()) + ev.latency_s(kinds, ms, coll_v, ops, sites)
        timeline = np.add.accumulate(delta[: self.tab.n_ops])  # `np.cumsum`, minus its wrapper
        peak = persistent + (float(timeline.max()) if len(timeline) else 0.0)
        step = compute_s + (1.0 - ev.overlap) * comm_s
        score = Score(step, compute_s, comm_s, peak, peak <= ev.capacity_bytes)
        return _Cached(masks.copy(), *state, score)


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
        return hit.nonzero()[0]

    def gather(self, rows: np.ndarray) -> _Gathered:
        """Rows `rows`, laid out for repeated mat-vecs (`_Gathered.matvec`)."""
        pos, n = self._positions(rows)
        owner = np.repeat(np.arange(len(rows)), n)
        return _Gathered(owner, self.data[pos], self.indices[pos], len(rows))

    def matvec(self, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        """`(M @ x)[rows]`, summed in the order scipy's CSR mat-vec sums (so bit-identical)."""
        pos, n = self._positions(rows)
        owner = np.repeat(np.arange(len(rows)), n)
        return np.bincount(
            owner, weights=self.data[pos] * x[self.indices[pos]], minlength=len(rows)
        )


@dataclass(slots=True)
class _Gathered:
    """Some rows of a `_Rows` matrix, flattened: `matvec(x)` is `_Rows.matvec(rows, x)` (the
    same products summed in the same order) in three numpy calls."""

    owner: np.ndarray
    data: np.ndarray
    indices: np.ndarray
    n_rows: int

    def matvec(self, x: np.ndarray) -> np.ndarray:
        return np.bincount(self.owner, weights=self.data * x[self.indices], minlength=self.n_rows)


def _memo_of(memos: dict, view) -> dict:
    """`view`'s memo in `memos`, made on first need; the oldest view's is dropped beyond
    `VIEWS_KEPT` views (a search moves on to other neighbourhoods)."""
    memo = memos.get(view)
    if memo is None:
        if len(memos) >= VIEWS_KEPT:
            memos.pop(next(iter(memos)))
        memo = memos[view] = {}
    return memo
