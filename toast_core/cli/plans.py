"""`toast compare`, `validate`, `explain`: one plan or the baselines, priced, compiled or
explained."""

from __future__ import annotations

import json

from toast_core.cli.common import (
    CliError,
    analyze_target,
    mesh_and_hardware,
    plan_mesh,
    report_row,
    simulate_devices,
    strategy_arg,
    strategy_doc,
    table,
)
from toast_core.fmt import fmt_bytes, fmt_s


def cmd_compare(args) -> int:
    import toast_core as tc

    _, _, ana, _ = analyze_target(args)
    mesh, hw = mesh_and_hardware(args)
    rows, doc, notes = [], {}, []
    for name, (strategy, why) in tc.baselines.all(ana, mesh).items():
        if strategy is None:
            rows.append([name, "n/a", "", "", "", "", ""])
            notes.append(f"{name}: not applicable: {why}")
            doc[name] = {"applicable": False, "reason": why}
            continue
        r = tc.estimate(ana, strategy, mesh, hw)
        rows.append(report_row(name, r))
        doc[name] = {"applicable": True, **r.to_dict(), "shardings": dict(strategy.shardings)}
        if why:  # applies, but not as the textbook says (e.g. the batch on other mesh axes)
            notes.append(f"{name}: {why}")
            doc[name]["note"] = why
    if args.json:
        print(json.dumps(doc, indent=2, default=list))
        return 0
    print(
        f"{ana.program.name} on {mesh} of {hw.name} (capacity {fmt_bytes(hw.hbm_capacity_bytes)}/device)"
    )
    print(table(rows, ["strategy", "step", "compute", "comm", "peak mem", "fits", "efficiency"]))
    if notes:
        print("\nNotes")
        for note in notes:
            print(f"  {note}")
    return 0


def cmd_validate(args) -> int:
    text, doc = strategy_doc(args.strategy) if args.strategy else ("", {})
    args.mesh = mesh_text = plan_mesh(args, doc)
    import toast_core as tc

    simulate_devices(tc.MeshSpec.parse(mesh_text).n_devices)
    fn, ex_args, ana, _ = analyze_target(args)
    mesh, hw = mesh_and_hardware(args)
    strategy = strategy_arg(args, ana, mesh, text)
    try:
        jmesh = tc.jax_mesh(mesh)
    except tc.ToastError as exc:
        raise CliError(str(exc)) from None
    rep = tc.validate(fn, ex_args, ana, strategy, jmesh, hw)
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2))
        return 0 if rep.numerics_ok else 1
    rows = []
    for q, p, c in rep.rows():
        ratio = f"{p / c:.3f}" if c else "-"
        rows.append([q, f"{p:,.0f}", f"{c:,.0f}", ratio])
    print(f"{strategy.name or 'strategy'} on {mesh}: predicted vs XLA-compiled (per device)")
    print(table(rows, ["quantity", "predicted", "compiled", "ratio"]))
    verdict = "OK" if rep.numerics_ok else "MISMATCH"
    print(f"numerics vs unsharded: {verdict} (max abs error {rep.max_abs_error:.2e})")
    return 0 if rep.numerics_ok else 1


def cmd_explain(args) -> int:
    import toast_core as tc

    text, doc = strategy_doc(args.strategy) if args.strategy else ("", {})
    args.mesh = plan_mesh(args, doc)
    _, _, ana, _ = analyze_target(args)
    mesh, hw = mesh_and_hardware(args)
    strategy = strategy_arg(args, ana, mesh, text)
    explanation = tc.explain(ana, strategy, mesh, hw)
    if args.json:
        doc = {
            "strategy": json.loads(strategy.to_json(mesh, ana.program.name)),
            "report": explanation.report.to_dict(),
            "what_if": [r.to_dict() for r in explanation.rows],
        }
        print(json.dumps(doc, indent=2, default=list))
        return 0
    r = explanation.report
    print(
        f"{strategy.name or 'strategy'} on {mesh} of {hw.name}: step {fmt_s(r.step_time_s)}, "
        f"comm {fmt_s(r.comm_s)}, peak {fmt_bytes(r.peak_bytes)}"
        f"{'' if r.fits else ' (DOES NOT FIT)'}"
    )
    print("What if one decision changed (the rest kept), by consequence:")
    rows = []
    for w in explanation.rows[: args.top]:
        if not w.legal:
            continue
        change = "; ".join([f"+{a}" for a in w.appear] + [f"-{v}" for v in w.vanish])
        rows.append(
            [
                w.decision,
                f"{w.current} -> {w.alternative}",
                f"{w.delta_step_s * 1e3:+.3f} ms",
                fmt_bytes(w.peak_bytes),
                "yes" if w.fits else "NO",
                " ".join(w.pins),
                change[:90],
            ]
        )
    print(table(rows, ["decision", "change", "step", "peak", "fits", "pin", "collectives"]))
    best = explanation.best_alternative()
    if best is None:
        print("No single change makes it faster: the plan is a local optimum.")
    else:
        print(f"Faster: {' '.join(best.pins)} ({best.delta_step_s * 1e3:+.3f} ms)")
    return 0
