"""Behaviour fingerprint: proves a speed-up changed nothing a user can see.

For a handful of zoo models and meshes it records the traced program (ops and values), the
analysis (named dims, conflicts, repeated-layer groups) and a deterministic search
(`num_simulations=30, budget_s=None, seed=0`: the strategy JSON and the step time), each as a
SHA-256 of its text. Run it before an optimisation (`--save`) and after (`--check`): any
difference names the case and the part that changed.

    cd <worktree> && .venv/bin/python scripts/fingerprint.py --save /tmp/fp.json
    cd <worktree> && .venv/bin/python scripts/fingerprint.py --check /tmp/fp.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (zoo model, size, overrides, mesh, hardware); the search runs on every case.
CASES = (
    ("mlp", "tiny", {}, "data=2,model=4", "tpu-v5e"),
    ("gpt", "small", {}, "data=2,model=4", "tpu-v5e"),
    ("gpt", "gpt2", {}, "data=2,model=4", "tpu-v5e"),
    ("gpt", "gpt2", {"n_layers": 4}, "data=2,fsdp=2,model=2", "tpu-v5p"),
    ("gpt-scan", "tiny", {}, "data=2,model=4", "tpu-v5e"),
    ("llama", "tiny", {}, "data=2,fsdp=2,model=2", "tpu-v5p"),
    ("moe", "tiny", {}, "data=2,model=4", "tpu-v5e"),
    ("unet", "tiny", {}, "data=2,model=4", "tpu-v5e"),
    ("gns", "tiny", {}, "data=8", "tpu-v5e"),
)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint_case(model: str, size: str, overrides: dict, mesh_text: str, hw_name: str) -> dict:
    import toast_core as tc
    from demos import MODEL_ZOO

    w = MODEL_ZOO[model](size=size, **overrides)
    prog = tc.trace(w.fn, *w.args, param_argnums=w.param_argnums)
    ana = tc.analyze(prog)
    mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware(hw_name)
    result = tc.search(ana, mesh, hw, num_simulations=30, budget_s=None, seed=0)
    return {
        "program": _sha(repr(prog.ops) + repr(prog.values)),
        "named_dims": _sha(repr(ana.named_dims)),
        "conflicts": _sha(repr(ana.conflicts)),
        "groups": _sha(repr((ana.dim_groups, ana.conflict_groups, ana.cooccurrence))),
        "strategy": _sha(result.best.to_json(mesh)),
        "step_time_s": repr(result.report.step_time_s),
        "peak_bytes": repr(result.report.peak_bytes),
        "evaluations": result.evaluations,
        "iterations": result.iterations,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--save")
    p.add_argument("--check")
    p.add_argument("--only", help="substring of the case key")
    args = p.parse_args()
    out = {}
    for model, size, overrides, mesh_text, hw_name in CASES:
        key = f"{model}/{size}/{json.dumps(overrides, sort_keys=True)}/{mesh_text}"
        if args.only and args.only not in key:
            continue
        out[key] = fingerprint_case(model, size, overrides, mesh_text, hw_name)
        print(key, json.dumps(out[key]), flush=True)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    if args.check:
        with open(args.check) as f:
            ref = json.load(f)
        bad = [
            f"{key}: {part} {ref[key][part]} -> {value}"
            for key, parts in out.items()
            for part, value in parts.items()
            if key in ref and ref[key].get(part) != value
        ]
        print("\n".join(bad) if bad else f"fingerprint identical ({len(out)} cases)")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
