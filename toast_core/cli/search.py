"""`toast search` (one mesh, or the mesh shapes of `--devices N`) and `toast fit`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from toast_core.cli.common import (
    analyze_target,
    mesh_and_hardware,
    parse_budget,
    report_row,
    simulate_devices,
    status_line,
    table,
)
from toast_core.fmt import fmt_bytes, fmt_s


def _plan_rows(plans) -> list[list[str]]:
    return [
        [
            str(p.mesh),
            fmt_s(p.step_time_s),
            fmt_bytes(p.peak_bytes),
            "yes" if p.fits else "NO",
            f"{p.efficiency:.1%}",
            ",".join(f"{g}={pol}" for g, pol in p.strategy.remat) or "-",
        ]
        for p in plans
    ]


_PLAN_HEADER = ["mesh", "step", "peak mem", "fits", "efficiency", "remat"]


def _plan_doc(p) -> dict:
    return {
        "mesh": p.mesh.as_dict(),
        "slow_axes": list(p.mesh.slow_axes),
        "step_time_s": p.step_time_s,
        "peak_bytes": p.peak_bytes,
        "fits": p.fits,
        "efficiency": p.efficiency,
        "strategy": json.loads(p.strategy.to_json(p.mesh)),
    }


def cmd_search_meshes(args) -> int:
    import toast_core as tc

    _, _, ana, _ = analyze_target(args)
    hw = tc.hardware(args.hardware)
    budget = parse_budget(args.budget)
    last = None
    for ev in tc.search_meshes_iter(
        ana, args.devices, hw, budget_s=budget, seed=args.seed, pins=args.pin or ()
    ):
        last = ev
        if ev.event is not None:
            best = ev.event
            status_line(
                f"[{ev.shape_index + 1}/{ev.n_shapes}] {ev.mesh}: best "
                f"{fmt_s(best.best_step_time_s)} {'fits' if best.best_fits else 'DOES NOT FIT'}"
                + " "
                * 10,
                args,
            )
    status_line("\n", args)
    ranking = last.ranking
    if args.out and ranking:
        Path(args.out).write_text(ranking[0].strategy.to_json(ranking[0].mesh, ana.program.name))
    if args.json:
        print(json.dumps({"ranking": [_plan_doc(p) for p in ranking]}, indent=2))
        return 0
    print(f"{ana.program.name}: mesh shapes of {args.devices} x {hw.name}, best plan each")
    print(table(_plan_rows(ranking), _PLAN_HEADER))
    if ranking and not ranking[0].fits:
        print("WARNING: NO MEMORY-FEASIBLE PLAN ON ANY SHAPE; try `toast fit` for a device count")
    return 0


def cmd_fit(args) -> int:
    import toast_core as tc

    _, _, ana, _ = analyze_target(args)
    hw = tc.hardware(args.hardware)
    budget = parse_budget(args.budget)

    def progress(ev):
        if ev.event is not None:
            status_line(
                f"{ev.mesh.n_devices} devices [{ev.shape_index + 1}/{ev.n_shapes}] {ev.mesh}"
                + " " * 20,
                args,
            )

    fit = tc.min_devices(
        ana, hw, budget_s=budget, seed=args.seed, max_devices=args.max_devices, progress=progress
    )
    status_line("\n", args)
    if args.json:
        doc = {
            "devices": fit.devices,
            "lower_bound_devices": fit.lower_bound_devices,
            "arithmetic": list(fit.arithmetic),
            "plan": _plan_doc(fit.plan) if fit.plan else None,
            "tried": [{"devices": n, **_plan_doc(p)} for n, p in fit.tried],
        }
        print(json.dumps(doc, indent=2))
        return 0 if fit.devices else 1
    print(f"{ana.program.name} on {hw.name}:")
    for line in fit.arithmetic:
        print(f"  {line}")
    print(table(_plan_rows([p for _, p in fit.tried]), _PLAN_HEADER))
    if fit.devices is None:
        print(f"NO PLAN FITS up to {args.max_devices} devices")
        return 1
    print(f"\nfewest devices that fit: {fit.devices} ({fit.plan.mesh})")
    for line in fit.plan.strategy.describe(ana, fit.plan.mesh):
        print(f"  {line}")
    return 0


def cmd_search(args) -> int:
    import toast_core as tc

    if args.devices is not None:
        return cmd_search_meshes(args)
    mesh, hw = mesh_and_hardware(args)
    budget = parse_budget(args.budget) if args.simulations is None or args.budget else None
    # XLA judges the best plans when there is a time budget to do it in (or when asked).
    verify = args.verify if args.verify is not None else (3 if budget else 0)
    if verify:
        simulate_devices(mesh.n_devices)
    _, _, ana, _ = analyze_target(args)
    settings = dict(
        budget_s=budget,
        num_simulations=args.simulations,
        seed=args.seed,
        pins=args.pin or (),
        forbids=args.forbid or (),
        verify=verify,
        workers=args.workers,
    )
    show = not args.json and sys.stderr.isatty() or bool(os.environ.get("TOAST_PROGRESS"))
    last = None
    with _progress(show, budget) as update:
        for ev in tc.search_iter(ana, mesh, hw, **settings):
            last = ev
            update(ev)
    best = last.best_strategy.with_name("search")
    report = tc.estimate(ana, best, mesh, hw)
    if args.out:
        text = (
            tc.plan_module(ana, best, mesh)
            if args.out.endswith(".py")
            else best.to_json(mesh, ana.program.name)
        )
        Path(args.out).write_text(text)
    if args.json:
        print(
            json.dumps(
                {
                    "strategy": json.loads(best.to_json(mesh, ana.program.name)),
                    "report": report.to_dict(),
                    "iterations": last.iteration,
                    "evaluations": last.evaluations,
                    "verified": [
                        {
                            "shardings": dict(v.strategy.shardings),
                            "options": list(v.strategy.options),
                            "predicted_step_time_s": v.predicted_step_time_s,
                            "compiled_step_time_s": v.compiled_step_time_s,
                        }
                        for v in last.verified
                    ],
                    "notes": list(last.notes),
                    "evals_per_s": last.evals_per_s,
                },
                indent=2,
            )
        )
        return 0
    if not report.fits:
        print("WARNING: NO MEMORY-FEASIBLE STRATEGY FOUND; showing the least infeasible one")
    print(
        f"search: {last.iteration} simulations, {last.evaluations} evaluations "
        f"({last.evals_per_s:.0f}/s) in {last.elapsed_s:.1f} s"
    )
    if last.verified:
        print("XLA-judged (compiled at the real size, priced from the compiled program):")
        for i, v in enumerate(last.verified):
            mark = "  <- returned" if i == 0 else ""
            print(
                f"  plan {i + 1}: predicted {fmt_s(v.predicted_step_time_s)}, "
                f"XLA-judged {fmt_s(v.compiled_step_time_s)}{mark}"
            )
    for note in last.notes:
        print(f"note: {note}")
    print(
        table(
            [report_row("search", report)],
            ["strategy", "step", "compute", "comm", "peak mem", "fits", "efficiency"],
        )
    )
    print("\nShardings (scaling-book notation)")
    for line in best.describe(ana, mesh):
        print(f"  {line}")
    if best.options:
        print("\nConflict resolutions")
        for k, o in best.options:
            c = ana.conflicts[k]
            print(f"  {c.name} option {o}: {c.options[o].description}")
    if best.remat:
        print("\nRematerialization")
        for group, policy in best.remat:
            print(f"  {group}: {policy} (recomputed in the backward)")
    if args.out:
        print(f"\nsaved {args.out}")
    return 0


class _progress:
    """A progress bar on stderr while a search runs: elapsed of the budget, evaluations/s and the
    best step time so far (rich when installed, else one plain line redrawn)."""

    def __init__(self, show: bool, budget_s: float | None) -> None:
        self.show, self.budget = show, budget_s
        self.bar = None

    def __enter__(self):
        if not self.show:
            return lambda ev: None
        try:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            return self._plain
        self.bar = Progress(
            TextColumn("search"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(file=sys.stderr),
            transient=False,
        )
        self.bar.__enter__()
        self.task = self.bar.add_task("search", total=self.budget or None, status="")
        return self._rich

    def _status(self, ev) -> str:
        return (
            f"best {fmt_s(ev.best_step_time_s)} {'fits' if ev.best_fits else 'DOES NOT FIT'} "
            f"| {ev.evals_per_s:,.0f} evals/s | {ev.iteration} simulations"
        )

    def _rich(self, ev) -> None:
        done = self.budget if ev.done and self.budget else min(ev.elapsed_s, self.budget or 0)
        self.bar.update(self.task, completed=done, status=self._status(ev))

    def _plain(self, ev) -> None:
        frac = min(ev.elapsed_s / self.budget, 1.0) if self.budget else 0.0
        print(
            f"\r[{'#' * int(30 * frac):<30}] {ev.elapsed_s:5.1f}s {self._status(ev)}",
            end="\n" if ev.done else "",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
