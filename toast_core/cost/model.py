"""The analytic cost model: compute, communication and per-device memory of a strategy.

Given a strategy, every atom's sharding follows from its named dim's mesh axes, every op's
per-device shapes follow, and every cut and every sharded reduction implies a collective:

* **Compute** per op (roofline): `max(flops_local / (peak_flops_per_s * efficiency),
  bytes_local / hbm_bytes_per_s)`, where an op's work is divided by the shard counts of the factors
  it computes over (not those it must replicate), and bytes are the local operands and results.
* **Sharded reductions**: a reduction factor on mesh axes R leaves each result partial over R: an
  all-reduce of the local result, or a reduce-scatter when every consumer (across a cut) wants a dim
  sharded on that axis (FSDP's gradients).
* **Cuts** (and reshape conflicts): at a cut use the value is resharded to what the consumer wants;
  per mesh axis: held by the value and not the use -> all-gather; moved to another dim ->
  all-to-all; only the use -> a local slice (free).
* **Replicate factors** on sharded dims force an all-gather of the operand; **permute** factors a
  collective-permute of a one-row halo.
* Collective times use the ring alpha-beta model of `collectives.py`, composed per mesh axis. They
  are linear in bytes for given mesh axes, so the evaluator precomputes `t = c0 + c1 * V` per kind
  and axis set.
* **Memory** per device: all inputs (parameters, optimizer state, data) at their per-device size,
  plus the peak over program order of live intermediates (outputs live to the end; with
  `donate_outputs`, an output that replaces a same-shaped persistent input reuses its buffer).
* **Step time** = compute + (1 - overlap) x communication. Ideal time = total flops /
  (devices x peak); efficiency = ideal / step time.

Worked example: `relu(x @ w1) @ w2` with the hidden dim F on `model` (Megatron) and the batch on
`data`: both matmuls divide their work by 8, the second contracts F so its result is partial over
`model`: one all-reduce of y's local [B/2, O] buffer over `model` per step - the only collective.

`Evaluator.score` is the fast path the search calls (a few sparse mat-vecs); `Evaluator.report`
recomputes the same numbers with attribution (`CostReport`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from toast_core.analysis import Analysis
from toast_core.cost.collectives import COLLECTIVE_KINDS, collective_time_s
from toast_core.cost.flops import op_flops
from toast_core.mesh import HardwareSpec, MeshSpec
from toast_core.strategy.layout import axis_bits, layout
from toast_core.strategy.strategy import Strategy

KIND_INDEX = {k: i for i, k in enumerate(COLLECTIVE_KINDS)}
AG, AR, A2A, CP, RS = (
    KIND_INDEX["all-gather"],
    KIND_INDEX["all-reduce"],
    KIND_INDEX["all-to-all"],
    KIND_INDEX["collective-permute"],
    KIND_INDEX["reduce-scatter"],
)


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective implied by a strategy, attributed to the op and value that cause it."""

    kind: str
    mesh_axes: tuple[str, ...]
    bytes: float  # V: the full buffer on those axes (see collectives.py)
    result_bytes: float  # per-device result size, as XLA's HLO reports it
    time_s: float
    op: int
    value: int
    direction: str  # "forward" | "backward"
    cause: str
    count: int = 1  # executions per step (scan trip count)


@dataclass(frozen=True, slots=True)
class OpCost:
    op: int
    primitive: str
    flops: float  # per device, all executions
    bytes: float
    time_s: float


@dataclass(frozen=True)
class CostReport:
    """Every number attributable: per-op compute, each collective, the memory timeline."""

    step_time_s: float
    compute_s: float
    comm_s: float
    peak_bytes: float
    capacity_bytes: float
    fits: bool
    ideal_s: float
    efficiency: float
    flops_per_device: float
    total_flops: float
    persistent_bytes: float
    collectives: tuple[Collective, ...] = ()
    op_costs: tuple[OpCost, ...] = field(default=(), repr=False)
    memory_timeline: tuple[float, ...] = field(default=(), repr=False)
    peak_op: int = -1

    def collective_bytes_by_kind(self, result: bool = True) -> dict[str, float]:
        """Bytes per device by kind (result sizes as in HLO by default, else V)."""
        out = {k: 0.0 for k in COLLECTIVE_KINDS}
        for c in self.collectives:
            out[c.kind] += (c.result_bytes if result else c.bytes) * c.count
        return out

    def comm_s_by_kind(self) -> dict[str, float]:
        out = {k: 0.0 for k in COLLECTIVE_KINDS}
        for c in self.collectives:
            out[c.kind] += c.time_s * c.count
        return out

    def to_dict(self) -> dict:
        return {
            "step_time_s": self.step_time_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "peak_bytes": self.peak_bytes,
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "ideal_s": self.ideal_s,
            "efficiency": self.efficiency,
            "flops_per_device": self.flops_per_device,
            "comm_bytes_by_kind": self.collective_bytes_by_kind(),
        }


