"""Scale: real-size train steps traced from ShapeDtypeStructs, analyzed and searched.

Cases (TPU v5p unless said): GPT-3 175B unrolled (96 layers) and with `lax.scan` over stacked
layers on 2048 devices (data=8, fsdp=16, model=16: with data=16, fsdp=16, model=8 the unrolled
step's activations need 116 GiB per chip), Llama-3 70B on 512 (data=4, fsdp=16, model=8), a
Mixtral-class MoE (8 experts of 14336, 32 layers) on 256 (data=4, fsdp=8, model=8) and the zoo's
large U-Net on 2x2x2. Each case runs in a fresh process (so its peak RSS is its own): trace,
analysis, preparation (the evaluator and the decision space, built once per analysis and mesh and
reused by every later search) and a search with `--budget` seconds. Columns: those wall times and
the total, CPU seconds of the trace, the preparation, the search and the whole (on a shared
machine wall time includes waiting for a core; the JSON has every phase's), peak RSS, evaluations/s, MCTS iterations, budget overrun (search wall time / budget - 1),
whether the plan fits and its efficiency (ideal / estimated step time).

`--depth` adds the curve of search time and quality against depth: GPT-2-small layers (768 wide)
stacked 1 to 96 deep on data=2,model=4 of TPU v5e, each searched with the same budget; quality is
the found step time over the best baseline's.

    .venv/bin/python bench/scale.py [--budget 5] [--only gpt3] [--depth] [--workers 2 | --ray auto]

`--cold` skips the preparation: the search builds the evaluator and the decision space inside
its budget, as a user's first `tc.search(ana, mesh, hw, budget_s=5)` does, so the total is
trace + analysis + that 5 s search (the issue's end-to-end figure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import peak_rss_bytes, save, set_devices, table

set_devices()
# This checkout's toast_core and demos, whatever package is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (zoo model, size, mesh, hardware, config overrides): global batches that give every data
# shard one sequence. Llama-3 70B uses 2048-token sequences: we model full (not flash) attention
# without rematerialization, whose 4096-token scores alone would overflow any chip.
CASES = {
    "gpt3-175b": ("gpt", "gpt3-175b", "data=8,fsdp=16,model=16", "tpu-v5p", {"batch": 128}),
    "gpt3-175b-scan": (
        "gpt-scan",
        "gpt3-175b",
        "data=8,fsdp=16,model=16",
        "tpu-v5p",
        {"batch": 128},
    ),
    "llama3-70b": (
        "llama",
        "llama3-70b",
        "data=4,fsdp=16,model=8",
        "tpu-v5p",
        {"batch": 64, "seq": 2048},
    ),
    "mixtral-8x7b": (
        "moe",
        "mixtral-8x7b",
        "data=4,fsdp=8,model=8",
        "tpu-v5p",
        {"batch": 32, "seq": 2048},
    ),
    "unet-large": ("unet", "large", "data=2,fsdp=2,model=2", "tpu-v5p", {}),
}
DEPTHS = (1, 2, 4, 8, 16, 32, 48, 64, 96)
COLUMNS = [
    "case",
    "devices",
    "eqns",
    "trace_s",
    "analysis_s",
    "prepare_s",
    "search_s",
    "total_s",
    "trace_cpu_s",
    "analysis_cpu_s",
    "prepare_cpu_s",
    "search_cpu_s",
    "total_cpu_s",
    "peak_rss_gb",
    "evals_per_s",
    "iterations",
    "overrun",
    "fits",
    "efficiency",
    "vs_best_baseline",
]


def run_case(
    model: str, size: str, mesh_text: str, hardware: str, overrides: dict, budget_s, cold=False
):
    """One case, measured in this (fresh) process. `cold`: no preparation before the search,
    which then builds the evaluator and the decision space inside its own budget, as a user's
    first `tc.search(ana, mesh, hw, budget_s=...)` does (prepare_s is 0 and the total is what
    that user waits: trace + analysis + the budget)."""
    import toast_core as tc
    from demos import MODEL_ZOO

    c0, t0 = time.process_time(), time.perf_counter()
    w = MODEL_ZOO[model](size=size, **overrides)
    prog = tc.trace(w.fn, *w.args, param_argnums=w.param_argnums)
    c1, t1 = time.process_time(), time.perf_counter()
    ana = tc.analyze(prog)
    c2, t2 = time.process_time(), time.perf_counter()
    mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware(hardware)
    # The per-(analysis, mesh) structures every search reuses (memoized): timed apart, so that
    # the search column shows what a re-search (after a pin) costs.
    from toast_core.cost import evaluator
    from toast_core.strategy import space_of

    if not cold:
        evaluator(ana, mesh, hw)
        space_of(ana, mesh)
    c_prep, t_prep = time.process_time(), time.perf_counter()
    result = tc.search(ana, mesh, hw, budget_s=budget_s, seed=0)
    c3, t3 = time.process_time(), time.perf_counter()
    s, r = ana.summary(), result.report
    feasible = [v for v in result.baselines.values() if v is not None]
    best_base = min(feasible) if feasible else None
    return {
        "devices": mesh.n_devices,
        "eqns": s["ops"],
        "named_dims": s["named_dims"],
        "dim_groups": s["dim_groups"],
        "conflicts": s["conflicts"],
        "trace_s": round(t1 - t0, 2),
        "analysis_s": round(t2 - t1, 2),
        "prepare_s": round(t_prep - t2, 2),
        "search_s": round(t3 - t_prep, 2),
        "total_s": round(t3 - t0, 2),
        # CPU seconds of this process: on a shared machine the wall times above include waiting
        # for a core; the search's CPU time is whatever of its wall budget it got.
        "trace_cpu_s": round(c1 - c0, 2),
        "analysis_cpu_s": round(c2 - c1, 2),
        "prepare_cpu_s": round(c_prep - c2, 2),
        "search_cpu_s": round(c3 - c_prep, 2),
        "total_cpu_s": round(c3 - c0, 2),
        "peak_rss_gb": round(peak_rss_bytes() / 1e9, 2),
        "evals_per_s": round(result.evaluations / max(result.elapsed_s, 1e-9)),
        "evaluations": result.evaluations,
        "iterations": result.iterations,
        "overrun": f"{(t3 - t_prep) / budget_s - 1:+.1%}",
        "cold": cold,
        "fits": r.fits,
        "peak_gib": round(r.peak_bytes / 2**30, 1),
        "step_s": r.step_time_s,
        "efficiency": round(r.efficiency, 3),
        "vs_best_baseline": round(r.step_time_s / best_base, 3) if best_base else "none fits",
    }


def in_fresh_process(job: dict) -> dict:
    """Runs one job (`--job` JSON) in a new interpreter: peak RSS is the job's alone. Module
    level, so that a process pool or Ray can call it by name."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--job", json.dumps(job)],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    if out.returncode:
        return {**job, "error": out.stderr.strip().splitlines()[-1:]}
    return {"case": job["name"], **json.loads(out.stdout.strip().splitlines()[-1])}


