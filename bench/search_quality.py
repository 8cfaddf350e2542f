"""Search quality: found step time against the best baseline, per zoo model, mesh and hardware.

Every zoo model (at a realistic size, traced from ShapeDtypeStructs) x meshes (8,), (2,4), (2,2,2)
x presets tpu-v5e and h100-80gb, with a 10 s budget: found step time / best feasible baseline's
(target <= 1.00 everywhere), time to first reach the best baseline, evaluations per second, and
whether the plan fits memory. Then the optimality gap against exhaustive enumeration of the same
decision space on tiny programs (target within 2%).

    .venv/bin/python bench/search_quality.py [--budget 10] [--models gpt,llama] [--skip-gap]
"""

from __future__ import annotations

import argparse
import time

from _common import load, save, table

# (size, config overrides). Llama and Mixtral use 1024-token sequences: with full (not flash)
# attention and no rematerialization, 4096-token attention scores alone exceed any 8-chip mesh.
SIZES = {
    "mlp": ("large", {}),
    "gpt": ("gpt2", {}),
    "gpt-scan": ("gpt2", {}),
    "llama": ("llama3-8b", {"seq": 1024}),
    "moe": ("mixtral-8x7b", {"seq": 1024}),
    "unet": ("large", {}),
    "gns": ("large", {}),
    "flax": ("large", {}),
    "equinox": ("large", {}),
}
MESHES = {"8": "data=8", "2x4": "data=2,model=4", "2x2x2": "data=2,fsdp=2,model=2"}
PRESETS = ("tpu-v5e", "h100-80gb")

# Tiny programs for the optimality gap: (label, zoo model, size, train, overrides, mesh).
GAP_CASES = (
    ("mlp forward", "mlp", "large", False, {}, "data=2,model=4"),
    ("mlp forward, 1-D mesh", "mlp", "large", False, {}, "data=8"),
    ("gpt forward, 1 layer", "gpt", "small", False, {"n_layers": 1}, "data=2,model=4"),
    ("gpt2-shaped forward, 1 layer", "gpt", "gpt2", False, {"n_layers": 1}, "data=2,model=4"),
    (
        "gpt2-shaped forward, 1 layer, 3-D mesh",
        "gpt",
        "gpt2",
        False,
        {"n_layers": 1},
        "data=2,fsdp=2,model=2",
    ),
    ("mlp train step", "mlp", "large", True, {}, "data=8"),
    ("mlp train step, 2-D mesh", "mlp", "large", True, {}, "data=2,model=4"),
)


def quality(budget_s: float, models: list[str]) -> list[dict]:
    import toast_core as tc

    rows = []
    for model in models:
        size, overrides = SIZES[model]
        _, _, ana, _, analyze_s = load(model, size, **overrides)
        for mesh_name, mesh_text in MESHES.items():
            for preset in PRESETS:
                mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware(preset)
                res = tc.search(ana, mesh, hw, budget_s=budget_s, seed=0)
                feasible = {k: v for k, v in res.baselines.items() if v is not None}
                best_name = min(feasible, key=feasible.get) if feasible else None
                best = feasible.get(best_name) if best_name else None
                row = {
                    "model": f"{model}:{size}",
                    "mesh": mesh_name,
                    "hw": preset,
                    "named_dims": len(ana.named_dims),
                    "best_baseline": best_name or "none fits",
                    "baseline_s": best if best is not None else "",
                    "found_s": res.report.step_time_s,
                    "ratio": round(res.report.step_time_s / best, 3) if best else "",
                    "t_reach_s": round(res.time_to_best_baseline_s, 2)
                    if res.time_to_best_baseline_s is not None
                    else "",
                    "evals_per_s": round(res.evaluations / max(res.elapsed_s, 1e-9)),
                    "fits": res.feasible,
                    "efficiency": round(res.report.efficiency, 3),
                }
                rows.append(row)
                print(table([row], list(row)), flush=True)
    return rows


def optimality_gap() -> list[dict]:
    import toast_core as tc
    from toast_core.search.exhaustive import exhaustive_search

    rows = []
    for label, model, size, train, overrides, mesh_text in GAP_CASES:
        _, _, ana, _, _ = load(model, size, train=train, **overrides)
        mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware("tpu-v5e")
        t0 = time.perf_counter()
        try:
            _, optimum, n_states = exhaustive_search(ana, mesh, hw, max_states=200_000)
        except tc.ToastError as exc:
            rows.append({"case": label, "mesh": mesh_text, "states": f"skipped: {exc}"})
            continue
        exhaustive_s = time.perf_counter() - t0
        res = tc.search(ana, mesh, hw, budget_s=10.0, seed=0)
        rows.append(
            {
                "case": label,
                "mesh": mesh_text,
                "states": n_states,
                "exhaustive_s": round(exhaustive_s, 1),
                "optimum_s": optimum,
                "search_s": res.report.step_time_s,
                "gap": f"{res.report.step_time_s / optimum - 1:.2%}",
            }
        )
        print(table(rows[-1:], list(rows[-1])), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=10.0)
    p.add_argument("--models", default=",".join(SIZES))
    p.add_argument("--skip-gap", action="store_true")
    args = p.parse_args()
    rows = quality(args.budget, args.models.split(","))
    print("\nSearch quality (ratio = found / best feasible baseline; <= 1 is the target)")
    print(table(rows, list(rows[0])))
    gap = [] if args.skip_gap else optimality_gap()
    if gap:
        print("\nOptimality gap against exhaustive enumeration")
        print(table(gap, list(gap[0])))
    print(f"results: {save('search_quality', {'quality': rows, 'gap': gap})}")


if __name__ == "__main__":
    main()
