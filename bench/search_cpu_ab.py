"""Search speed of this checkout against another commit, in one process: evaluations per CPU second.

On a machine shared by many processes, two runs of `search_cpu_speed.py` a minute apart differ
by 20 % and more. Here both versions run in one process, searches alternated, and each keeps its
best CPU time over the rounds, so contention hits both alike. The other commit's `toast_core` is
extracted with `git archive` into a temporary directory and imported as `toast_core_base` (every
`toast_core` in its sources renamed); each version traces and analyzes the workload itself.

    .venv/bin/python bench/search_cpu_ab.py BASE_REF [--case gpt2-small] [--simulations N]
        [--rounds 8]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, set_devices
from search_cpu_speed import CASES

set_devices()


def import_base(ref: str, into: Path):
    """`toast_core` of commit `ref`, importable as `toast_core_base`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "toast_core"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    src = into / "toast_core"
    for path in src.rglob("*.py"):
        text = re.sub(r"\btoast_core\b", "toast_core_base", path.read_text())
        path.write_text(text)
    src.rename(into / "toast_core_base")
    sys.path.insert(0, str(into))
    import toast_core_base

    return toast_core_base


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("base", help="the commit to compare with (a git ref)")
    p.add_argument("--case", default="gpt2-small", choices=sorted(CASES))
    p.add_argument("--simulations", type=int, help="default: the case's")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    import toast_core
    from demos import MODEL_ZOO

    model, size, overrides, mesh_text, hw_name, simulations = CASES[args.case]
    simulations = args.simulations or simulations
    w = MODEL_ZOO[model](size=size, **overrides)
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"base": import_base(args.base, Path(tmp)), "this": toast_core}
        searches = {}
        for name, tc in versions.items():
            ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
            mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware(hw_name)

            def search(tc=tc, ana=ana, mesh=mesh, hw=hw):
                return tc.search(ana, mesh, hw, num_simulations=simulations, budget_s=None, seed=0)

            search()  # warm-up: evaluator, decision space, memos
            searches[name] = search
        best, results = dict.fromkeys(searches, float("inf")), {}
        for _ in range(args.rounds):
            for name, search in searches.items():
                t0 = time.process_time()
                results[name] = search()
                best[name] = min(best[name], time.process_time() - t0)
    rate = {name: results[name].evaluations / best[name] for name in searches}
    for name, r in results.items():
        print(
            f"{name}: {r.evaluations} evaluations in {best[name]:.3f} CPU s: "
            f"{rate[name]:.0f} evaluations/CPU s (step {r.report.step_time_s!r} s)"
        )
    print(f"{args.case}, {simulations} simulations: x{rate['this'] / rate['base']:.2f}")


if __name__ == "__main__":
    main()
