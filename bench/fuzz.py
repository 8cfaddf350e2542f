"""Fuzz the whole toast pipeline with random JAX programs for N minutes (issue 14).

Each program (fuzz/programs.py, reproducible from (seed, index)) goes through trace, analyze, then
on every mesh of fuzz.pipeline.MESHES search (deterministic small budget), every baseline and
Strategy.validate; the searched plan and one baseline are validated with XLA on one mesh per
program (rotating). Programs run in worker subprocesses (`--jobs`, default 1) so that an XLA
segfault is recorded as a crash. Prints the counts and the fidelity distribution (predicted /
compiled flops, total collective bytes, memory), minimizes one failure per distinct signature
(kind, stage, exception type, innermost toast_core frame) and writes a reproduction script for each
to artifacts/fuzz/, and the results to bench/results/fuzz.json.

    .venv/bin/python bench/fuzz.py --minutes 20 [--seed 0] [--jobs 1] [--programs N]

With `--programs N` the run stops after programs 0..N-1 (or at `--minutes`, when given): a fixed
set to compare the cost model before and after a change. Without either, it runs for 5 minutes.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from _common import save, set_devices, table

set_devices(8)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fuzz.minimize import minimize, same_failure, write_repro  # noqa: E402
from fuzz.pipeline import FAILURES, MESHES, Outcome  # noqa: E402
from fuzz.programs import Program  # noqa: E402
from fuzz.worker import WORKER_DEATH, Worker  # noqa: E402

TARGETS = {"flops": 0.05, "collective_bytes": 0.25, "memory": 0.30}
#: Like-for-like floors: below these compiled sizes a ratio mostly measures XLA:CPU's handling of
#: scalars (a folded `+ 0.0`, the loss's few scalar ops, 16- to 64-byte scalar temporaries and
#: alignment in `memory_analysis()`), not the model. The summary gives the share within tolerance
#: over every validation (the target) and, beside it, over those at or above the floor.
FLOORS = {"flops": 2000.0, "collective_bytes": 1024.0, "memory": 8192.0}
#: A user-facing slack for memory: the explorer shows memory per device in MiB and GiB, and a
#: plan fits or not by GiB; a miss of under 1 KiB (a few of XLA:CPU's 64-byte aligned scalar
#: temporaries, a threefry loop's state) changes nothing a user sees. The summary gives, beside
#: the strict target, the share within tolerance *or* within this many bytes; the raw ratios
#: stay in the json.
ABSOLUTE_SLACK = {"memory": 1024.0}
_PREDICTED = {
    "flops": "predicted_flops",
    "collective_bytes": "predicted_collective_bytes",
    "memory": "predicted_memory_bytes",
}
_COMPILED = {
    "flops": "compiled_flops",
    "collective_bytes": "compiled_collective_bytes",
    "memory": "compiled_memory_bytes",
}


def _run_program(worker: Worker, args, index: int) -> dict:
    mesh_names = list(MESHES)
    task = {
        "task": "program",
        "seed": args.seed,
        "index": index,
        "meshes": mesh_names,
        "validate_meshes": [] if args.no_validate else [mesh_names[index % len(mesh_names)]],
        "num_simulations": args.sims,
        "max_ops": args.max_ops,
    }
    t0 = time.perf_counter()
    events, died = worker.run(task, args.timeout)
    rec: dict = {"index": index, "outcomes": [], "fuzzer_errors": []}
    stage = ""
    for ev in events:
        kind = ev["event"]
        if kind == "program":
            rec.update(
                {k: ev[k] for k in ("spec", "mode", "ops", "generate_s", "error") if k in ev}
            )
        elif kind == "stage":
            stage = ev["stage"]
        elif kind == "outcome":
            rec["outcomes"].append(ev["outcome"])
        elif kind == "fuzzer_error":
            rec["fuzzer_errors"].append(ev["error"])
    if died:
        parts = stage.split()
        o = Outcome(
            "crash",
            parts[0] if parts else "worker",
            parts[1] if len(parts) > 1 else "",
            parts[2] if len(parts) > 2 else "",
            f"{WORKER_DEATH}: {died}",
        )
        rec["outcomes"].append(o.to_dict())
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def _reproduce_with(worker: Worker, args):
    def check(prog: Program, want: Outcome) -> Outcome | None:
        task = {
            "task": "reproduce",
            "program": prog.to_dict(),
            "outcome": want.to_dict(),
            "num_simulations": args.sims,
        }
        events, died = worker.run(task, args.timeout)
        if died:
            return Outcome("crash", want.stage, want.mesh, want.strategy, f"{WORKER_DEATH}: {died}")
        for ev in events:
            if ev["event"] == "result":
                return Outcome(**ev["outcome"]) if ev["outcome"] else None
        return None

    return check


def _fidelity(records: list[dict]) -> dict:
    vals = [
        o["fidelity"]
        for r in records
        for o in r["outcomes"]
        if o["stage"] == "validate" and o["fidelity"]
    ]
    out: dict = {"validations_with_ratios": len(vals)}
    for key, tol in TARGETS.items():
        ratios = [v[key] for v in vals if not (key == "flops" and v.get("flops_unmeasured"))]
        finite = np.array([x for x in ratios if x is not None and math.isfinite(x)], dtype=float)
        within = sum(1 for x in ratios if x is not None and math.isfinite(x) and abs(x - 1) <= tol)
        row = {
            "within": within / len(ratios) if ratios else float("nan"),
            "tolerance": tol,
            "n": len(ratios),
            "undefined": len(ratios) - len(finite),  # XLA has none where we predict some
        }
        large = [
            v[key]
            for v in vals
            if v[_COMPILED[key]] >= FLOORS[key]
            and not (key == "flops" and v.get("flops_unmeasured"))
        ]
        if key in ABSOLUTE_SLACK:
            row["absolute_slack"] = ABSOLUTE_SLACK[key]
            row["within_or_slack"] = (
                sum(
                    1
                    for v in vals
                    if (v[key] is not None and math.isfinite(v[key]) and abs(v[key] - 1) <= tol)
                    or abs(v[_PREDICTED[key]] - v[_COMPILED[key]]) <= ABSOLUTE_SLACK[key]
                )
                / len(vals)
                if vals
                else float("nan")
            )
        row["n_at_floor"] = len(large)
        row["within_at_floor"] = (
            sum(1 for x in large if x is not None and math.isfinite(x) and abs(x - 1) <= tol)
            / len(large)
            if large
            else float("nan")
        )
        if len(finite):
            row.update(
                median=float(np.median(finite)),
                p5=float(np.percentile(finite, 5)),
                p95=float(np.percentile(finite, 95)),
            )
        out[key] = row
    out["flops_unmeasured"] = sum(1 for v in vals if v.get("flops_unmeasured"))
    out["unpredicted_collectives"] = sum(
        1
        for v in vals
        if v["predicted_collective_bytes"] == 0 and v["compiled_collective_bytes"] > 0
    )
    return out


def _by_op(records: list[dict]) -> list[dict]:
    """For each op kind, the share of its programs' validations within the flops/bytes/memory
    tolerances: which op kinds the cost model misjudges."""
    acc: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        for o in r["outcomes"]:
            if o["stage"] != "validate" or not o["fidelity"]:
                continue
            for op in set(r.get("ops", [])):
                c = acc[op]
                c["n"] += 1
                for key, tol in TARGETS.items():
                    x = o["fidelity"][key]
                    if key == "flops" and o["fidelity"].get("flops_unmeasured"):
                        x = 1.0  # XLA could not count it: not a miss of the model
                    c[key] += x is not None and math.isfinite(x) and abs(x - 1) <= tol
    rows = [
        {"op": op, "validations": c["n"], **{k: round(c[k] / c["n"], 2) for k in TARGETS}}
        for op, c in acc.items()
        if c["n"] >= 3
    ]
    return sorted(rows, key=lambda r: (r["flops"], r["op"]))


def _explained(g: dict, member) -> bool:
    """A member is explained by a reproduction whose ops it all holds (same cause, presumably)."""
    ops = Counter(member[0].get("ops", []))
    return any(not (Counter(x["minimized_ops"]) - ops) for x in g["repros"])


def _unexplained(g: dict):
    return next((m for m in g["members"] if not _explained(g, m)), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="time limit (default: 5, or none with --programs)",
    )
    p.add_argument(
        "--programs",
        type=int,
        default=None,
        help="stop after this many programs (indices 0..N-1: the same set run after run)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--sims", type=int, default=24, help="search num_simulations")
    p.add_argument("--max-ops", type=int, default=10)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per program")
    p.add_argument("--minimize-minutes", type=float, default=None)
    p.add_argument("--minimize-each-s", type=float, default=90.0)
    p.add_argument("--max-per-group", type=int, default=3, help="reproductions per signature")
    p.add_argument("--out", default="fuzz")
    p.add_argument(
        "--no-validate", action="store_true", help="trace/analyze/search/baselines only (no XLA)"
    )
    args = p.parse_args()
    if args.minutes is None:  # a fixed set of programs is run whole unless a limit is asked for
        args.minutes = 5.0 if args.programs is None else float("inf")
    if args.minutes <= 0:
        raise SystemExit(f"fuzz: expected a positive duration, got `--minutes={args.minutes}`")
    if args.jobs < 1:
        raise SystemExit(f"fuzz: expected at least one job, got `--jobs={args.jobs}`")
    log_dir = ROOT / "artifacts" / "fuzz"
    log_dir.mkdir(parents=True, exist_ok=True)

    deadline = time.monotonic() + args.minutes * 60
    next_index = [0]
    lock = threading.Lock()
    records: list[dict] = []
    workers = [Worker(str(ROOT), str(log_dir / f"worker{j}.log")) for j in range(args.jobs)]

    def loop(worker: Worker) -> None:
        done = 0
        while time.monotonic() < deadline:
            done += 1
            if done % 40 == 0:  # a fresh process now and then: JAX's caches only grow
                worker.stop()
            with lock:
                index = next_index[0]
                if args.programs is not None and index >= args.programs:
                    return
                next_index[0] += 1
            rec = _run_program(worker, args, index)
            with lock:
                records.append(rec)
                bad = [o for o in rec["outcomes"] if o["kind"] != "ok"]
                print(
                    f"[{len(records):4d}] #{index} {rec.get('mode', '?'):11s} "
                    f"{len(rec.get('ops', [])):2d} ops {rec['wall_s']:5.1f}s "
                    + (", ".join(f"{o['kind']}@{o['stage']}" for o in bad) or "ok")
                    + "".join(f" FUZZER ERROR {e}" for e in rec["fuzzer_errors"])
                    + (f" GENERATION FAILED {rec['error']}" if "error" in rec else ""),
                    flush=True,
                )

    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run_s = time.perf_counter() - t0
    records.sort(key=lambda r: r["index"])

    outcomes = [(r, o) for r in records for o in r["outcomes"]]
    counts = Counter(o["kind"] for _, o in outcomes if o["kind"] in FAILURES)
    validations = sum(1 for _, o in outcomes if o["stage"] == "validate")
    programs = sum(1 for r in records if "spec" in r)
    fuzzer_errors = [e for r in records for e in r["fuzzer_errors"]]
    summary = {
        "programs": programs,
        "validations": validations,
        "crashes": counts["crash"],
        "toast_errors": counts["toast_error"],
        "invalid_plans": counts["invalid_plan"],
        "numerics_mismatches": counts["numerics"],
        "generation_failures": sum(1 for r in records if "error" in r),
        "fuzzer_errors": len(fuzzer_errors),
        "run_s": round(run_s, 1),
        "seed": args.seed,
        "jobs": args.jobs,
        "num_simulations": args.sims,
    }
    notes = Counter(n for _, o in outcomes for n in o.get("notes", []))
    summary["notes"] = dict(notes.most_common())
    fid = _fidelity(records)
    print(
        "\nfuzz: {programs} programs, {validations} validations, {crashes} crashes, "
        "{toast_errors} ToastErrors, {invalid_plans} invalid plans, "
        "{numerics_mismatches} numerics mismatches ({run_s} s, seed {seed})".format(**summary)
    )
    rows = []
    for key, tol in TARGETS.items():
        f = fid[key]
        rows.append(
            {
                "ratio (pred/XLA)": key,
                "target": f"within {tol:.0%}",
                "within": f"{f['within']:.1%}",
                "median": f.get("median", float("nan")),
                "p5": f.get("p5", float("nan")),
                "p95": f.get("p95", float("nan")),
                "undefined": f["undefined"],
                "within (XLA >= floor)": f"{f['within_at_floor']:.1%} of {f['n_at_floor']}",
            }
        )
    print(table(rows, list(rows[0])))
    for key, slack in ABSOLUTE_SLACK.items():
        print(
            f"{key} within {TARGETS[key]:.0%} or {slack:.0f} bytes: {fid[key]['within_or_slack']:.1%}"
        )
    print(
        f"validations with compiled collectives where none predicted: {fid['unpredicted_collectives']}"
    )
    print(f"validations whose flops XLA could not count (left out): {fid['flops_unmeasured']}")
    for note, n in notes.most_common():
        print(f"{note}: {n} programs")
    by_op = _by_op(records)
    print("\nShare of validations within tolerance, by op kind in the program (worst flops first)")
    print(table(by_op[:25], ["op", "validations", *TARGETS]))

    # ---- group failures by signature; minimize members until each is explained
    groups: dict[tuple, dict] = {}
    for r, o in outcomes:
        if o["kind"] == "ok" or "spec" not in r:
            continue
        out = Outcome(**o)
        g = groups.setdefault(
            out.signature, {"count": 0, "members": [], "meshes": Counter(), "repros": []}
        )
        g["count"] += 1
        g["meshes"][out.mesh] += 1
        if all(m[0]["index"] != r["index"] for m in g["members"]):
            g["members"].append((r, out))
    minimize_budget = (
        args.minimize_minutes if args.minimize_minutes is not None else min(30.0, args.minutes)
    ) * 60
    m_deadline = time.monotonic() + minimize_budget
    check = _reproduce_with(workers[0], args)
    ordered = sorted(groups.items(), key=lambda kv: -kv[1]["count"])
    for _round in range(args.max_per_group):
        for sig, g in ordered:
            member = _unexplained(g)
            left = m_deadline - time.monotonic()
            if member is None or left < 5:
                continue
            r, out = member
            prog = Program.from_dict(r["spec"])
            small, small_out, tried = minimize(
                prog, out, check, budget_s=min(args.minimize_each_s, left)
            )
            still = same_failure(check(small, out), out) if tried else True
            path = log_dir / f"repro_{prog.seed}_{prog.index}.py"
            if any(
                x["repro"] == str(path.relative_to(ROOT))
                for gg in groups.values()
                for x in gg["repros"]
            ):
                path = log_dir / f"repro_{prog.seed}_{prog.index}_{len(g['repros']) + 1}.py"
            write_repro(small, small_out, path, args.sims)
            g["repros"].append(
                {
                    "program": prog.index,
                    "ops": prog.ops(),
                    "mode": prog.mode,
                    "mesh": out.mesh,
                    "strategy": out.strategy,
                    "error": out.error,
                    "repro": str(path.relative_to(ROOT)),
                    "minimized_ops": small.ops(),
                    "minimized_mode": small.mode,
                    "minimized_inputs": {i.name: list(i.shape) for i in small.inputs},
                    "minimized_error": small_out.error,
                    "candidates_tried": tried,
                    "reproduces": still,
                }
            )
            print(
                f"\n[{sig[0]} @ {sig[1]}] x{g['count']} ({len(g['members'])} programs): {out.error}"
                f"\n  at {out.where}\n  #{prog.index} {prog.mode} {prog.ops()}"
                f"\n  minimized to {small.mode} {small.ops()} -> {path.relative_to(ROOT)}"
                + ("" if still else " (no longer reproduces)"),
                flush=True,
            )
    failure_rows = []
    for sig, g in ordered:
        failure_rows.append(
            {
                "kind": sig[0],
                "stage": sig[1],
                "error_type": sig[2],
                "where": sig[3],
                "count": g["count"],
                "programs": len(g["members"]),
                "example_programs": [m[0]["index"] for m in g["members"][:20]],
                "example_error": g["members"][0][1].error,
                "meshes": dict(g["meshes"]),
                "unexplained_programs": sum(1 for m in g["members"] if not _explained(g, m)),
                "repros": g["repros"],
            }
        )
    for w in workers:
        w.stop()

    payload = {
        "summary": summary,
        "fidelity": fid,
        "fidelity_by_op": by_op,
        "failures": failure_rows,
        "fuzzer_errors": fuzzer_errors[:50],
        "meshes": MESHES,
        "programs": [
            {
                "index": r["index"],
                "mode": r.get("mode"),
                "ops": r.get("ops"),
                "wall_s": round(r["wall_s"], 2),
                "failures": [o for o in r["outcomes"] if o["kind"] != "ok"],
                "validations": [
                    {k: o[k] for k in ("kind", "mesh", "strategy", "fidelity")}
                    for o in r["outcomes"]
                    if o["stage"] == "validate"
                ],
            }
            for r in records
        ],
    }
    print(f"\nresults: {save(args.out, payload)}")


if __name__ == "__main__":
    main()
