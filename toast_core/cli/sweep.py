"""`toast sweep`: many targets x meshes x presets on a process pool or a Ray cluster."""

from __future__ import annotations

import json
import time

from toast_core.cli.common import (
    load_target,
    parse_budget,
    table,
)
from toast_core.fmt import fmt_bytes, fmt_s


def search_case(case: dict) -> dict:
    """One case of a sweep: trace, analyze and search a zoo model or `file.py:function` on a
    mesh and hardware preset. `case`: target, size, mesh, hardware, and the search keywords
    (budget_s, num_simulations, seed); a module-level function, so that a process pool or Ray
    can run it by name."""
    import toast_core as tc

    keys = ("target", "size", "mesh", "hardware")
    missing = [k for k in keys if k not in case]
    if missing:
        raise tc.ToastError(f"expected a sweep case with {', '.join(keys)}, got `case={case}`")
    t0 = time.perf_counter()
    fn, ex_args, argnums, _ = load_target(case["target"], case["size"], False)
    ana = tc.analyze(tc.trace(fn, *ex_args, param_argnums=argnums))
    t1 = time.perf_counter()
    mesh, hw = tc.MeshSpec.parse(case["mesh"]), tc.hardware(case["hardware"])
    settings = {k: case[k] for k in ("budget_s", "num_simulations", "seed") if k in case}
    r = tc.search(ana, mesh, hw, **settings)
    return {
        **{k: case[k] for k in keys},
        "step_time_s": r.report.step_time_s,
        "peak_bytes": r.report.peak_bytes,
        "fits": r.report.fits,
        "efficiency": r.report.efficiency,
        "iterations": r.iterations,
        "evaluations": r.evaluations,
        "strategy": [list(x) for x in r.best.shardings],
        "options": [list(x) for x in r.best.options],
        "analysis_s": t1 - t0,
        "search_s": r.elapsed_s,
    }


def cmd_sweep(args) -> int:
    from toast_core.search.sweep import sweep

    budget = parse_budget(args.budget) if args.simulations is None or args.budget else None
    cases = [
        {
            "target": t,
            "size": args.size,
            "mesh": m,
            "hardware": h,
            "budget_s": budget,
            "num_simulations": args.simulations,
            "seed": args.seed,
        }
        for t in args.target
        for m in args.mesh or ["data=2,model=4"]
        for h in args.hardware or ["tpu-v5e"]
    ]
    rows = sweep(search_case, cases, workers=args.workers, ray=args.ray)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        table(
            [
                [
                    r["target"],
                    r["mesh"],
                    r["hardware"],
                    fmt_s(r["step_time_s"]),
                    fmt_bytes(r["peak_bytes"]),
                    "yes" if r["fits"] else "NO",
                    f"{r['efficiency']:.1%}",
                    str(r["evaluations"]),
                ]
                for r in rows
            ],
            ["target", "mesh", "hardware", "step", "peak mem", "fits", "efficiency", "evals"],
        )
    )
    return 0
