"""Mesh shape and device count as decisions: `search_meshes` and `min_devices`.

A plan is a mesh shape plus a strategy on it. `search_meshes(ana, devices=N, hw=hw)` tries the
factorizations of N into 1-3 named mesh axes and searches each within a share of one budget;
`min_devices(ana, hw)` finds the smallest power-of-two device count for which a plan fits.

**Shapes.** Mesh axes are named by role (`data`; `data, model`; `data, fsdp, model`), largest
first; since the search may put any named dim on any mesh axis, two fast meshes with the same
sizes in another order are the same plan space and only one is tried. A hardware preset whose
chips are joined by fast links only within a domain (8 GPUs of a node on NVLink, 256 chips of a
TPU v5e pod) gets, when N exceeds the domain, a slow major axis `dcn` whose size is at least
N / domain (up to 4 times that), so that the minor axes stay inside a domain.

**Device count.** Below some count nothing can fit, whatever the plan: the weights, their
gradients (all live at once when the update follows the whole backward, as in a traced train
step), the optimizer state and the batch, spread perfectly over n devices, need
`bytes / n <= capacity`. `min_devices` starts at the smallest power of two that passes this
bound (the arithmetic is returned, to say why fewer devices cannot work) and searches upwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from toast_core.analysis import Analysis
from toast_core.cost import CostOptions, evaluator
from toast_core.errors import ToastError, bad_value
from toast_core.fmt import fmt_bytes
from toast_core.mesh import HardwareSpec, MeshSpec, hardware
from toast_core.search.mcts import search_iter
from toast_core.search.types import SearchEvent
from toast_core.strategy import remat_space

#: Chips joined by fast links (ICI, NVLink) per preset; a larger mesh crosses slow links.
FAST_DOMAIN = {
    "tpu-v4": 4096,
    "tpu-v5e": 256,
    "tpu-v5p": 8960,
    "tpu-v6e": 256,
    "a100-80gb": 8,
    "h100-80gb": 8,
    "h200": 8,
    "b200": 8,
}
AXIS_NAMES = {1: ("data",), 2: ("data", "model"), 3: ("data", "fsdp", "model")}


@dataclass(frozen=True)
class MeshPlan:
    """The best plan found on one mesh shape."""

    mesh: MeshSpec
    strategy: object  # Strategy
    step_time_s: float
    peak_bytes: float
    fits: bool
    efficiency: float
    elapsed_s: float


@dataclass(frozen=True)
class MeshProgress:
    """A streaming event of `search_meshes_iter`: the shape being searched (index of n), its
    search's latest event, and the finished plans so far (ranked)."""

    shape_index: int
    n_shapes: int
    mesh: MeshSpec
    event: SearchEvent | None
    ranking: tuple[MeshPlan, ...] = ()
    done: bool = False


@dataclass(frozen=True)
class FitResult:
    """`min_devices`' answer: the smallest power-of-two count with a plan that fits."""

    devices: int | None
    plan: MeshPlan | None
    lower_bound_devices: int
    arithmetic: tuple[str, ...]
    tried: tuple[tuple[int, MeshPlan], ...] = field(default=())


