"""The analytic cost model: compute, communication and per-device memory of a strategy.

Given a strategy, every atom's sharding follows from its named dim's mesh axes, every op's
per-device shapes follow, and every cut and every sharded reduction implies a collective:

* **Compute** per op (roofline): `max(flops_local / (peak_flops_per_s * efficiency),
  bytes_local / hbm_bytes_per_s)`, where an op's work is divided by the shard counts of the factors
  it computes over (not those it must replicate), and bytes are the local operands and results.
  Flops are counted as XLA counts them (`flops.py`, transcendentals apart but priced alike), once
  per loop fusion that computes the op (`fusion.py`), less what XLA's simplifier removes (dead
  code, constants, work on broadcasts: `simplify.py`); bytes only for values fusion materializes.
  An operand resharded at a cut is read at its new buffer's size (an FSDP matmul reads the
  all-gathered weight, `_reshard_reads`).
* **Sharded reductions**: a reduction factor on mesh axes R leaves each result partial over R: an
  all-reduce of the local result, or a reduce-scatter when every consumer (across a cut) wants a dim
  sharded on that axis (FSDP's gradients).
* **Cuts** (and reshape conflicts): at a cut use the value is resharded to what the consumer wants;
  per mesh axis: held by the value and not the use -> all-gather; moved to another dim ->
  all-to-all; only the use -> a local slice (free); a dim that trades some mesh axes for others
  -> a collective-permute of shards (plus an all-gather when it ends up coarser), as XLA does.
* **Replicate factors** on sharded dims force an all-gather of the operand, except where XLA
  reshards otherwise (`concat_slice.py`): a concatenate's operands move their shards to another dim
  (all-to-all) and its result is moved back (all-to-all) or gathered; a split / slice piece sharded
  like its operand takes halos (collective-permutes, sized as XLA's halo exchange, `halo.py`).
  **Permute** factors a collective-permute of a one-row halo.
* Collective times use the ring alpha-beta model of `collectives.py`, composed per mesh axis. They
  are linear in bytes for given mesh axes, so the evaluator precomputes `t = c0 + c1 * V` per kind
  and axis set. XLA's combiners then merge independent collectives of one kind and mesh axes into
  one op up to the hardware's threshold (`combine.py`): the latency `c0` is paid once per combined
  op, the bandwidth term `c1 * V` per member.
* **Memory** per device: all inputs (parameters, optimizer state, data) at their per-device size,
  plus the peak over program order of live intermediates (outputs live to the end; with
  `donate_outputs`, an output that replaces a same-shaped persistent input reuses its buffer).
  Remat shortens and splits lives (`remat.py`). The same buffers laid out as XLA's buffer
  assignment does, outputs in allocations of their own for the whole step, are
  `buffers.allocated_memory` (what `validate` compares with `memory_analysis()`).
* **Step time** = compute + (1 - overlap) x communication. Ideal time = total flops /
  (devices x peak); efficiency = ideal / step time.

Worked example: `relu(x @ w1) @ w2` with the hidden dim F on `model` (Megatron) and the batch on
`data`: both matmuls divide their work by 8, the second contracts F so its result is partial over
`model`: one all-reduce of y's local [B/2, O] buffer over `model` per step - the only collective.

`Evaluator.score` is the fast path the search calls (a few sparse mat-vecs); `Evaluator.report`
recomputes the same numbers with attribution (`CostReport`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from functools import cached_property
from math import prod

import numpy as np
import scipy.sparse as sp

from toast_core.analysis import Analysis
from toast_core.cost.buffers import cpu_temporaries, merged_repeat_rows, round_up
from toast_core.cost.collectives import COLLECTIVE_KINDS, collective_time_s
from toast_core.cost.combine import CombinedOp, combine, post_order, region_of_ops, site_inputs
from toast_core.cost.concat_slice import CONCAT, SLICE, STRIDE, concat_slice_sites
from toast_core.cost.cpu_buffers import cpu_buffers, dot_broadcasts
from toast_core.cost.flops import FOLDING, local_fold_flops, op_counts, spread_divisor_source
from toast_core.cost.flops_measured import (
    SORTS,
    sharded_random_bits_flops,
    sort_flops_of,
    window_scan_factor,
)
from toast_core.cost.fusion import bitcasts, fused_away, materialized
from toast_core.cost.halo import slice_halo_permutes
from toast_core.cost.halo_conv import halo_conv_flops, spatial_dims
from toast_core.cost.hoist import use_counts
from toast_core.cost.layout_copies import dot_copy_traffic
from toast_core.cost.loop_buffers import buffer_aliases, held_until, zero_filled
from toast_core.cost.masked_gather import masked_gather_flops, masked_gathers
from toast_core.cost.remat import (
    hold_barrier_inputs,
    recompute_comm_s,
    recompute_time_s,
    recomputed_collectives,
    shorten_lifetimes,
)
from toast_core.cost.reshard_keys import classify, group_by_key
from toast_core.cost.scatter_chain import scatter_values
from toast_core.cost.sharded_scatter import local_scatter_flops, sharded_scatters
from toast_core.cost.simplify import (
    cse_repeats,
    live_ops,
    rewired,
    splits_as_slices,
    spread_dot_other,
    without_dead_ops,
)
from toast_core.cost.simplify import executions as simplified_executions
from toast_core.cost.top_k_sorts import whole_dim_sorts
from toast_core.cost.work_rows import op_work_fine
from toast_core.errors import ToastError, bad_value
from toast_core.ir import primitives as prim
from toast_core.ir.primitives import ARG_REDUCTIONS, CUMULATIVE
from toast_core.ir.program import dtype_itemsize
from toast_core.mesh import HardwareSpec, MeshSpec, hardware
from toast_core.mesh.spec import XLA_CPU_COMBINE
from toast_core.strategy import Strategy, mesh_axes, space_of
from toast_core.strategy.layout import REGION_BOUNDARIES, layout
from toast_core.strategy.memo import per_analysis
from toast_core.strategy.remat import POLICIES, RematEffect, remat_effect, remat_space

KIND_INDEX = {k: i for i, k in enumerate(COLLECTIVE_KINDS)}
#: Up to this many sites whose layouts differ, `_compute_reshards` classifies them in Python
#: (`_scalar_reshards`): NumPy's per-call overhead exceeds the arithmetic on so few.
SCALAR_SITES = 32
#: `_scalar_reshards` results kept per evaluator, and per restricted view (there are hundreds).
SCALAR_KEPT, SCALAR_KEPT_PER_VIEW = 1024, 16
AG, AR, A2A, CP, RS = (
    KIND_INDEX["all-gather"],
    KIND_INDEX["all-reduce"],
    KIND_INDEX["all-to-all"],
    KIND_INDEX["collective-permute"],
    KIND_INDEX["reduce-scatter"],
)


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective implied by a strategy, attributed to the op and value that cause it.

    `time_s` is its share of the combined op it belongs to (`group`, an index into
    `CostReport.combined`): its own bandwidth term plus an equal share of that op's latency, so
    the members' times add up to the combined op's time. `site` identifies where it sits in the
    program for the combiner's dependence test (see `toast_core.cost.combine`).
    """

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
    group: int = -1  # index of its combined op in CostReport.combined
    site: int = field(default=-1, repr=False)


@dataclass(frozen=True, slots=True)
class OpCost:
    op: int
    primitive: str
    flops: float  # per device, all executions
    bytes: float
    time_s: float
    transcendentals: float = 0.0  # per device, all executions


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
    transcendentals_per_device: float = 0.0
    collectives: tuple[Collective, ...] = ()
    op_costs: tuple[OpCost, ...] = field(default=(), repr=False)
    memory_timeline: tuple[float, ...] = field(default=(), repr=False)
    peak_op: int = -1
    recompute_flops_per_device: float = 0.0  # forward flops run again under remat (included)
    remat: tuple[tuple[str, str], ...] = ()  # the strategy's remat policies

    @cached_property
    def combined(self) -> tuple[CombinedOp, ...]:
        """The collective ops XLA emits after combining, in program order, each with its members
        (indices into `collectives`); a collective that merges with nothing is its own op."""
        members: dict[int, list[int]] = {}
        ungrouped = len(self.collectives)
        for i, c in enumerate(self.collectives):
            members.setdefault(c.group if c.group >= 0 else ungrouped + i, []).append(i)
        out = []
        for key in sorted(members):
            group = members[key]
            first = self.collectives[group[0]]
            out.append(
                CombinedOp(
                    first.kind,
                    first.mesh_axes,
                    tuple(group),
                    sum(self.collectives[i].bytes for i in group),
                    sum(self.collectives[i].result_bytes for i in group),
                    sum(self.collectives[i].time_s for i in group),
                    first.count,
                )
            )
        return tuple(out)

    def collective_ops_by_kind(self) -> dict[str, int]:
        """Number of collective ops per kind after combining, as the program text lists them (an
        op inside a loop body counts once)."""
        out = dict.fromkeys(COLLECTIVE_KINDS, 0)
        for op in self.combined:
            out[op.kind] += 1
        return out

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
            "transcendentals_per_device": self.transcendentals_per_device,
            "comm_bytes_by_kind": self.collective_bytes_by_kind(),
            "collective_ops_by_kind": self.collective_ops_by_kind(),
        }


@dataclass(frozen=True, slots=True)
class Score:
    """The fast-path result the search uses."""

    step_time_s: float
    compute_s: float
    comm_s: float
    peak_bytes: float
    fits: bool


def reduction_flops(collectives, program, once: bool = False) -> float:
    """The adds of all-reduces and reduce-scatters (one per element of the full buffer), which
    XLA's `cost_analysis()` counts as flops; `once` counts a loop body's collectives once."""
    total = 0.0
    for c in collectives:
        if c.kind in ("all-reduce", "reduce-scatter"):
            v = program.values[c.value]
            total += c.bytes / v.nbytes * v.size * (1 if once else c.count)
    return total


@dataclass(frozen=True)
class _Reshards:
    """Distinct reshards of one strategy (value, first reading op, first and last reader, new
    buffer size / local bytes) and their collectives (kind, mesh axes, V / local bytes, index of
    their reshard)."""

    value: np.ndarray
    op: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    buffer: np.ndarray
    kind: np.ndarray
    mask: np.ndarray
    factor: np.ndarray
    of: np.ndarray
    # Last reader before the backward part (-1: none), first reader in it (n_ops: none).
    fwd_hi: np.ndarray | None = None
    bwd_lo: np.ndarray | None = None
    # Every use reading a reshard's new buffer, in site order: its op, the index of the
    # reshard, and its site (index into the evaluator's site arrays).
    read_op: np.ndarray | None = None
    read_of: np.ndarray | None = None
    read_site: np.ndarray | None = None

    @staticmethod
    def empty() -> _Reshards:
        i, f = np.zeros(0, dtype=np.int64), np.zeros(0)
        return _Reshards(i, i, i, i, f, i, i, f, i, i, i, i, i, i)


@dataclass(frozen=True, slots=True)
class CostOptions:
    """How a step is priced, beyond the mesh and the hardware (the evaluator's key).

    `overlap`: the fraction of communication hidden behind compute (0: none, the default);
    `donate_outputs`: an output that replaces a same-shaped persistent input reuses its buffer;
    `memory_headroom`: the fraction of HBM kept free (a plan fits under (1 - headroom) x HBM).
    """

    overlap: float = 0.0
    donate_outputs: bool = True
    memory_headroom: float = 0.1

    def __post_init__(self) -> None:
        for name, low, high in (("overlap", 0.0, 1.0), ("memory_headroom", 0.0, 1.0)):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not low <= value <= high
            ):
                raise ToastError(bad_value(name, value, f"a number in [{low:g}, {high:g}]"))
        if self.memory_headroom == 1.0:
            raise ToastError(bad_value("memory_headroom", 1.0, "a number in [0, 1)"))
        if not isinstance(self.donate_outputs, bool):
            raise ToastError(bad_value("donate_outputs", self.donate_outputs, "True or False"))


def _reduction_atoms(ana: Analysis) -> list[tuple[int, int]]:
    """(op, atom) of every reduction atom of every op, in op order then the op's atom order
    (one NumPy pass over NDA's op-atom table, not a Python test per atom)."""
    nda = ana.nda
    is_reduction = np.fromiter(
        (k == "reduction" for k in nda.atom_kind), dtype=bool, count=len(nda.atom_kind)
    )
    rows = np.flatnonzero(is_reduction[nda.op_atom]) if len(nda.op_atom) else np.zeros(0, int)
    ops = np.searchsorted(nda.op_atom_start, rows, side="right") - 1
    return list(zip(ops.tolist(), nda.op_atom[rows].tolist()))


def _dead_region_uses(prog, live: np.ndarray) -> np.ndarray:
    """Codes (op * n_values + value) of the values a loop or cond start passes into its body
    only to be read there by dead ops (an FSDP weight whose forward matmul only the dropped loss
    reads, in a gradient accumulation loop): a collective priced on that use (the weight's
    gather, hoisted before the loop) goes with them. Sorted, for `np.isin`."""
    n_values = len(prog.values)
    uses = prog.uses()
    codes = []
    for op in prog.ops:
        if op.primitive not in (prim.SCAN_START, prim.WHILE_START, prim.COND_START):
            continue
        dead: dict[int, bool] = {}
        for v, r in zip(op.operands, op.results):
            unread = all(not live[o] for o, _ in uses[r])
            dead[v] = dead.get(v, True) and unread
        codes += [op.index * n_values + v for v, d in dead.items() if d]
    return np.array(sorted(codes), dtype=np.int64)


