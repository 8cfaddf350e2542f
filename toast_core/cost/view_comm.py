"""Scalar pricing of a restricted view's communication: the incremental evaluator's hot path.

A search step re-prices the collectives of a few values (`incremental._SitesOf`: on GPT-2 small
about 12 reshard sites and 8 reduction rows). `Evaluator._collective_arrays` and
`_compute_reshards` price them with some hundred NumPy calls on arrays of that length, so the
calls' overhead is nearly all the time. `ScalarView` prices the same view with Python ints and
floats over tables built once per view: the same bits, the same arithmetic in the same order
(IEEE products and sums of Python floats are NumPy's float64 ones), the same listing order, so
its arrays are the NumPy path's bit for bit (tests/test_view_comm.py holds it to that).

It covers the common view, whose values have reduction rows and reshard sites only; a view
with replicate, permute or concatenate rows, or a reduction read by a split alone
(`red_split`), has no `ScalarView` (`scalar_view` returns None). A state in which some site
needs XLA's permuting reshard (an "odd" site, `Evaluator._exact_reshard`) is priced by the
NumPy path too (`price` returns None): those layouts are rare and their memo lives there.

Worked example: sharding an MLP weight's output dim on `model` re-prices its value's
reduction row (an all-reduce over `model` of the matmul's partial sum when the contracting dim is
sharded) and the reshard sites of its uses: per site a handful of integer ORs decide whether the
value is gathered (a mesh axis the value holds and the use does not) or moved (an all-to-all).
"""

from __future__ import annotations

import numpy as np

from toast_core.cost.model import A2A, AG, AR, RS

