"""Validating a strategy against what XLA actually compiles (the external judge).

`validate` shards the function and compiles it on a `jax.sharding.Mesh` from the example
arguments as given: `jax.ShapeDtypeStruct`s compile at the real size with nothing allocated
(lowering needs only shapes). It then compares the cost model's predictions with the compiled
program:

* per-device flops and transcendentals vs `compiled.cost_analysis()` (`flops`, `transcendentals`);
* collective bytes per kind vs those parsed from `compiled.as_text()` (result bytes per device),
  and collective *op counts* per kind after XLA's combiners (`toast_core.cost.combine`);
* per-device memory vs `memory_analysis()`: argument + output + temp - alias (the CPU's
  `peak_memory_in_bytes` is unreliable), the prediction laid out as XLA assigns buffers (the
  outputs in allocations of their own for the whole step, `cost/buffers.py`);
* step time: the cost model's `predicted_step_time_s` beside `compiled_step_time_s`, priced from
  the compiled program alone (`compiled_step_time`).

Numerics. The sharded run is compared with the same function under `jax.jit` on the same mesh
with every input and output replicated (so both runs are XLA-compiled programs; comparing with
the un-jitted function flags fusion differences as errors). Each output leaf gets a tolerance
scaled to its magnitude, `RTOL * max|reference leaf| + ATOL`: a wrong plan (a partial sum not
reduced, a shard read from the wrong device) moves values by a sizeable fraction of the leaf's
scale, reordering a float32 reduction by ~1e-7 of it. Some steps amplify reordering (Adam's
update when a gradient is near `eps`, a router's top-k, a sign near zero); so when a leaf is out
of tolerance, the reference is compared once more with the un-jitted function (a third, differently
fused evaluation): a leaf whose sharded deviation stays within `NOISE_FACTOR` times the deviation
between those two references differs by reordering alone. A mismatch names the output's pytree
path, the flat index and both values. Numerics run on the example arguments (random data for
abstract leaves, if the host can hold them) or, with `numerics_args`, on a smaller size of the
same function (traced and analysed again, the strategy carried over by its JSON form).

XLA's CPU backend lowers collectives differently from TPU/GPU, and the compiled program's text and
`cost_analysis()` show a loop body once whatever its trip count, so the prediction is also given "as
XLA CPU shows it": a reduce-scatter becomes an all-reduce of the full buffer followed by a local
slice (so the full reduced buffer is also live in memory), and bf16 collectives run in f32. Both
views are reported (`*_target` is the TPU/GPU view); the comparison uses the CPU view.
Wall time on simulated devices means nothing and is never measured.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import numpy as np
from jax.sharding import Mesh

from toast_core.analysis import Analysis
from toast_core.apply.compile_cache import compile_lowered
from toast_core.apply.hlo import collective_bytes_by_kind, collective_ops_by_kind
from toast_core.apply.hlo_pricing import target_collective_ops, target_comm_s
from toast_core.apply.shard import mesh_spec_of, shard
from toast_core.cost import CostOptions, estimate
from toast_core.cost.arg_reduce import arg_reduction_flops
from toast_core.cost.buffers import allocated_memory
from toast_core.cost.collectives import COLLECTIVE_KINDS
from toast_core.cost.cpu_buffers import (
    _grouping,
    conv_operand_copies,
    dot_operand_copies,
    is_library_reduction,
    library_call_inputs,
)
from toast_core.cost.cpu_tree_reduce import (
    dot_matrix_operand,
    is_tree_reduced,
    tree_factor,
    view_source_operand,
)
from toast_core.cost.fusion import fusible, materialized
from toast_core.cost.iota_offsets import iota_offset_flops
from toast_core.cost.loop_control import loop_control_flops
from toast_core.cost.model import evaluator, reduction_flops
from toast_core.cost.scan_slots import scan_slot_flops
from toast_core.cost.simplify import (
    REMAT_CALLS,
    _pruned,
    _rewired,
    executions,
    live_ops,
    rewired,
    tiled_copies,
    tiled_operand,
    uniform_dims,
    work_factors,
)
from toast_core.cost.slice_replicas import slice_replica_flops
from toast_core.cost.top_k_sorts import top_k_call_flops
from toast_core.errors import ToastError, bad_value
from toast_core.ir import primitives as prim
from toast_core.mesh import HardwareSpec, MeshSpec, hardware
from toast_core.strategy import Strategy, remat_space, space_of
from toast_core.strategy.remat import POLICIES

RTOL, ATOL = 1e-4, 1e-6

#: XLA:CPU packs the temporaries of a program into one preallocated block at 64-byte aligned
#: offsets (its buffer assignment dump: two f32[6] temporaries at offsets 0 and 64 make an
#: 88-byte block), so below a few hundred bytes per buffer the block is mostly padding: a 4-byte
#: scalar temporary takes 64. TPU/GPU align and tile differently; the CPU view only.
CPU_BUFFER_ALIGN_BYTES = 64
#: A program with several outputs returns a tuple, and XLA:CPU counts the tuple's table of
#: 8-byte pointers in `output_size_in_bytes` (two f32[6] outputs: 48 + 16 bytes).
CPU_TUPLE_ENTRY_BYTES = 8
NOISE_FACTOR = 4.0


@dataclass(frozen=True)
class ValidationReport:
    numerics_ok: bool
    max_abs_error: float
    predicted_flops: float
    compiled_flops: float
    predicted_collective_bytes: dict[str, float]
    compiled_collective_bytes: dict[str, float]
    predicted_memory_bytes: float
    compiled_memory_bytes: float
    predicted_collective_bytes_target: dict[str, float] = field(default_factory=dict)
    predicted_memory_bytes_target: float = 0.0
    predicted_flops_target: float = 0.0
    predicted_transcendentals: float = 0.0
    compiled_transcendentals: float = 0.0
    hlo_text: str = field(default="", repr=False)
    # Step time: the cost model's, and the compiled program's priced by the same formulas.
    predicted_step_time_s: float = 0.0
    compiled_step_time_s: float = 0.0
    predicted_compute_s: float = 0.0
    predicted_comm_s: float = 0.0
    compiled_compute_s: float = 0.0
    compiled_comm_s: float = 0.0
    # Collective ops per kind after combining: predicted as XLA CPU compiles them (the
    # comparison), on the target hardware (`_target`), parsed from the compiled text, and the
    # compiled program's collectives combined as the target's XLA would (`compiled_..._target`).
    predicted_collective_ops: dict[str, int] = field(default_factory=dict)
    compiled_collective_ops: dict[str, int] = field(default_factory=dict)
    predicted_collective_ops_target: dict[str, int] = field(default_factory=dict)
    compiled_collective_ops_target: dict[str, int] = field(default_factory=dict)
    # Numerics: whether they ran, on what, and every output leaf out of tolerance.
    numerics_checked: bool = True
    numerics_on: str = ""
    numerics_mismatches: tuple[str, ...] = ()

    @property
    def step_time_ratio(self) -> float:
        """Predicted / XLA-judged step time (1.0 = the model agrees with the compiled program)."""
        if not self.compiled_step_time_s:
            return float("nan")
        return self.predicted_step_time_s / self.compiled_step_time_s

    @property
    def flops_ratio(self) -> float:
        return self.predicted_flops / self.compiled_flops if self.compiled_flops else float("nan")

    @property
    def memory_ratio(self) -> float:
        if not self.compiled_memory_bytes:
            return float("nan")
        return self.predicted_memory_bytes / self.compiled_memory_bytes

    def rows(self) -> list[tuple[str, float, float]]:
        """(quantity, predicted, compiled) rows for tables."""
        out = [("flops per device", self.predicted_flops, self.compiled_flops)]
        if self.predicted_transcendentals or self.compiled_transcendentals:
            out.append(
                (
                    "transcendentals per device",
                    self.predicted_transcendentals,
                    self.compiled_transcendentals,
                )
            )
        out.append(
            ("memory per device (bytes)", self.predicted_memory_bytes, self.compiled_memory_bytes)
        )
        for k in COLLECTIVE_KINDS:
            p = self.predicted_collective_bytes.get(k, 0.0)
            c = self.compiled_collective_bytes.get(k, 0.0)
            if p or c:
                out.append((f"{k} bytes per device", p, c))
        for k in COLLECTIVE_KINDS:
            p = self.predicted_collective_ops.get(k, 0)
            c = self.compiled_collective_ops.get(k, 0)
            if p or c:
                out.append((f"{k} ops (after combining)", float(p), float(c)))
        if self.compiled_step_time_s:
            out.append(
                ("step time (s, XLA-judged)", self.predicted_step_time_s, self.compiled_step_time_s)
            )
        return out

    def to_dict(self) -> dict:
        return {
            "numerics_ok": self.numerics_ok,
            "max_abs_error": self.max_abs_error,
            "predicted_flops": self.predicted_flops,
            "compiled_flops": self.compiled_flops,
            "predicted_transcendentals": self.predicted_transcendentals,
            "compiled_transcendentals": self.compiled_transcendentals,
            "predicted_collective_bytes": self.predicted_collective_bytes,
            "compiled_collective_bytes": self.compiled_collective_bytes,
            "predicted_collective_bytes_target": self.predicted_collective_bytes_target,
            "predicted_memory_bytes": self.predicted_memory_bytes,
            "predicted_memory_bytes_target": self.predicted_memory_bytes_target,
            "predicted_flops_target": self.predicted_flops_target,
            "compiled_memory_bytes": self.compiled_memory_bytes,
            "predicted_step_time_s": self.predicted_step_time_s,
            "compiled_step_time_s": self.compiled_step_time_s,
            "predicted_compute_s": self.predicted_compute_s,
            "predicted_comm_s": self.predicted_comm_s,
            "compiled_compute_s": self.compiled_compute_s,
            "compiled_comm_s": self.compiled_comm_s,
            "predicted_collective_ops": self.predicted_collective_ops,
            "compiled_collective_ops": self.compiled_collective_ops,
            "predicted_collective_ops_target": self.predicted_collective_ops_target,
            "compiled_collective_ops_target": self.compiled_collective_ops_target,
            "numerics_checked": self.numerics_checked,
            "numerics_on": self.numerics_on,
            "numerics_mismatches": list(self.numerics_mismatches),
        }


def concrete_args(args, seed: int = 0):
    """Arrays for `args`: concrete leaves pass through; ShapeDtypeStructs get small random data
    (floats ~ N(0, 0.02), integers in [0, 2), booleans False).

    An integer leaf that indexes a dim of size 1 is then out of bounds: `jnp.take` fills NaN and
    XLA:CPU (jax 0.10.2) computes `exp` of that fill as run-to-run garbage, so sharded and
    reference disagree whatever the plan. Pass concrete in-bounds indices for such programs."""
    rng = np.random.default_rng(seed)

    def make(leaf):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        dtype = np.dtype(leaf.dtype)
        if np.issubdtype(dtype, np.floating) or leaf.dtype == jax.numpy.bfloat16:
            return jax.numpy.asarray(rng.normal(0, 0.02, leaf.shape), dtype=leaf.dtype)
        if np.issubdtype(dtype, np.integer):
            return jax.numpy.asarray(rng.integers(0, 2, leaf.shape), dtype=leaf.dtype)
        return jax.numpy.zeros(leaf.shape, leaf.dtype)

    return jax.tree_util.tree_map(make, args)


def cpu_view(report, program) -> dict[str, float]:
    """Predicted bytes per kind as the compiled HLO text shows them (see module docstring): a
    collective inside a loop body appears once in the text, whatever the trip count."""
    out = {k: 0.0 for k in COLLECTIVE_KINDS}
    for c in report.collectives:
        scale = 2.0 if program.values[c.value].dtype == "bfloat16" else 1.0
        if c.kind == "reduce-scatter":
            out["all-reduce"] += c.bytes * scale
        else:
            out[c.kind] += c.result_bytes * scale
    return out


#: XLA's CPU pipeline expands optimization barriers before CSE and before scheduling; GPU and TPU
#: keep them until after scheduling. Without the barrier, CSE merges a recomputation with the
#: forward it repeats (measured with `jax.checkpoint` itself: the same compiled program with and
#: without it), and the scheduler may hoist every block's recomputation to the start of the
#: backward, so that remat moves no memory (GPT demo, 8 layers, full remat: 19.8 MB compiled vs
#: 21.6 MB without remat; 11.9 MB with the barriers kept, 10.1 MB predicted). So on CPU, for a
#: strategy with remat, neither pass runs: the compiled program is the one those backends run.
#: XLA:CPU's concurrency-optimized scheduler is left on: it is a process-wide flag
#: (`--xla_cpu_enable_concurrency_optimized_scheduler=false`, not read from per-compile options),
#: and with the barriers kept turning it off moves the compiled figures by at most 15 % (same
#: GPT: 13.6 -> 11.9 MB; `bench/remat_memory.py --scheduler memory|default` measures both).
REMAT_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "cse,cse_barrier_expander"}


def compiler_options_for(strategy: Strategy) -> dict:
    """XLA compiler options for validating `strategy` on CPU (see REMAT_COMPILER_OPTIONS)."""
    if strategy.remat and jax.default_backend() == "cpu":
        return dict(REMAT_COMPILER_OPTIONS)
    return {}


def cpu_flops(
    report, ana: Analysis, strategy: Strategy | None = None, mesh: MeshSpec | None = None
) -> tuple[float, float]:
    """Predicted (flops, transcendentals) per device as `cost_analysis()` counts them: the body of
    a loop once, whatever its trip count (the per-step figures are in the CostReport).

    With the `strategy` and `mesh` that `report` priced, a reduction is counted as XLA:CPU's
    tree reduction runs it on its local operand (`cost.cpu_tree_reduce`: a reduced dim longer
    than 32 padded to a multiple of 32; fuzz seed 14 #1426 reduced 48 rows: 511 flops, not 383).

    The recomputation of a program's own `jax.checkpoint` body, which the model counts as
    TPU/GPU run it (behind the barriers JAX puts before it: `simplify.barred`), is merged with
    the forward it repeats: the program `shard` compiles replays the traced ops, the body
    inlined, with no barrier (`_cpu_fusion_factors`; fuzz seed 18 #99, `checkpoint(gelu(x @
    w))` under SGD: 80 flops predicted, 68 compiled; 68 once merged).

    Each loop's control (its counter's compare and add, `cost.loop_control`) is counted once, and
    each `TopK` custom call as the -1 flop `cost_analysis()` adds for it (`cost.top_k_sorts`).
    An iota cut along its counted dim adds each device's offset (`cost.iota_offsets`: fuzz seed
    18 #500, `one_hot(i, 16)` with the classes on 8 devices, 4 flops predicted, 8 compiled), and
    a scan whose stacked output is cut along its steps selects each step's slot on its owner
    (`cost.scan_slots`: seed 18 #25, 650 predicted, 872 compiled), and a narrow slice of a cut
    dim read whole is masked and all-reduced (`cost.slice_replicas`: seed 19 #1614, the edge
    row of a pad, 184 predicted, 252 compiled).

    A reduction the CPU compiles apart from its operand's producers (a tree reduction's
    reduce-window; a reduce whose reduced dims are all of local size 1, which the partitioner
    leaves to an all-reduce of the operand) makes that operand a stored buffer, so its
    producers are fused as for any reader XLA does not fuse (`_cpu_fusion_factors`)."""
    program = ana.program
    trips = [op.trip_count for op in program.ops]
    again = set(recomputed_ops(report.remat, ana))  # run twice under remat
    tree, unfused = _cpu_reduces(ana, strategy, mesh) if strategy is not None else ({}, ())
    tile = _cpu_tile_factors(ana, strategy, mesh) if strategy is not None else {}
    partitioned = mesh is not None and mesh.n_devices > 1
    shifts = _library_shifts(ana, strategy, mesh) if strategy is not None else frozenset()
    if strategy is not None:
        shifts |= _library_inputs(ana, strategy, mesh)
    local = _local_value_shapes(ana, strategy, mesh) if strategy and partitioned else None
    uses = _local_use_shapes(ana, strategy, mesh) if strategy and partitioned else None
    recopied = _copied_in_several_groupings(program, uses)
    fusion, fusion_trans = _cpu_fusion_factors(
        program,
        frozenset(unfused),
        _cpu_copied_operands(program, local) | recopied,
        partitioned,
        shifts,
        local,
        _collected(report.collectives, program) if partitioned else frozenset(),
        _cut_outer_products(program, uses) if uses else frozenset(),
        recopied,
    )
    flops = sum(
        c.flops
        / trips[c.op]
        * (1 + (c.op in again))
        * tree.get(c.op, 1.0)
        * tile.get(c.op, 1.0)
        * fusion.get(c.op, 1.0)
        for c in report.op_costs
    )
    transcendentals = sum(
        c.transcendentals
        / trips[c.op]
        * (1 + (c.op in again))
        * tile.get(c.op, 1.0)
        * fusion_trans.get(c.op, 1.0)
        for c in report.op_costs
    )
    flops += loop_control_flops(program) + top_k_call_flops(program)
    if mesh is not None:
        sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
        flops += arg_reduction_flops(report.collectives, program, sizes)
        kinds = {op.primitive for op in program.ops}
        if (
            strategy is not None
            and sizes
            and not kinds.isdisjoint({"iota", "slice", prim.SCAN_END})
        ):
            space, masks = space_of(ana, mesh), strategy.fine_masks(ana, mesh)
            axes_of = lambda v: space.value_axes(masks, v)  # noqa: E731
            flops += iota_offset_flops(program, axes_of, sizes)
            flops += scan_slot_flops(program, axes_of, sizes)
            flops += slice_replica_flops(program, axes_of, sizes)
    return flops + reduction_flops(report.collectives, program, once=True), transcendentals


def _cpu_tile_factors(ana: Analysis, strategy: Strategy, mesh: MeshSpec) -> dict[int, float]:
    """Per op XLA runs on a tile's source (`simplify.tiled_copies`), the share of its flops left
    on each device: one over the copies of the source in the device's block. A tiled dim of
    r repeats cut m ways (m dividing r) holds r / m of them, else one (measured: seed 14 #685,
    `erf(tile(x) - tile(x))` repeated twice along an uncut dim, 192 flops of 384; seed 14 #291,
    `tile(v, (1, 1, 1, 2))` with that dim cut in 2, the full 23,550)."""
    prog = ana.program
    if not any(op.primitive == "tile" for op in prog.ops):
        return {}
    tiled = tiled_copies(prog, uniform_dims(prog))
    space = space_of(ana, mesh)
    masks = strategy.fine_masks(ana, mesh)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    out = {}
    for op in prog.ops:
        hit = tiled_operand(op, tiled)
        if hit is None:
            continue
        j, (_, dims) = hit
        axes = space.use_axes(masks, op.index, j)
        copies = 1
        for d, reps in dims:
            cut = int(np.prod([sizes[a] for a in axes[d]], dtype=np.int64))
            copies *= reps // cut if reps % cut == 0 else 1
        if copies > 1:
            out[op.index] = 1.0 / copies
    return out


def _cpu_reduces(
    ana: Analysis, strategy: Strategy, mesh: MeshSpec
) -> tuple[dict[int, float], list[int]]:
    """(tree factors, unfused) of the reductions, on the local shape of each one's operand (each
    dim divided by the mesh axes of its use): per reduction op that XLA:CPU tree-reduces, its
    flops over the folds the model counts; and the reductions XLA:CPU does not fuse with their
    operand's producers: those it tree-reduces (a reduce-window, compiled apart), and those whose
    reduced dims are all of local size 1 (a reshape, then the all-reduce reads the operand:
    fuzz seed 15 #466, the variance of an exact GELU with its reduced dim on 8 devices: XLA
    computes the GELU once and stores it). A reduction the simplifier shrinks (over a
    broadcast: `simplify.work_factors`) reduces another shape in XLA, so it is left as the
    model counts it."""
    prog = ana.program
    ops = [op for op in prog.ops if op.primitive in prim.REDUCTIONS and op.operands]
    if ops:
        whole = work_factors(prog)
        ops = [op for op in ops if whole[op.index] == 1.0]
    if not ops:
        return {}, []
    space = space_of(ana, mesh)
    masks = strategy.fine_masks(ana, mesh)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    out, unfused = {}, []
    uses = prog.uses()
    for op in ops:
        shape = prog.values[op.operands[0]].shape
        axes = space.use_axes(masks, op.index, 0)
        local = _local_shape(shape, axes, sizes)
        reduced = tuple(op.param("axes", ()))
        matrix = dot_matrix_operand(prog, op, local)
        if matrix is None:
            matrix = view_source_operand(
                prog, op, local, lambda i: _local_shape(
                    prog.values[prog.ops[i].operands[0]].shape, space.use_axes(masks, i, 0), sizes
                ),
            )  # fmt: skip
        # A reduce of local size-1 dims that are cut (an all-reduce) is judged on the op's own
        # dims; the tree windows on the shape XLA reduces (a dot's matrix, a reshape's source).
        all_reduced = reduced and not any(local[d] > 1 for d in reduced)
        all_reduced = all_reduced and any(shape[d] > 1 for d in reduced)
        if matrix is not None:
            local, reduced = matrix
        factor = tree_factor(local, reduced)
        if factor != 1.0:
            out[op.index] = factor
        if (
            is_tree_reduced(local, reduced)
            or all_reduced
            or _library_reduced(op, prog, local, uses)
        ):
            unfused.append(op.index)
    return out, unfused


def _local_value_shapes(
    ana: Analysis, strategy: Strategy, mesh: MeshSpec
) -> dict[int, tuple[int, ...]]:
    """Per value cut by `strategy`, its shape on one device (each dim divided by the mesh axes
    of the value's own sharding): the shapes XLA's fusion tests see in the partitioned HLO
    (`_cpu_fusion_factors`)."""
    space = space_of(ana, mesh)
    masks = strategy.fine_masks(ana, mesh)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    out = {}
    for v in ana.program.values:
        local = _local_shape(v.shape, space.value_axes(masks, v.id), sizes)
        if local != tuple(v.shape):
            out[v.id] = local
    return out


def _local_use_shapes(ana: Analysis, strategy: Strategy, mesh: MeshSpec) -> Callable:
    """`local_shape(op, pos)`: an operand use's shape on one device, which differs from its
    value's where the op reads a cut of it (a dot whose output is cut along a free dim reads
    that slice of a replicated operand: `_copied_in_several_groupings`)."""
    space = space_of(ana, mesh)
    masks = strategy.fine_masks(ana, mesh)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    prog = ana.program

    def local_shape(op: int, pos: int) -> tuple:
        shape = prog.values[prog.ops[op].operands[pos]].shape
        if (op, pos) not in space.layout.use_dim_fine:
            return shape
        return _local_shape(shape, space.use_axes(masks, op, pos), sizes)

    return local_shape


def _local_shape(shape: tuple, axes, sizes: dict) -> tuple[int, ...]:
    """Each dim of `shape` divided (rounded up) by the mesh axes `axes` names for it."""
    return tuple(
        -(-n // int(np.prod([sizes[a] for a in names], dtype=np.int64)))
        for n, names in zip(shape, axes)
    )


def _library_reduced(op, prog, local: tuple, uses) -> bool:
    """Whether XLA:CPU hands reduction `op` to its kernel library (`cpu_buffers.
    library_reduction_inputs`: a float sum, max or min of at least `LIBRARY_REDUCE_MIN_ELEMENTS`
    local elements, a `__ynn_fusion` call) with an operand it stores: the elementwise op making
    it, read by the call and by loops, is computed once, not in each fusion reading it
    (measured: the BatchNorm MLP replicated on 2x4, its ReLU-gradient select counted in five
    fusions, 1.057 of XLA's flops; 1.003 with this rule). Not so for an operand read by the
    reduction alone (the call takes in its producer), one a dot also reads (stored for the dot
    already, and XLA:CPU's layout copies for weight-gradient dots recompute it: the zoo GPT's
    GELU gradient, 0.943 of XLA's flops under megatron when counted once), nor one the
    reduction normalizes (`_normalizes`). The CPU comparison only: the search never sees it."""
    if not is_library_reduction(prog, op, int(np.prod(local, dtype=np.int64))):
        return False
    x = op.operands[0]
    if len(uses[x]) < 2:
        return False
    if any(prog.ops[o].primitive in prim.MATMULS for o, _k in uses[x]):
        return False  # stored for the dot already; its layout copies recompute it (measured)
    return not _normalizes(op, prog, uses)


#: Ops between a reduction and the elementwise op combining its result with its own operand
#: that XLA:CPU's library call takes in with the reduction (a keepdims broadcast; no code).
_SPREADS = frozenset({"broadcast_in_dim", "reshape", "stop_gradient"})


def _library_shifts(ana: Analysis, strategy: Strategy, mesh: MeshSpec) -> frozenset[int]:
    """Values `x op broadcast(reduce(x))` that XLA:CPU computes inside the library call of the
    reduction (`_library_reduced`: a float max, min or sum of at least
    `LIBRARY_REDUCE_MIN_ELEMENTS` local elements, its reduced dims uncut) and stores, so every
    reader reads them: log_softmax's `x - max(x)` is computed once, where the model fuses it
    into the exp's loop and into the final subtract's (measured on `log_softmax(x[1024, 4], 1)`:
    the `__ynn_fusion` of the max returns the shifted rows, 14,336 flops, counted 18,432; on
    [256, 4] no library call and both loops compute it, 4,608). Read on the program XLA's
    simplifier leaves (`simplify.rewired`: `max(m, -inf)` is `m`). The CPU comparison only."""
    prog = rewired(ana.program)
    # a reduction too small unsharded is too small on any device
    ops = [
        op
        for op in prog.ops
        if op.operands and is_library_reduction(prog, op, prog.values[op.operands[0]].size)
    ]
    if not ops:
        return frozenset()
    space = space_of(ana, mesh)
    masks = strategy.fine_masks(ana, mesh)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    uses = prog.uses()
    out = set()
    for op in ops:
        x = op.operands[0]
        shape = prog.values[x].shape
        local = _local_shape(shape, space.use_axes(masks, op.index, 0), sizes)
        reduced = tuple(op.param("axes", ()))
        if not is_library_reduction(prog, op, int(np.prod(local, dtype=np.int64))):
            continue
        if any(local[d] != shape[d] for d in reduced):
            continue  # a cut reduced dim: an all-reduce between the reduction and its readers
        frontier = list(op.results)
        for _ in range(4):
            nxt = []
            for v in frontier:
                for o, _k in uses[v]:
                    reader = prog.ops[o]
                    if reader.primitive in _SPREADS:
                        nxt += reader.results
                    elif reader.primitive in prim.ELEMENTWISE and x in reader.operands:
                        out.update(r for r in reader.results if len(uses[r]) > 1)
            frontier = nxt
    return frozenset(out)


def _library_inputs(ana: Analysis, strategy: Strategy, mesh: MeshSpec) -> frozenset[int]:
    """Special functions XLA expands (erfc, digamma: `prim.EXPANDED_TRANSCENDENTAL`) whose
    result is an input of a library reduction (`cpu_buffers.library_call_inputs`: the `__ynn_fusion`
    call takes in the elementwise ops feeding the reduction alone, on its local operand) and is
    read by other loops too: XLA:CPU computes the expansion once and stores it, where the model
    fuses its cheap part into each reader. The call is a consumer no producer fuses into, and
    the expansion ends in a select of several arrays, which XLA duplicates only when it can fuse
    it into all its consumers (`InstructionFusion::ComputeGloballyUnfusible`). Measured:
    `value_and_grad(mean(gelu(x, approximate=False)))` on x[4, 4, 8, 32], the mean's call reads
    the stored erfc beside the gradient's loop, 307,200 flops, predicted 585,728 with erfc in
    both (fuzz seed 19 #39, Adam on an exact GELU of an einsum: 1.25 of XLA's flops). Read on
    the program XLA's simplifier leaves (`simplify.rewired`, its dead ops reading nothing: the
    GELU's `copy`). The CPU comparison only."""
    prog = rewired(ana.program)
    prog = _pruned(prog, live_ops(prog))
    ops = [
        op
        for op in prog.ops
        if op.operands and is_library_reduction(prog, op, prog.values[op.operands[0]].size)
    ]
    if not ops or not any(op.primitive in prim.EXPANDED_TRANSCENDENTAL for op in prog.ops):
        return frozenset()
    space = space_of(ana, mesh)
    masks = strategy.fine_masks(ana, mesh)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    uses, producers = prog.uses(), prog.producers()
    out = set()
    for op in ops:
        shape = prog.values[op.operands[0]].shape
        local = _local_shape(shape, space.use_axes(masks, op.index, 0), sizes)
        if not is_library_reduction(prog, op, int(np.prod(local, dtype=np.int64))):
            continue
        whole = prog.values[op.results[0]].size == 1
        for v, sized in library_call_inputs(prog, op.operands[0], uses, producers, whole):
            p = producers[v]
            if v == sized and p is not None and len(uses[v]) > 1:
                if prog.ops[p].primitive in prim.EXPANDED_TRANSCENDENTAL:
                    out.add(v)
    return frozenset(out)


def _normalizes(op, prog, uses, depth: int = 4) -> bool:
    """Whether the result of reduction `op` comes back, through at most `depth` elementwise or
    broadcast ops, to an op reading the reduction's own operand (`x - mean(x)`, `exp(x) /
    sum(exp(x))`): measured on the zoo GPT and ViT under megatron, XLA:CPU still recomputes the
    producers of such an operand in each fusion (0.943 and 0.933 of XLA's flops when counted
    once)."""
    x = op.operands[0]
    frontier, seen = list(op.results), set()
    for _ in range(depth):
        nxt = []
        for v in frontier:
            for o, _k in uses[v]:
                reader = prog.ops[o]
                if x in reader.operands:
                    return True
                if o not in seen and (
                    reader.primitive in prim.ELEMENTWISE or reader.primitive == "broadcast_in_dim"
                ):
                    seen.add(o)
                    nxt += reader.results
        frontier = nxt
    return False


def _cpu_copied_operands(program, local_shapes: dict | None = None) -> frozenset[int]:
    """Values XLA:CPU copies into another layout for the dots and convolutions reading them
    (`cost.cpu_buffers`): the copy is a loop fusion reading the value like any fusible reader.
    With them, the values a dot reads on both sides (`fusion._copied_for_both_sides` says
    whether each side is copied in its own order, even when the producer's fusion writes one of
    them in place and `cpu_buffers` counts no copy's buffer), and those every dot reads
    reshaped (`_reshaped_dot_operands`)."""
    is_mat = materialized(program)
    dots = dot_operand_copies(program, is_mat)[0].tolist()
    convs = [row[0] for row in conv_operand_copies(program, is_mat)]
    both = [
        op.operands[0]
        for op in rewired(program).ops  # a value repeated (CSE'd) counts as the one value
        if op.primitive == "dot_general" and len(set(op.operands)) == 1
    ]
    return frozenset(dots + convs + both) | _reshaped_dot_operands(program, local_shapes)


def _copied_in_several_groupings(program, local_shape=None) -> frozenset[int]:
    """Values that dots read through layout copies in more than one grouping (`cpu_buffers.
    _grouping` of each dot's operand on one device, `local_shape(op, pos)`): XLA:CPU makes one
    copy per grouping, each a loop fusion of its own, and a cheap producer is computed in each
    (measured: fuzz seed 19 #219 on 2x3, a dropout read by `einsum('abc,deb->acde')` with `a`
    cut 3 ways, which copies the device's slice into [16, 16], and by `einsum('abc,bz->acz')`,
    which copies it whole into [48, 16]: the dropout's mask chain is in `copy_bitcast_fusion`
    and again in `copy_bitcast_fusion.2`, 6,912 flops each; 0.916 of XLA's flops counted
    once). Whether or not a producer's fusion writes one copy in place (`dot_operand_copies`
    counts no buffer then), the other is computed again."""
    is_mat = materialized(program)
    if local_shape is None:

        def local_shape(op: int, pos: int) -> tuple:
            return program.values[program.ops[op].operands[pos]].shape

    groupings: dict[int, set] = {}
    for op in program.ops:
        if op.primitive != "dot_general" or len(op.operands) != 2:
            continue
        (lc, rc), (lb, rb) = op.param("dimension_numbers")
        shapes = (local_shape(op.index, 0), local_shape(op.index, 1))
        if not lc or all(shapes[0][d] == 1 for d in lc):
            continue  # an outer product: an elementwise multiply
        for side, (batch, contracted) in enumerate(((lb, lc), (rb, rc))):
            x = op.operands[side]
            g = _grouping(shapes[side], batch, contracted, side)
            if g is not None and is_mat[x]:
                groupings.setdefault(x, set()).add(g)
    return frozenset(x for x, gs in groupings.items() if len(gs) > 1)


def _reshaped_dot_operands(program, local_shapes: dict | None = None) -> frozenset[int]:
    """Values that every dot reading them reads in another shape than XLA:CPU's dot takes
    (`_canonical_dot_operand`): XLA's dot decomposer (or its gemv rewriter, for a vector)
    reshapes such an operand, a bitcast that is a loop fusion like a layout copy, so a cheap
    producer is fused into it and into each other fusion reading it, however many arrays it
    reads (`InstructionFusion::ComputeGloballyUnfusible` finds every consumer fusible). Measured:
    the gradient of `gelu(t @ w)` for a vector `t` feeds the input-gradient dot (`g @ w.T`, a
    vector read as [8, 1]) and the outer-product weight gradient, which Adam's two moments read:
    the GELU's backward chain is in the dot's bitcast fusion and in both moments' fusions (fuzz
    seed 19 #388, 0.82 of XLA's flops counted once); `einsum('abc,bef->acef', x, v)` reads `v`
    as [b, e * f], and `v = min(a, b) - s` is computed there and in each other reader (seed 19
    #790, 0.79). On one device's `local_shapes` (a dim cut to 1 is a unit dim there)."""
    shape_of = lambda v: (local_shapes or {}).get(v, program.values[v].shape)  # noqa: E731
    reads: dict[int, bool] = {}
    for op in program.ops:
        if op.primitive != "dot_general" or len(op.operands) != 2:
            continue
        dims = op.param("dimension_numbers")
        for pos, v in enumerate(op.operands):
            canonical = _canonical_dot_operand(shape_of(v), dims[0][pos], dims[1][pos])
            reads[v] = reads.get(v, True) and not canonical
    return frozenset(v for v, reshaped in reads.items() if reshaped)


def _canonical_dot_operand(shape: tuple, contracted, batch) -> bool:
    """Whether a dot reads an operand of `shape` as it is: its batch dims leading, then one
    free and one contracted dim (in either order), no dim of size 1 (XLA's dot decomposer
    flattens several free or contracted dims into one, and its simplifier drops unit dims)."""
    free = [d for d in range(len(shape)) if d not in contracted and d not in batch]
    return (
        len(contracted) == 1
        and len(free) == 1
        and tuple(batch) == tuple(range(len(batch)))
        and all(n > 1 for n in shape)
    )


def _collected(collectives, program) -> frozenset[tuple[int, int]]:
    """(value, op) of each resharding collective of the partitioned program (an all-gather of
    `Collective.value` before the op that reads a cut dim of it whole, an all-to-all, a halo's
    permutes; not a slice XLA cuts shard by shard, `_sliced_in_place`):
    a collective fuses nothing, so each is a stored buffer, and its cheap producers are
    computed once there, not again in every other reader that does not duplicate them (fuzz
    seed 19 #545: dropout's select, gathered before a `pad` and read by `var`'s two sums, is
    one loop on XLA:CPU: 277 flops compiled, 331 predicted with the select's chain computed in
    all three)."""
    return frozenset(
        (c.value, c.op)
        for c in collectives
        if c.kind in _RESHARDING_KINDS and not _sliced_in_place(program, c.op)
    )


def _sliced_in_place(program, op: int) -> bool:
    """Whether `op` is a slice whose result is not a program output, which XLA slices shard by
    shard rather than after the all-gather the model prices: sharding propagation gives the
    slice its operand's tiled sharding (a sharding constraint on its result is an op after
    it), so the partitioner fetches the window's edge from the neighbour with a
    collective-permute (`HandleSlice`'s windowed input) and gathers the result later if at all.
    The operand is then no buffer stored for a collective: the permute's fusion and the
    shifted local copy each compute its producers, as any other reader does (measured,
    `v = x[..., None] * y` cut 8 ways, read by a dot and `sum(v[1:])`: the multiply in three
    loops, 9,599 flops; fuzz seed 19 #772 0.892 -> 0.946 of XLA's flops, #918 0.830 -> 0.853).
    A slice that is an output carries the output's sharding itself, and XLA gathers its
    operand first (fuzz seed 19 #796, `v7[:-1]` out: all-gather, then the slice)."""
    o = program.ops[op]
    if o.primitive != "slice":
        return False
    return all(program.values[r].output_name is None for r in o.results)


#: Collectives that read a value whole to reshard it (not the partial sums of a reduction).
_RESHARDING_KINDS = frozenset({"all-gather", "all-to-all", "collective-permute"})


def _cpu_fusion_factors(
    program,
    unfused: frozenset[int],
    copied: frozenset[int] = frozenset(),
    partitioned=False,
    stored: frozenset[int] = frozenset(),
    local_shapes: dict[int, tuple[int, ...]] | None = None,
    collected: frozenset[tuple[int, int]] = frozenset(),
    outer_dots: frozenset[int] = frozenset(),
    recopied: frozenset[int] = frozenset(),
) -> tuple[dict[int, float], dict[int, float]]:
    """Per op, XLA:CPU's (flop, transcendental) executions with the `unfused` reductions
    compiled apart, the `copied` dot operands read through their copies, the `stored` values
    computed once and no barrier before the `jax.checkpoint` bodies (the program `shard`
    replays inlines them: a recomputation merges with the forward), and the fusion tests made
    on one device's `local_shapes` (`fusion.fusion_work`: a mean broadcast onto rows cut to
    one per device is a bitcast there), over the model's (`simplify.executions`), where they
    differ (`partitioned`: for more than one device, as the model's). `outer_dots`: dots whose
    contraction is cut to one element per device (`_cut_outer_products`), fusions like the
    matrix-vector dots XLA:CPU fuses. `recopied`: `copied` values that dots read through copies
    in several groupings, each computing them."""
    remat = any(not REMAT_CALLS.isdisjoint(op.call_path) for op in program.ops)
    dots = _fused_matrix_vector_dots(program, local_shapes) | outer_dots
    if not (unfused or copied or stored or remat or local_shapes or dots or collected or recopied):
        return {}, {}
    base = executions(program, partitioned=partitioned)
    cpu = executions(
        program,
        unfused,
        copied,
        partitioned=partitioned,
        stored=stored,
        barriers=False,
        local_shapes=local_shapes,
        fused_dots=dots,
        collected=collected,
        recopied=recopied,
    )
    if remat:
        _charge_merged_to_counted(program, base, cpu)
    return tuple(
        {i: c / b for i, (b, c) in enumerate(zip(base[k], cpu[k])) if b > 0 and c != b}
        for k in (0, 1)
    )


#: XLA:CPU fuses producers into a matrix-vector dot whose vector is smaller than this
#: (`CpuInstructionFusion::ShouldFuse`'s `kFusionThresholdBytes`).
_MATVEC_FUSION_BYTES = 16 * 1024


def _cut_outer_products(prog, local_shape: Callable) -> frozenset[int]:
    """Dots that contract something of size > 1 (not `fusion.fusible`) but whose contracted
    dims the strategy cuts to one element per device: after partitioning, each device's dot is
    an outer product, which XLA's simplifier rewrites as a multiply of two broadcasts, a loop
    fusion that takes in the cheap producers of its operands (a sliced concatenate and the add
    before it). Its result is a partial sum, stored for the all-reduce. Measured: fuzz seed 19
    #575, `einsum('abcd,az->bcdz', concatenate([x + b, tanh(x + b)]), w[8, 3])` with `a` on 8
    devices: the add (64 flops) computed again in the multiply's fusion, 365 flops compiled,
    300 predicted with the dot reading a stored operand. `local_shape(op, pos)`: an operand
    use's shape on one device (`_local_use_shapes`)."""
    out = []
    for op in prog.ops:
        if op.primitive != "dot_general" or len(op.operands) != 2 or fusible(op, prog):
            continue
        (lc, _), _ = op.param("dimension_numbers")
        local = local_shape(op.index, 0)
        if lc and all(local[d] == 1 for d in lc):
            out.append(op.index)
    return frozenset(out)


def _fused_matrix_vector_dots(program, local_shapes: dict | None = None) -> frozenset[int]:
    """Dots XLA:CPU emits as loop fusions: matrix-vector products (unit dims aside: no batch,
    a matrix, a vector of under 16 KiB, one free dim in all) whose matrix reaches the dot in a
    transposed layout (`_transposed_layouts`). XLA's gemv rewriter gives any other
    matrix-vector dot a unit dim (a matrix-matrix dot no fusion takes), but it leaves a dot
    whose operand has a layout other than row-major, and `CpuInstructionFusion::ShouldFuse`
    then fuses the matrix's producers into the dot ("small matrix-vector product"), then the
    vector's: a fusible reader of both. Measured: `(a.T * b) @ v` is one fusion, `(b * a.T) @
    v` (the multiply takes its first operand's layout) is a dot reading a stored multiply;
    the gradient of `prod(1 + 0.1 * tanh(v4 @ w), axis=1)` (whose `reshape` with `dimensions`
    transposes) reads the tanh's gradient chain in both weight-gradient dots' fusions (fuzz
    seed 19 #1243, 0.82 of XLA's flops when the chain was stored once)."""
    shape_of = lambda v: (local_shapes or {}).get(v, program.values[v].shape)  # noqa: E731
    transposed = _transposed_layouts(program)
    out = []
    for op in program.ops:
        if op.primitive != "dot_general" or len(op.operands) != 2 or fusible(op, program):
            continue
        (lc, rc), (lb, rb) = op.param("dimension_numbers")
        shapes = [shape_of(v) for v in op.operands]
        if any(shapes[0][d] > 1 for d in lb):
            continue
        free = [
            [d for d in range(len(s)) if d not in c and d not in b and s[d] > 1]
            for s, c, b in zip(shapes, (lc, rc), (lb, rb))
        ]
        wide = [sum(n > 1 for n in s) for s in shapes]
        if len(free[0]) + len(free[1]) != 1:
            continue  # a dot product (a reduce) or a matrix-matrix product
        m = 0 if free[0] else 1  # the matrix side
        vector = program.values[op.operands[1 - m]]
        nbytes = np.prod(shapes[1 - m]) * vector.nbytes / max(vector.size, 1)
        if (wide[m], wide[1 - m]) != (2, 1) or nbytes >= _MATVEC_FUSION_BYTES:
            continue
        if transposed[op.operands[m]]:
            out.append(op.index)
    return frozenset(out)


def _transposed_layouts(program) -> list[bool]:
    """Per value, whether XLA's HLO before layout assignment gives it a layout other than
    row-major: a transpose's result (JAX lowers it, and a `reshape` with `dimensions`, to a
    transpose XLA lays out as a bitcast of its operand), and an elementwise op's whose first
    operand of its own shape has one (measured on XLA:CPU, jaxlib 0.10.2)."""
    out = [False] * len(program.values)
    for op in program.ops:
        if len(op.results) != 1:
            continue
        (r,) = op.results
        if op.primitive == "transpose":  # a bitcast of its operand: the permutations compose
            src = program.values[op.operands[0]].shape
            wide = [d for d in op.param("permutation") if src[d] > 1]
            out[r] = (wide != sorted(wide)) != out[op.operands[0]]
        elif op.primitive == "reshape" and op.param("dimensions") is not None:
            src = program.values[op.operands[0]].shape
            wide = [d for d in op.param("dimensions") if src[d] > 1]
            out[r] = wide != sorted(wide)
        elif op.primitive in prim.ELEMENTWISE:
            shape = program.values[r].shape
            for v in op.operands:
                if program.values[v].shape == shape and program.values[v].role not in (
                    "literal",
                    "constant",
                ):
                    out[r] = out[v]
                    break
    return out


def _charge_merged_to_counted(program, base, cpu) -> None:
    """Move, in place, the CPU executions of an op the model counts dead onto the repeat of it
    that CSE merged into it (same primitive, same operands): the work is the same, but the
    CostReport prices only the op the model keeps. Without the barriers, a `jax.checkpoint`
    body's recomputation merges with the forward's first evaluation even where that one is
    dead in the model (only the unreturned loss read it: fuzz seed 19 #843, `gelu(t @ w)`
    under a while-loop accumulation, whose recomputed dot and GELU were counted nowhere: 250
    flops predicted, 430 compiled; 316 once charged, as without `jax.checkpoint`)."""
    _, canon = _rewired(program)
    producers = program.producers()
    for op in program.ops:
        if not op.results:
            continue
        first = producers[canon[op.results[0]]]
        if first is None or first == op.index:
            continue
        if program.ops[first].primitive != op.primitive:
            continue
        for k in (0, 1):
            if base[k][first] == 0 and cpu[k][first] > 0 and base[k][op.index] > 0:
                cpu[k][op.index] += cpu[k][first]
                cpu[k][first] = 0.0


def recomputed_ops(remat, ana: Analysis) -> list[int]:
    """Ops that a strategy's remat policies run twice."""
    if not remat:
        return []
    rs = remat_space(ana)
    out = []
    for group, policy in remat:
        out += rs.groups[rs.index(group)].effects[POLICIES.index(policy)].twice_ops.tolist()
    return out


def cpu_memory_bytes(report, n_outputs: int = 1, live_end=None) -> float:
    """Predicted peak per-device bytes as XLA's CPU backend allocates them.

    `report` should price temporaries as XLA:CPU places them (`Evaluator.report(strategy,
    buffer_align_bytes=CPU_BUFFER_ALIGN_BYTES)`), and a program with `n_outputs` > 1 output
    leaves also holds its output tuple's pointer table (`CPU_TUPLE_ENTRY_BYTES` each).

    A reduce-scatter runs there as an all-reduce into a new buffer of the full size V, then a
    slice, and the all-reduce combiner merges those all-reduces into one, issued once the last of
    them is ready: until then every unreduced partial buffer stays live, and then every full-size
    result is live at once. Added to the target view's timeline at that op; a partial still
    live there in the timeline (`live_end` [values]: the op after each value's last reader, as
    `Evaluator` times them) is in it already and is not added twice. The target view keeps a
    partial until the reader of its scattered result, the new weight's update: an FSDP step's
    [256, 256] gradient, made before the last partial and updated after it, was counted twice
    (label-smoothing MLP, data=8: 1.36 of XLA's bytes; 1.02 counted once).
    """
    table = CPU_TUPLE_ENTRY_BYTES * n_outputs if n_outputs > 1 else 0
    timeline = np.asarray(report.memory_timeline, dtype=np.float64)
    scattered = [c for c in report.collectives if c.kind == "reduce-scatter"]
    if not len(timeline) or not scattered:
        return report.peak_bytes + table
    last = max(c.op for c in scattered)
    results = sum(c.bytes for c in scattered)
    held = sum(
        c.bytes
        for c in scattered
        if c.op < last and (live_end is None or live_end[c.value] <= last)
    )
    return max(report.peak_bytes, float(timeline[last]) + results + held) + table


def predicted_cpu_memory_bytes(
    ana: Analysis, strategy: Strategy, mesh: MeshSpec, hw: HardwareSpec | str
) -> float:
    """The prediction compared with `memory_analysis()` on XLA:CPU (outputs not donated, as
    `validate` compiles them): `cpu_memory_bytes` of the CPU-aligned report, its timeline laid
    out as XLA's buffer assignment allocates it (`cost/buffers.py`: each output in an allocation
    of its own for the whole step, which earlier temporaries may borrow; the other temporaries
    in one block), with the temporaries only XLA:CPU makes (`toast_core.cost.cpu_buffers`)."""
    ev = evaluator(ana, mesh, hardware(hw), CostOptions(donate_outputs=False))
    report = ev.report(strategy, buffer_align_bytes=CPU_BUFFER_ALIGN_BYTES, cpu_buffers=True)
    inputs, outputs, block = allocated_memory(ev, strategy, CPU_BUFFER_ALIGN_BYTES, cpu=True)
    if len(block):
        timeline = inputs + outputs + block
        peak_op = int(np.argmax(timeline))
        report = dataclasses.replace(
            report,
            peak_bytes=float(timeline[peak_op]),
            memory_timeline=tuple(timeline.tolist()),
            peak_op=peak_op,
        )
    return cpu_memory_bytes(report, len(ana.program.outputs), ev.live_end)


def _check_host_memory(ana: Analysis, report, n_devices: int, check_numerics: bool) -> None:
    """Refuse, before allocating anything, a run that cannot fit in this host's memory: every
    simulated device lives in it, and the unsharded reference run needs the inputs once more."""
    need = cpu_memory_bytes(report) * n_devices
    if check_numerics:
        need += sum(ana.program.values[i].nbytes for i in ana.program.inputs)
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > 1.25 * have:  # the prediction is within ~15 % of XLA's: refuse only hopeless runs
        raise ToastError(
            f"validate: running this strategy on {n_devices} simulated devices needs about "
            f"{need / 2**30:.1f} GiB of host memory and this machine has {have / 2**30:.1f} GiB; "
            "validate a smaller size of the model (the cost model itself needs no memory)"
        )


def compiled_step_time(
    hlo_text: str, cost: dict, mesh: MeshSpec, hw: HardwareSpec
) -> tuple[float, float]:
    """(compute_s, comm_s) of one step of a compiled program, judged from its own numbers alone.

    Compute: the program's instructions re-fused as TPU/GPU fuse them and priced with the cost
    model's roofline, `max(flops / (peak * efficiency), bytes / HBM B/s)`, per dot-like
    instruction and for the rest as a whole, with XLA's own flop count from `cost_analysis()`
    (`toast_core.apply.hlo_compute` says why the CPU's `bytes accessed` is not used). Comm: every
    collective of the optimized HLO priced on its replica groups' mesh axes with the alpha-beta
    formulas and constants the model uses, combined as the target's XLA combines them (the CPU
    backend combines differently and lowers reduce-scatters to all-reduces:
    `toast_core.apply.hlo_pricing.target_comm_s`); a combined op pays its latency once. A loop
    body counts as often as it runs (its known trip count), for compute and communication alike:
    `cost_analysis()` and the text show it once (`toast_core.apply.hlo_loops`).
    """
    from toast_core.apply.hlo_compute import judged_compute_s
    from toast_core.apply.hlo_loops import loop_scaled_cost

    scaled = loop_scaled_cost(hlo_text, cost)
    flops = scaled["flops"] + scaled["transcendentals"]
    compute_s = judged_compute_s(hlo_text, flops, hw)
    return compute_s, target_comm_s(hlo_text, mesh, hw)


def _op_counts(ops) -> dict[str, int]:
    counts = dict.fromkeys(COLLECTIVE_KINDS, 0)
    for op in ops:
        counts[op.kind] += 1
    return counts


def _has_abstract_leaves(args) -> bool:
    return any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree_util.tree_leaves(args))


def _small_size_run(fn, numerics_args, ana: Analysis, strategy: Strategy, mesh: Mesh):
    """The sharded function and concrete args for numerics at a smaller size: the function is
    traced and analysed again at that size and the strategy carried over by its JSON form."""
    from toast_core.analysis import analyze
    from toast_core.ir import trace

    small = analyze(trace(fn, *numerics_args))
    try:
        small_strategy = Strategy.from_json(strategy.to_json(), small)
        small_strategy.validate(small, mesh_spec_of(mesh))
    except ToastError as error:
        raise ToastError(
            f"validate: the strategy does not carry over to `numerics_args` ({error}); give "
            "numerics_args of the same structure whose sharded dims divide by the mesh axes"
        ) from None
    if len(small.named_dims) != len(ana.named_dims):
        raise ToastError(
            bad_value(
                "numerics_args",
                f"{len(small.named_dims)} named dims",
                f"a smaller size of the same program ({len(ana.named_dims)} named dims)",
            )
        )
    return shard(fn, small, small_strategy, mesh), concrete_args(tuple(numerics_args))


def _replicated_reference(fn: Callable, mesh: Mesh) -> Callable:
    """`fn` under `jax.jit` on the same mesh, every input and output replicated."""
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(fn, in_shardings=replicated, out_shardings=replicated)


def compare_outputs(got, want, noise=None) -> tuple[float, tuple[str, ...]]:
    """(max abs error, mismatches) of the sharded outputs `got` against the reference `want`.

    Leaf by leaf, in pytree order: the tolerance is `RTOL * max|want leaf| + ATOL`, widened by
    `NOISE_FACTOR` times the leaf's reordering noise when `noise(path)` gives it (module essay).
    A mismatch reads `path[index]: sharded 0.1 vs reference 0.2 (tolerance 1e-05)`, at the worst
    element of the leaf.
    """
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves = jax.tree_util.tree_leaves(want)
    if len(got_leaves) != len(want_leaves):
        return float("inf"), (f"{len(got_leaves)} outputs vs {len(want_leaves)} in the reference",)
    err, mismatches = 0.0, []
    for (path, g), w in zip(got_leaves, want_leaves):
        g = np.asarray(g, dtype=np.float64)
        w = np.asarray(w, dtype=np.float64)
        if g.shape != w.shape:
            mismatches.append(f"{jax.tree_util.keystr(path)}: shape {g.shape} vs {w.shape}")
            continue
        if not g.size:
            continue
        finite = np.isfinite(w)
        scale = float(np.max(np.abs(w[finite]))) if finite.any() else 0.0
        # NaN against NaN, and an infinity against the same infinity, agree (`-inf - -inf` is NaN)
        with np.errstate(invalid="ignore"):  # the `inf - inf` the `where` discards
            diff = np.where((np.isnan(g) & np.isnan(w)) | (g == w), 0.0, np.abs(g - w))
        diff = np.where(np.isnan(diff), np.inf, diff)
        worst = int(np.argmax(diff))
        err = max(err, float(diff.flat[worst]))
        tolerance = RTOL * scale + ATOL
        if diff.flat[worst] > tolerance and noise is not None:
            tolerance += NOISE_FACTOR * noise(jax.tree_util.keystr(path))
        if diff.flat[worst] > tolerance:
            mismatches.append(
                f"{jax.tree_util.keystr(path) or '<output>'}[{worst}]: sharded "
                f"{g.flat[worst]:.7g} vs reference {w.flat[worst]:.7g} (tolerance {tolerance:.2g})"
            )
    return err, tuple(mismatches)


def _reorder_noise(fn: Callable, args, want) -> Callable[[str], float]:
    """Per output path, the largest difference between the jitted reference and the un-jitted
    function: how far reordering alone moves that leaf. Computed on first need."""
    cache: dict[str, float] = {}

    def noise(path: str) -> float:
        if not cache:
            eager = jax.tree_util.tree_flatten_with_path(fn(*args))[0]
            for (p, e), w in zip(eager, jax.tree_util.tree_leaves(want)):
                e, w = np.asarray(e, dtype=np.float64), np.asarray(w, dtype=np.float64)
                both = np.isfinite(e) & np.isfinite(w)
                cache[jax.tree_util.keystr(p)] = (
                    float(np.max(np.abs(e - w)[both])) if both.any() else 0.0
                )
        return cache.get(path, 0.0)

    return noise


def validate(
    fn: Callable,
    example_args: tuple,
    ana: Analysis,
    strategy: Strategy,
    mesh: Mesh,
    hw: HardwareSpec | str,
    *,
    check_numerics: bool = True,
    numerics_args: tuple | None = None,
) -> ValidationReport:
    """Compiles the sharded function with XLA, checks its numerics and compares the compiled
    program with the prediction (module essay).

    `example_args` may hold `jax.ShapeDtypeStruct`s: the program then compiles at that size
    without allocating anything. Numerics run on `numerics_args` when given (concrete arrays or
    ShapeDtypeStructs, a size that fits the host), else on the example arguments (random data
    for abstract leaves), unless `check_numerics=False`.
    """
    ms = mesh_spec_of(mesh)
    hw = hardware(hw)  # a preset name or a HardwareSpec, as everywhere
    report = estimate(ana, strategy, ms, hw, CostOptions(donate_outputs=False))
    sharded = shard(fn, ana, strategy, mesh)
    example_args = tuple(example_args)
    if numerics_args is None and check_numerics:
        _check_host_memory(ana, report, ms.n_devices, check_numerics)
    compiled = compile_lowered(sharded.lower(*example_args), mesh, compiler_options_for(strategy))
    hlo = compiled.as_text()
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    mem = compiled.memory_analysis()
    compiled_mem = float(
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        + mem.temp_size_in_bytes
        - mem.alias_size_in_bytes
    )
    flops, transcendentals = cpu_flops(report, ana, strategy, ms)
    ok, err, mismatches, numerics_on = True, 0.0, (), ""
    if check_numerics:
        if numerics_args is not None:
            run, args = _small_size_run(fn, numerics_args, ana, strategy, mesh)
            numerics_on = "numerics_args"
        else:
            run, args = compiled, concrete_args(example_args)
            numerics_on = "random data" if _has_abstract_leaves(example_args) else "example_args"
        want = _replicated_reference(fn, mesh)(*args)
        err, mismatches = compare_outputs(run(*args), want, _reorder_noise(fn, args, want))
        ok = not mismatches
    compute_s, comm_s = compiled_step_time(hlo, cost, ms, hw)
    ev = evaluator(ana, ms, hw, CostOptions(donate_outputs=False))
    return ValidationReport(
        numerics_ok=ok,
        max_abs_error=err,
        predicted_flops=flops,
        predicted_flops_target=report.flops_per_device,
        compiled_flops=float(cost.get("flops", 0.0)),
        predicted_collective_bytes=cpu_view(report, ana.program),
        compiled_collective_bytes={k: float(v) for k, v in collective_bytes_by_kind(hlo).items()},
        predicted_memory_bytes=predicted_cpu_memory_bytes(ana, strategy, ms, hw),
        compiled_memory_bytes=compiled_mem,
        predicted_collective_bytes_target=report.collective_bytes_by_kind(),
        predicted_memory_bytes_target=report.peak_bytes,
        predicted_transcendentals=transcendentals,
        compiled_transcendentals=float(cost.get("transcendentals", 0.0)),
        hlo_text=hlo,
        predicted_step_time_s=report.step_time_s,
        compiled_step_time_s=compute_s + comm_s,
        predicted_compute_s=report.compute_s,
        predicted_comm_s=report.comm_s,
        compiled_compute_s=compute_s,
        compiled_comm_s=comm_s,
        predicted_collective_ops=ev.combined_op_counts(report.collectives, cpu=True),
        compiled_collective_ops=collective_ops_by_kind(hlo),
        predicted_collective_ops_target=report.collective_ops_by_kind(),
        compiled_collective_ops_target=_op_counts(target_collective_ops(hlo, ms, hw)),
        numerics_checked=bool(check_numerics),
        numerics_on=numerics_on,
        numerics_mismatches=mismatches,
    )