class Evaluator:
    """Compiled cost model for one (analysis, mesh, hardware); strategies as fine-class masks.
    Get one with `evaluator(...)`, which builds it once per key."""

    _scalar_kept = SCALAR_KEPT  # `_scalar_reshards` results kept (a restricted view: fewer)

    def __init__(
        self, ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, options: CostOptions
    ) -> None:
        self.ana, self.mesh, self.hw, self.options = ana, mesh, hw, options
        self.overlap = float(options.overlap)
        self._donate = options.donate_outputs
        # Memos of pure functions of their keys; safe to share between threads (see _reshards).
        self._last_reshards = None
        self._exact_cache: dict = {}
        self._use_fines_memo: dict = {}  # the use -> fine classes table (`_use_fine_table`)
        self._layout_ids: dict[bytes, int] = {}
        self._layout_ids_lock = threading.Lock()
        self.capacity_bytes = hw.hbm_capacity_bytes * (1.0 - options.memory_headroom)
        prog = ana.program
        lay = layout(ana)
        self.lay = lay
        self.op_work_fine = op_work_fine(ana)
        self.axes = mesh_axes(mesh)
        self.n_axes = self.axes.n
        self.log2n = self.axes.log2_sizes
        # log2 of the shard count of every mask, when every mesh axis size is a power of two:
        # then each is a sum of integers, exact in any order, so a look-up gives the same
        # floats as `bits.T @ log2n` (`_local`); None otherwise.
        self.logdeg_of_mask = None
        if np.array_equal(self.log2n, np.round(self.log2n)):
            self.logdeg_of_mask = self.axes.bits(np.arange(1 << self.n_axes)).T @ self.log2n
        self._collective_coefficients()

        n_ops = len(prog.ops)
        self.trip = np.array([op.trip_count for op in prog.ops], dtype=np.float64)
        is_mat = materialized(prog)
        self._is_mat = np.array(is_mat, dtype=bool)
        # loop fusion's duplicates and XLA's simplifier (CSE, identities, dead code, constants)
        reciprocals: dict[int, float] = {}
        flop_runs, trans_runs = simplified_executions(
            prog, reciprocals_out=reciprocals, partitioned=mesh.n_devices > 1
        )
        # Ops whose work reaches no output: XLA removes them with their collectives (a train
        # step's loss, whose partial sums the gradient never reads).
        self._op_live = np.array(live_ops(prog), dtype=bool)
        self._dead_use_codes = _dead_region_uses(prog, self._op_live)
        executions = self.trip * np.array(flop_runs, dtype=np.float64)
        trans_executions = self.trip * np.array(trans_runs, dtype=float)
        flops, trans = op_counts(prog)
        self.op_flops = np.array(flops) * executions
        self.op_trans = np.array(trans)
        self.op_trans *= trans_executions
        self.total_flops = float(self.op_flops.sum())
        # Divisions by a spread divisor, its value, and their reciprocals' flops (`_reciprocals`).
        recip = [
            (i, src, flops[i] * share * self.trip[i])
            for i, share in sorted(reciprocals.items())
            if self.op_flops[i] > 0
            and (src := spread_divisor_source(prog.ops[i], prog)) is not None
        ]
        self._recip_ops = np.array([r[0] for r in recip], dtype=np.int64)
        self._recip_values = np.array([r[1] for r in recip], dtype=np.int64)
        self._recip_flops = np.array([r[2] for r in recip], dtype=np.float64)
        # Folding ops (reductions, dots) and how many times the simplifier leaves them to run:
        # their local count is not the global one's share when a folded dim is cut (`_folded`).
        base = [f if op.primitive in FOLDING else 0.0 for op, f in zip(prog.ops, flops)]
        self._fold_ops = np.array([i for i, b in enumerate(base) if b > 0], dtype=np.int64)
        self._fold_runs = np.array([self.op_flops[i] / base[i] for i in self._fold_ops.tolist()])
        # per folding op, a dot's operand read beside a spread scalar, else -1 (`_folded`)
        self._fold_spread_other = [spread_dot_other(prog.ops[i], prog) for i in self._fold_ops]
        self._scan_ops = np.array(
            [i for i, op in enumerate(prog.ops) if op.primitive in CUMULATIVE and op.results],
            dtype=np.int64,
        )
        # A windowed scan's combines per output: the whole row's (`_windowed_scans`).
        self._scan_window = np.array(
            [window_scan_factor(prog.ops[i], prog) for i in self._scan_ops.tolist()]
        )
        # Sorts, with the elements of their first operand: `_local_sorts`.
        self._sort_ops = np.array(
            [i for i, (op, f) in enumerate(zip(prog.ops, flops)) if op.primitive in SORTS and f],
            dtype=np.int64,
        )
        # Gathers with a masked operand dim, and how many times they run: `_masked_gathers`.
        self._gather_ops = np.array(masked_gathers(prog), dtype=np.int64)
        self._gather_runs = self.trip[self._gather_ops]
        self._gather_masks = np.array(flop_runs, dtype=np.float64)[self._gather_ops]
        # Scatters, counted on their local updates: `_sharded_scatters`.
        self._scatter_ops = np.array(sharded_scatters(prog), dtype=np.int64)
        self._scatter_runs = executions[self._scatter_ops]
        # Convolutions, counted on their windowed input when a spatial dim is cut: `_halo_convs`.
        convs = [i for i, op in enumerate(prog.ops) if op.primitive == "conv_general_dilated"]
        self._conv_ops = np.array([i for i in convs if self.op_flops[i] > 0], dtype=np.int64)
        self._conv_runs = executions[self._conv_ops]
        # Random bits, counted on each device's elements and counters: `_sharded_random_bits`.
        self._bits_ops = [
            (i, self.op_flops[i] / flops[i])
            for i, op in enumerate(prog.ops)
            if op.primitive == "random_bits" and flops[i] > 0
        ]
        self.nbytes = np.array([v.nbytes for v in prog.values], dtype=np.float64)
        # Ops that move no bytes: region markers, views (`bitcasts`) and the ops XLA's CSE and
        # simplifier remove (`simplify.rewired`: a repeat of an earlier op, an identity), whose
        # readers read the value they equal (a BatchNorm computing `sum(h)` for its mean and
        # again for its variance reads h once: 14 % of its replicated step's fused bytes); a
        # scan's end writes its zero-filled stacked outputs once (`zero_filled`).
        kept = live_ops(rewired(prog))
        self._moves = np.array(
            [
                op.primitive not in REGION_BOUNDARIES and not view and (kept_op or not live)
                for op, view, kept_op, live in zip(
                    prog.ops, bitcasts(prog, is_mat), kept, self._op_live.tolist()
                )
            ],
            dtype=bool,
        )
        rows = [
            [v for v in list(op.operands) + list(op.results) if is_mat[v]]
            if moves
            else zero_filled(op)
            for op, moves in zip(prog.ops, self._moves.tolist())
        ]
        indptr = np.zeros(n_ops + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        idx = np.fromiter((v for r in rows for v in r), dtype=np.int64, count=int(indptr[-1]))
        self.op_values = sp.csr_matrix(
            (np.ones(len(idx)), idx, indptr), shape=(n_ops, len(prog.values))
        )
        # Dot operands transposed into layout copies move their bytes again (layout_copies.py).
        copies = dot_copy_traffic(prog, is_mat)
        if copies:
            c_ops, c_vals, c_bytes = zip(*copies)
            self.op_values = self.op_values + sp.csr_matrix(
                (c_bytes, (c_ops, c_vals)), shape=(n_ops, len(prog.values))
            )
        self.peak_flops = hw.peak_flops_per_s * hw.flops_efficiency
        self.direction = [
            "backward" if "transpose(" in op.name_stack else "forward" for op in prog.ops
        ]
        self._is_backward = np.array([d == "backward" for d in self.direction], dtype=bool)
        self._reduction_sites()
        self._reshard_sites()
        self._replicate_and_permute_sites()
        self._liveness(is_mat)
        self.remat = remat_space(ana)

    # -- precomputation -------------------------------------------------------------------------

    def _collective_coefficients(self) -> None:
        """t(kind, axes, V) = c0 + c1 * V for V > 0, for every subset of mesh axes (a bitmask)."""
        n_masks = 1 << self.n_axes
        self.real_axes = self.axes.real
        self.c0 = np.zeros((len(COLLECTIVE_KINDS), n_masks))
        self.c1 = np.zeros((len(COLLECTIVE_KINDS), n_masks))
        self.mask_ways = self.axes.ways.astype(np.float64)
        self.n_bits = self.axes.n_bits
        for m in range(1, n_masks):
            axes = self.axes.names_of(m)
            for kind, k in KIND_INDEX.items():
                t1 = collective_time_s(kind, 1e6, axes, self.mesh, self.hw)
                t2 = collective_time_s(kind, 2e6, axes, self.mesh, self.hw)
                self.c1[k, m] = (t2 - t1) / 1e6
                self.c0[k, m] = t1 - self.c1[k, m] * 1e6

    def _reduction_sites(self) -> None:
        ana, prog = self.ana, self.ana.program
        fine = ana.fine_of_atom
        uses = prog.uses()
        # From the M-edge table, not `ana.medges` (127k records built for these few columns).
        cand_uses = set(map(tuple, ana.nda.medge_table[ana.candidate_edges, 2:4].tolist()))
        red_op, red_fine, red_value, red_scan = [], [], [], []
        for opi, a in _reduction_atoms(ana):
            for vid in prog.ops[opi].results:
                red_op.append(opi)
                red_fine.append(int(fine[a]))
                red_value.append(vid)
                red_scan.append(scatter_values(prog, vid, uses, cand_uses))
        self.red_op = np.array(red_op, dtype=np.int64)
        self.red_fine = np.array(red_fine, dtype=np.int64)
        self.red_value = np.array(red_value, dtype=np.int64)
        # Per row of an argmax / argmin: its operand, and the operand's bytes per element over
        # the result's (else -1 and 0): XLA gathers the shards' partial results instead of
        # reducing them (`_arg_reduction_gathers`).
        self.red_arg_operand = np.full(len(red_op), -1, dtype=np.int64)
        self.red_arg_ratio = np.zeros(len(red_op))
        for row, (opi, vid) in enumerate(zip(red_op, red_value)):
            op = prog.ops[opi]
            if op.primitive in ARG_REDUCTIONS:
                x = op.operands[0]
                self.red_arg_operand[row] = x
                self.red_arg_ratio[row] = dtype_itemsize(prog.values[x].dtype) / dtype_itemsize(
                    prog.values[vid].dtype
                )
        # [row, k]: the values whose uses may reduce-scatter the row's partial sum, -1 padded.
        width = max((len(x) for x in red_scan), default=0)
        self.red_scan = np.full((len(red_scan), width), -1, dtype=np.int64)
        for row, values in enumerate(red_scan):
            self.red_scan[row, : len(values)] = values

    def _reshard_sites(self) -> None:
        """Uses that a cut or a reshape conflict may reshard: (value, op, position), with the
        fine classes of every dim on both sides padded into arrays [site, dim, sub-factor]."""
        ana = self.ana
        keys = dict.fromkeys(map(tuple, ana.nda.medge_table[ana.candidate_edges, 1:4].tolist()))
        for vid, opi, pos, _ in ana.nda.reshape_sites:
            keys[(vid, opi, pos)] = None
        self.sites = list(keys)
        pad = ana.n_fine  # an extra fine class whose mask is always 0
        rank = max((len(self.lay.value_dim_fine[v]) for v, _, _ in self.sites), default=1)
        subs = 1
        for v, o, p in self.sites:
            for dims in (self.lay.value_dim_fine[v], self.lay.use_dim_fine[(o, p)]):
                subs = max(subs, max((len(d) for d in dims), default=1))
        vf = np.full((len(self.sites), max(rank, 1), subs), pad, dtype=np.int64)
        uf = np.full_like(vf, pad)
        for i, (v, o, p) in enumerate(self.sites):
            for d, fines in enumerate(self.lay.value_dim_fine[v]):
                vf[i, d, : len(fines)] = fines
            for d, fines in enumerate(self.lay.use_dim_fine[(o, p)]):
                uf[i, d, : len(fines)] = fines
        self.site_vf, self.site_uf = vf, uf
        self.site_value = np.array([v for v, _, _ in self.sites], dtype=np.int64)
        self.site_op = np.array([o for _, o, _ in self.sites], dtype=np.int64)
        # The last op a loop holds each site's resharded copy to (-1: its last reader).
        self.site_hold = np.array(held_until(ana.program, self.sites), dtype=np.int64)

    def _replicate_and_permute_sites(self) -> None:
        ana, prog = self.ana, self.ana.program
        fine = ana.fine_of_atom
        rep, per, rep_at, before = [], [], [], []
        atom_kind, ops = ana.nda.atom_kind, prog.ops
        for (opi, pos), dims in ana.nda.use_atoms.items():
            vid = ops[opi].operands[pos]
            later: list[int] = []  # replicate fines of this use's later dims
            for d in reversed(range(len(dims))):
                here = []
                for a in dims[d]:
                    kind = atom_kind[a]
                    if kind == "replicate":
                        rep.append((opi, vid, int(fine[a])))
                        rep_at.append((opi, vid, int(fine[a]), pos, d))
                        before.append(tuple(later))
                        here.append(int(fine[a]))
                    elif kind == "permute":
                        per.append((opi, vid, int(fine[a]), int(ana.nda.atom_size[a])))
                later += here
        # Columns: op, value, fine, style, room, piece list id (see concat_slice.py), and
        # below a partial-sum id.
        cs = concat_slice_sites(ana, self.lay, rep_at)
        self.rep = np.column_stack(
            [np.array(rep, dtype=np.int64).reshape(-1, 3), cs.style, cs.room, cs.pieces_id]
        ).astype(np.int64)
        self.rep_pieces, self.cat = cs.pieces, cs.cat
        # Per concatenate row: its operands (-1 padded), for a stack's operand all-to-alls.
        width = max((len(prog.ops[o].operands) for o in self.cat[:, 0].tolist()), default=1)
        self.cat_operands = np.full((len(self.cat), width), -1, dtype=np.int64)
        for k, o in enumerate(self.cat[:, 0].tolist()):
            self.cat_operands[k, : len(prog.ops[o].operands)] = prog.ops[o].operands
        # Per replicate row of a split / slice: its pieces' result fine classes (-1 padded), and
        # every fine class of its operand (-1 padded), for slicing a whole operand dim into
        # sharded pieces (`_replicate_collectives`).
        slice_rows = self.rep[:, 3] == SLICE
        width = max((len(p) for p in cs.pieces), default=1)
        self.rep_piece_fines = np.full((len(self.rep), width), -1, dtype=np.int64)
        operand_fines = [()] * len(self.rep)
        for k in np.flatnonzero(slice_rows).tolist():
            got = [rf for _, rf, *_ in cs.pieces[int(self.rep[k, 5])]]
            self.rep_piece_fines[k, : len(got)] = got
            dims = self.lay.value_dim_fine[int(self.rep[k, 1])]
            operand_fines[k] = tuple(sorted({f for fines in dims for f in fines}))
        width = max((len(f) for f in operand_fines), default=1)
        self.rep_operand_fines = np.full((len(self.rep), max(width, 1)), -1, dtype=np.int64)
        for k, fines in enumerate(operand_fines):
            self.rep_operand_fines[k, : len(fines)] = fines
        # XLA gathers a use's sharded dims one all-gather per dim, the last dim first (measured:
        # f32[8, 32, 8] sharded [a, -, b] on a {a: 4, b: 2} mesh, replicated for a top_k: an
        # all-gather on b to f32[2, 32, 8], then one on a to f32[8, 32, 8]); each gathers what
        # the ones before it grew. `rep_before[k]`: fines of the replicate factors gathered
        # before entry k (later dims of the same use), -1 padded.
        width = max((len(b) for b in before), default=0)
        self.rep_before = np.full((len(before), max(width, 1)), -1, dtype=np.int64)
        for k, b in enumerate(before):
            self.rep_before[k, : len(b)] = b
        # Column 6: for a slice row whose operand is a reduction's result read by that op
        # alone, the index of its reduction fine classes in `_partial_fines`, else -1
        # (see `_partial_target`).
        uses = prog.uses()
        red_fines: dict[int, list[int]] = {}  # `_reduction_sites`' rows, in their order
        for vid, f in zip(self.red_value.tolist(), self.red_fine.tolist()):
            red_fines.setdefault(vid, []).append(f)
        partial_id, partial_fines = np.full(len(self.rep), -1, dtype=np.int64), []
        for k, (v, style) in enumerate(self.rep[:, [1, 3]].tolist()):
            if style == SLICE and v in red_fines and len(uses[v]) == 1:
                partial_id[k] = len(partial_fines)
                partial_fines.append(tuple(red_fines[v]))
        self.rep = np.column_stack([self.rep, partial_id])
        self._partial_fines = tuple(partial_fines)
        # Per reduction row: (partial-sum id, piece list id) of the split / slice that alone
        # reads its result, else -1: the partial sum is reduce-scattered onto the pieces' mesh
        # axes (`_partial_target`).
        self.red_split = np.full((len(self.red_value), 2), -1, dtype=np.int64)
        split_of = {v: (i, p) for v, i, p in self.rep[:, [1, 6, 5]].tolist() if i >= 0}
        for row, v in enumerate(self.red_value.tolist()):
            self.red_split[row] = split_of.get(v, (-1, -1))
        self.per = np.array(per, dtype=np.int64).reshape(-1, 4)
        self.halos = {(opi, vid) for opi, vid, _, _ in per}
        self.halos |= {(int(o), int(v)) for o, v, *_ in self.rep[self.rep[:, 3] == SLICE].tolist()}

    def _liveness(self, is_mat: list[bool]) -> None:
        """Live ranges of the intermediates that take memory: from the producer to the last
        reader (outputs to the end of the step). A value fused away into its readers
        (`fusion.fused_away`: the causal mask broadcast to [B, H, S, S], a scaled or cast copy)
        takes none; its readers recompute it from its producer's operands, which therefore stay
        live until the last of those readers, through chains of fused values. Dead ops
        (`simplify.without_dead_ops`) make no buffer and read none: XLA removes them; a `split`
        fuses as the slices it lowers to (`simplify.splits_as_slices`); a `top_k` of a whole dim
        whose indices nothing reads makes its values alone (`top_k_sorts.whole_dim_sorts`)."""
        live = self._op_live.tolist()
        prog, _ = without_dead_ops(self.ana.program, live)
        prog = whole_dim_sorts(splits_as_slices(prog))
        self._mem_prog = prog  # the program whose buffers XLA allocates: dead ops read nothing
        if prog is not self.ana.program:
            is_mat = materialized(prog)
        n_ops = len(prog.ops)
        producers = prog.producers()
        self._fused = fused_away(prog, is_mat)
        self._is_fused = np.array(self._fused, dtype=bool)
        self._in_memory = 1.0 - self._is_fused.astype(np.float64)
        self._producer = np.array([-1 if p is None else p for p in producers], dtype=np.int64)
        self._last_reader = self._last_readers(frozenset())
        born, dies, live_ids, persistent = [], [], [], []
        alias = buffer_aliases(prog)  # loop operands and carries: one buffer (loop_buffers.py)
        lasts: dict[int, int] = {}
        for v in prog.values:
            if producers[v.id] is None:
                if v.role in ("input", "parameter", "state", "constant"):
                    persistent.append(v.id)
                continue
            if self._fused[v.id] or not live[producers[v.id]]:
                continue
            last = int(self._last_reader[v.id])
            if v.is_output:
                if self._donate and v.updates is not None:
                    continue  # written into the buffer of the input it replaces
                last = n_ops - 1
            elif _written_over_by_scatter(prog, v.id, last):
                last -= 1  # the scatter's result takes its buffer at that op
            if v.id in alias:
                owner = alias[v.id]
                lasts[owner] = max(lasts.get(owner, -1), last)
                continue
            born.append(producers[v.id])
            dies.append(last)
            live_ids.append(v.id)
        for k, v in enumerate(live_ids):
            dies[k] = max(dies[k], lasts.get(v, -1))
        self.live_ids = np.array(live_ids, dtype=np.int64)
        self._live_is_output = np.array([prog.values[v].is_output for v in live_ids], dtype=bool)
        self.born = np.array(born, dtype=np.int64)
        self.dies = np.array(dies, dtype=np.int64) + 1
        self.persistent_ids = np.array(persistent, dtype=np.int64)
        self._live_end = np.full(len(prog.values), -1, dtype=np.int64)  # -1: no buffer
        self._live_end[self.live_ids] = self.dies
        self.n_ops = n_ops
        self._remat_live_memo: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def _last_readers(self, dropped: frozenset) -> np.ndarray:
        """The last op reading each value, directly or through the fused values made from it
        (walking the ops backwards, a fused result hands its last reader to its producer's
        operands). A `dropped` residual is recomputed for the backward part under remat: its
        backward readers read the new copy, so only its forward readers count."""
        prog = self._mem_prog
        # A Python list, not the array, in the loops: a NumPy scalar read and compare per
        # operand was most of this function's time (40k ops; again per remat choice).
        last = [-1 if p is None else p for p in prog.producers()]
        backward = self.direction
        for op in prog.ops:
            i = op.index
            for x in op.operands:
                if x in dropped and backward[i] == "backward":
                    continue
                if i > last[x]:
                    last[x] = i
        fused = self._fused
        for op in reversed(prog.ops):
            ends = [last[r] for r in op.results if fused[r]]
            if not ends:
                continue
            end = max(ends)
            for x in op.operands:
                if x in dropped and backward[op.index] == "backward":
                    continue
                if end > last[x]:
                    last[x] = end
        return np.array(last, dtype=np.int64)

    def _remat_block_ops(self, pairs) -> np.ndarray:
        """Whether each op is a forward op of a block whose group has a remat policy."""
        key = tuple(g for g, p in pairs if p)
        hit = self._remat_live_memo.get(key)
        if hit is None:
            hit = np.zeros(self.n_ops + 1, dtype=bool)
            for g in key:
                for ops in self.remat.groups[g].blocks:
                    hit[list(ops)] = True
            self._remat_live_memo[key] = hit
        return hit

    def _remat_liveness(self, remat: RematEffect):
        """(value, op after which it is freed under remat, op after which it was freed without):
        the values that lived on only for the fused readers of residuals that remat drops."""
        key = remat.values.tobytes()
        hit = self._remat_live_memo.get(key)
        if hit is None:
            dropped = frozenset(remat.values.tolist())
            last = self._last_readers(dropped)
            old = self.dies - 1
            new = last[self.live_ids]
            is_output = np.array(
                [self.ana.program.values[v].is_output for v in self.live_ids.tolist()], dtype=bool
            )
            moved = (new < old) & ~is_output & ~np.isin(self.live_ids, remat.values)
            hit = (self.live_ids[moved], new[moved], old[moved])
            if len(self._remat_live_memo) >= 64:
                self._remat_live_memo.clear()
            self._remat_live_memo[key] = hit
        return hit

    def _after_own_life(self, remat: RematEffect) -> RematEffect:
        """`remat` with each extension starting after its value's own live range: the effect
        counts a value's last reader among its direct readers, the liveness also through the
        fused values made from it, and the overlap would count the value twice for that op
        (GPT demo, `full`: one 64 KB value per layer, counted twice at one op). A value whose
        life remat shortens (`_remat_liveness`: it lived on for the fused readers of a dropped
        residual) ends earlier, and its extension starts there (as `buffers.buffer_intervals`
        counts it: the GPT's LayerNorm input under `dots`, read through the fused normalized
        value by the recomputation)."""
        if not len(remat.extend_values):
            return remat
        own_end = self._live_end
        if len(remat.values):
            vals, new, _ = self._remat_liveness(remat)
            if len(vals):
                own_end = own_end.copy()
                own_end[vals] = new + 1
        own_end = own_end[remat.extend_values]
        start = np.minimum(np.maximum(remat.extend_from, own_end), remat.extend_to)
        if np.array_equal(start, remat.extend_from):
            return remat
        return replace(remat, extend_from=start)

    # -- evaluation -----------------------------------------------------------------------------

    def _local(self, masks: np.ndarray):
        fine_logdeg = self._fine_logdeg(masks)
        value_local = self.nbytes * np.exp2(-(self.lay.value_fine @ fine_logdeg))
        op_logdeg = self.op_work_fine @ fine_logdeg
        return fine_logdeg, value_local, op_logdeg

    def _fine_logdeg(self, masks: np.ndarray) -> np.ndarray:
        """log2 of the shard count of each fine class of `masks`."""
        if self.logdeg_of_mask is not None:
            return self.logdeg_of_mask[masks]
        return self.axes.bits(masks).T @ self.log2n

    def _compute(self, value_local, op_logdeg, read_extra):
        """Per-op local flops, transcendentals, HBM bytes and roofline time (a transcendental
        costs the compute units as much as a flop). `read_extra` [ops]: bytes an op reads beyond
        its operands' local sizes (`_read_extra`)."""
        share = np.exp2(-op_logdeg)
        flops_local, trans_local = self.op_flops * share, self.op_trans * share
        bytes_local = (self.op_values @ value_local + read_extra) * self.trip
        return (
            flops_local,
            trans_local,
            bytes_local,
            self._roofline(flops_local, trans_local, bytes_local),
        )

    def _folded(self, flops_local, value_local, op_logdeg) -> np.ndarray:
        """`flops_local` with each folding op whose folded dims are cut counted on its local
        shard (`local_fold_flops`: each device folds its operand shard into whole partial sums,
        which the all-reduce then adds, as XLA's partitioned reduce and dot do). Flops only: the
        roofline times keep the global count's share (the difference is the partial result's
        elements, noise beside the op's time), so `score`, the incremental evaluator and the
        report's times stay one model."""
        flops_local = self._windowed_scans(flops_local, value_local, op_logdeg)
        flops_local = self._local_sorts(flops_local, op_logdeg)
        flops_local = self._reciprocals(flops_local, value_local, op_logdeg)
        if not len(self._fold_ops):
            return flops_local
        prog = self.ana.program
        ways = np.exp2(op_logdeg[self._fold_ops])
        result = [prog.ops[i].results[0] for i in self._fold_ops.tolist()]
        result_ways = self.nbytes[result] / np.maximum(value_local[result], 1e-300)
        cut = np.flatnonzero(ways > result_ways * (1 + 1e-9))
        if not len(cut):
            return flops_local
        out = flops_local.copy()
        for j in cut.tolist():
            i = int(self._fold_ops[j])
            local = local_fold_flops(prog.ops[i], prog, float(ways[j]), float(result_ways[j]))
            other = self._fold_spread_other[j]
            if other >= 0 and local == prog.values[prog.ops[i].results[0]].size / result_ways[j]:
                # an outer product on the device by a spread scalar: XLA multiplies the other
                # operand's shard by the scalar and broadcasts that (seed 18 #480)
                local = min(
                    local, value_local[other] * prog.values[other].size / self.nbytes[other]
                )
            out[i] = local * self._fold_runs[j]
        return out

    def _reciprocals(self, flops_local, value_local, op_logdeg) -> np.ndarray:
        """`flops_local` with each division's reciprocal of its spread divisor counted on the
        divisor's shard, not the division's: a softmax over a cut dim all-reduces its sums and
        every device computes `1 / sum` over the whole of them (measured: `softmax(x[16, 12, 8],
        axis=0)` with dim 0 cut 8 ways, 864 flops per device, 96 of them the reciprocal; the
        division's share counted 780, 0.90). Flops only, like `_folded`.

        None when the divisor's shard is as large as the division's: the broadcast then only
        adds dims of local size 1, which XLA's simplifier makes a bitcast, and the device
        divides by it with no reciprocal (`softmax(x[6, 4, 4, 8], axis=0)` with dim 0 cut 6
        ways: 512 flops per device, no `1 / sum`; counting it said 640, fuzz seed 19 #1814)."""
        if not len(self._recip_ops):
            return flops_local
        ways = np.exp2(op_logdeg[self._recip_ops])
        src = self._recip_values
        src_ways = self.nbytes[src] / np.maximum(value_local[src], 1e-300)
        prog = self.ana.program
        result = [prog.ops[i].results[0] for i in self._recip_ops.tolist()]
        result_elems = np.array([prog.values[v].size for v in result], dtype=np.float64) / ways
        src_elems = np.array([prog.values[v].size for v in src.tolist()], dtype=np.float64)
        unspread = src_elems / src_ways >= result_elems * (1 - 1e-9)
        more = (ways > src_ways * (1 + 1e-9)) & ~unspread
        if not (more.any() or unspread.any()):
            return flops_local
        out = flops_local.copy()
        extra = np.where(unspread, -1 / ways, 1 / src_ways - 1 / ways) * self._recip_flops
        hit = more | unspread
        np.add.at(out, self._recip_ops[hit], extra[hit])
        return out

    def _windowed_scans(self, flops_local, value_local, op_logdeg) -> np.ndarray:
        """`flops_local` with each prefix scan whose result stays cut along the scanned dim
        counted on its result shard: the model gathers the operand along that dim (each device
        reads the whole row), but XLA's partitioned reduce-window computes only the device's own
        outputs, each from its window of the gathered row (fuzz seed 14 #554, `cummin(x[6, 8,
        16], axis=0)` with dim 0 on 6 devices: 640 flops per device, not 3840; #635): a whole
        row's `n - 1` combines per output, also for a row longer than 16, which the unsharded
        scan reduces in blocks (`window_scan_factor`; fuzz seed 15 #111, `cumsum` of 2304
        elements on 4 devices: 1.33 M flops per device); and the arithmetic of each device's
        window offset."""
        if not len(self._scan_ops):
            return flops_local
        result = [self.ana.program.ops[i].results[0] for i in self._scan_ops.tolist()]
        result_ways = self.nbytes[result] / np.maximum(value_local[result], 1e-300)
        ways = np.exp2(op_logdeg[self._scan_ops])
        more = result_ways > ways * (1 + 1e-9)
        if not more.any():
            return flops_local
        out = flops_local.copy()
        ops = self._scan_ops[more]
        out[ops] = self.op_flops[ops] * self._scan_window[more] / result_ways[more]
        # The window's start: the device's index along the scanned dim times its shard length,
        # from the partition id (a convert and a multiply) when that dim is cut over the whole
        # mesh, else looked up in a table (a multiply; fuzz seed 19 #384, `cummin(x[4])` on a
        # 2 x 3 mesh: 6 combines and 1, 7 flops; `x[16]` on 8 devices: 30 and 2).
        whole = result_ways[more] / ways[more] >= self.mesh.n_devices * (1 - 1e-9)
        out[ops] += np.where(whole, 2.0, 1.0) * self.trip[ops]
        return out

    def _masked_gathers(self, flops_local, value_local, op_logdeg, masks) -> np.ndarray:
        """`flops_local` with each gather whose masked operand dims are cut (its iteration space
        cut more ways than its result) counted as XLA's partitioned gather runs it: index
        bookkeeping and a select per local result element; and each fill-mode gather's mask
        counted on its result and index shards (`masked_gather.py`). Flops only, like
        `_folded`. A gather whose masked dims are cut along the axes that cut its result (a
        conflict: its work cut more ways than its mesh axes give) gathers them whole, as
        XLA's partitioner does (fuzz seed 16 #544, `take_along_axis` of an `argsort`)."""
        if not len(self._gather_ops):
            return flops_local
        prog = self.ana.program
        ways = np.exp2(op_logdeg[self._gather_ops])
        result = [prog.ops[i].results[0] for i in self._gather_ops.tolist()]
        result_ways = self.nbytes[result] / np.maximum(value_local[result], 1e-300)
        out = flops_local.copy()
        for j in range(len(self._gather_ops)):
            i = int(self._gather_ops[j])
            idx = prog.ops[i].operands[1]
            index_ways = self.nbytes[idx] / max(float(value_local[idx]), 1e-300)
            masked_ways = float(ways[j] / result_ways[j])
            if self._conflicting(i, float(ways[j]), masks):
                masked_ways = 1.0  # conflicting cuts: the masked dims are gathered
            whole = masked_ways >= self.mesh.n_devices * (1 - 1e-9)
            local = masked_gather_flops(
                prog.ops[i],
                prog,
                masked_ways,
                float(result_ways[j]),
                index_ways,
                whole,
                float(self._gather_masks[j]),
            )
            out[i] = local * self._gather_runs[j]
        return out

    def _conflicting(self, i: int, ways: float, masks) -> bool:
        """Whether op `i`'s work is cut more ways than the mesh axes cutting it give (two of its
        factors cut along one axis: XLA's partitioner gathers one of them first)."""
        rows = self.op_work_fine
        atoms = rows.indices[rows.indptr[i] : rows.indptr[i + 1]]
        axes = int(np.bitwise_or.reduce(masks[atoms])) if len(atoms) else 0
        return ways > self.axes.ways[axes] * (1 + 1e-9)

    def _sharded_scatters(self, flops_local, value_local, op_logdeg, masks) -> np.ndarray:
        """`flops_local` with each scatter counted on the updates each device holds, plus the
        index offsets when its operand's indexed dims are cut (`sharded_scatter.py`). Flops
        only, like `_folded`."""
        if not len(self._scatter_ops):
            return flops_local
        prog = self.ana.program
        ways = np.exp2(op_logdeg[self._scatter_ops])
        out = flops_local.copy()
        for j, i in enumerate(self._scatter_ops.tolist()):
            op = prog.ops[i]
            upd, idx = op.operands[2], op.operands[1]
            updates_ways = self.nbytes[upd] / max(float(value_local[upd]), 1e-300)
            index_ways = self.nbytes[idx] / max(float(value_local[idx]), 1e-300)
            indexed_ways = float(ways[j]) / updates_ways
            if self._conflicting(i, float(ways[j]), masks):
                indexed_ways = 1.0
            local = local_scatter_flops(op, prog, updates_ways, indexed_ways, index_ways)
            out[i] = local * self._scatter_runs[j]
        return out

    def _halo_convs(self, flops_local, fine_logdeg, op_logdeg) -> np.ndarray:
        """`flops_local` with each convolution whose result is cut along a spatial dim counted
        on the windowed input XLA's partitioner builds: every tap of the local outputs (the
        padding is data now) and the select masking the padding (`halo_conv.py`). Flops only,
        like `_folded`."""
        if not len(self._conv_ops):
            return flops_local
        prog, out = self.ana.program, None
        for i, runs in zip(self._conv_ops.tolist(), self._conv_runs.tolist()):
            op = prog.ops[i]
            lhs_ways, res_ways = (
                tuple(
                    float(np.exp2(sum(fine_logdeg[f] for f in fines)))
                    for fines in self.lay.value_dim_fine[v]
                )
                for v in (op.operands[0], op.results[0])
            )
            out_ways = tuple(res_ways[od] for _, _, od in spatial_dims(op))
            if max(out_ways, default=1.0) <= 1 + 1e-9:
                continue
            share = float(np.exp2(-op_logdeg[i]))
            local = halo_conv_flops(op, prog, share, out_ways, lhs_ways)
            if local is None:
                continue
            if out is None:
                out = flops_local.copy()
            out[i] = local * runs
        return flops_local if out is None else out

    def _sharded_random_bits(self, flops_local, masks) -> np.ndarray:
        """`flops_local` with each `random_bits` whose result is cut counted as XLA's partitioner
        runs it: the threefry on the local elements and each element's counter, its global
        index, from the device's offsets (`flops_measured.sharded_random_bits_flops`; fuzz seed
        19 #2512, the dropout of x[2, 16] cut 8 ways, 0.911 of XLA's flops as the global
        count's share). Flops only, like `_folded`."""
        if not self._bits_ops:
            return flops_local
        prog = self.ana.program
        space = space_of(self.ana, self.mesh)
        sizes = dict(zip(self.mesh.axis_names, self.mesh.axis_sizes))
        whole = tuple(a for a in self.mesh.axis_names if sizes[a] > 1)
        out = flops_local
        for i, runs in self._bits_ops:
            op = prog.ops[i]
            axes = space.value_axes(masks, op.results[0])
            ways = tuple(prod(sizes[a] for a in names) for names in axes)
            if len(ways) != len(prog.values[op.results[0]].shape) or max(ways, default=1) <= 1:
                continue
            by_all = tuple(w > 1 and tuple(names) == whole for w, names in zip(ways, axes))
            out = out.copy() if out is flops_local else out
            out[i] = sharded_random_bits_flops(op, prog, ways, by_all) * runs
        return out

    def _local_sorts(self, flops_local, op_logdeg) -> np.ndarray:
        """`flops_local` with each sort counted on its local operand: XLA counts N log2 N over
        the N elements it sorts, so a device sorting N / k of them counts (N / k) log2(N / k),
        not the global count's share (fuzz seed 15 #59, a sort of 1,920 elements on 6 devices:
        2,880 flops per device, not 3,520)."""
        if not len(self._sort_ops):
            return flops_local
        ways = np.exp2(op_logdeg[self._sort_ops])
        if not (ways > 1 + 1e-9).any():
            return flops_local
        out = flops_local.copy()
        prog = self.ana.program
        for j, i in enumerate(self._sort_ops.tolist()):
            op = prog.ops[i]
            n = prog.values[op.operands[0]].size
            local = max(int(round(n / ways[j])), 1)
            out[i] = self.op_flops[i] * sort_flops_of(local) / sort_flops_of(n)
        return out

    def _moved_sorts(self, flops_local, masks) -> np.ndarray:
        """`flops_local` with each sort whose sorted dim is cut counted as XLA's partitioner runs
        it: it moves the sorted dim's shards onto another dim whose size they divide (with that
        dim's own cut), by an all-to-all, and each device sorts its 1 / (all the cuts) of the
        elements; with no such dim it gathers the sorted dim (measured: `sort(x[8, 4], axis=1)`
        with dim 1 cut 4 ways sorts [2, 4] on each device, 24 flops; [6, 4] sorts whole, 122;
        `x[8, 16]` cut (2, 4) sorted along dim 1 sorts [1, 16]; fuzz seed 19 #1827, 1.42 of
        XLA's flops, #2741, 2.36). Flops only, like `_folded`; a sort gathered along its dim
        keeps `_local_sorts`' count."""
        if not len(self._sort_ops):
            return flops_local
        prog = self.ana.program
        space = space_of(self.ana, self.mesh)
        sizes = dict(zip(self.mesh.axis_names, self.mesh.axis_sizes))
        out = flops_local
        for i in self._sort_ops.tolist():
            op = prog.ops[i]
            if op.primitive != "sort":
                continue  # top_k: the partitioner's own top-k path
            shape = prog.values[op.operands[0]].shape
            d = int(op.param("dimension", len(shape) - 1)) % max(len(shape), 1)
            cuts = [prod(sizes[a] for a in names) for names in space.use_axes(masks, i, 0)]
            if len(cuts) != len(shape) or cuts[d] <= 1:
                continue
            n = prog.values[op.operands[0]].size
            if not any(shape[e] % (cuts[e] * cuts[d]) == 0 for e in range(len(shape)) if e != d):
                continue  # gathered along the sorted dim: `_local_sorts`' count
            local = max(n // prod(cuts), 1)
            out = out.copy() if out is flops_local else out
            out[i] = self.op_flops[i] * sort_flops_of(local) / sort_flops_of(n)
        return out

    def _roofline(self, flops_local, trans_local, bytes_local) -> np.ndarray:
        """Per-op time: compute or HBM traffic, whichever is slower (the incremental evaluator
        prices its subsets of ops through this too, so its times are the same floats)."""
        return np.maximum(
            (flops_local + trans_local) / self.peak_flops, bytes_local / self.hw.hbm_bytes_per_s
        )

    def _reshard_reads(self, r: _Reshards, value_local):
        """(op, value, site, extra bytes) of every use reading a reshard's new buffer, in site
        order: an op reading a value all-gathered before it reads the gathered buffer, not the
        value's local shard (FSDP: a layer's matmul reads the full weight, as XLA's fusion takes
        the all-gather's result). Only materialized values read by ops that move bytes: the op's
        own bytes count those (`op_values`); the extra is the new buffer beyond the local size."""
        grown = r.buffer - 1.0
        keep = (grown[r.read_of] > 0) & self._is_mat[r.value[r.read_of]] & self._moves[r.read_op]
        of = r.read_of[keep]
        value = r.value[of]
        return r.read_op[keep], value, r.read_site[keep], value_local[value] * grown[of]

    def _read_extra(self, masks, value_local) -> np.ndarray:
        """[ops]: bytes each op reads beyond its operands' local sizes (`_reshard_reads`), each
        op's reads summed in site order (the incremental evaluator sums them in that order)."""
        ops, _, _, extra = self._reshard_reads(self._reshards(masks), value_local)
        return np.bincount(ops, weights=extra, minlength=self.n_ops)

    def _memory(
        self,
        value_local,
        masks,
        remat: RematEffect | None = None,
        pairs=(),
        align_bytes: int = 0,
        cpu_buffers: bool = False,
    ):
        """(persistent bytes, live bytes after each op). Resharded copies made at cuts live from
        their first to their last reader; residuals that remat drops live twice, briefly, and so
        does a copy read by a remat'd block and by the backward part (`pairs`: the remat
        policies): like `jax.checkpoint`, whose backward reads the block's inputs through the
        barrier, FSDP gathers a layer's weights again for its backward instead of keeping them
        gathered from the forward. `align_bytes` rounds each temporary buffer (not the inputs
        and outputs, which get allocations of their exact size) up to that multiple, as a
        backend that places temporaries at aligned offsets of one block does.
        `cpu_buffers` adds the temporaries only XLA:CPU makes (`cpu_buffers`: layout copies of
        dot operands, threefry loops)."""
        # The timeline's changes, added to zeros in the order listed: one `np.bincount`, which
        # adds them one by one as `np.add.at` would, in one call.
        b = value_local[self.live_ids]
        if align_bytes:
            b = np.where(self._live_is_output, b, round_up(b, align_bytes))
        at, add = [self.born, self.dies], [b, -b]
        r = self._reshards(masks)
        if len(r.value):
            extra = value_local[r.value] * r.buffer
            if align_bytes:
                extra = round_up(extra, align_bytes)
            at += [r.lo, r.hi + 1]
            add += [extra, -extra]
            if pairs:
                split = self._remat_block_ops(pairs)[r.lo] & (r.fwd_hi >= 0)
                split &= r.bwd_lo > r.fwd_hi + 1
                at += [r.fwd_hi[split] + 1, r.bwd_lo[split]]
                add += [-extra[split], extra[split]]
        if cpu_buffers:
            extra, lo, end = cpu_temporaries(self, value_local, align_bytes)
            at += [lo, end]
            add += [extra, -extra]
        delta = _added(self.n_ops + 2, at, add)
        if remat is not None:
            whole = round_up(value_local, align_bytes) if align_bytes else value_local
            held = whole * self._in_memory
            shorten_lifetimes(delta, held, self._after_own_life(remat))
            hold_barrier_inputs(delta, whole, remat, self._is_fused, self._producer)
            if len(remat.values):
                vals, new, old = self._remat_liveness(remat)
                np.add.at(delta, new + 1, -held[vals])
                np.add.at(delta, old + 1, held[vals])
        timeline = np.add.accumulate(delta[: self.n_ops])  # `np.cumsum`, minus its wrapper
        persistent = float(value_local[self.persistent_ids].sum())
        return persistent, timeline

    @property
    def live_end(self) -> np.ndarray:
        """Per value, the op after its last reader (its buffer's end), -1 for a value with
        no buffer of the step (inputs kept for the whole step, values never made)."""
        return self._live_end

    def score(self, masks: np.ndarray, remat: tuple = ()) -> Score:
        """Fast path: step time and peak memory of a fine-class mask assignment and remat
        policies ((group index, policy index) pairs, see `strategy/remat.py`)."""
        _, value_local, op_logdeg = self._local(masks)
        _, _, _, t = self._compute(value_local, op_logdeg, self._read_extra(masks, value_local))
        compute_s = float(t.sum())
        coll = self._collective_arrays(masks, value_local)  # listed once, priced twice
        comm_s = self._comm_s(masks, value_local, coll)
        eff = remat_effect(self.remat, remat) if remat else None
        if eff is not None:
            compute_s += recompute_time_s(t, eff)
            comm_s += recompute_comm_s(self, masks, value_local, eff, coll)
        persistent, timeline = self._memory(value_local, masks, eff, remat)
        peak = persistent + (float(timeline.max()) if len(timeline) else 0.0)
        step = compute_s + (1.0 - self.overlap) * comm_s
        return Score(step, compute_s, comm_s, peak, peak <= self.capacity_bytes)

    def report(
        self,
        strategy: Strategy,
        masks: np.ndarray | None = None,
        *,
        buffer_align_bytes: int = 0,
        cpu_buffers: bool = False,
    ) -> CostReport:
        """The attributable report of one strategy (validated first). `buffer_align_bytes`
        rounds every temporary buffer up to that multiple (see `_memory`): the memory of a
        backend that aligns them, such as XLA:CPU when the report is compared with it;
        `cpu_buffers` adds the temporaries only XLA:CPU makes (`cpu_buffers`)."""
        if masks is None:
            masks = strategy.fine_masks(self.ana, self.mesh)
        fine_logdeg, value_local, op_logdeg = self._local(masks)
        flops_local, trans_local, bytes_local, t = self._compute(
            value_local, op_logdeg, self._read_extra(masks, value_local)
        )
        flops_local = self._folded(flops_local, value_local, op_logdeg)
        flops_local = self._moved_sorts(flops_local, masks)
        flops_local = self._masked_gathers(flops_local, value_local, op_logdeg, masks)
        flops_local = self._sharded_scatters(flops_local, value_local, op_logdeg, masks)
        flops_local = self._halo_convs(flops_local, fine_logdeg, op_logdeg)
        flops_local = self._sharded_random_bits(flops_local, masks)
        collectives = self._collectives(masks, value_local)
        eff = remat_effect(self.remat, self._remat_pairs(strategy))
        again = recomputed_collectives(collectives, eff)
        comm_s = sum(c.time_s * c.count for c in collectives + again)
        compute_s = float(t.sum()) + recompute_time_s(t, eff)
        recompute_flops = float(flops_local[eff.twice_ops].sum())
        persistent, timeline = self._memory(
            value_local,
            masks,
            eff,
            self._remat_pairs(strategy),
            buffer_align_bytes,
            cpu_buffers,
        )
        peak_i = int(np.argmax(timeline)) if len(timeline) else -1
        peak = persistent + (float(timeline[peak_i]) if len(timeline) else 0.0)
        step = compute_s + (1.0 - self.overlap) * comm_s
        ideal = self.total_flops / (self.mesh.n_devices * self.hw.peak_flops_per_s)
        prog = self.ana.program

        def floats(x) -> list[float]:
            return np.asarray(x, dtype=np.float64).tolist()

        # One OpCost per op, 40k at GPT-3 175B: built from lists (`float(a[i])` on a NumPy
        # array per field was most of the report, paid after the search's time budget).
        op_costs = tuple(
            map(
                OpCost,
                range(len(prog.ops)),
                [op.primitive for op in prog.ops],
                floats(flops_local),
                floats(bytes_local),
                floats(t),
                floats(trans_local),
            )
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
            flops_per_device=float(flops_local.sum())
            + recompute_flops
            + reduction_flops(collectives + again, prog),
            total_flops=self.total_flops,
            persistent_bytes=persistent,
            transcendentals_per_device=float(trans_local.sum()),
            collectives=tuple(collectives),
            op_costs=op_costs,
            memory_timeline=tuple((timeline + persistent).tolist()),
            peak_op=peak_i,
            recompute_flops_per_device=recompute_flops,
            remat=strategy.remat,
        )

    @cached_property
    def _cpu_buffers(self) -> tuple[np.ndarray, ...]:
        """XLA:CPU's extra temporaries: dot and conv operand layout copies, threefry loops,
        select-and-scatter expansions (`cpu_buffers`)."""
        return self.live_cpu_rows(cpu_buffers(self.ana.program, self._is_mat.tolist()))

    @cached_property
    def dot_broadcasts(self) -> np.ndarray:
        """The broadcasts XLA:CPU remakes per layout its dots read them in
        (`cpu_buffers.dot_broadcasts`): their own buffers are not in the CPU view."""
        return np.array(dot_broadcasts(self.ana.program, self._is_mat.tolist()), dtype=np.int64)

    def live_cpu_rows(self, rows: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """`cpu_buffers` rows without those whose last op is dead (XLA removes it: a dot of the
        discarded loss of a gradient-accumulation loop copies no operand), and a repeat's row
        merged into its original's (`merged_repeat_rows`)."""
        keep = self._op_live[rows[2]]
        rows = rows if keep.all() else tuple(a[keep] for a in rows)
        return merged_repeat_rows(rows, self._repeat_of)

    @cached_property
    def _repeat_of(self) -> list[int]:
        """Per value, the earlier value XLA's CSE merges it into (itself if none:
        `simplify.cse_repeats`)."""
        return cse_repeats(self.ana.program)

    def _remat_pairs(self, strategy: Strategy) -> tuple:
        """(group index, policy index) pairs of a strategy's remat policies."""
        out = []
        for group, policy in strategy.remat:
            g = self.remat.index(group)
            if g is None:
                raise ToastError(bad_value("strategy.remat", group, "a remat group of ana"))
            out.append((g, POLICIES.index(policy)))
        return tuple(sorted(out))

    # -- collectives ----------------------------------------------------------------------------

    def _collective_arrays(self, masks: np.ndarray, value_local: np.ndarray):
        """Every collective as parallel arrays: (kind index, mesh-axis mask, V bytes, op, value,
        combiner site; see `_combine_setup`)."""
        if not hasattr(self, "_site_static"):
            self._combine_setup()
        parts = []
        # Sharded reductions -> all-reduce, or reduce-scatter into consumers sharded on the axis.
        if len(self.red_fine):
            m = masks[self.red_fine]
            act = m.nonzero()[0]
            if len(act):
                m = m[act]
                scatter = m & self._scan_common(masks)[act]
                for r in (self.red_split[act, 0] >= 0).nonzero()[0].tolist():
                    pid, pieces = self.red_split[act[r]].tolist()
                    scatter[r] |= m[r] & self._partial_target(pid, self.rep_pieces[pieces], masks)
                ops, vals = self.red_op[act], self.red_value[act]
                v = value_local[vals]
                site = self._red_site[act]
                arg = self.red_arg_operand[act] >= 0
                scatter[arg] = 0
                parts.append(
                    (np.full(len(act), AR), np.where(arg, 0, m & ~scatter), v, ops, vals, site)
                )
                parts.append((np.full(len(act), RS), scatter, v, ops, vals, site))
                if arg.any():
                    parts += self._arg_reduction_gathers(act[arg], m[arg], v[arg])
        # Cuts and reshape conflicts -> reshard at the use (see `_compute_reshards`).
        r = self._reshards(masks)
        if len(r.kind):
            vals = r.value[r.of]
            v = value_local[vals] * r.factor
            ops = r.op[r.of]
            parts.append((r.kind, r.mask, v, ops, vals, self._use_site(ops, vals)))
        # Replicate factors on sharded dims -> all-gather of the operand; XLA's own resharding
        # of a concatenate's operands and a split / slice's operand (concat_slice.py).
        if len(self.rep):
            parts += self._replicate_collectives(masks, value_local)
        if len(self.cat):
            parts += self._concat_result_collectives(masks, value_local)
        # Permute factors on sharded dims -> a one-row halo exchange.
        if len(self.per):
            m = masks[self.per[:, 2]]
            vals = self.per[:, 1]
            local_len = np.maximum(self.per[:, 3] / self.mask_ways[m], 1.0)
            parts.append(
                (
                    np.full(len(m), CP),
                    m,
                    value_local[vals] / local_len,
                    self.per[:, 0],
                    vals,
                    self._per_site,
                )
            )
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0), empty, empty, empty
        kinds, ms, vs, ops, vals, sites = (np.concatenate(x) for x in zip(*parts))
        ms = ms & self.real_axes  # a collective over a size-1 mesh axis is no collective at all
        keep = (ms != 0) & (vs > 0) & self._op_live[ops]
        if len(self._dead_use_codes):
            keep &= ~np.isin(ops * len(self.ana.program.values) + vals, self._dead_use_codes)
        return kinds[keep], ms[keep], vs[keep], ops[keep], vals[keep], sites[keep]

    def _arg_reduction_gathers(self, rows: np.ndarray, m: np.ndarray, v: np.ndarray) -> list:
        """An argmax / argmin over a dim sharded on mesh axes M (reduction rows `rows`, local
        result bytes `v`): XLA reduces each shard locally, all-gathers the shards' maxima (in the
        operand's dtype) and their indices (s32) over M, and reduces those; no all-reduce
        (measured: argmax of f32[4, 16] over dim 1 sharded 8 ways: all-gathers of f32[4, 8] and
        s32[4, 8]; the same for argmin, for dim 0, for two mesh axes, bf16 gathered in f32 on
        CPU). The maxima are attributed to the operand (its dtype), the indices to the result."""
        full = v * self.mask_ways[m]
        ops, site = self.red_op[rows], self._red_site[rows]
        ag = np.full(len(rows), AG)
        return [
            (ag, m, full, ops, self.red_value[rows], site),
            (ag, m, full * self.red_arg_ratio[rows], ops, self.red_arg_operand[rows], site),
        ]

    def _replicate_collectives(self, masks: np.ndarray, value_local: np.ndarray) -> list:
        """Collectives of the replicate rows (kind, axes, V, op, value, site arrays): an
        all-gather of the operand, except where XLA reshards otherwise (concat_slice.py): a
        concatenate's operand moves its shards to another dim (all-to-all, same V); a split /
        slice piece whose result stays sharded alike takes halos (collective-permutes); a strided
        slice takes its own elements of each shard (nothing, or a gather of the result)."""
        rep = self.rep
        m = masks[rep[:, 2]]
        vals = rep[:, 1]
        ways = self.mask_ways[m]
        before = self.rep_before
        # The operand as the gathers of its later dims left it (see `rep_before`).
        grown = np.where(before >= 0, self.mask_ways[masks[np.maximum(before, 0)]], 1.0)
        kinds = np.full(len(m), AG)
        kinds[(rep[:, 3] == CONCAT) & (rep[:, 4] % ways == 0)] = A2A
        keep = np.ones(len(m), dtype=bool)
        extra: list[tuple[int, int, float, int, int, int]] = []
        piece_fines = self.rep_piece_fines
        pieces_sharded = (
            np.where(piece_fines >= 0, masks[np.maximum(piece_fines, 0)], 0) & self.real_axes
        ).any(axis=1)
        strided = np.flatnonzero((rep[:, 3] == STRIDE) & ((m & self.real_axes) != 0))
        scale = np.ones(len(m))
        for k in strided.tolist():
            ((_, rf, dim_size, _, _),) = self.rep_pieces[int(rep[k, 5])]
            held = int(m[k]) & self.real_axes
            n, stride = int(self.mask_ways[held]), int(rep[k, 4])
            if dim_size % n or (dim_size // n) % stride:
                continue  # shards out of step with the stride: the operand is gathered
            if int(masks[rf]) & self.real_axes == held:
                keep[k] = False  # each shard slices its own elements
            else:
                scale[k] = 1.0 / stride  # the result is gathered, not the operand
        slices = (rep[:, 3] == SLICE) & (
            ((m & self.real_axes) != 0) | (rep[:, 6] >= 0) | pieces_sharded
        )
        for k in np.flatnonzero(slices).tolist():
            pieces = self.rep_pieces[int(rep[k, 5])]
            held = int(m[k]) & self.real_axes
            mk = held or self._partial_target(int(rep[k, 6]), pieces, masks)
            if not mk:
                extra += self._whole_operand_halos(k, pieces, masks, value_local)
                continue
            n = int(self.mask_ways[mk])
            local_len = pieces[0][2] / self.mask_ways[held]
            gather = False
            for _, rf, dim_size, start, size in pieces:
                sizes = None
                if int(masks[rf]) & self.real_axes == mk:
                    sizes = slice_halo_permutes(dim_size, n, start, size)
                if sizes is None:
                    gather = True
                    continue
                for s in sizes:
                    v = float(value_local[vals[k]]) * s / local_len
                    extra.append((CP, mk, v, int(rep[k, 0]), int(vals[k]), int(self._rep_site[k])))
            keep[k] = gather
        out = [
            (
                kinds[keep],
                m[keep],
                (value_local[vals] * ways * grown.prod(axis=1) * scale)[keep],
                rep[keep, 0],
                vals[keep],
                self._rep_site[keep],
            )
        ]
        if extra:
            cols = list(zip(*extra))
            out.append(
                (
                    np.array(cols[0], dtype=np.int64),
                    np.array(cols[1], dtype=np.int64),
                    np.array(cols[2], dtype=np.float64),
                    np.array(cols[3], dtype=np.int64),
                    np.array(cols[4], dtype=np.int64),
                    np.array(cols[5], dtype=np.int64),
                )
            )
        return out

    def _whole_operand_halos(
        self, k: int, pieces: tuple, masks: np.ndarray, value_local: np.ndarray
    ) -> list[tuple[int, int, float, int, int, int]]:
        """Halos of slicing a dim the operand holds whole into pieces sharded on it (replicate
        row k, neither sharded there nor a partial sum resharded so). XLA's partitioner first
        slices the operand locally to the piece's sharding on that dim, then reads the piece's
        window with the same halo exchange as for a sharded operand (`halo.py`); measured on
        f32[6, 4] replicated, `[0:3]` into 3 shards: one permute of 2 rows, as for the operand
        sharded 3 ways. Left to a local slice (nothing priced) when the operand holds the
        piece's mesh axes on another dim or the halo form does not apply."""
        rep = self.rep
        operand = 0
        for f in self.rep_operand_fines[k].tolist():
            if f >= 0:
                operand |= int(masks[f])
        vid = int(rep[k, 1])
        out = []
        for _, rf, dim_size, start, size in pieces:
            mk = int(masks[rf]) & self.real_axes
            if not mk or mk & operand:
                continue
            sizes = slice_halo_permutes(dim_size, int(self.mask_ways[mk]), start, size)
            for s in sizes or ():
                v = float(value_local[vid]) * s / dim_size
                out.append((CP, mk, v, int(rep[k, 0]), vid, int(self._rep_site[k])))
        return out

    def _partial_target(self, pid: int, pieces: tuple, masks: np.ndarray) -> int:
        """Mesh axes XLA shards the sliced dim of a replicate row's operand on although the
        strategy leaves it whole: the operand is a partial sum (over those axes) read only by
        the split / slice, whose pieces are all sharded on them. XLA's propagation gives the
        partial sum the pieces' sharding (all-reduce then dynamic-slice on CPU, a reduce-scatter
        elsewhere: priced so at the reduction, `red_split`) and then takes the halos.
        0 when that does not apply."""
        if pid < 0:
            return 0
        fines = self._partial_fines[pid]
        partial = 0
        for f in fines:
            partial |= int(masks[f])
        want = {int(masks[rf]) & self.real_axes for _, rf, *_ in pieces}
        if len(want) != 1:
            return 0
        mk = want.pop()
        return mk if mk and (mk & ~partial) == 0 else 0

    def _concat_result_collectives(self, masks: np.ndarray, value_local: np.ndarray) -> list:
        """XLA's reshard of a concatenate's result after its operands' shards moved to another
        dim (concat_slice.py): an all-to-all back onto the concatenated dim when the result is
        sharded there on the same mesh axes, an all-gather of the whole result otherwise
        (replicated there, or sharded on other mesh axes: then sliced locally, priced
        pessimistically). Operands whole on that dim into a result sharded there on mesh axes R:
        XLA concatenates locally, sharded on another dim by R (a free local slice), and moves R
        back by one all-to-all of the local result (measured: f32[6, 8] ++ f32[6, 8] on dim 1
        into [6, 16] sharded 2 ways: one all-to-all of 192 bytes; nothing when no other dim
        divides by the ways, [5, 8] ++ [5, 8]: sliced locally). When the operands' dim has size
        1 (`jnp.stack`), each operand takes an all-to-all of its local buffer first (measured:
        stacking k whole f32[8] into [k, 8] sharded n ways: k all-to-alls of 32 bytes, then one
        of the local result, for k, n = 2, 2; 4, 2; 4, 4)."""
        cat = self.cat
        m = np.where(cat[:, 3] >= 0, masks[np.maximum(cat[:, 3], 0)], 0) & self.real_axes
        r = masks[cat[:, 2]] & self.real_axes
        ways = self.mask_ways[m]
        movable = (m != 0) & (cat[:, 4] % ways == 0)
        back = movable & (r == m)
        whole = (m == 0) & (r != 0) & (cat[:, 4] % self.mask_ways[r] == 0)
        sel = movable | whole
        kinds = np.where(back | whole, A2A, AG)[sel]
        res = cat[:, 1]
        v = value_local[res] * np.where(back, ways, self.mask_ways[r])
        axes = np.where(whole, r, m)
        out = [(kinds, axes[sel], v[sel], cat[sel, 0], res[sel], self._cat_site[sel])]
        rows = np.flatnonzero(whole & (cat[:, 3] < 0))
        if len(rows):
            operands = self.cat_operands[rows]
            row, col = np.nonzero(operands >= 0)
            k = rows[row]
            ov = value_local[operands[row, col]] * self.mask_ways[r[k]]
            out.append((np.full(len(k), A2A), r[k], ov, cat[k, 0], res[k], self._cat_site[k]))
        return out

    def _reshards(self, masks: np.ndarray):
        """Memoized for the last mask vector: communication and memory both need it. The memo is
        one (key, value) tuple replaced whole, so a thread never reads another's value."""
        key = masks.tobytes()
        last = self._last_reshards
        if last is not None and last[0] == key:
            return last[1]
        value = self._compute_reshards(masks)
        self._last_reshards = (key, value)
        return value

    def _compute_reshards(self, masks: np.ndarray) -> _Reshards:
        """The reshards at cut uses, one per distinct (value, target layout) since XLA reshards a
        value once per target layout and reuses the buffer at every such use.

        Per mesh axis: held by the value and not the use -> all-gather (one per dim, see
        `_gathers`); held by both on different dims -> all-to-all (after the gathers, as XLA orders
        them); only by the use -> a free local slice. That is exact while each dim keeps its leading axes and only gains or loses axes at
        its end. A dim that loses some axes and gains others, or whose axes change while it holds
        several, goes through `_exact_reshard` (XLA permutes the shards there)."""
        ext = np.concatenate((masks, _ZERO))
        vsub, usub = ext[self.site_vf], ext[self.site_uf]
        vm, um = _or_last(vsub), _or_last(usub)
        # A site whose every dim keeps its (real) mesh axes reshards nothing: most sites, so
        # classify only the others (`cand`; the arrays below are over them).
        cand = _or_last((vm ^ um) & self.real_axes).nonzero()[0]
        if not len(cand):
            return _Reshards.empty()
        vm, um, vsub, usub = vm[cand], um[cand], vsub[cand], usub[cand]
        # A function of the candidates' layouts (and of the layout ids, which never change once
        # given), which a search meets again and again.
        memo = self._scalar_memo()
        key = (cand.tobytes(), vsub.tobytes(), usub.tobytes())
        r = memo.get(key)
        if r is None:
            if len(cand) <= SCALAR_SITES:
                r = self._scalar_reshards(cand, vm.tolist(), um.tolist(), vsub, usub)
            else:
                r = self._numpy_reshards(cand, vm, um, vsub, usub)
            with self._layout_ids_lock:
                if len(memo) >= self._scalar_kept:
                    memo.pop(next(iter(memo)))
                memo[key] = r
        return r

    def _numpy_reshards(self, cand, vm, um, vsub, usub) -> _Reshards:
        """`_compute_reshards`' result from its candidate sites `cand` and their layouts (per
        dim `vm`, `um` [cand, dim]; per sub-factor `vsub`, `usub` [cand, dim, sub-factor])."""
        hv, hu = _or_last(vm), _or_last(um)
        same = _or_last(vm & um)
        gather = hv & ~hu & self.real_axes
        moved = hv & hu & ~same & self.real_axes
        lose, gain = vm & ~um & self.real_axes, um & ~vm & self.real_axes
        several = (self.n_bits[vm & self.real_axes] > 1) | (self.n_bits[um & self.real_axes] > 1)
        changed = ((vm ^ um) & self.real_axes) != 0
        odd = (((lose != 0) & (gain != 0)) | (several & changed)).any(axis=1)
        active = np.flatnonzero(((gather | moved) != 0) | odd)
        if not len(active):
            return _Reshards.empty()
        key = (gather[active] << 8) | moved[active]
        odd_j = np.flatnonzero(odd[active])
        if len(odd_j):
            key[odd_j] = (1 << 18) | self._layout_id_of(usub[active[odd_j]])
        key |= self.site_value[cand[active]] << 20
        uniq, first_idx, inverse = np.unique(key, return_index=True, return_inverse=True)
        ops = self.site_op[cand[active]]
        lo = np.full(len(uniq), np.iinfo(np.int64).max)
        hi = np.full(len(uniq), -1)
        np.minimum.at(lo, inverse, ops)
        np.maximum.at(hi, inverse, ops)
        np.maximum.at(hi, inverse, self.site_hold[cand[active]])  # a loop's operands: held
        back = self._is_backward[ops]
        fwd_hi = np.full(len(uniq), -1)
        bwd_lo = np.full(len(uniq), self.n_ops)
        np.maximum.at(fwd_hi, inverse[~back], ops[~back])
        np.minimum.at(bwd_lo, inverse[back], ops[back])
        buffer, kind, mask, factor, of = self._reshard_collectives(
            active[first_idx], odd, vsub, usub, lose & ~hu[:, None], moved
        )
        first = cand[active[first_idx]]
        return _Reshards(
            value=self.site_value[first],
            op=self.site_op[first],
            lo=lo,
            hi=hi,
            buffer=buffer,
            kind=kind,
            mask=mask,
            factor=factor,
            of=of,
            fwd_hi=fwd_hi,
            bwd_lo=bwd_lo,
            read_op=ops,
            read_of=inverse,
            read_site=cand[active],
        )

    def _site_lists(self) -> tuple:
        """The site tables `_scalar_reshards` reads, as Python lists, and its memo (built once
        per object: a restricted view, `incremental._SitesOf`, has its own sites)."""
        lists = self.__dict__.get("_site_lists_memo")
        if lists is None:
            lists = self.__dict__["_site_lists_memo"] = (
                self.site_value.tolist(),
                self.site_op.tolist(),
                self.site_hold.tolist(),
                self._is_backward[self.site_op].tolist(),
                [float(w) for w in self.mask_ways.tolist()],
                self.n_bits.tolist(),
                {},
            )
        return lists

    def _scalar_memo(self) -> dict:
        """`_scalar_reshards`' results by (candidate sites, their value and use layouts)."""
        return self._site_lists()[-1]

    def _scalar_reshards(self, cand: np.ndarray, vms: list, ums: list, vsub, usub) -> _Reshards:
        """`_numpy_reshards`' result from its candidate sites `cand`, their per-dim mesh axes
        (value side `vms`, use side `ums`) and sub-factor masks (`vsub`, `usub` [cand, dim,
        sub-factor]), computed with Python ints and floats: the same
        classification, keys, layout ids (given in the same order), order and products, so the
        same arrays bit for bit, without the forty NumPy calls that cost more than the
        arithmetic on a few dozen sites. An odd site's collectives are `_exact_reshard`'s."""
        site_value, site_op, site_hold, backward, ways, n_bits, _ = self._site_lists()
        real = int(self.real_axes)
        active = []  # (key, site, gathered axes per dim or its position when odd, moved axes)
        for i, (s, vm_d, um_d) in enumerate(zip(cand.tolist(), vms, ums)):
            kinds = classify(vm_d, um_d, real, n_bits)
            if kinds is None:  # odd
                with self._layout_ids_lock:
                    ids = self._layout_ids
                    layout = ids.setdefault(usub[i].tobytes(), len(ids))
                active.append(((site_value[s] << 20) | (1 << 18) | layout, s, i, 0))
                continue
            gather, moved, gathered = kinds
            if gather | moved:
                active.append(((site_value[s] << 20) | (gather << 8) | moved, s, gathered, moved))
        if not active:
            return _Reshards.empty()
        groups = group_by_key(active, lambda s: (site_op[s], site_hold[s], backward[s]), self.n_ops)
        order = sorted(groups)
        of_key = {key: j for j, key in enumerate(order)}
        kind, mask, factor, of, buffer = [], [], [], [], []
        for j, key in enumerate(order):
            gathered, moved = groups[key][5], groups[key][6]
            if isinstance(gathered, int):  # odd (at this position in `cand`): XLA's permutes
                colls, grown = self._exact_reshard(vsub[gathered], usub[gathered])
                for c in colls:
                    kind.append(c[0])
                    mask.append(c[1])
                    factor.append(c[2])
                    of.append(j)
                buffer.append(grown)
                continue
            grown = 1.0  # the gathers, last dim first, each over what the ones before grew
            for g in reversed(gathered):
                grown = grown * ways[g]
                if g:
                    kind.append(AG)
                    mask.append(g)
                    factor.append(grown)
                    of.append(j)
            if moved:
                kind.append(A2A)
                mask.append(moved)
                factor.append(grown * ways[moved])
                of.append(j)
            buffer.append(grown)
        firsts = [groups[key][0] for key in order]

        def ints(x) -> np.ndarray:
            return np.array(x, dtype=np.int64)

        return _Reshards(
            value=ints([site_value[s] for s in firsts]),
            op=ints([site_op[s] for s in firsts]),
            lo=ints([groups[key][1] for key in order]),
            hi=ints([groups[key][2] for key in order]),
            buffer=np.array(buffer, dtype=np.float64),
            kind=ints(kind),
            mask=ints(mask),
            factor=np.array(factor, dtype=np.float64),
            of=ints(of),
            fwd_hi=ints([groups[key][3] for key in order]),
            bwd_lo=ints([groups[key][4] for key in order]),
            read_op=ints([site_op[s] for _, s, _, _ in active]),
            read_of=ints([of_key[key] for key, _, _, _ in active]),
            read_site=ints([s for _, s, _, _ in active]),
        )

    def _reshard_collectives(self, first, odd, vsub, usub, gathered, moved):
        """Collectives of the reshards at sites `first` as arrays (kind, mesh axes, V / local
        bytes, index of their reshard), ordered by reshard and, within one, as XLA issues them,
        and every reshard's new buffer size / local bytes. `gathered` [site, dim]: the axes each
        dim loses to no other dim; `moved` [site]: the axes that change dim.

        The plain reshards (not `odd`) are priced all at once: the same arithmetic as
        `_gathers` then one all-to-all, as a cumulative product over the dims, last dim first
        (the same multiplications in the same order, so bit-identical results); only the odd ones
        go through `_exact_reshards`."""
        n = len(first)
        is_odd = odd[first]
        plain = np.flatnonzero(~is_odd)
        buffer = np.ones(n)
        parts = []
        if len(plain):
            sites = first[plain]
            # [reshard, slot]: the all-gathers (last dim first), then the all-to-all.
            g = gathered[sites][:, ::-1]
            grown = np.cumprod(self.mask_ways[g], axis=1)
            ways = grown[:, -1] if g.shape[1] else np.ones(len(plain))
            buffer[plain] = ways
            mv = moved[sites]
            m = np.concatenate([g, mv[:, None]], axis=1)
            f = np.concatenate([grown, (ways * self.mask_ways[mv])[:, None]], axis=1)
            k = np.full(m.shape, AG, dtype=np.int64)
            k[:, -1] = A2A
            rows, slots = np.nonzero(m)
            parts.append((k[rows, slots], m[rows, slots], f[rows, slots], plain[rows]))
        odd_rows = np.flatnonzero(is_odd)
        if len(odd_rows):
            parts.append(self._exact_reshards(odd_rows, first[odd_rows], vsub, usub, buffer))
        if not parts:
            i = np.zeros(0, dtype=np.int64)
            return buffer, i, i, np.zeros(0), i
        kind, mask, factor, of = (np.concatenate(x) for x in zip(*parts))
        if len(parts) > 1:  # back in reshard order; stable keeps each reshard's own order
            order = np.argsort(of, kind="stable")
            kind, mask, factor, of = kind[order], mask[order], factor[order], of[order]
        return buffer, kind, mask, factor, of

    def _layout_id_of(self, targets: np.ndarray) -> np.ndarray:
        """[site] ids of the use layouts `targets` [site, dim, sub-factor] (ids given in order of
        first appearance, kept for the evaluator's life): one dictionary look-up per distinct
        layout, not per site."""
        rows, first, inverse = _distinct_rows(targets, self.n_axes)
        ids = np.empty(len(rows), dtype=np.int64)
        with self._layout_ids_lock:
            for u in np.argsort(first, kind="stable").tolist():
                ids[u] = self._layout_ids.setdefault(rows[u].tobytes(), len(self._layout_ids))
        return ids[inverse]

    def _exact_reshards(self, rows, sites, vsub, usub, buffer):
        """`_exact_reshard` of the reshards `rows` (at `sites`) as arrays (kind, mesh axes,
        V / local bytes, index of their reshard), each reshard's collectives in order; writes
        their buffer sizes into `buffer`. One call per distinct (value, use) layout pair: a deep
        model repeats the same few layer after layer."""
        pairs = np.concatenate(
            [vsub[sites].reshape(len(sites), -1), usub[sites].reshape(len(sites), -1)], axis=1
        )
        _, first, inverse = _distinct_rows(pairs, self.n_axes)
        n = len(first)
        colls = [self._exact_reshard(vsub[i], usub[i]) for i in sites[first].tolist()]
        buffer[rows] = np.array([b for _, b in colls])[inverse]
        lengths = np.array([len(c) for c, _ in colls], dtype=np.int64)
        flat = [c for cs, _ in colls for c in cs]
        kind = np.array([c[0] for c in flat], dtype=np.int64)
        mask = np.array([c[1] for c in flat], dtype=np.int64)
        factor = np.array([c[2] for c in flat], dtype=np.float64)
        starts = np.zeros(n, dtype=np.int64)
        starts[1:] = np.cumsum(lengths)[:-1]
        take = _ranges(starts[inverse], lengths[inverse])
        return kind[take], mask[take], factor[take], np.repeat(rows, lengths[inverse])

    def _gathers(self, per_dim: np.ndarray) -> tuple[list, float]:
        """All-gathers of the axes each dim loses: XLA gathers one dim at a time, the last dim
        first, each over a buffer grown by the previous ones. Returns them (kind, axes, V / local
        bytes) and the gathered buffer size / local bytes."""
        out, grown = [], 1.0
        for m in reversed(per_dim.tolist()):
            if m:
                grown *= self.mask_ways[m]
                out.append((AG, m, grown))
        return out, grown

    def _exact_reshard(self, vsub: np.ndarray, usub: np.ndarray):
        """Collectives (kind, mesh axes, V / local bytes) and new-buffer size / local bytes of one
        reshard, from the ordered mesh axes of every dim (sub-factors major first), as XLA's
        partitioner does it (measured): each dim keeps the axes its value and use layouts share
        as a prefix; an axis leaving one dim for another moves by all-to-all; a dim that loses
        axes X and gains axes Y exchanges shards by collective-permute (of the target shard when
        Y splits at least as finely as X, else of the local shard followed by an all-gather up to
        the target shard); a dim that only loses axes is all-gathered."""
        key = (vsub.tobytes(), usub.tobytes(), vsub.shape)
        hit = self._exact_cache.get(key)
        if hit is not None:
            return hit
        real = self.real_axes

        def ordered(subs) -> list[int]:
            return [a for m in subs.tolist() for a in self.axes.indices(m & real)]

        lost, gained = [], []
        for tv, tu in zip(map(ordered, vsub), map(ordered, usub)):
            k = 0
            while k < min(len(tv), len(tu)) and tv[k] == tu[k]:
                k += 1
            lost.append(sum(self.axes.bit(a) for a in tv[k:]))
            gained.append(sum(self.axes.bit(a) for a in tu[k:]))
        moved = 0
        for d, x in enumerate(lost):
            for e, y in enumerate(gained):
                if d != e:
                    moved |= x & y
        colls, buffer, plain = [], 1.0, []
        for x, y in zip(lost, gained):
            x, y = x & ~moved, y & ~moved
            if x and y:
                g, s = self.mask_ways[x], self.mask_ways[y]
                colls.append((CP, x | y, g / s if s >= g else 1.0))
                if s < g:
                    # The gather runs among the devices that hold pieces of one target shard:
                    # over the lost axes the dim keeps none of, when they are that many (F on
                    # (data, model) -> F on model: a permute, then a gather over data alone).
                    only = x & ~y
                    colls.append((AG, only if self.mask_ways[only] * s == g else x, g / s))
                buffer *= g / s
            plain.append(0 if y else x)
        gathers, ways = self._gathers(np.array(plain, dtype=np.int64))
        colls += gathers + [(A2A, moved, ways * self.mask_ways[moved])]
        result = (tuple(c for c in colls if c[1]), buffer * ways)
        self._exact_cache[key] = result
        return result

    def _comm_s(self, masks, value_local, coll=None) -> float:
        """Communication time: every member's bandwidth term, and the latency once per combined
        op (the latency of a group's first member, all members having the same kind and axes).
        `coll`: `_collective_arrays(masks, value_local)` when the caller has it already."""
        if coll is None:
            coll = self._collective_arrays(masks, value_local)
        kinds, ms, vs, ops, _, sites = coll
        total = float((self.c1[kinds, ms] * vs * self.site_trip[sites]).sum())
        return total + self.latency_s(kinds, ms, vs, ops, sites)

    # -- combining (XLA's combiner passes, see combine.py) --------------------------------------

    def _combine_setup(self) -> None:
        """Combiner sites of every possible collective and their dependence bitsets (once per
        evaluator): a partial sum sits on the result of its op; reshards, gathers of replicate
        factors and halos on the use of the value by the op that reads it."""
        prog = self.ana.program
        index: dict[tuple[str, int, int], int] = {}

        def site(where: str, op: int, value: int) -> int:
            return index.setdefault((where, int(op), int(value)), len(index))

        self._red_site = np.array(
            [site("result", o, v) for o, v in zip(self.red_op, self.red_value)], dtype=np.int64
        )
        use_pairs = {(int(o), int(v)) for v, o, _ in self.sites}
        for o, v in use_pairs:
            site("use", o, v)
        self._rep_site = np.array(
            [site("use", o, v) for o, v in self.rep[:, :2].tolist()], dtype=np.int64
        )
        self._per_site = np.array(
            [site("use", o, v) for o, v in self.per[:, :2].tolist()], dtype=np.int64
        )
        self._cat_site = np.array(
            [site("result", o, v) for o, v in self.cat[:, :2].tolist()], dtype=np.int64
        )
        n_values = len(prog.values)
        codes = sorted((o * n_values + v, k) for (w, o, v), k in index.items() if w == "use")
        self._use_codes = np.array([c for c, _ in codes], dtype=np.int64)
        self._use_ids = np.array([k for _, k in codes], dtype=np.int64)
        sites = list(index)
        self._site_inputs = site_inputs(
            [op.operands for op in prog.ops], [op.results for op in prog.ops], sites
        )
        self._op_rank = np.array(
            post_order(
                [op.operands for op in prog.ops], [op.results for op in prog.ops], prog.outputs
            ),
            dtype=np.int64,
        )
        # Executions per step and computation of each site: a collective on the use of a loop
        # constant is hoisted out of the loop (hoist.py), a partial sum runs where its op does.
        trips, regions = use_counts(prog, [(o, v) for _, o, v in sites])
        region = region_of_ops(
            [op.primitive for op in prog.ops], [op.region_depth for op in prog.ops]
        )
        for k, (where, o, _) in enumerate(sites):
            if where == "result":
                trips[k], regions[k] = self.trip[o], region[o]
        self.site_trip = trips
        # XLA combines only all-reduces of one reduction computation: a product's never joins a
        # sum's (fuzz seed 19 #110, `sum(x * x)` and `prod(1 + 0.1 * tanh(x))` on 8: two).
        reducers = {
            "reduce_max": "max",
            "argmax": "max",
            "reduce_min": "min",
            "argmin": "min",
            "reduce_prod": "mul",
            "reduce_and": "and",
            "reduce_or": "or",
            "reduce_xor": "xor",
        }
        statics: dict[tuple, int] = {}
        target, cpu = [], []
        for (where, o, v), r in zip(sites, regions.tolist()):
            dtype = prog.values[v].dtype
            reducer = reducers.get(prog.ops[o].primitive, "add") if where == "result" else ""
            target.append(statics.setdefault((dtype, reducer, r), len(statics)))
            # XLA's CPU backend runs bf16 collectives in f32 (all-reduce promotion).
            dtype = "float32" if dtype == "bfloat16" else dtype
            cpu.append(statics.setdefault((dtype, reducer, r), len(statics)))
        self._site_static = {False: np.array(target, dtype=np.int64)}
        self._site_static[True] = np.array(cpu, dtype=np.int64)
        self._thresholds = {
            False: {KIND_INDEX[k]: t for k, t in self.hw.combine_threshold_bytes},
            True: {KIND_INDEX[k]: t for k, t in XLA_CPU_COMBINE},
        }
        # Per kind: the byte limit (-1: never combines); per (kind, axes): V / result bytes.
        self._limit = {}
        for cpu, thresholds in self._thresholds.items():
            limit = np.full(len(COLLECTIVE_KINDS), -1.0)
            for k, t in thresholds.items():
                limit[k] = t if t > 0 else -1.0
            self._limit[cpu] = limit
        self._cpu_kind = np.arange(len(COLLECTIVE_KINDS))
        self._cpu_kind[RS] = AR
        divisor = np.ones((len(COLLECTIVE_KINDS), len(self.mask_ways)))
        divisor[RS] = divisor[A2A] = self.mask_ways
        self._result_div = {False: divisor, True: np.ones_like(divisor)}
        self._key_stride = len(self.mask_ways) << 3
        self._group_memo: dict[tuple, np.ndarray] = {}
        self._latency_memo: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # `latency_s`

    def _use_site(self, ops: np.ndarray, vals: np.ndarray) -> np.ndarray:
        """Combiner sites of collectives on the use of value `vals` by op `ops`."""
        codes = ops * len(self.ana.program.values) + vals
        return self._use_ids[np.searchsorted(self._use_codes, codes)]

    def _groups(self, kinds, ms, vs, ops, sites, cpu: bool = False) -> np.ndarray:
        """Combined-op id (index of its first member) of every collective. `cpu` combines them as
        XLA's CPU backend does (reduce-scatters run as all-reduces of the full buffer, bf16 in
        f32, only all-reduces combine, without a byte limit) to compare with its compiled text.
        On the search's hot path: a handful of numpy calls, then one pass of `combine`; the
        search meets the same collectives again often (about 40 % of calls on GPT-2), so the
        last few thousand results are kept."""
        if len(kinds) < 2:
            return np.arange(len(kinds))
        # A canonical order first, so that the grouping never depends on the order in which the
        # collectives were listed (the incremental evaluator lists them differently).
        order = np.lexsort((vs, ms, kinds, ops, sites))
        kinds, ms, vs, ops, sites = kinds[order], ms[order], vs[order], ops[order], sites[order]
        memo_key = (cpu, kinds.tobytes(), ms.tobytes(), sites.tobytes(), vs.tobytes())
        hit = self._group_memo.get(memo_key)
        if hit is None:
            if len(self._group_memo) >= 4096:
                self._group_memo.clear()
            hit = self._group_memo[memo_key] = self._combine_groups(kinds, ms, vs, ops, sites, cpu)
        group = np.empty_like(hit)
        group[order] = order[hit]
        return group

    def latency_s(self, kinds, ms, vs, ops, sites) -> float:
        """The latency part of communication: once per combined op (its first member's).

        `_groups`' work, kept leaner for the search's hot path (every evaluation pays it): the
        memo, keyed like `_groups`' by the collectives in canonical order, holds the canonical
        positions of the combined ops' first members and their latencies, which the listing
        order then sums (the same products added in the same order as summing the latencies
        of the listed collectives that lead a combined op, so the same float)."""
        n = len(kinds)
        if n < 2:
            return float((self.c0[kinds, ms] * self.site_trip[sites]).sum()) if n else 0.0
        order = np.lexsort((vs, ms, kinds, ops, sites))
        k, m, s, v = kinds[order], ms[order], sites[order], vs[order]
        memo_key = (False, k.tobytes(), m.tobytes(), s.tobytes(), v.tobytes())
        hit = self._latency_memo.get(memo_key)
        if hit is None:
            group = self._group_memo.get(memo_key)
            if group is None:
                group = self._combine_groups(k, m, v, ops[order], s, False)
            firsts = np.flatnonzero(group == np.arange(n))
            if len(self._latency_memo) >= 4096:
                self._latency_memo.clear()
            hit = self._latency_memo[memo_key] = (
                firsts,
                self.c0[k[firsts], m[firsts]] * self.site_trip[s[firsts]],
            )
        firsts, latencies = hit
        return float(latencies[np.argsort(order[firsts])].sum())

    def _combine_groups(self, kinds, ms, vs, ops, sites, cpu: bool) -> np.ndarray:
        group = np.arange(len(kinds))
        if cpu:
            kinds = self._cpu_kind[kinds]
        result = vs / self._result_div[cpu][kinds, ms]
        ok = np.flatnonzero(result <= self._limit[cpu][kinds])
        if len(ok) < 2:
            return group
        ok = ok[np.argsort(self._op_rank[ops[ok]], kind="stable")]
        at = sites[ok]
        kind_ok = kinds[ok]
        keys = self._site_static[cpu][at] * self._key_stride + (ms[ok] << 3) + kind_ok
        merged = combine(
            kind_ok.tolist(),
            keys.tolist(),
            result[ok].tolist(),
            None,
            at.tolist(),
            self._site_inputs,
            self._thresholds[cpu],
        )
        group[ok] = ok[merged]
        return group

    def combined_op_counts(self, collectives, cpu: bool = False) -> dict[str, int]:
        """Collective ops per kind after combining `collectives` (from this evaluator's report),
        with this hardware's thresholds or, with `cpu`, as XLA's CPU backend compiles them."""
        if not hasattr(self, "_site_static"):
            self._combine_setup()
        out = dict.fromkeys(COLLECTIVE_KINDS, 0)
        if not collectives:
            return out
        kinds = np.array([KIND_INDEX[c.kind] for c in collectives], dtype=np.int64)
        ms = np.array(
            [sum(1 << self.mesh.axis_names.index(a) for a in c.mesh_axes) for c in collectives],
            dtype=np.int64,
        )
        vs = np.array([c.bytes for c in collectives])
        ops = np.array([c.op for c in collectives], dtype=np.int64)
        sites = np.array([c.site for c in collectives], dtype=np.int64)
        group = self._groups(kinds, ms, vs, ops, sites, cpu=cpu)
        if cpu:
            kinds = np.where(kinds == RS, AR, kinds)
        for i in np.flatnonzero(group == np.arange(len(group))).tolist():
            out[COLLECTIVE_KINDS[int(kinds[i])]] += 1
        return out

    def _collectives(self, masks, value_local, detailed: bool = True) -> list[Collective]:
        prog = self.ana.program
        kinds, ms, vs, ops, vals, sites = self._collective_arrays(masks, value_local)
        group = self._groups(kinds, ms, vs, ops, sites)
        firsts, size = np.unique(group, return_counts=True)
        members = np.zeros(len(group))
        members[firsts] = size
        alpha = self.c0[kinds, ms]
        times = self.c1[kinds, ms] * vs + alpha[group] / members[group]
        by_op = firsts[np.lexsort((firsts, ops[firsts]))].tolist()
        numbering = {int(g): k for k, g in enumerate(by_op)}
        out = []
        for k, m, v, opi, vid, t, g, s in zip(
            kinds.tolist(),
            ms.tolist(),
            vs.tolist(),
            ops.tolist(),
            vals.tolist(),
            times.tolist(),
            group.tolist(),
            sites.tolist(),
        ):
            kind = COLLECTIVE_KINDS[k]
            ways = self.mask_ways[m]
            result = v / ways if kind in ("reduce-scatter", "all-to-all") else v
            value, op = prog.values[vid], prog.ops[opi]
            cause = {
                "all-reduce": f"partial sum of {value.display()} from {op.where()}",
                "reduce-scatter": f"partial sum of {value.display()} from {op.where()}, "
                "scattered into its sharded consumers",
                "all-gather": f"{value.display()} gathered before {op.where()}"
                if vid not in op.results
                else f"{value.display()} gathered after {op.where()} (concatenated on another dim)",
                "all-to-all": f"{value.display()} resharded (dim moved) before {op.where()}"
                if vid not in op.results
                else f"{value.display()} resharded (dim moved back) after {op.where()}",
                "collective-permute": f"halo of {value.display()} at {op.where()}"
                if (opi, vid) in self.halos
                else f"{value.display()} resharded (shards permuted between mesh axes) before "
                f"{op.where()}",
            }[kind]
            out.append(
                Collective(
                    kind,
                    self.axes.names_of(m),
                    float(v),
                    float(result),
                    float(t),
                    opi,
                    vid,
                    self.direction[opi],
                    cause,
                    int(self.site_trip[s]),
                    numbering[g],
                    s,
                )
            )
        return out

    def _scan_common(self, masks: np.ndarray) -> np.ndarray:
        """[reduction row]: the mesh axes a row's partial sum may be reduce-scattered over,
        ORed over the values of its chain (`red_scan`): for each such value, the axes every use
        of it shards some dim on (per use the mesh axes it holds on any dim, ANDed over the
        value's uses; a value with no use gives every axis). The row's own mask is ANDed in by
        the caller. Bitwise, so any grouping gives the same bits: four numpy reductions over
        a table built once per row set (`_scan_table`), not a pass per chain position."""
        fines, use_starts, pair_starts, pair_at, shape = self._scan_table()
        ext = np.concatenate((masks, _SCAN_SENTINELS))
        held = np.bitwise_or.reduceat(ext[fines], use_starts) if len(fines) else fines
        dense = np.zeros(shape, dtype=np.int64)
        if len(pair_starts):
            dense.flat[pair_at] = np.bitwise_and.reduceat(held, pair_starts)
        return _or_last(dense)

    def _scan_table(self):
        """(fine classes of every use of every value of `red_scan`, each use followed by the
        zero sentinel and each value's uses by a use holding the all-ones sentinel, so that no
        segment is empty; each use's first position; each value's first use; the flat position
        of each value in [row, k]; that shape). Built once per object: a restricted view
        (`incremental._SitesOf`) has its own rows and resets it."""
        hit = self.__dict__.get("_scan_tab")
        if hit is not None:
            return hit
        value_uses, use_fines, table = self._use_fine_table()
        n_fine = self.ana.n_fine
        zero, ones = n_fine, n_fine + 1  # indices of `_SCAN_SENTINELS` after the masks
        scan = self.red_scan
        pair_at = np.flatnonzero(scan.reshape(-1) >= 0)
        fines, use_starts, pair_starts = [], [], []
        for vid in scan.reshape(-1)[pair_at].tolist():
            pair_starts.append(len(use_starts))
            for u in range(int(value_uses[vid]), int(value_uses[vid + 1])):
                use_starts.append(len(fines))
                fines += table[use_fines[u] : use_fines[u + 1]].tolist() + [zero]
            use_starts.append(len(fines))
            fines += [ones, zero]
        shape = (scan.shape[0], max(scan.shape[1], 1))
        hit = (
            np.asarray(fines, dtype=np.int64),
            np.asarray(use_starts, dtype=np.int64),
            np.asarray(pair_starts, dtype=np.int64),
            pair_at,
            shape,
        )
        self.__dict__["_scan_tab"] = hit
        return hit

    def _use_fine_table(self):
        """(value -> first use [values + 1], use -> first fine [uses + 1], fines): every use of
        every value in program order with its dims' fine classes, built once (memoized in a
        dict made in `__init__`, so restricted views share it)."""
        hit = self._use_fines_memo.get("table")
        if hit is None:
            use_dim_fine = self.lay.use_dim_fine
            value_uses, use_fines, fines = [0], [0], []
            for uses in self.ana.program.uses():
                for use in uses:
                    fines += [f for dim in use_dim_fine[use] for f in dim]
                    use_fines.append(len(fines))
                value_uses.append(len(use_fines) - 1)
            hit = tuple(np.asarray(x, dtype=np.int64) for x in (value_uses, use_fines, fines))
            self._use_fines_memo["table"] = hit
        return hit


#: Appended to the masks by `_compute_reshards`: the padding fine class, which holds no mesh axis.
_ZERO = np.zeros(1, dtype=np.int64)
#: Appended to the masks by `_scan_common`: a fine class holding no mesh axis, one holding all.
_SCAN_SENTINELS = np.array([0, -1], dtype=np.int64)


def _added(n: int, at: list, add: list) -> np.ndarray:
    """[n] zeros with `add[k][j]` added at `at[k][j]` in the order listed: the floats of
    `np.add.at` on zeros, one call after another (`np.bincount` adds its weights one by one
    in input order), in one NumPy call instead of one per list."""
    idx = np.concatenate([np.asarray(a, dtype=np.int64) for a in at])
    weights = np.concatenate([np.asarray(w, dtype=np.float64) for w in add])
    out = np.bincount(idx, weights=weights, minlength=n)
    if len(out) != n:
        raise ValueError(f"index {int(idx.max())} beyond the timeline of {n} entries")
    return out


def _or_last(a: np.ndarray) -> np.ndarray:
    """The bitwise or over the last axis: one vectorized `|` per entry of that short axis (dims,
    sub-factors), several times faster than `np.bitwise_or.reduce` along it."""
    out = a[..., 0].copy()
    for k in range(1, a.shape[-1]):
        out |= a[..., k]
    return out


def _distinct_rows(a: np.ndarray, bits: int):
    """(distinct rows of `a` [n, ...] as [k, ...], index of each one's first row, [n] index of
    each row's distinct row), without a Python loop. Entries are masks of `bits` mesh axes: a
    row that fits in 63 bits is packed into one int64 (sorting ints is much faster than sorting
    raw bytes); a longer one is compared as raw bytes."""
    flat = np.ascontiguousarray(a.reshape(len(a), int(np.prod(a.shape[1:]))))
    if flat.shape[1] * bits <= 63:
        shifts = np.arange(flat.shape[1], dtype=np.int64) * bits
        keys = (flat.astype(np.int64, copy=False) << shifts).sum(axis=1)
    else:
        keys = flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1])))[:, 0]
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return a[first], first, inverse.reshape(-1)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of range(start, start + length) for each pair, without a Python loop."""
    total = int(lengths.sum())
    return np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)


def estimate(
    ana: Analysis,
    strategy: Strategy,
    mesh: MeshSpec,
    hw: HardwareSpec,
    options: CostOptions | None = None,
) -> CostReport:
    """Prices `strategy` on `mesh` of `hw` chips: compute, collectives, memory (see module essay)."""
    if not isinstance(strategy, Strategy):
        raise ToastError(bad_value("strategy", strategy, "a tc.Strategy"))
    return evaluator(ana, mesh, hw, options).report(strategy)


def evaluator(
    ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, options: CostOptions | None = None
) -> Evaluator:
    """The compiled evaluator for (ana, mesh, hw, options), built once per key.

    `hw` may also be a preset name or a dict of HardwareSpec fields; a bad argument raises a
    ToastError naming it.
    """
    if not isinstance(ana, Analysis):
        raise ToastError(bad_value("ana", type(ana).__name__, "an Analysis from tc.analyze"))
    if not isinstance(mesh, MeshSpec):
        raise ToastError(bad_value("mesh", mesh, "a tc.MeshSpec such as MeshSpec({'data': 8})"))
    if options is None:
        options = CostOptions()
    if not isinstance(options, CostOptions):
        raise ToastError(bad_value("options", options, "a tc.CostOptions"))
    return _evaluator(ana, mesh, hardware(hw), options)


@per_analysis(max_keys=8)
def _evaluator(ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, options: CostOptions) -> Evaluator:
    return Evaluator(ana, mesh, hw, options)


def _written_over_by_scatter(prog, v: int, last: int) -> bool:
    """Whether the scatter reading `v` last writes its result over it: XLA updates a scatter's
    operand in place when nothing reads it after (its in-place input/output pair), so the
    operand and the result never hold two buffers at the scatter. Measured on XLA:CPU: a
    `take_along_axis` gradient's `zeros([32, 64]).at[i].add(g)` is one 8 KiB buffer, the
    broadcast zeros and the scattered sum (tests/test_fuzz_memory.py)."""
    if last < 0:
        return False
    op = prog.ops[last]
    return (
        op.primitive.startswith("scatter")
        and bool(op.operands)
        and op.operands[0] == v
        and v not in op.operands[1:]
    )
