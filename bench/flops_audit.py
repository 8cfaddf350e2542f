"""Where do predicted flops and XLA's differ on fuzz programs? Two views, unsharded.

* Per program: the cost model's flops (replicated strategy, as `tc.validate` predicts them for the
  CPU view) against `cost_analysis()` of the program under plain `jax.jit`.
* Per equation (`--eqns`): every primitive equation of the program (call bodies inlined, loop and
  cond bodies walked) compiled alone on its operand shapes, our rule's count against XLA's; the
  mismatching (primitive, shapes, params) are listed once each. This isolates the per-primitive
  counting conventions from the whole-program effects (fusion duplicates, the simplifier).

    .venv/bin/python bench/flops_audit.py --seed 3 --programs 40 [--eqns]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

from _common import save, set_devices

set_devices(8)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.extend.core as jex  # noqa: E402

import toast_core as tc  # noqa: E402
from fuzz.programs import generate  # noqa: E402
from toast_core.apply.validate import cpu_flops  # noqa: E402
from toast_core.cost.flops import op_flops, op_transcendentals  # noqa: E402
from toast_core.cost.simplify import flop_executions  # noqa: E402

_CALLS = {"jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint"}


def _cost(compiled) -> dict:
    c = compiled.cost_analysis()
    return c[0] if isinstance(c, list | tuple) else c


def program_flops(fn, args) -> tuple[float, float, float, float]:
    """(predicted flops, compiled flops, predicted transcendentals, compiled ones), unsharded."""
    ana = tc.analyze(tc.trace(fn, *args))
    mesh = tc.MeshSpec({"data": 2})
    strategy = tc.Strategy(name="replicated")
    report = tc.estimate(
        ana, strategy, mesh, tc.hardware("tpu-v5e"), tc.CostOptions(donate_outputs=False),
    )  # fmt: skip
    pf, pt = cpu_flops(report, ana, strategy, mesh)
    cost = _cost(jax.jit(fn).lower(*args).compile())
    return pf, float(cost.get("flops", 0)), pt, float(cost.get("transcendentals", 0))


def _side(prog) -> int:
    """-1 / +1 when the unsharded prediction is more than 5 % under / over XLA's count (on at
    least 100 compiled flops), else 0."""
    fn, args = prog.step_and_args()
    pf, cf, _, _ = program_flops(fn, args)
    if cf < 100 or abs(pf - cf) <= 0.05 * cf:
        return 0
    return 1 if pf > cf else -1


def minimized(prog, budget_s: float = 60.0):
    """The smallest program (simpler modes, dropped statements; no dims shrunk: tiny programs
    measure scalar noise) whose unsharded flops still miss on the same side."""
    from fuzz import minimize as fm

    side = _side(prog)
    best, progress, deadline = prog, True, time.monotonic() + budget_s
    while progress and time.monotonic() < deadline:
        progress = False
        cands = list(fm._simpler_modes(best))
        for i in reversed(range(len(best.stmts))):
            cands += list(fm._drop_stmt(best, i))
        for cand in cands:
            try:
                cand.check(run=False)
                if _side(cand) == side:
                    best, progress = cand, True
                    break
            except Exception:  # noqa: BLE001 - not a valid program
                continue
    return best


def _eqns(jaxpr):
    """Primitive equations, call bodies inlined, region bodies walked."""
    for eqn in jaxpr.eqns:
        subs = [
            v.jaxpr if isinstance(v, jex.ClosedJaxpr) else v
            for p in eqn.params.values()
            for v in (p if isinstance(p, tuple | list) else (p,))
            if isinstance(v, jex.ClosedJaxpr | jex.Jaxpr)
        ]
        if subs:
            for s in subs:
                yield from _eqns(s)
        else:
            yield eqn


def _single(eqn):
    """A function of the equation's non-literal operands that binds it alone, and their avals."""
    names = [i for i, v in enumerate(eqn.invars) if not isinstance(v, jex.Literal)]

    def fn(*xs):
        it = iter(xs)
        ins = [v.val if isinstance(v, jex.Literal) else next(it) for v in eqn.invars]
        return eqn.primitive.bind(*ins, **eqn.params)

    avals = [
        jax.ShapeDtypeStruct(eqn.invars[i].aval.shape, eqn.invars[i].aval.dtype) for i in names
    ]
    return fn, avals


