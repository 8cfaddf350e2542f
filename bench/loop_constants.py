"""Collectives per step on a gradient accumulation loop, predicted vs compiled, loop trips counted.

`bench/fidelity.py` compares collective bytes as the program text shows them (a loop body's
collective once); this bench counts executions per step on both sides: predicted bytes times each
collective's `count`, compiled bytes times how often its computation runs
(`hlo_loops.computation_counts`). It runs the `grad-accum` workload (tiny) on mesh data=2,
model=4 under the baselines and under plans that shard the batch's microbatch dim (x[M, B, D],
y[M, B, E] dim 0), which the loop's dynamic slice needs gathered: a collective on a loop constant,
hoisted out of the loop by XLA.

    .venv/bin/python bench/loop_constants.py [--preset tpu-v5e]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import set_devices, table

set_devices(8)

import toast_core as tc  # noqa: E402
from demos import MODEL_ZOO  # noqa: E402
from toast_core.apply.hlo import parse_collectives  # noqa: E402
from toast_core.apply.hlo_loops import computation_counts  # noqa: E402

MESH = tc.MeshSpec({"data": 2, "model": 4})


def _fmt_bytes(d: dict) -> str:
    return " ".join(f"{k}={int(v)}" for k, v in sorted(d.items()) if v) or "-"


def _micro_plan(ana, axes: tuple[str, ...]):
    prog = ana.program
    shard = {}
    for v in prog.inputs:
        if prog.values[v].role == "input" and prog.values[v].rank == 3:
            for d in ana.value_named_dims(v)[0]:
                shard[f"N{d}"] = axes
    return tc.Strategy.make(ana, shard, {}, f"micro_on_{'+'.join(axes)}")


def row(w, ana, name, plan, hw) -> dict:
    report = tc.estimate(ana, plan, MESH, hw)
    check = tc.validate(w.fn, w.args, ana, plan, tc.jax_mesh(MESH), hw, check_numerics=False)
    pred, comp = {}, {}
    for c in report.collectives:
        pred[c.kind] = pred.get(c.kind, 0.0) + c.result_bytes * c.count
    counts = computation_counts(check.hlo_text)
    for c in parse_collectives(check.hlo_text):
        n = counts.get(c.computation, 1)
        comp[c.kind] = comp.get(c.kind, 0.0) + c.result_bytes * n
    return {
        "plan": name,
        "pred_bytes_per_step": _fmt_bytes(pred),
        "xla_bytes_per_step": _fmt_bytes(comp),
        "pred_us": round(check.predicted_step_time_s * 1e6, 2),
        "xla_us": round(check.compiled_step_time_s * 1e6, 2),
        "step": round(check.step_time_ratio, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tpu-v5e", help="hardware preset")
    args = p.parse_args()
    hw = tc.hardware(args.preset)
    w = MODEL_ZOO["grad-accum"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    plans = {n: s for n, (s, _) in tc.baselines.all(ana, MESH).items() if s is not None}
    for axes in (("data",), ("model",)):
        plan = _micro_plan(ana, axes)
        plans[plan.name] = plan
    rows = [row(w, ana, name, plan, hw) for name, plan in plans.items()]
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
