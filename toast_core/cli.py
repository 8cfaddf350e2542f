"""The `toast` command line: analyze, search, compare and validate a JAX program.

    toast analyze gpt
    toast search gpt --mesh data=2,model=4 --hardware tpu-v5e --budget 10s --out s.json
    toast compare gpt --mesh data=2,model=4 --hardware h100-80gb
    toast validate gpt --mesh data=2,model=4 --strategy s.json
    toast sweep gpt mlp --mesh data=8 --mesh data=2,model=4 --simulations 20 [--ray auto]
    toast search gpt --devices 256 --hardware tpu-v5e --budget 60s   (mesh shapes ranked)
    toast fit moe --size mixtral-8x7b --hardware tpu-v5e             (fewest devices that fit)

TARGET is a zoo name (`gpt`, `llama`, ... with `--size`) or `path/to/file.py:function` where the
function returns `(fn, example_args)` (or a demos Workload). Human tables by default, `--json` for
machines; bad input exits non-zero with a one-line error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from toast_core.fmt import fmt_bytes, fmt_s

DEFAULT_MESH = "data=2,model=4"
DEFAULT_HARDWARE = "tpu-v5e"


class CliError(Exception):
    pass


def _parse_budget(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*", text or "")
    if not m:
        raise CliError(f"expected a time budget such as 10s, 500ms or 2m, got `--budget={text}`")
    value = float(m.group(1))
    unit = m.group(2) or "s"
    return value / 1000 if unit == "ms" else value * 60 if unit in ("m", "min") else value


def load_target(target: str, size: str, forward: bool):
    """(fn, args, param_argnums, name) for a zoo name or `file.py:function`."""
    from demos import MODEL_ZOO
    from toast_core.targets import load_user_function, split_target

    if _user_path(target) is not None:
        path, function = split_target(target)
        made = load_user_function(path, function)
        return made.fn, made.args, made.param_argnums, function
    if target not in MODEL_ZOO:
        raise CliError(
            f"expected a zoo model ({', '.join(sorted(MODEL_ZOO))}) or file.py:function, "
            f"got `TARGET={target}`"
        )
    try:
        w = MODEL_ZOO[target](size=size, train=not forward)
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    return w.fn, tuple(w.args), w.param_argnums, w.name


def _user_path(target: str) -> str | None:
    """The file of a `file.py:function` target, None for a zoo name."""
    if ":" in target and target.split(":", 1)[0].endswith(".py"):
        return target.rsplit(":", 1)[0]
    return None


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def _analyze(args):
    import toast_core as tc
    from toast_core.targets import where

    fn, ex_args, argnums, name = load_target(args.target, args.size, args.forward)
    try:
        prog = tc.trace(fn, *ex_args, param_argnums=argnums)
    except tc.TraceError as exc:
        path = _user_path(args.target)
        if path is None:
            raise
        raise CliError(f"{where(path, exc.__cause__ or exc)}: {exc}") from None
    t0 = time.perf_counter()
    ana = tc.analyze(prog)
    return fn, ex_args, ana, time.perf_counter() - t0


def cmd_analyze(args) -> int:
    _, _, ana, dt = _analyze(args)
    summary = ana.summary() | {"analysis_s": dt}
    if args.json:
        doc = {
            "summary": summary,
            "named_dims": [
                {
                    "name": nd.name,
                    "size": nd.size,
                    "label": nd.label,
                    "bytes_covered": nd.bytes_covered,
                    "members": len(nd.members),
                    "has_reduction": nd.has_reduction,
                    "replication_ops": list(nd.replication_ops),
                    "persistent": nd.is_persistent,
                }
                for nd in ana.named_dims
            ],
            "conflicts": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "named_dims": [f"N{d}" for d in c.named_dims],
                    "description": c.description,
                    "sites": [s.text for s in c.sites],
                    "options": [
                        {"bytes": o.bytes, "description": o.description} for o in c.options
                    ],
                }
                for c in ana.conflicts
            ],
            "dim_groups": [[f"N{d}" for d in g] for g in ana.dim_groups],
            "conflict_groups": [[f"K{c}" for c in g] for g in ana.conflict_groups],
            "diagnostics": list(ana.diagnostics),
        }
        print(json.dumps(doc, indent=2))
        return 0
    s = summary
    print(
        f"{s['program']}: {s['ops']} ops, {s['tensor_dims']} tensor dims -> {s['named_dims']} named "
        f"dims ({s['dim_groups']} repeated-layer groups), {s['conflicts']} conflicts; "
        f"analysis {dt:.3f} s"
    )
    rows = [
        [
            nd.name,
            nd.size,
            nd.label,
            fmt_bytes(nd.bytes_covered),
            len(nd.members),
            "yes" if nd.has_reduction else "",
            len(nd.replication_ops) or "",
            "param" if nd.is_persistent else ("data" if nd.is_input else ""),
        ]
        for nd in sorted(ana.named_dims, key=lambda n: -n.bytes_covered)
    ]
    print("\nNamed dims")
    print(
        _table(rows, ["id", "size", "label", "bytes", "members", "reduces", "replicate@", "holds"])
    )
    if ana.dim_groups or ana.conflict_groups:
        print("\nRepeated-layer decision groups (the search decides each group at once; a pin on")
        print("one member singles that layer out)")
        for g in ana.dim_groups:
            nd = ana.named_dims[g[0]]
            print(f"  {len(g)} x {nd.label}: {' '.join(f'N{d}' for d in g)}")
        for g in ana.conflict_groups:
            c = ana.conflicts[g[0]]
            print(f"  {len(g)} x {c.kind} conflict: {' '.join(f'K{k}' for k in g)}")
    if ana.conflicts:
        print("\nConflicts")
        for c in ana.conflicts:
            print(f"  {c.name} [{c.kind}] {c.description}")
            for site in c.sites[:2]:
                print(f"      at {site.text}")
            for o in c.options:
                print(f"      option {o.index}: {o.description} ({fmt_bytes(o.bytes)})")
    for d in ana.diagnostics:
        print(f"diagnostic: {d}")
    return 0


def _mesh_hw(args):
    import toast_core as tc

    return tc.MeshSpec.parse(args.mesh), tc.hardware(args.hardware)


def _report_row(name, r):
    return [
        name,
        fmt_s(r.step_time_s),
        fmt_s(r.compute_s),
        fmt_s(r.comm_s),
        fmt_bytes(r.peak_bytes),
        "yes" if r.fits else "NO",
        f"{r.efficiency:.1%}",
    ]


def cmd_compare(args) -> int:
    import toast_core as tc

    _, _, ana, _ = _analyze(args)
    mesh, hw = _mesh_hw(args)
    rows, doc, notes = [], {}, []
    for name, (strategy, why) in tc.baselines.all(ana, mesh).items():
        if strategy is None:
            rows.append([name, "n/a", "", "", "", "", ""])
            notes.append(f"{name}: not applicable: {why}")
            doc[name] = {"applicable": False, "reason": why}
            continue
        r = tc.estimate(ana, strategy, mesh, hw)
        rows.append(_report_row(name, r))
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
    print(_table(rows, ["strategy", "step", "compute", "comm", "peak mem", "fits", "efficiency"]))
    if notes:
        print("\nNotes")
        for note in notes:
            print(f"  {note}")
    return 0


def _simulate_devices(n: int) -> None:
    """Asks XLA's CPU backend for `n` simulated devices (at least 8), unless the user chose."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={max(n, 8)}"