def _key(eqn) -> str:
    shapes = [(tuple(v.aval.shape), str(v.aval.dtype)) for v in eqn.invars]
    params = {k: v for k, v in eqn.params.items() if k not in ("jaxpr", "call_jaxpr")}
    return f"{eqn.primitive.name} {shapes} {params}"


def eqn_audit(fn, args, seen: dict) -> None:
    """Compile each distinct equation alone; record ours vs XLA's in `seen[key]`."""
    closed = jax.make_jaxpr(fn)(*args)
    for eqn in _eqns(closed.jaxpr):
        key = _key(eqn)
        if key in seen:
            continue
        single, avals = _single(eqn)
        try:
            cost = _cost(jax.jit(single).lower(*avals).compile())
            prog = tc.trace(single, *avals)
        except Exception as exc:  # noqa: BLE001 - a report, not a judge
            seen[key] = {"error": repr(exc)[:200]}
            continue
        wf = flop_executions(prog)
        ours_f = sum(op_flops(op, prog) * w for op, w in zip(prog.ops, wf))
        ours_t = sum(op_transcendentals(op, prog) * w for op, w in zip(prog.ops, wf))
        seen[key] = {
            "primitive": eqn.primitive.name,
            "ours": ours_f,
            "xla": float(cost.get("flops", 0)),
            "ours_t": ours_t,
            "xla_t": float(cost.get("transcendentals", 0)),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--programs", type=int, default=40)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--eqns", action="store_true")
    p.add_argument("--minimize", action="store_true", help="minimize each miss, print its source")
    p.add_argument("--out", default="flops_audit")
    args = p.parse_args()
    rows, seen = [], {}
    for index in range(args.start, args.start + args.programs):
        prog = generate(args.seed, index)
        fn, fargs = prog.step_and_args()
        try:
            pf, cf, pt, ct = program_flops(fn, fargs)
        except Exception as exc:  # noqa: BLE001
            print(f"#{index}: {exc!r}"[:200])
            continue
        ratio = pf / cf if cf else float("nan")
        rows.append({"index": index, "mode": prog.mode, "ops": prog.ops(), "predicted": pf,
                     "compiled": cf, "ratio": ratio, "pred_t": pt, "comp_t": ct})  # fmt: skip
        flag = "" if abs(ratio - 1) <= 0.05 else "  MISS"
        print(f"#{index} {prog.mode:11s} {pf:10.0f} {cf:10.0f} {ratio:6.3f}{flag} {prog.ops()}")
        if flag and args.minimize:
            small = minimized(prog)
            fn2, a2 = small.step_and_args()
            pf2, cf2, _, _ = program_flops(fn2, a2)
            body = small.source().split("def forward")[1].split("def example_args")[0]
            print(f"  minimized: {small.mode} {pf2:.0f} vs {cf2:.0f}\n  def forward{body}")
        if args.eqns:
            eqn_audit(fn, fargs, seen)
    within = sum(abs(r["ratio"] - 1) <= 0.05 for r in rows) / max(len(rows), 1)
    print(f"\nunsharded within 5 %: {within:.1%} of {len(rows)}")
    bad = defaultdict(list)
    for key, s in seen.items():
        if "error" in s or s["ours"] != s["xla"] or s["ours_t"] != s["xla_t"]:
            bad[s.get("primitive", "error")].append((key, s))
    for prim_name, items in sorted(bad.items()):
        print(f"\n== {prim_name}: {len(items)} mismatching equations")
        for key, s in items[:6]:
            print(f"  {key[:220]}\n     {s}")
    save(args.out, {"programs": rows, "eqns": seen})


if __name__ == "__main__":
    main()
