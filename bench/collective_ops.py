"""Collective ops after XLA's combiners, and the XLA-judged step time, predicted vs compiled.

For the MLP and GPT train steps on meshes (8,), (2,4), (2,2,2) of simulated CPU devices and every
applicable baseline: collective op counts per kind predicted as XLA CPU compiles them (only
all-reduces combine there; reduce-scatters run as all-reduces) against those in the compiled
HLO, the counts on the target hardware's thresholds, and the predicted step time against the one
priced from the compiled program alone (`ValidationReport.compiled_step_time_s`).

    .venv/bin/python bench/collective_ops.py [--hardware tpu-v5e] [--gpt-size tiny]
"""

from __future__ import annotations

import argparse

from _common import save, set_devices, table

set_devices(8)

MESHES = {
    "8": {"data": 8},
    "2x4": {"data": 2, "model": 4},
    "2x2x2": {"data": 2, "fsdp": 2, "model": 2},
}
SHORT = {
    "all-gather": "AG",
    "all-reduce": "AR",
    "all-to-all": "A2A",
    "collective-permute": "CP",
    "reduce-scatter": "RS",
}


def _counts(by_kind: dict) -> str:
    return " ".join(f"{SHORT[k]}{n}" for k, n in sorted(by_kind.items()) if n) or "-"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hardware", default="tpu-v5e")
    p.add_argument("--gpt-size", default="tiny")
    args = p.parse_args()

    import toast_core as tc
    from demos import MODEL_ZOO

    hw = tc.hardware(args.hardware)
    rows = []
    for model, size in (("mlp", "tiny"), ("gpt", args.gpt_size)):
        w = MODEL_ZOO[model](size=size, train=True)
        ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
        for mesh_name, axes in MESHES.items():
            mesh = tc.MeshSpec(axes)
            jm = tc.jax_mesh(mesh)
            for name, (strategy, _why) in tc.baselines.all(ana, mesh).items():
                if strategy is None or name == "replicated":
                    continue
                rep = tc.validate(w.fn, w.args, ana, strategy, jm, hw, check_numerics=False)
                uncombined = {}
                for c in tc.estimate(ana, strategy, mesh, hw).collectives:
                    uncombined[c.kind] = uncombined.get(c.kind, 0) + 1
                row = {
                    "model": model,
                    "mesh": mesh_name,
                    "strategy": name,
                    "uncombined": _counts(uncombined),
                    "predicted_cpu": _counts(rep.predicted_collective_ops),
                    "compiled": _counts(rep.compiled_collective_ops),
                    "equal": rep.predicted_collective_ops == rep.compiled_collective_ops,
                    f"target_{hw.name}": _counts(rep.predicted_collective_ops_target),
                    "xla_target": _counts(rep.compiled_collective_ops_target),
                    "pred_us": round(rep.predicted_step_time_s * 1e6, 1),
                    "xla_us": round(rep.compiled_step_time_s * 1e6, 1),
                    "ratio": round(rep.step_time_ratio, 3),
                    "pred_comm_us": round(rep.predicted_comm_s * 1e6, 1),
                    "xla_comm_us": round(rep.compiled_comm_s * 1e6, 1),
                    "pred_compute_us": round(rep.predicted_compute_s * 1e6, 1),
                    "xla_compute_us": round(rep.compiled_compute_s * 1e6, 1),
                }
                rows.append(row)
                print(table([row], list(row)), flush=True)
    print("\nCollective ops per kind after combining, and step time (predicted vs XLA-judged)")
    print(table(rows, list(rows[0])))
    equal = sum(r["equal"] for r in rows)
    print(f"\nop counts equal in {equal}/{len(rows)} cases")
    save(f"collective_ops_{hw.name}", rows)


if __name__ == "__main__":
    main()