def _status_line(text: str, args) -> None:
    if not args.json and (sys.stderr.isatty() or os.environ.get("TOAST_PROGRESS")):
        print(f"\r{text}", end="", file=sys.stderr, flush=True)


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

    _, _, ana, _ = _analyze(args)
    hw = tc.hardware(args.hardware)
    budget = _parse_budget(args.budget)
    last = None
    for ev in tc.search_meshes_iter(
        ana, args.devices, hw, budget_s=budget, seed=args.seed, pins=args.pin or ()
    ):
        last = ev
        if ev.event is not None:
            best = ev.event
            _status_line(
                f"[{ev.shape_index + 1}/{ev.n_shapes}] {ev.mesh}: best "
                f"{fmt_s(best.best_step_time_s)} {'fits' if best.best_fits else 'DOES NOT FIT'}"
                + " "
                * 10,
                args,
            )
    _status_line("\n", args)
    ranking = last.ranking
    if args.out and ranking:
        Path(args.out).write_text(ranking[0].strategy.to_json(ranking[0].mesh, ana.program.name))
    if args.json:
        print(json.dumps({"ranking": [_plan_doc(p) for p in ranking]}, indent=2))
        return 0
    print(f"{ana.program.name}: mesh shapes of {args.devices} x {hw.name}, best plan each")
    print(_table(_plan_rows(ranking), _PLAN_HEADER))
    if ranking and not ranking[0].fits:
        print("WARNING: NO MEMORY-FEASIBLE PLAN ON ANY SHAPE; try `toast fit` for a device count")
    return 0


