"""How soon a short search reaches the plan a long one converges to (issue 15: a re-search after a
pin must be interactive).

For each mesh, a `--long` search (default 120 s) gives the converged step time; then a `--short`
search (default 3 s, same seed) is run and its history (iteration, elapsed, best step time) tells
when it first reached a step time no worse than the long search's. Both build their evaluator
before the clock starts (`prepare`), as a re-search in the explorer does. Wall times include
waiting for a core on a shared machine, so a loaded run over-states the time to reach.

    .venv/bin/python bench/converge.py [--meshes data=2,model=4 data=2,fsdp=2,model=2]
        [--long 120] [--short 3] [--out converge]
"""

from __future__ import annotations

import argparse
import os

from _common import save, set_devices, table

set_devices()


def run(mesh_text: str, long_s: float, short_s: float, seed: int) -> dict:
    import toast_core as tc
    from demos import MODEL_ZOO

    w = MODEL_ZOO["gpt"](size="gpt2")
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware("tpu-v5e")
    tc.search(ana, mesh, hw, num_simulations=2, budget_s=None, seed=seed)  # builds the evaluator
    long = tc.search(ana, mesh, hw, budget_s=long_s, seed=seed)
    target = long.report.step_time_s
    short = tc.search(ana, mesh, hw, budget_s=short_s, seed=seed)
    reached = next(
        (t for _, t, best in short.history if best <= target * (1 + 1e-9)),
        None,
    )
    return {
        "mesh": mesh_text,
        "long_s": long_s,
        "long_step_s": target,
        "long_iterations": long.iterations,
        "short_s": short_s,
        "short_step_s": short.report.step_time_s,
        "short_iterations": short.iterations,
        "reached_s": None if reached is None else round(reached, 3),
        "met": reached is not None and reached <= short_s,
        "load_1min": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--meshes", nargs="+", default=["data=2,model=4", "data=2,fsdp=2,model=2"])
    p.add_argument("--long", type=float, default=120.0)
    p.add_argument("--short", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="converge")
    args = p.parse_args()
    rows = [run(m, args.long, args.short, args.seed) for m in args.meshes]
    print(table(rows, list(rows[0])))
    save(args.out, rows)


if __name__ == "__main__":
    main()
