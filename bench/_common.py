"""Shared helpers for the benchmark scripts: zoo loading, tables, JSON results.

Importing it puts this checkout's root first on `sys.path`: the editable install points at one
checkout, and a script run by path from another (a git worktree) would otherwise measure that one's
`toast_core` without a word.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
RESULTS = Path(__file__).parent / "results"


def load(name: str, size: str, train: bool = True, **overrides):
    """(workload, program, analysis, trace_s, analyze_s) for a zoo model."""
    import toast_core as tc
    from demos import MODEL_ZOO

    w = MODEL_ZOO[name](size=size, train=train, **overrides)
    t0 = time.perf_counter()
    prog = tc.trace(w.fn, *w.args, param_argnums=w.param_argnums)
    t1 = time.perf_counter()
    ana = tc.analyze(prog)
    t2 = time.perf_counter()
    return w, prog, ana, t1 - t0, t2 - t1


def table(rows: list[dict], columns: list[str]) -> str:
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [
        max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(columns)
    ]
    out = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def _fmt(x) -> str:
    if isinstance(x, float):
        if x == 0 or 1e-3 <= abs(x) < 1e6:
            return f"{x:.4g}"
        return f"{x:.3e}"
    return str(x)


def save(name: str, payload) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def set_devices(n: int = 8) -> None:
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={n}")
