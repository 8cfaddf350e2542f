"""Validating a strategy against what XLA actually compiles (the external judge).

`validate` shards the function, compiles it on a `jax.sharding.Mesh`, runs it on small inputs and
compares with the unsharded function (rtol 1e-4, atol 1e-5 in fp32), then compares the cost
model's predictions with the compiled program:

* per-device flops and transcendentals vs `compiled.cost_analysis()` (`flops`, `transcendentals`);
* collective bytes per kind vs those parsed from `compiled.as_text()` (result bytes per device);
* per-device memory vs `memory_analysis()`: argument + output + temp - alias (the CPU's
  `peak_memory_in_bytes` is unreliable).

XLA's CPU backend lowers collectives differently from TPU/GPU, and the compiled program's text and
`cost_analysis()` show a loop body once whatever its trip count, so the prediction is also given "as
XLA CPU shows it": a reduce-scatter becomes an all-reduce of the full buffer followed by a local
slice (so the full reduced buffer is also live in memory), and bf16 collectives run in f32. Both
views are reported (`*_target` is the TPU/GPU view); the comparison uses the CPU view.
Wall time on simulated devices means nothing and is never measured.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import numpy as np
from jax.sharding import Mesh

from toast_core.analysis import Analysis
from toast_core.apply.hlo import collective_bytes_by_kind
from toast_core.apply.shard import mesh_spec_of, shard
from toast_core.cost import CostOptions, estimate
from toast_core.cost.collectives import COLLECTIVE_KINDS
from toast_core.cost.model import reduction_flops
from toast_core.errors import ToastError
from toast_core.mesh import HardwareSpec
from toast_core.strategy import Strategy, remat_space
from toast_core.strategy.remat import POLICIES

RTOL, ATOL = 1e-4, 1e-5


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
        }


def concrete_args(args, seed: int = 0):
    """Arrays for `args`: concrete leaves pass through; ShapeDtypeStructs get small random data
    (floats ~ N(0, 0.02), integers in [0, 2), booleans False)."""
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


#: XLA's CPU pipeline expands optimization barriers before CSE, which then merges a
#: recomputation with the forward it repeats (measured with `jax.checkpoint` itself: the same
#: compiled program with and without it). TPU and GPU keep the barrier; on CPU, CSE is disabled
#: for a strategy with remat so that the compiled program is the one those backends run.
REMAT_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "cse"}


def compiler_options_for(strategy: Strategy) -> dict:
    """XLA compiler options for validating `strategy` on CPU (see REMAT_COMPILER_OPTIONS)."""
    if strategy.remat and jax.default_backend() == "cpu":
        return dict(REMAT_COMPILER_OPTIONS)
    return {}


def cpu_flops(report, ana: Analysis) -> tuple[float, float]:
    """Predicted (flops, transcendentals) per device as `cost_analysis()` counts them: the body of
    a loop once, whatever its trip count (the per-step figures are in the CostReport)."""
    program = ana.program
    trips = [op.trip_count for op in program.ops]
    again = set(recomputed_ops(report.remat, ana))  # run twice under remat
    flops = sum(c.flops / trips[c.op] * (1 + (c.op in again)) for c in report.op_costs)
    transcendentals = sum(
        c.transcendentals / trips[c.op] * (1 + (c.op in again)) for c in report.op_costs
    )
    return flops + reduction_flops(report.collectives, program, once=True), transcendentals


def recomputed_ops(remat, ana: Analysis) -> list[int]:
    """Ops that a strategy's remat policies run twice."""
    if not remat:
        return []
    rs = remat_space(ana)
    out = []
    for group, policy in remat:
        out += rs.groups[rs.index(group)].effects[POLICIES.index(policy)].twice_ops.tolist()
    return out


def cpu_memory_bytes(report) -> float:
    """Predicted peak per-device bytes as XLA's CPU backend allocates them.

    A reduce-scatter runs there as an all-reduce into a new buffer of the full size V, then a
    slice, and the all-reduce combiner merges those all-reduces into one, issued once the last of
    them is ready: until then every unreduced partial buffer stays live, and then every full-size
    result is live at once. Added to the target view's timeline at that op (an approximation that
    may count a partial buffer twice when it is also read after that op).
    """
    timeline = np.asarray(report.memory_timeline, dtype=np.float64)
    scattered = [c for c in report.collectives if c.kind == "reduce-scatter"]
    if not len(timeline) or not scattered:
        return report.peak_bytes
    last = max(c.op for c in scattered)
    results = sum(c.bytes for c in scattered)
    held = sum(c.bytes for c in scattered if c.op < last)
    return max(report.peak_bytes, float(timeline[last]) + results + held)


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


def validate(
    fn: Callable,
    example_args: tuple,
    ana: Analysis,
    strategy: Strategy,
    mesh: Mesh,
    hw: HardwareSpec,
    *,
    check_numerics: bool = True,
) -> ValidationReport:
    """Compiles the sharded function with XLA, runs it, and compares it with the prediction."""
    ms = mesh_spec_of(mesh)
    report = estimate(ana, strategy, ms, hw, CostOptions(donate_outputs=False))
    _check_host_memory(ana, report, ms.n_devices, check_numerics)
    sharded = shard(fn, ana, strategy, mesh)
    args = concrete_args(tuple(example_args))
    compiled = sharded.lower(*args).compile(compiler_options=compiler_options_for(strategy))
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
    flops, transcendentals = cpu_flops(report, ana)
    ok, err = True, 0.0
    if check_numerics:
        got = jax.tree_util.tree_leaves(compiled(*args))
        want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
        for g, w in zip(got, want):
            g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
            if g.size:
                err = max(err, float(np.max(np.abs(g - w))))
            ok = ok and bool(np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True))
    return ValidationReport(
        numerics_ok=ok,
        max_abs_error=err,
        predicted_flops=flops,
        predicted_flops_target=report.flops_per_device,
        compiled_flops=float(cost.get("flops", 0.0)),
        predicted_collective_bytes=cpu_view(report, ana.program),
        compiled_collective_bytes={k: float(v) for k, v in collective_bytes_by_kind(hlo).items()},
        predicted_memory_bytes=cpu_memory_bytes(report),
        compiled_memory_bytes=compiled_mem,
        predicted_collective_bytes_target=report.collective_bytes_by_kind(),
        predicted_memory_bytes_target=report.peak_bytes,
        predicted_transcendentals=transcendentals,
        compiled_transcendentals=float(cost.get("transcendentals", 0.0)),
        hlo_text=hlo,
    )
