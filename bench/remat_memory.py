"""Remat applied to real traced steps: does XLA's compiled memory move as the cost model predicts?

For the GPT demo and the Flax MLP, data parallel on 8 simulated devices, each plan is compiled
by `tc.validate` (numerics off: tests/test_remat.py checks them) without remat, with `dots` and
with `full` remat everywhere, and with the remat the search chooses (`searched`: `tc.search` on
the same mesh with the device memory set halfway between the predicted peaks without and with
full remat, so that only remat makes a plan fit; its remat policies applied to the same data
parallel sharding); the table gives the predicted per-device memory (the CPU view,
`ValidationReport.predicted_memory_bytes`) beside XLA's `memory_analysis()` (argument + output +
temp - alias), and the reduction from the plan without remat, predicted and compiled.

The scheduler matters (see `toast_core/apply/validate.py`, REMAT_COMPILER_OPTIONS, for why
remat plans compile on CPU with CSE and barrier expansion off): `--scheduler memory` sets
`--xla_cpu_enable_concurrency_optimized_scheduler=false` for the process (XLA:CPU's default
scheduler favours concurrency; TPU/GPU schedulers track memory). Process-wide only: the option
is not read from per-compile options.

    .venv/bin/python bench/remat_memory.py [--scheduler default|memory] [--out NAME]

Writes bench/results/remat_memory_<scheduler>.json (or bench/results/NAME.json).
"""

from __future__ import annotations

import argparse
import os
import sys

SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"

# model: (zoo name, config overrides); small, activation-heavy sizes that compile in seconds.
CASES = {
    "gpt": ("gpt", {"batch": 64, "n_layers": 8}),
    "flax": ("flax", {"batch": 8192, "hidden": 256, "depth": 4}),
}
PLANS = ("none", "dots", "full", "searched")


def measure(model: str, plans=PLANS, hw: str = "h100-80gb") -> list[dict]:
    """One row per plan: predicted and compiled per-device memory, and the reduction from the
    plan without remat."""
    import toast_core as tc
    from demos import MODEL_ZOO

    name, overrides = CASES[model]
    w = MODEL_ZOO[name](**overrides)
    ana = tc.analyze(tc.trace(w.fn, *w.args))
    mesh = tc.MeshSpec({"data": 8})
    dp = tc.baselines.data_parallel(ana, mesh)
    jm = tc.jax_mesh(mesh)
    rows = []
    for plan in plans:
        s = (
            dp
            if plan == "none"
            else dp.with_remat(
                ana, searched_remat(ana, mesh, hw, dp) if plan == "searched" else plan
            )
        )
        r = tc.validate(w.fn, w.args, ana, s, jm, hw, check_numerics=False)
        rows.append(
            {
                "model": model,
                "plan": plan,
                "remat": ",".join(f"{g}={p}" for g, p in s.remat) or "-",
                "predicted_MB": r.predicted_memory_bytes / 1e6,
                "xla_MB": r.compiled_memory_bytes / 1e6,
                "ratio": r.memory_ratio,
                "flops_ratio": r.flops_ratio,
            }
        )
    base = rows[0]
    for row in rows:
        row["predicted_reduction_MB"] = base["predicted_MB"] - row["predicted_MB"]
        row["xla_reduction_MB"] = base["xla_MB"] - row["xla_MB"]
        row["reduction_ratio"] = (
            row["predicted_reduction_MB"] / row["xla_reduction_MB"]
            if row["xla_reduction_MB"]
            else float("nan")
        )
    return rows


def searched_remat(ana, mesh, hw: str, dp) -> dict:
    """The remat policies `tc.search` picks when the device memory lies halfway between the
    predicted peaks of `dp` without and with full remat."""
    import dataclasses

    import toast_core as tc

    spec = tc.hardware(hw)
    none = tc.estimate(ana, dp, mesh, spec).peak_bytes
    full = tc.estimate(ana, dp.with_remat(ana, "full"), mesh, spec).peak_bytes
    small = dataclasses.replace(spec, name="small-hbm", hbm_capacity_bytes=int((none + full) / 2))
    opts = tc.CostOptions(memory_headroom=0.0)
    res = tc.search(ana, mesh, small, budget_s=None, num_simulations=60, seed=0, cost_options=opts)
    return dict(res.best.remat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheduler", choices=("default", "memory"), default="memory")
    ap.add_argument("--only", choices=tuple(CASES), default=None)
    ap.add_argument("--out", default=None, help="results name (default remat_memory_<scheduler>)")
    a = ap.parse_args()
    flags = "--xla_force_host_platform_device_count=8"
    if a.scheduler == "memory":
        flags += " " + SCHEDULER_FLAG
    os.environ["XLA_FLAGS"] = flags
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.dirname(__file__))
    from _common import save, table

    rows = []
    for model in [a.only] if a.only else CASES:
        rows += measure(model)
    cols = [
        "model",
        "plan",
        "remat",
        "predicted_MB",
        "xla_MB",
        "ratio",
        "predicted_reduction_MB",
        "xla_reduction_MB",
        "reduction_ratio",
        "flops_ratio",
    ]
    print(f"scheduler: {a.scheduler} (XLA_FLAGS={flags})")
    print(table(rows, cols))
    payload = {"scheduler": a.scheduler, "xla_flags": flags, "cases": CASES, "rows": rows}
    print("wrote", save(a.out or f"remat_memory_{a.scheduler}", payload))


if __name__ == "__main__":
    main()
