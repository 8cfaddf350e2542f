"""Fidelity of the cost model against XLA, the external judge.

For the MLP and GPT train steps on meshes (8,), (2,4), (4,2), (2,2,2) of simulated CPU devices and
every applicable baseline: per-device flops and transcendentals (vs `compiled.cost_analysis()`), collective bytes per
kind (vs those parsed from the optimized HLO; the prediction as XLA CPU lowers it: reduce-scatter as
an all-reduce of the full buffer, bf16 collectives in f32), memory (vs `memory_analysis()` argument
+ output + temp), numerics, and whether the ranking of baselines by predicted communication bytes
equals XLA's. Targets: flops within 5%, bytes per kind within 25%, memory within 30%.

    .venv/bin/python bench/fidelity.py [--gpt-size tiny|small]
"""

from __future__ import annotations

import argparse

from _common import save, set_devices, table

set_devices(8)

MESHES = {
    "8": {"data": 8},
    "2x4": {"data": 2, "model": 4},
    "4x2": {"data": 4, "model": 2},
    "2x2x2": {"data": 2, "fsdp": 2, "model": 2},
}


def _ratio(p: float, c: float) -> float | str:
    if c == 0 and p == 0:
        return 1.0
    return round(p / c, 3) if c else "inf"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gpt-size", default="tiny")
    p.add_argument("--hardware", default="tpu-v5e")
    args = p.parse_args()
    import jax
    import numpy as np
    from jax.sharding import Mesh

    import toast_core as tc
    from demos import MODEL_ZOO

    hw = tc.hardware(args.hardware)
    rows, rankings = [], []
    for model, size in (("mlp", "tiny"), ("gpt", args.gpt_size)):
        w = MODEL_ZOO[model](size=size, train=True)
        ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
        for mesh_name, axes in MESHES.items():
            mesh = tc.MeshSpec(axes)
            jm = Mesh(
                np.array(jax.devices()[: mesh.n_devices]).reshape(mesh.axis_sizes), mesh.axis_names
            )
            pred_total, comp_total = {}, {}
            for name, (strategy, _why) in tc.baselines.all(ana, mesh).items():
                if strategy is None or name == "replicated":
                    continue
                rep = tc.validate(w.fn, w.args, ana, strategy, jm, hw)
                kinds = sorted(
                    k
                    for k in rep.compiled_collective_bytes
                    if rep.compiled_collective_bytes[k] or rep.predicted_collective_bytes.get(k)
                )
                pred_total[name] = sum(rep.predicted_collective_bytes.values())
                comp_total[name] = sum(rep.compiled_collective_bytes.values())
                row = {
                    "model": model,
                    "mesh": mesh_name,
                    "strategy": name,
                    "numerics": "ok" if rep.numerics_ok else "MISMATCH",
                    "flops": _ratio(rep.predicted_flops, rep.compiled_flops),
                    "transc": _ratio(rep.predicted_transcendentals, rep.compiled_transcendentals),
                    "memory": _ratio(rep.predicted_memory_bytes, rep.compiled_memory_bytes),
                    "comm_total": _ratio(pred_total[name], comp_total[name]),
                }
                for k in kinds:
                    row[k] = _ratio(
                        rep.predicted_collective_bytes.get(k, 0.0), rep.compiled_collective_bytes[k]
                    )
                row["pred_bytes"] = int(pred_total[name])
                row["xla_bytes"] = int(comp_total[name])
                rows.append(row)
                print(table([row], list(row)), flush=True)
            order_p = sorted(pred_total, key=lambda n: (pred_total[n], n))
            order_c = sorted(comp_total, key=lambda n: (comp_total[n], n))
            rankings.append(
                {
                    "model": model,
                    "mesh": mesh_name,
                    "predicted": " < ".join(order_p),
                    "xla": " < ".join(order_c),
                    "same": order_p == order_c,
                }
            )
    cols = [
        "model",
        "mesh",
        "strategy",
        "numerics",
        "flops",
        "transc",
        "memory",
        "comm_total",
        "all-gather",
        "all-reduce",
        "all-to-all",
        "collective-permute",
        "reduce-scatter",
        "pred_bytes",
        "xla_bytes",
    ]
    print("\nPredicted / compiled (1.0 = exact)")
    print(table(rows, cols))
    print("\nRanking of baselines by communication bytes")
    print(table(rankings, ["model", "mesh", "same", "predicted", "xla"]))
    name = "fidelity" if args.gpt_size == "tiny" else f"fidelity_gpt_{args.gpt_size}"
    print(f"results: {save(name, {'rows': rows, 'rankings': rankings})}")


if __name__ == "__main__":
    main()