def cmd_fit(args) -> int:
    import toast_core as tc

    _, _, ana, _ = _analyze(args)
    hw = tc.hardware(args.hardware)
    budget = _parse_budget(args.budget)

    def progress(ev):
        if ev.event is not None:
            _status_line(
                f"{ev.mesh.n_devices} devices [{ev.shape_index + 1}/{ev.n_shapes}] {ev.mesh}"
                + " " * 20,
                args,
            )

    fit = tc.min_devices(
        ana, hw, budget_s=budget, seed=args.seed, max_devices=args.max_devices, progress=progress
    )
    _status_line("\n", args)
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
    print(_table(_plan_rows([p for _, p in fit.tried]), _PLAN_HEADER))
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
    mesh, hw = _mesh_hw(args)
    budget = _parse_budget(args.budget) if args.simulations is None or args.budget else None
    # XLA judges the best plans when there is a time budget to do it in (or when asked).
    verify = args.verify if args.verify is not None else (3 if budget else 0)
    if verify:
        _simulate_devices(mesh.n_devices)
    _, _, ana, _ = _analyze(args)
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
        _table(
            [_report_row("search", report)],
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

    budget = _parse_budget(args.budget) if args.simulations is None or args.budget else None
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
        _table(
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


def _strategy_doc(path_text: str) -> tuple[str, dict]:
    """The text of a strategy JSON file and its parsed document ({} if it does not parse: the
    strategy parser then reports it, naming the problem)."""
    path = Path(path_text)
    if not path.is_file():
        raise CliError(f"expected a strategy JSON file, got `--strategy={path_text}`")
    text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = {}
    return text, doc if isinstance(doc, dict) else {}


def _plan_mesh(args, doc: dict) -> str:
    """The mesh to validate or explain on: --mesh, else the mesh stored in the strategy file, else the
    default; a --mesh that disagrees with the stored one is an error (the plan was priced and
    searched for its own mesh, and its named dims may not divide another one)."""
    import toast_core as tc

    stored = doc.get("mesh")
    stored_text = (
        ",".join(f"{k}={v}" for k, v in stored.items()) if isinstance(stored, dict) else None
    )
    if args.mesh is None:
        return stored_text or DEFAULT_MESH
    if stored_text is not None:
        given, saved = tc.MeshSpec.parse(args.mesh), tc.MeshSpec.parse(stored_text)
        if given.axes != saved.axes:
            raise CliError(
                f"expected the mesh stored in {args.strategy} ({saved}) or no --mesh, "
                f"got `--mesh={args.mesh}`"
            )
    return args.mesh


def cmd_validate(args) -> int:
    text, doc = _strategy_doc(args.strategy) if args.strategy else ("", {})
    args.mesh = mesh_text = _plan_mesh(args, doc)
    import toast_core as tc

    _simulate_devices(tc.MeshSpec.parse(mesh_text).n_devices)
    fn, ex_args, ana, _ = _analyze(args)
    mesh, hw = _mesh_hw(args)
    strategy = _strategy_arg(args, ana, mesh, text)
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
    print(_table(rows, ["quantity", "predicted", "compiled", "ratio"]))
    verdict = "OK" if rep.numerics_ok else "MISMATCH"
    print(f"numerics vs unsharded: {verdict} (max abs error {rep.max_abs_error:.2e})")
    return 0 if rep.numerics_ok else 1


def cmd_explain(args) -> int:
    import toast_core as tc

    text, doc = _strategy_doc(args.strategy) if args.strategy else ("", {})
    args.mesh = _plan_mesh(args, doc)
    _, _, ana, _ = _analyze(args)
    mesh, hw = _mesh_hw(args)
    strategy = _strategy_arg(args, ana, mesh, text)
    table = tc.explain(ana, strategy, mesh, hw)
    if args.json:
        doc = {
            "strategy": json.loads(strategy.to_json(mesh, ana.program.name)),
            "report": table.report.to_dict(),
            "what_if": [r.to_dict() for r in table.rows],
        }
        print(json.dumps(doc, indent=2, default=list))
        return 0
    r = table.report
    print(
        f"{strategy.name or 'strategy'} on {mesh} of {hw.name}: step {fmt_s(r.step_time_s)}, "
        f"comm {fmt_s(r.comm_s)}, peak {fmt_bytes(r.peak_bytes)}"
        f"{'' if r.fits else ' (DOES NOT FIT)'}"
    )
    print("What if one decision changed (the rest kept), by consequence:")
    rows = []
    for w in table.rows[: args.top]:
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
    print(_table(rows, ["decision", "change", "step", "peak", "fits", "pin", "collectives"]))
    best = table.best_alternative()
    if best is None:
        print("No single change makes it faster: the plan is a local optimum.")
    else:
        print(f"Faster: {' '.join(best.pins)} ({best.delta_step_s * 1e3:+.3f} ms)")
    return 0


def _strategy_arg(args, ana, mesh, text: str):
    """The strategy of `--strategy FILE` (its text) or `--baseline NAME`."""
    import toast_core as tc

    if args.strategy:
        return tc.Strategy.from_json(text, ana)
    baselines = tc.baselines.all(ana, mesh)
    if args.baseline not in baselines:
        raise CliError(
            f"expected a baseline ({', '.join(baselines)}), got `--baseline={args.baseline}`"
        )
    strategy, why = baselines[args.baseline]
    if strategy is None:
        raise CliError(f"baseline {args.baseline} does not apply: {why}")
    return strategy


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line error format (`toast: error: ...`, exit status 2)."""

    def error(self, message: str):
        print(f"toast: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="toast", description="TOAST auto-sharding for JAX programs")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("analyze", "named dims and conflicts"),
        ("search", "MCTS search for a strategy"),
        ("compare", "baseline strategies side by side"),
        ("validate", "compile a strategy with XLA and compare with the prediction"),
        ("explain", "what if each decision of a strategy changed: step time, memory, collectives"),
        ("sweep", "search many targets x meshes x hardware presets in parallel"),
        ("fit", "the fewest devices (a power of two) with a plan that fits memory"),
    ):
        s = sub.add_parser(name, help=help_text)
        s.add_argument(
            "target",
            nargs="+" if name == "sweep" else None,
            help="zoo model name or path/to/file.py:function",
        )
        s.add_argument("--size", default="tiny", help="zoo model size (default tiny)")
        s.add_argument(
            "--forward", action="store_true", help="zoo model forward pass, not a train step"
        )
        s.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "sweep":
            s.add_argument("--mesh", action="append", help="mesh axes (repeat for several)")
            s.add_argument("--hardware", action="append", help="hardware preset (repeat)")
        elif name == "fit":
            pass
        elif name in ("validate", "explain"):
            s.add_argument(
                "--mesh",
                default=None,
                help="mesh axes, e.g. data=4,model=2 (default: the mesh stored in --strategy, "
                f"else {DEFAULT_MESH})",
            )
        elif name != "analyze":
            s.add_argument(
                "--mesh",
                default=DEFAULT_MESH,
                help=f"mesh axes, e.g. data=4,model=2 (default {DEFAULT_MESH})",
            )
        if name not in ("analyze", "sweep"):
            s.add_argument(
                "--hardware",
                default=DEFAULT_HARDWARE,
                help=f"hardware preset (default {DEFAULT_HARDWARE})",
            )
        if name in ("search", "sweep"):
            s.add_argument(
                "--workers", type=int, default=1 if name == "search" else None, help="processes"
            )
        if name == "sweep":
            s.add_argument("--budget", default=None, help="time budget per case, e.g. 5s")
            s.add_argument("--simulations", type=int, default=None, help="simulations per case")
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--ray", default=None, help="run on a Ray cluster: auto or ADDRESS")
        if name == "fit":
            s.add_argument("--budget", default="30s", help="search time per device count")
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--max-devices", type=int, default=1 << 16, dest="max_devices")
        if name == "search":
            s.add_argument("--budget", default=None, help="time budget, e.g. 10s (default 10s)")
            s.add_argument("--simulations", type=int, default=None, help="simulation budget")
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--pin", action="append", help="pin, e.g. N3@model or K2=0")
            s.add_argument("--forbid", action="append", help="forbid, e.g. !N3@data")
            s.add_argument(
                "--verify",
                type=int,
                default=None,
                help="compile the K best plans with XLA (within the budget again) and keep the "
                "best as XLA judges it (default 3 with a time budget, 0 with --simulations only)",
            )
            s.add_argument(
                "--out", help="write the strategy JSON here (a .py name: a module that applies it)"
            )
            s.add_argument(
                "--devices",
                type=int,
                default=None,
                help="rank the mesh shapes of this many devices (instead of --mesh)",
            )
        if name in ("validate", "explain"):
            s.add_argument("--strategy", help="strategy JSON (from toast search --out)")
            s.add_argument(
                "--baseline",
                default="data_parallel",
                help=f"baseline to {name} when no --strategy is given",
            )
        if name == "explain":
            s.add_argument("--top", type=int, default=25, help="rows to show (default 25)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("search", "sweep") and args.budget is None and args.simulations is None:
        args.budget = "10s"
    from toast_core.errors import ToastError

    try:
        return {
            "analyze": cmd_analyze,
            "search": cmd_search,
            "compare": cmd_compare,
            "validate": cmd_validate,
            "explain": cmd_explain,
            "sweep": cmd_sweep,
            "fit": cmd_fit,
        }[args.command](args)
    except (CliError, ToastError) as exc:
        print(f"toast: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - e.g. the user's function failing when run by XLA
        if os.environ.get("TOAST_DEBUG"):
            raise
        print(
            f"toast: error: {type(exc).__name__}: {_one_line(str(exc), 300)} "
            "(set TOAST_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def _one_line(text: str, limit: int = 2000) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
