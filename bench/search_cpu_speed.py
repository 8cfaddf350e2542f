"""Search speed in evaluations per CPU second, for comparing two checkouts on a loaded machine.

A deterministic search (`num_simulations=N, budget_s=None, seed=0`: the same evaluations every
run) is timed with `time.process_time`, best of 3, after one warm-up search that builds the
evaluator, the decision space and their memos. Wall time means little on a shared machine; CPU
time of the same work does. To compare a change, run it in this checkout and in a `git archive`
of the older commit (the script imports the checkout it lives in):

    .venv/bin/python bench/search_cpu_speed.py [--only gpt3-175b]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _common import set_devices

set_devices()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (zoo model, size, overrides, mesh, hardware, simulations): GPT-3 175B as bench/scale.py runs it.
CASES = {
    "gpt3-175b": ("gpt", "gpt3-175b", {"batch": 128}, "data=8,fsdp=16,model=16", "tpu-v5p", 20),
    "gpt2-small": ("gpt", "small", {}, "data=2,model=4", "tpu-v5e", 60),
}


def run_case(model, size, overrides, mesh_text, hw_name, simulations) -> str:
    import toast_core as tc
    from demos import MODEL_ZOO

    w = MODEL_ZOO[model](size=size, **overrides)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware(hw_name)

    def search():
        return tc.search(ana, mesh, hw, num_simulations=simulations, budget_s=None, seed=0)

    search()  # warm-up: evaluator, decision space, memos
    best_s = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        result = search()
        best_s = min(best_s, time.process_time() - t0)
    return (
        f"{result.evaluations} evaluations in {best_s:.3f} CPU s: "
        f"{result.evaluations / best_s:.0f} evaluations/CPU s "
        f"(step {result.report.step_time_s!r} s)"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--only", help="substring of the case name")
    args = p.parse_args()
    for name, case in CASES.items():
        if not args.only or args.only in name:
            print(f"{name}: {run_case(*case)}", flush=True)


if __name__ == "__main__":
    main()
