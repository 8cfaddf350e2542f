"""Scale: real-size train steps traced from ShapeDtypeStructs, analyzed and searched.

GPT-3 175B (unrolled, 96 layers, and with `lax.scan` over stacked layers) on a 3-axis mesh of 2048
devices (data=8, fsdp=16, model=16: with data=16, fsdp=16, model=8 the unrolled step's activations
need 116 GiB per chip, see the closing note of the scale issue) and Llama-3 70B on 512 devices (data=4, fsdp=16, model=8), TPU
v5p: trace, analysis and a 30 s search in one process each. Reported: wall times, peak RSS, named
dims, decision groups, whether the plan fits device memory and its efficiency (ideal / estimated
step time). Targets: total under 60 s, peak RSS under 6 GB.

    .venv/bin/python bench/scale.py [--budget 30] [--only gpt3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _common import peak_rss_bytes, save, table

# (zoo model, size, mesh, config overrides): global batches that give every data shard one
# sequence. Llama-3 70B uses 2048-token sequences: we model full (not flash) attention without
# rematerialization, whose 4096-token scores alone would overflow any chip.
CASES = {
    "gpt3-175b": ("gpt", "gpt3-175b", "data=8,fsdp=16,model=16", {"batch": 128}),
    "gpt3-175b-scan": ("gpt-scan", "gpt3-175b", "data=8,fsdp=16,model=16", {"batch": 128}),
    "llama3-70b": ("llama", "llama3-70b", "data=4,fsdp=16,model=8", {"batch": 64, "seq": 2048}),
}


def run_case(key: str, budget_s: float, hardware: str) -> dict:
    """One case, measured in this (fresh) process."""
    import toast_core as tc
    from demos import MODEL_ZOO

    model, size, mesh_text, overrides = CASES[key]
    t0 = time.perf_counter()
    w = MODEL_ZOO[model](size=size, **overrides)
    prog = tc.trace(w.fn, *w.args, param_argnums=w.param_argnums)
    t1 = time.perf_counter()
    ana = tc.analyze(prog)
    t2 = time.perf_counter()
    mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware(hardware)
    result = tc.search(ana, mesh, hw, budget_s=budget_s, seed=0)
    t3 = time.perf_counter()
    s, r = ana.summary(), result.report
    feasible_baselines = {k: v for k, v in result.baselines.items() if v is not None}
    best_base = min(feasible_baselines.values()) if feasible_baselines else None
    return {
        "case": key,
        "devices": mesh.n_devices,
        "batch": w.config.batch,
        "seq": w.config.seq,
        "eqns": s["ops"],
        "tensor_dims": s["tensor_dims"],
        "named_dims": s["named_dims"],
        "dim_groups": s["dim_groups"],
        "conflicts": s["conflicts"],
        "conflict_groups": s["conflict_groups"],
        "trace_s": round(t1 - t0, 2),
        "analyze_s": round(t2 - t1, 2),
        "search_s": round(t3 - t2, 2),
        "total_s": round(t3 - t0, 2),
        "peak_rss_gb": round(peak_rss_bytes() / 1e9, 2),
        "evals_per_s": round(result.evaluations / max(result.elapsed_s, 1e-9)),
        "fits": r.fits,
        "peak_gib": round(r.peak_bytes / 2**30, 1),
        "step_s": round(r.step_time_s, 3),
        "efficiency": round(r.efficiency, 3),
        "vs_best_baseline": round(r.step_time_s / best_base, 3)
        if best_base
        else "no feasible baseline",
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=30.0)
    p.add_argument("--hardware", default="tpu-v5p")
    p.add_argument("--only", default="")
    p.add_argument("--case", default="", help=argparse.SUPPRESS)  # internal: run one case
    args = p.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.budget, args.hardware)))
        return
    rows = []
    for key in CASES:
        if args.only and args.only not in key:
            continue
        # A fresh process per case, so peak RSS is that case's alone.
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--case",
                key,
                "--budget",
                str(args.budget),
                "--hardware",
                args.hardware,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(table(rows[-1:], list(rows[-1])), flush=True)
    print()
    print(table(rows, list(rows[0])))
    print(f"results: {save('scale', rows)}")


if __name__ == "__main__":
    main()
