"""What pricing the baselines in the background costs a page run: in a thread, or in the pricing
process (`app.pricing`).

A page run is Python holding the interpreter lock; here a fixed pure-Python loop stands for it
(~1 s of CPU). It runs alone, then while the baselines of llama3-70b (data=8,fsdp=8,model=8,
tpu-v5p) are priced in a thread of this process, then while the pricing process prices them.
Reported per case: wall time, the loop's own CPU time (`time.thread_time`), and their ratio, the
share of a core the page got. Wall time depends on the machine's load; the share's drop beside
the pricing thread is the interpreter lock's doing, whatever the load.

    /work/main/.venv/bin/python bench/pricing_contention.py
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=16")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import toast_core as tc  # noqa: E402
from app import pricing, programs  # noqa: E402

MESH, HW = "data=8,fsdp=8,model=8", "tpu-v5p"
LOOP = 12_000_000


def page() -> dict:
    wall, cpu = time.perf_counter(), time.thread_time()
    total = 0
    for i in range(LOOP):
        total += i & 7
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "share": round(cpu / wall, 2)}


def main() -> None:
    _, ana = programs.zoo("llama", "llama3-70b", True)
    mesh, hw = tc.MeshSpec.parse(MESH), tc.hardware(HW)
    out = {"load average at start": os.getloadavg()[0], "alone": page()}

    def in_thread() -> None:
        for strategy, _ in tc.baselines.all(ana, mesh).values():
            if strategy is not None:
                tc.estimate(ana, strategy, mesh, hw)

    worker = threading.Thread(target=in_thread)
    worker.start()
    time.sleep(0.3)
    out["beside a pricing thread"] = page()
    worker.join()

    spec = {"source": "zoo", "model": "llama", "size": "llama3-70b", "train": True,
            "path": "", "function": "", "digest": "", "batch": 0}  # fmt: skip
    answered = threading.Event()
    pricing.request(("bench",), (spec, programs.fingerprint(ana), MESH, HW),
                    lambda *_: answered.set())  # fmt: skip
    time.sleep(0.3)
    out["beside the pricing process"] = page()
    answered.wait(600)
    out["alone, again"] = page()
    out["load average at end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
