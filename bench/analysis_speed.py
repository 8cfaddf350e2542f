"""Analysis throughput: jaxpr equations per second of Named Dimension Analysis, by model size.

GPT-2-shaped train steps (Adam) with 2, 6, 12, 24 and 48 layers, traced from ShapeDtypeStructs.
For each: equations, tensor dims, named dims, conflicts, trace time (excluded from the rate), the
NDA pass alone and the full analysis (NDA + conflicts with their resolution options), equations per
second, and the ratio of named dims to tensor dims. Growth should be linear: time per equation
roughly constant across sizes.

Times are CPU time of this process (`time.process_time`, best of `--repeats`): the machine is
shared, and wall time counts the other processes' turns too (`analyze_wall_s` keeps it for
reference).

    .venv/bin/python bench/analysis_speed.py [--layers 2,6,12,24,48] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import time

from _common import load, save, table


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="2,6,12,24,48")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    import toast_core as tc
    from toast_core.analysis.nda import run_nda

    rows = []
    for n_layers in [int(x) for x in args.layers.split(",")]:
        _, prog, _, trace_s, _ = load("gpt", "gpt2", n_layers=n_layers)
        nda_s = min(_timed(run_nda, prog) for _ in range(args.repeats))
        best, wall, ana = float("inf"), float("inf"), None
        for _ in range(args.repeats):
            t0, w0 = time.process_time(), time.perf_counter()
            ana = tc.analyze(prog)
            best = min(best, time.process_time() - t0)
            wall = min(wall, time.perf_counter() - w0)
        s = ana.summary()
        rows.append(
            {
                "layers": n_layers,
                "eqns": s["ops"],
                "tensor_dims": s["tensor_dims"],
                "named_dims": s["named_dims"],
                "dim_groups": s["dim_groups"],
                "conflicts": s["conflicts"],
                "named/tensor": round(s["named_dims"] / s["tensor_dims"], 4),
                "trace_s": round(trace_s, 3),
                "nda_s": round(nda_s, 3),
                "analyze_s": round(best, 3),
                "analyze_wall_s": round(wall, 3),
                "nda_eq_per_s": round(s["ops"] / nda_s),
                "eq_per_s": round(s["ops"] / best),
                "us_per_eq": round(best / s["ops"] * 1e6, 1),
            }
        )
        print(table(rows[-1:], list(rows[-1])), flush=True)
    print()
    print(table(rows, list(rows[0])))
    print(f"results: {save('analysis_speed', rows)}")


def _timed(fn, *args) -> float:
    """CPU time of one call with the garbage collector paused, as `tc.analyze` runs its passes."""
    gc.disable()
    try:
        t0 = time.process_time()
        fn(*args)
        return time.process_time() - t0
    finally:
        gc.enable()


if __name__ == "__main__":
    main()