def _factorizations(n: int, parts: int, max_first: int | None = None) -> list[tuple[int, ...]]:
    """Non-increasing factorizations of n into exactly `parts` factors >= 2."""
    if parts == 1:
        return [(n,)] if n >= 2 and (max_first is None or n <= max_first) else []
    out = []
    top = n if max_first is None else min(n, max_first)
    for f in range(top, 1, -1):
        if n % f == 0:
            out += [(f, *rest) for rest in _factorizations(n // f, parts - 1, f)]
    return out


def mesh_shapes(devices: int, hw: HardwareSpec | str, max_axes: int = 3) -> list[MeshSpec]:
    """The mesh shapes of `devices` chips of `hw` tried by `search_meshes` (see module essay)."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ToastError(bad_value("devices", devices, "a positive int"))
    if not isinstance(max_axes, int) or not 1 <= max_axes <= 3:
        raise ToastError(bad_value("max_axes", max_axes, "1, 2 or 3"))
    hw = hardware(hw)
    if devices == 1:
        return [MeshSpec({"data": 1})]
    domain = FAST_DOMAIN.get(hw.name)
    out = []
    if domain is None or devices <= domain:
        for parts in range(1, max_axes + 1):
            for sizes in _factorizations(devices, parts):
                out.append(MeshSpec(dict(zip(AXIS_NAMES[parts], sizes))))
        return out
    least = math.ceil(devices / domain)
    for slow in range(least, min(4 * least, devices) + 1):  # larger slow axes only lose
        if devices % slow:
            continue
        inner = devices // slow
        if inner == 1:
            out.append(MeshSpec({"dcn": slow}, slow_axes=("dcn",)))
            continue
        for parts in range(1, max_axes):
            for sizes in _factorizations(inner, parts):
                axes = {"dcn": slow, **dict(zip(AXIS_NAMES[parts], sizes))}
                out.append(MeshSpec(axes, slow_axes=("dcn",)))
    return out


def _rank(plans) -> tuple[MeshPlan, ...]:
    return tuple(
        sorted(plans, key=lambda p: (not p.fits, p.step_time_s if p.fits else p.peak_bytes))
    )


def search_meshes_iter(
    ana: Analysis,
    devices: int,
    hw: HardwareSpec | str,
    *,
    budget_s: float | None = 30.0,
    max_axes: int = 3,
    seed: int = 0,
    pins=(),
    cost_options: CostOptions | None = None,
    meshes=None,
    num_simulations: int | None = None,
) -> Iterator[MeshProgress]:
    """Searches every mesh shape of `devices` chips (or the given `meshes`), each within an
    equal share of `budget_s`, yielding progress; the last event has `done=True` and the
    ranking (plans that fit first, then by step time). Pins must name mesh axes every shape has
    (remat and conflict pins always do). `num_simulations` caps every shape's search at that
    many MCTS simulations too; with `budget_s=None` it is the only limit, and the answer is the
    same on a loaded machine (tests, benches)."""
    hw = hardware(hw)
    if not (budget_s is None and num_simulations is not None) and (
        not isinstance(budget_s, int | float) or budget_s <= 0
    ):
        raise ToastError(bad_value("budget_s", budget_s, "a positive number of seconds"))
    shapes = list(meshes) if meshes is not None else mesh_shapes(devices, hw, max_axes)
    opts = cost_options or CostOptions()
    plans: list[MeshPlan] = []
    share = None if budget_s is None else budget_s / max(len(shapes), 1)
    for i, mesh in enumerate(shapes):
        t0 = time.perf_counter()
        last = None
        for ev in search_iter(
            ana,
            mesh,
            hw,
            budget_s=share,
            num_simulations=num_simulations,
            seed=seed,
            pins=pins,
            cost_options=opts,
        ):
            last = ev
            yield MeshProgress(i, len(shapes), mesh, ev, _rank(plans))
        report = evaluator(ana, mesh, hw, opts).report(last.best_strategy)
        plans.append(
            MeshPlan(
                mesh,
                last.best_strategy.with_name(f"search on {mesh}"),
                report.step_time_s,
                report.peak_bytes,
                report.fits,
                report.efficiency,
                time.perf_counter() - t0,
            )
        )
    ranking = _rank(plans)
    yield MeshProgress(
        len(shapes), len(shapes), ranking[0].mesh if ranking else None, None, ranking, True
    )


def search_meshes(
    ana: Analysis, devices: int, hw: HardwareSpec | str, **kw
) -> tuple[MeshPlan, ...]:
    """The ranking of mesh shapes of `devices` chips, best plan each (see `search_meshes_iter`
    for the keywords)."""
    events = list(search_meshes_iter(ana, devices, hw, **kw))
    return events[-1].ranking


def memory_floor(ana: Analysis) -> tuple[float, tuple[str, ...]]:
    """(bytes no plan can spread below, the arithmetic): weights + gradients + optimizer state +
    data, all live together at the update of a train step."""
    prog = ana.program
    first_backward = remat_space(ana).first_backward
    has_backward = first_backward < len(prog.ops)
    # Weights are the persistent inputs the forward reads; the other persistent inputs (Adam's
    # moments, step counts) are optimizer state, read only by the update.
    read_forward = {v for op in prog.ops[:first_backward] for v in op.operands}
    weights = state = data = 0
    for vid in prog.inputs:
        v = prog.values[vid]
        if v.role in ("parameter", "state"):
            if v.role == "parameter" and (vid in read_forward or not has_backward):
                weights += v.nbytes
            else:
                state += v.nbytes
        else:
            data += v.nbytes
    grads = weights if has_backward else 0
    total = weights + grads + state + data
    lines = (
        f"weights {fmt_bytes(weights)} + gradients {fmt_bytes(grads)} + optimizer state "
        f"{fmt_bytes(state)} + data {fmt_bytes(data)} = {fmt_bytes(total)}",
    )
    return float(total), lines


def min_devices(
    ana: Analysis,
    hw: HardwareSpec | str,
    *,
    budget_s: float | None = 30.0,
    max_devices: int = 1 << 16,
    max_axes: int = 3,
    seed: int = 0,
    cost_options: CostOptions | None = None,
    progress=None,
    pins=(),
    num_simulations: int | None = None,
) -> FitResult:
    """The smallest power-of-two device count with a plan that fits `hw`'s memory, its plan,
    and the arithmetic that rules out fewer devices. Each count tried gets `budget_s` shared by
    its mesh shapes; `progress(MeshProgress)` is called with every event, for streaming. `pins`
    (and forbids) apply to every shape, so they must not name mesh axes: remat and conflict
    pins (`!remat[blocks]=full`, `K2=1`). `num_simulations`: as in `search_meshes_iter`."""
    hw = hardware(hw)
    opts = cost_options or CostOptions()
    capacity = hw.hbm_capacity_bytes * (1.0 - opts.memory_headroom)
    floor_bytes, lines = memory_floor(ana)
    need = max(1, math.ceil(floor_bytes / capacity))
    start = 1 << max(0, math.ceil(math.log2(need)))
    verdict = f"so fewer than {start} (a power of two) cannot fit" if start > 1 else "no bound"
    arithmetic = lines + (
        f"/ {fmt_bytes(capacity)} usable per {hw.name} = {floor_bytes / capacity:.2f} devices "
        f"at least: {verdict}",
    )
    tried = []
    n = start
    while n <= max_devices:
        last = None
        for last in search_meshes_iter(
            ana,
            n,
            hw,
            budget_s=budget_s,
            max_axes=max_axes,
            seed=seed,
            pins=pins,
            cost_options=opts,
            num_simulations=num_simulations,
        ):
            if progress is not None:
                progress(last)
        best = last.ranking[0]
        tried.append((n, best))
        if best.fits:
            below = [
                f"{m} devices: best plan needs {fmt_bytes(p.peak_bytes)} per device"
                for m, p in tried[:-1]
            ]
            return FitResult(n, best, start, arithmetic + tuple(below), tuple(tried))
        n *= 2
    return FitResult(None, None, start, arithmetic, tuple(tried))
