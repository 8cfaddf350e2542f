""" "Make it fit": when no plan fits the device's memory, three concrete ways out, each priced.

* **remat**: recompute every remat group in the backward (`remat[g]=full` pinned for each; any
  remat pin or forbid of the user's replaced), searched on the same mesh under the other pins;
* **a larger mesh**: `tc.min_devices`, the smallest power-of-two device count with a plan that
  fits, with its mesh shape and plan (under the user's remat and conflict pins; pins on named
  dims may name mesh axes the new shape lacks);
* **a smaller batch**: a zoo model's batch halved until a plan fits (each size traced and
  scored after the search's seeding: baselines and greedy descents, no tree search).

Each option carries its price (step time, peak bytes per device, fits) and what applying it
changes (pins, the mesh, or the model's batch). No Streamlit here beyond the cached loaders, so the
pricing runs the same from a test.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import toast_core as tc
from app import cached
from app.cached import Loaded
from app.fmt import fmt_bytes

#: min_devices looks up to this many times the current device count (at least MIN_REACH).
REACH, MIN_REACH = 64, 256


@dataclass(frozen=True)
class FitOption:
    """One way to make the program fit, priced; `available` False says why not in `note`."""

    kind: str  # remat | mesh | batch
    title: str
    change: str  # what applying it changes, one line
    available: bool = True
    note: str = ""
    step_time_s: float | None = None
    peak_bytes: float | None = None
    fits: bool | None = None
    strategy: tc.Strategy | None = None
    pins: tuple[str, ...] = ()  # the pins to apply (remat, batch)
    mesh_text: str = ""  # the mesh to apply (mesh)
    batch: int = 0  # the batch to apply (batch)
    arithmetic: tuple[str, ...] = ()  # why fewer devices cannot fit (mesh)


def remat_pins(ana: tc.Analysis, pins: tuple[str, ...]) -> tuple[str, ...]:
    """`pins` with every remat pin and forbid replaced by `remat[g]=full` for each group."""
    kept = [p for p in pins if tc.parse_pin(p).kind != "remat"]
    return tuple(kept + [tc.remat_pin(g, "full") for g in tc.remat_groups(ana)])


def remat_option(
    loaded: Loaded,
    mesh_text: str,
    hw_name: str,
    pins: tuple[str, ...],
    budget_s: float,
    num_simulations: int | None,
    seed: int = 0,
    current: tc.Strategy | None = None,
) -> FitOption:
    """The best plan on the current mesh with every remat group recomputed in full (`current`:
    the search's best, to say when it already recomputes everything)."""
    title = "Recompute activations (remat full)"
    groups = tc.remat_groups(loaded.ana)
    if not groups:
        return FitOption(
            "remat", title, "", False, "no remat group: the program has no backward part"
        )
    new_pins = remat_pins(loaded.ana, pins)
    change = "pin " + ", ".join(f"`{tc.remat_pin(g, 'full')}`" for g in groups)
    if any(tc.parse_pin(p).kind == "remat" for p in pins):
        change += " (replacing your remat pins and forbids)"
    elif current is not None and dict(current.remat) == dict.fromkeys(groups, "full"):
        change += " (as the search's best does)"
    try:
        events = tc.search_iter(
            loaded.ana,
            cached.mesh_of(mesh_text),
            tc.hardware(hw_name),
            budget_s=budget_s,
            num_simulations=num_simulations,
            seed=seed,
            pins=new_pins,
        )
        last = collections.deque(events, maxlen=1)[0]
    except tc.ToastError as exc:
        return FitOption("remat", title, change, False, str(exc))
    return FitOption(
        "remat",
        title,
        change,
        step_time_s=last.best_step_time_s,
        peak_bytes=last.best_peak_bytes,
        fits=last.best_fits,
        strategy=last.best_strategy,
        pins=new_pins,
    )


def mesh_option(
    loaded: Loaded,
    n_devices: int,
    hw_name: str,
    budget_s: float,
    progress: Callable[[tc.MeshProgress], None] | None = None,
    seed: int = 0,
    pins: tuple[str, ...] = (),
    num_simulations: int | None = None,
) -> FitOption:
    """The smallest power-of-two device count with a plan that fits (`tc.min_devices`, up to
    REACH times the current `n_devices`), each count searched within `budget_s` shared by its
    mesh shapes, under the remat and conflict pins among `pins` (pins on named dims name mesh
    axes a new shape may lack)."""
    shape_free = shape_free_pins(pins)
    max_devices = max(MIN_REACH, REACH * n_devices)
    try:
        fit = tc.min_devices(
            loaded.ana,
            hw_name,
            budget_s=budget_s,
            max_devices=max_devices,
            seed=seed,
            progress=progress,
            pins=shape_free,
            num_simulations=num_simulations,
        )
    except tc.ToastError as exc:
        return FitOption("mesh", "More devices", "", False, str(exc))
    if fit.devices is None:
        closest = min(fit.tried, key=lambda t: t[1].peak_bytes, default=None)
        best = (
            f"; the closest: {closest[0]:,} devices need {fmt_bytes(closest[1].peak_bytes)} "
            "each (a larger budget may find a plan that fits)"
            if closest
            else ""
        )
        return FitOption(
            "mesh",
            "More devices",
            "",
            False,
            f"no power of two up to {max_devices:,} devices fits{best}",
            arithmetic=fit.arithmetic,
        )
    plan = fit.plan
    return FitOption(
        "mesh",
        f"{fit.devices} devices",
        f"mesh `{plan.mesh}`"
        + (" (searched without your pins on named dims)" if shape_free != tuple(pins) else ""),
        step_time_s=plan.step_time_s,
        peak_bytes=plan.peak_bytes,
        fits=plan.fits,
        strategy=plan.strategy,
        mesh_text=str(plan.mesh),
        arithmetic=fit.arithmetic,
    )


def shape_free_pins(pins: tuple[str, ...]) -> tuple[str, ...]:
    """The pins that hold on any mesh shape: all but those on named dims (remat, conflicts)."""
    return tuple(p for p in pins if tc.parse_pin(p).kind != "dim")


def batch_option(
    loaded: Loaded,
    mesh_text: str,
    hw_name: str,
    pins: tuple[str, ...],
    on_try: Callable[[int], None] | None = None,
) -> FitOption:
    """The largest batch (the current one halved, again and again) for which the search's seeding
    finds a plan that fits, under the same pins when they still hold; `on_try(batch)` is called
    before each batch is traced and priced (tracing a large model takes seconds)."""
    title = "A smaller batch"
    if loaded.spec.source != "zoo" or not loaded.batch:
        return FitOption(
            "batch",
            title,
            "",
            False,
            "only for zoo models with a batch setting: for your own file, lower the batch there",
        )
    batch, smallest = loaded.batch // 2, None
    while batch >= 1:
        spec = dataclasses.replace(loaded.spec, batch=batch)
        if on_try is not None:
            on_try(batch)
        try:
            small = cached.load(spec)
            kept = _pins_that_hold(small, mesh_text, pins)
            ev = cached.quick_search(small.key, mesh_text, hw_name, kept, small.ana)
        except tc.ToastError as exc:
            return FitOption("batch", title, "", False, str(exc))
        smallest = ev
        if ev.best_fits:
            dropped = "" if kept == pins else " (your pins do not carry over: searched without)"
            return FitOption(
                "batch",
                f"Batch {batch} instead of {loaded.batch}",
                f"load {spec.title}{dropped}",
                step_time_s=ev.best_step_time_s,
                peak_bytes=ev.best_peak_bytes,
                fits=True,
                strategy=ev.best_strategy,
                pins=kept,
                batch=batch,
            )
        batch //= 2
    need = f": batch 1 needs {fmt_bytes(smallest.best_peak_bytes)}" if smallest else ""
    return FitOption("batch", title, "", False, f"no smaller batch fits{need}")


def _pins_that_hold(loaded: Loaded, mesh_text: str, pins: tuple[str, ...]) -> tuple[str, ...]:
    """`pins` if they hold on `loaded` (named dims are numbered alike at another batch), else ()."""
    try:
        cached.check_pins(loaded, mesh_text, "", tuple(pins))
    except tc.ToastError:
        return ()
    return tuple(pins)