@dataclass(frozen=True, slots=True)
class Score:
    """The fast-path result the search uses."""

    step_time_s: float
    compute_s: float
    comm_s: float
    peak_bytes: float
    fits: bool


class Evaluator:
    """Compiled cost model for one (analysis, mesh, hardware); strategies as fine-class masks."""

    def __init__(
        self,
        ana: Analysis,
        mesh: MeshSpec,
        hw: HardwareSpec,
        *,
        overlap: float = 0.0,
        donate_outputs: bool = True,
        memory_headroom: float = 0.1,
    ) -> None:
        self.ana, self.mesh, self.hw = ana, mesh, hw
        self.overlap = float(overlap)
        self._donate = bool(donate_outputs)
        self.capacity_bytes = hw.hbm_capacity_bytes * (1.0 - memory_headroom)
        prog = ana.program
        lay = layout(ana)
        self.lay = lay
        self.n_axes = len(mesh.axis_names)
        self.log2n = np.log2(np.asarray(mesh.axis_sizes, dtype=np.float64))
        self._collective_coefficients()

        n_ops = len(prog.ops)
        self.trip = np.array([op.trip_count for op in prog.ops], dtype=np.float64)
        self.op_flops = np.array([op_flops(op, prog) for op in prog.ops]) * self.trip
        self.total_flops = float(self.op_flops.sum())
        self.nbytes = np.array([v.nbytes for v in prog.values], dtype=np.float64)
        rows = [list(op.operands) + list(op.results) for op in prog.ops]
        indptr = np.zeros(n_ops + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        idx = np.fromiter((v for r in rows for v in r), dtype=np.int64, count=int(indptr[-1]))
        self.op_values = sp.csr_matrix(
            (np.ones(len(idx)), idx, indptr), shape=(n_ops, len(prog.values))
        )
        self.peak_flops = hw.peak_flops_per_s * hw.flops_efficiency
        self.direction = [
            "backward" if "transpose(" in op.name_stack else "forward" for op in prog.ops
        ]
        self._reduction_sites()
        self._reshard_sites()
        self._replicate_and_permute_sites()
        self._liveness()

    # -- precomputation -------------------------------------------------------------------------

    def _collective_coefficients(self) -> None:
        """t(kind, axes, V) = c0 + c1 * V for V > 0, for every subset of mesh axes (a bitmask)."""
        n_masks = 1 << self.n_axes
        self.c0 = np.zeros((len(COLLECTIVE_KINDS), n_masks))
        self.c1 = np.zeros((len(COLLECTIVE_KINDS), n_masks))
        self.mask_ways = np.ones(n_masks)
        for m in range(1, n_masks):
            axes = self.mask_axes(m)
            self.mask_ways[m] = float(np.prod([self.mesh.size(a) for a in axes]))
            for kind, k in KIND_INDEX.items():
                t1 = collective_time_s(kind, 1e6, axes, self.mesh, self.hw)
                t2 = collective_time_s(kind, 2e6, axes, self.mesh, self.hw)
                self.c1[k, m] = (t2 - t1) / 1e6
                self.c0[k, m] = t1 - self.c1[k, m] * 1e6

    def mask_axes(self, mask: int) -> tuple[str, ...]:
        return tuple(a for i, a in enumerate(self.mesh.axis_names) if mask >> i & 1)

    def _reduction_sites(self) -> None:
        ana, prog = self.ana, self.ana.program
        fine = ana.fine_of_atom
        uses = prog.uses()
        candidate = set(ana.candidate_edges.tolist())
        cand_uses = {(ana.medges[e].op, ana.medges[e].position) for e in candidate}
        red_op, red_fine, red_value, red_rs = [], [], [], []
        for op in prog.ops:
            for a in ana.nda.op_atoms[op.index]:
                if ana.nda.atom_kind[a] != "reduction":
                    continue
                for vid in op.results:
                    red_op.append(op.index)
                    red_fine.append(int(fine[a]))
                    red_value.append(vid)
                    v = prog.values[vid]
                    all_cut = bool(uses[vid]) and not v.is_output
                    all_cut = all_cut and all(u in cand_uses for u in uses[vid])
                    red_rs.append(all_cut)
        self.red_op = np.array(red_op, dtype=np.int64)
        self.red_fine = np.array(red_fine, dtype=np.int64)
        self.red_value = np.array(red_value, dtype=np.int64)
        self.red_rs = np.array(red_rs, dtype=bool)

    def _reshard_sites(self) -> None:
        """Uses that a cut may reshard: (value, op, position), with their paired atoms."""
        ana = self.ana
        fine = ana.fine_of_atom
        sites: dict[tuple[int, int, int], int] = {}
        pair_site, pair_vf, pair_uf = [], [], []
        for eid in ana.candidate_edges.tolist():
            e = ana.medges[eid]
            key = (e.value, e.op, e.position)
            s = sites.setdefault(key, len(sites))
            pair_site.append(s)
            pair_vf.append(int(fine[e.value_atom]))
            pair_uf.append(int(fine[e.use_atom]))
        self.forced_sites = []
        for vid, opi, pos, _ in ana.nda.reshape_sites:
            key = (vid, opi, pos)
            if key not in sites:
                sites[key] = len(sites)
            self.forced_sites.append(sites[key])
        self.sites = list(sites)
        self.pair_site = np.array(pair_site, dtype=np.int64)
        self.pair_vf = np.array(pair_vf, dtype=np.int64)
        self.pair_uf = np.array(pair_uf, dtype=np.int64)

    def _replicate_and_permute_sites(self) -> None:
        ana, prog = self.ana, self.ana.program
        fine = ana.fine_of_atom
        rep, per = [], []
        for (opi, pos), dims in ana.nda.use_atoms.items():
            vid = prog.ops[opi].operands[pos]
            for atoms in dims:
                for a in atoms:
                    kind = ana.nda.atom_kind[a]
                    if kind == "replicate":
                        rep.append((opi, vid, int(fine[a])))
                    elif kind == "permute":
                        per.append((opi, vid, int(fine[a]), int(ana.nda.atom_size[a])))
        self.rep = np.array(rep, dtype=np.int64).reshape(-1, 3)
        self.per = np.array(per, dtype=np.int64).reshape(-1, 4)

    def _liveness(self) -> None:
        prog = self.ana.program
        n_ops = len(prog.ops)
        producers = prog.producers()
        uses = prog.uses()
        persistent_in = {
            (v.name.split(".", 1)[-1], v.shape, v.dtype)
            for v in prog.values
            if v.id in set(prog.inputs) and v.is_persistent
        }
        born, dies, live_ids, persistent = [], [], [], []
        for v in prog.values:
            if producers[v.id] is None:
                if v.role in ("input", "parameter", "state", "constant"):
                    persistent.append(v.id)
                continue
            last = max((u[0] for u in uses[v.id]), default=producers[v.id])
            if v.is_output:
                key = (v.output_name.split(".", 1)[-1], v.shape, v.dtype)
                if self._donate and key in persistent_in:
                    continue
                last = n_ops - 1
            born.append(producers[v.id])
            dies.append(last)
            live_ids.append(v.id)
        self.live_ids = np.array(live_ids, dtype=np.int64)
        self.born = np.array(born, dtype=np.int64)
        self.dies = np.array(dies, dtype=np.int64) + 1
        self.persistent_ids = np.array(persistent, dtype=np.int64)
        self.n_ops = n_ops

    # -- evaluation -----------------------------------------------------------------------------

    def _local(self, masks: np.ndarray):
        bits = axis_bits(masks, self.n_axes)
        fine_logdeg = bits.T @ self.log2n
        value_local = self.nbytes * np.exp2(-(self.lay.value_fine @ fine_logdeg))
        op_logdeg = self.lay.op_work_fine @ fine_logdeg
        return fine_logdeg, value_local, op_logdeg

    def _compute(self, value_local, op_logdeg):
        flops_local = self.op_flops * np.exp2(-op_logdeg)
        bytes_local = (self.op_values @ value_local) * self.trip
        t = np.maximum(flops_local / self.peak_flops, bytes_local / self.hw.hbm_bytes_per_s)
        return flops_local, bytes_local, t

    def _memory(self, value_local):
        delta = np.zeros(self.n_ops + 2)
        b = value_local[self.live_ids]
        np.add.at(delta, self.born, b)
        np.add.at(delta, self.dies, -b)
        timeline = np.cumsum(delta)[: self.n_ops]
        persistent = float(value_local[self.persistent_ids].sum())
        return persistent, timeline

    def score(self, masks: np.ndarray) -> Score:
        """Fast path: step time and peak memory of a fine-class mask assignment."""
        _, value_local, op_logdeg = self._local(masks)
        _, _, t = self._compute(value_local, op_logdeg)
        compute_s = float(t.sum())
        comm_s = sum(c.time_s * c.count for c in self._collectives(masks, value_local, False))
        persistent, timeline = self._memory(value_local)
        peak = persistent + (float(timeline.max()) if len(timeline) else 0.0)
        step = compute_s + (1.0 - self.overlap) * comm_s
        return Score(step, compute_s, comm_s, peak, peak <= self.capacity_bytes)

    def report(self, strategy: Strategy, masks: np.ndarray | None = None) -> CostReport:
        """The attributable report of one strategy (validated first)."""
        if masks is None:
            masks = strategy.fine_masks(self.ana, self.mesh)
        _, value_local, op_logdeg = self._local(masks)
        flops_local, bytes_local, t = self._compute(value_local, op_logdeg)
        collectives = self._collectives(masks, value_local, True)
        comm_s = sum(c.time_s * c.count for c in collectives)
        compute_s = float(t.sum())
        persistent, timeline = self._memory(value_local)
        peak_i = int(np.argmax(timeline)) if len(timeline) else -1
        peak = persistent + (float(timeline[peak_i]) if len(timeline) else 0.0)
        step = compute_s + (1.0 - self.overlap) * comm_s
        ideal = self.total_flops / (self.mesh.n_devices * self.hw.peak_flops_per_s)
        prog = self.ana.program
        op_costs = tuple(
            OpCost(i, prog.ops[i].primitive, float(flops_local[i]), float(bytes_local[i]), float(t[i]))
            for i in range(len(prog.ops))
        )
        return CostReport(
            step_time_s=step,
            compute_s=compute_s,
            comm_s=comm_s,
            peak_bytes=peak,
            capacity_bytes=self.capacity_bytes,
            fits=peak <= self.capacity_bytes,
            ideal_s=ideal,
            efficiency=ideal / step if step > 0 else 1.0,
            flops_per_device=float(flops_local.sum()),
            total_flops=self.total_flops,
            persistent_bytes=persistent,
            collectives=tuple(collectives),
            op_costs=op_costs,
            memory_timeline=tuple((timeline + persistent).tolist()),
            peak_op=peak_i,
        )

    # -- collectives ----------------------------------------------------------------------------

    def _make(self, kind, mask, v_bytes, opi, vid, cause, detailed) -> Collective:
        k = KIND_INDEX[kind]
        time_s = float(self.c0[k, mask] + self.c1[k, mask] * v_bytes) if v_bytes > 0 else 0.0
        ways = self.mask_ways[mask]
        result = v_bytes / ways if kind in ("reduce-scatter", "all-to-all") else v_bytes
        count = int(self.trip[opi]) if opi >= 0 else 1
        if not detailed:
            return Collective(kind, (), v_bytes, result, time_s, opi, vid, "", "", count)
        return Collective(
            kind,
            self.mask_axes(mask),
            float(v_bytes),
            float(result),
            time_s,
            opi,
            vid,
            self.direction[opi] if opi >= 0 else "forward",
            cause,
            count,
        )

    def _collectives(self, masks, value_local, detailed: bool) -> list[Collective]:
        out: list[Collective] = []
        prog = self.ana.program
        # Sharded reductions -> all-reduce (or reduce-scatter into a sharded consumer).
        if len(self.red_fine):
            red_masks = masks[self.red_fine]
            for s in np.flatnonzero(red_masks).tolist():
                m = int(red_masks[s])
                opi, vid = int(self.red_op[s]), int(self.red_value[s])
                scatter = self._scatter_mask(vid, m, masks) if self.red_rs[s] else 0
                cause = ""
                if detailed:
                    cause = f"partial sum of {prog.values[vid].display()} from {prog.ops[opi].where()}"
                if scatter:
                    out.append(self._make("reduce-scatter", scatter, value_local[vid], opi, vid, cause, detailed))
                if m & ~scatter:
                    out.append(self._make("all-reduce", m & ~scatter, value_local[vid], opi, vid, cause, detailed))
        # Cuts and reshape conflicts -> reshard at the use.
        active = set(self.forced_sites)
        if len(self.pair_site):
            diff = masks[self.pair_vf] != masks[self.pair_uf]
            active.update(np.unique(self.pair_site[diff]).tolist())
        for s in sorted(active):
            out.extend(self._reshard(self.sites[s], masks, value_local, detailed))
        # Replicate factors on sharded dims -> all-gather of the operand.
        if len(self.rep):
            rm = masks[self.rep[:, 2]]
            for i in np.flatnonzero(rm).tolist():
                opi, vid, m = int(self.rep[i, 0]), int(self.rep[i, 1]), int(rm[i])
                cause = f"{prog.ops[opi].where()} needs {prog.values[vid].display()} whole" if detailed else ""
                out.append(self._make("all-gather", m, value_local[vid] * self.mask_ways[m], opi, vid, cause, detailed))
        # Permute factors on sharded dims -> halo exchange.
        if len(self.per):
            pm = masks[self.per[:, 2]]
            for i in np.flatnonzero(pm).tolist():
                opi, vid, size = (int(x) for x in self.per[i, [0, 1, 3]])
                m = int(pm[i])
                local_len = max(size / self.mask_ways[m], 1.0)
                halo = value_local[vid] / local_len
                cause = f"halo of {prog.values[vid].display()} at {prog.ops[opi].where()}" if detailed else ""
                out.append(self._make("collective-permute", m, halo, opi, vid, cause, detailed))
        return out

    def _scatter_mask(self, vid: int, mask: int, masks: np.ndarray) -> int:
        """Axes of `mask` that every use of `vid` shards some dim on (reduce-scatter them)."""
        lay = self.lay
        common = mask
        for opi, pos in self.ana.program.uses()[vid]:
            held = 0
            for fines in lay.use_dim_fine[(opi, pos)]:
                for f in fines:
                    held |= int(masks[f])
            common &= held
        return common

    def _reshard(self, site, masks, value_local, detailed: bool) -> list[Collective]:
        vid, opi, pos = site
        vdims = self.lay.value_dim_fine[vid]
        udims = self.lay.use_dim_fine[(opi, pos)]
        held_v = [_mask_of(d, masks) for d in vdims]
        held_u = [_mask_of(d, masks) for d in udims]
        gather = moved = 0
        for i, m in enumerate(held_v):
            for a in range(self.n_axes):
                bit = 1 << a
                if not m & bit:
                    continue
                if held_u[i] & bit:
                    continue
                if any(hu & bit for hu in held_u):
                    moved |= bit
                else:
                    gather |= bit
        out = []
        prog = self.ana.program
        cause = ""
        if detailed:
            cause = f"cut: {prog.values[vid].display()} resharded before {prog.ops[opi].where()}"
        local = value_local[vid]
        if moved:
            out.append(self._make("all-to-all", moved, local * self.mask_ways[moved], opi, vid, cause, detailed))
        if gather:
            out.append(self._make("all-gather", gather, local * self.mask_ways[gather], opi, vid, cause, detailed))
        return out


def _mask_of(fines, masks) -> int:
    m = 0
    for f in fines:
        m |= int(masks[f])
    return m


def estimate(
    ana: Analysis,
    strategy: Strategy,
    mesh: MeshSpec,
    hw: HardwareSpec,
    *,
    overlap: float = 0.0,
    donate_outputs: bool = True,
    memory_headroom: float = 0.1,
) -> CostReport:
    """Prices `strategy` on `mesh` of `hw` chips: compute, collectives, memory (see module essay)."""
    return evaluator(
        ana, mesh, hw, overlap=overlap, donate_outputs=donate_outputs, memory_headroom=memory_headroom
    ).report(strategy)


def evaluator(ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, **kw) -> Evaluator:
    """The compiled evaluator for (ana, mesh, hw, options), cached on the analysis."""
    key = ("evaluator", mesh, hw, tuple(sorted(kw.items())))
    if key not in ana.cache:
        ana.cache[key] = Evaluator(ana, mesh, hw, **kw)
    return ana.cache[key]