def jobs(args) -> list[dict]:
    out = []
    for key, (model, size, mesh, hardware, overrides) in CASES.items():
        if args.only and args.only not in key:
            continue
        out.append(
            dict(
                name=key,
                model=model,
                size=size,
                mesh=mesh,
                hardware=hardware,
                overrides=overrides,
                budget_s=args.budget,
                cold=args.cold,
            )
        )
    if args.depth:
        for n in DEPTHS:
            out.append(
                dict(
                    name=f"gpt2-depth-{n}",
                    model="gpt",
                    size="gpt2",
                    mesh="data=2,model=4",
                    hardware="tpu-v5e",
                    overrides={"n_layers": n},
                    budget_s=args.budget,
                )
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=5.0)
    p.add_argument("--only", default="", help="run the cases whose key contains this")
    p.add_argument("--depth", action="store_true", help="also the depth curve (GPT-2, 1-96)")
    p.add_argument("--workers", type=int, default=1, help="cases run at once (process pool)")
    p.add_argument("--ray", default=None, help="run the cases on a Ray cluster: auto|ADDRESS")
    p.add_argument(
        "--cold",
        action="store_true",
        help="the search builds its evaluator within its budget (a user's first tc.search)",
    )
    p.add_argument("--out", default="scale", help="results file name in bench/results/")
    p.add_argument("--job", default="", help=argparse.SUPPRESS)  # internal: run one job
    args = p.parse_args()
    if args.job:
        j = json.loads(args.job)
        row = run_case(
            j["model"],
            j["size"],
            j["mesh"],
            j["hardware"],
            j["overrides"],
            j["budget_s"],
            j.get("cold", False),
        )
        print(json.dumps(row))
        return
    from toast_core.search.sweep import sweep

    todo = jobs(args)
    if args.ray or args.workers > 1:
        rows = sweep(in_fresh_process, todo, workers=args.workers, ray=args.ray)
    else:
        rows = []
        for job in todo:
            rows.append(in_fresh_process(job))
            print(table(rows[-1:], COLUMNS), flush=True)
    print()
    print(table(rows, COLUMNS))
    print(f"results: {save(args.out, rows)}")


if __name__ == "__main__":
    main()