#: Reshard keys as `Evaluator._compute_reshards` builds them: value, gathered axes, moved axes.
_VALUE_SHIFT, _GATHER_SHIFT = 20, 8


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

    def price(self, masks: np.ndarray, value_local: np.ndarray) -> tuple | None:
        """`Incremental._comm_of`'s result for this view under `masks`: (bandwidth seconds of
        each view value, collectives [5, n] and their V, resharded copies [5, n] and their
        bytes, reads of those copies [3, n] and their extra bytes); None when a site needs the
        NumPy path (an odd reshard)."""
        mk = masks[self.fines].tolist()
        vl = value_local[self.values].tolist()
        real, ways = self.real, self.ways
        # Reshards first (they may send the view to the NumPy path): per active site its key
        # and gathers per dim.
        n_bits = self.n_bits
        active = []
        for s, site in enumerate(self.sites):
            dims = site[0]
            vms, ums = [], []
            diff = 0
            for vd, ud in dims:
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
            hv = hu = same = 0
            for vm, um in zip(vms, ums):
                hv |= vm
                hu |= um
                same |= vm & um
            for vm, um in zip(vms, ums):
                if (vm & ~um & real) and (um & ~vm & real):
                    return None
                if (vm ^ um) & real and (n_bits[vm & real] > 1 or n_bits[um & real] > 1):
                    return None
            gather = hv & ~hu & real
            moved = hv & hu & ~same & real
            if not (gather | moved):
                continue
            key = (site[1] << _VALUE_SHIFT) | (gather << _GATHER_SHIFT) | moved
            active.append((key, s, [vm & ~um & real & ~hu for vm, um in zip(vms, ums)], moved))
        # Reduction rows: an all-reduce, or a reduce-scatter over the axes every consumer down
        # the row's chain shards on (`Evaluator._scan_common`).
        kinds, ms, vs, ops, vals, sites, trips = [], [], [], [], [], [], []
        scatters = []
        for row in self.rows:
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
            scatters.append(scatter)
            ms.append((m & ~scatter) & real)
            kinds.append(AR)
            _, o, v, vp, site, trip, _ = row
            vs.append(vl[vp])
            ops.append(o)
            vals.append(v)
            sites.append(site)
            trips.append(trip)
        n_red = len(kinds)
        for k in range(n_red):
            kinds.append(RS)
            ms.append(scatters[k] & real)
            vs.append(vs[k])
            ops.append(ops[k])
            vals.append(vals[k])
            sites.append(sites[k])
            trips.append(trips[k])
        # Distinct reshards in key order, each with its readers' span.
        groups: dict[int, list] = {}
        for key, s, gathered, moved in active:
            site = self.sites[s]
            op, hold = site[3], site[4]
            g = groups.get(key)
            if g is None:
                # first site, lo, hi, last forward reader, first backward reader
                g = groups[key] = [s, op, op, -1, self.n_ops, gathered, moved]
            else:
                g[1] = min(g[1], op)
                g[2] = max(g[2], op)
            g[2] = max(g[2], hold)
            if site[5]:
                g[4] = min(g[4], op)
            else:
                g[3] = max(g[3], op)
        order = sorted(groups)
        of_key = {key: j for j, key in enumerate(order)}
        r_value, r_lo, r_hi, r_fwd, r_bwd, buffers, res_bytes = [], [], [], [], [], [], []
        for key in order:
            first, lo, hi, fwd, bwd, gathered, moved = groups[key]
            site = self.sites[first]
            v, vp, op, use_site, trip = site[1], site[2], site[3], site[6], site[7]
            local = vl[vp]
            grown = 1.0
            for g in reversed(gathered):
                grown = grown * ways[g]
                if g:
                    kinds.append(AG)
                    ms.append(g & real)
                    vs.append(local * grown)
                    ops.append(op)
                    vals.append(v)
                    sites.append(use_site)
                    trips.append(trip)
            if moved:
                kinds.append(A2A)
                ms.append(moved & real)
                vs.append(local * (grown * ways[moved]))
                ops.append(op)
                vals.append(v)
                sites.append(use_site)
                trips.append(trip)
            r_value.append(v)
            r_lo.append(lo)
            r_hi.append(hi)
            r_fwd.append(fwd)
            r_bwd.append(bwd)
            buffers.append(grown)
            res_bytes.append(local * grown)
        # Reads of the resharded copies, in site order (`Evaluator._reshard_reads`).
        read_op, read_value, read_site, read_bytes = [], [], [], []
        for key, s, _, _ in active:
            grown = buffers[of_key[key]] - 1.0
            site = self.sites[s]
            if grown > 0 and site[8]:
                read_op.append(site[3])
                read_value.append(site[1])
                read_site.append(self.site_ids[s])
                read_bytes.append(vl[site[2]] * grown)
        # The collectives that move data, and each view value's bandwidth seconds.
        c1 = self.c1
        per_value: dict[int, float] = {}
        keep = []
        for i, (k, m, v) in enumerate(zip(kinds, ms, vs)):
            if m and v > 0:
                keep.append(i)
                per_value[vals[i]] = per_value.get(vals[i], 0.0) + c1[k][m] * v * trips[i]
        moved_s = [per_value.get(v, 0.0) for v in self.view_values]
        new_i = np.array(
            [
                [kinds[i] for i in keep],
                [ms[i] for i in keep],
                [ops[i] for i in keep],
                [vals[i] for i in keep],
                [sites[i] for i in keep],
            ],
            dtype=np.int64,
        ).reshape(5, len(keep))
        return (
            np.array(moved_s, dtype=np.float64),
            new_i,
            np.array([vs[i] for i in keep], dtype=np.float64),
            np.array([r_value, r_lo, r_hi, r_fwd, r_bwd], dtype=np.int64).reshape(5, len(order)),
            np.array(res_bytes, dtype=np.float64),
            np.array([read_op, read_value, read_site], dtype=np.int64).reshape(3, len(read_op)),
            np.array(read_bytes, dtype=np.float64),
        )


def scalar_view(view) -> ScalarView | None:
    """The `ScalarView` of a restricted view (built once, kept on it), or None when the view has
    rows it does not cover (see the module essay)."""
    hit = view.__dict__.get("_scalar")
    if hit is None:
        covered = (
            not len(view.rep)
            and not len(view.per)
            and not len(view.cat)
            and not (view.red_split[:, 0] >= 0).any()
        )
        hit = ScalarView(view) if covered else False
        view.__dict__["_scalar"] = hit
    return hit or None
