"""Sweeps: one function over many cases (models x meshes x hardware presets), in parallel.

A case is independent of every other (its own trace, analysis and search), so a sweep is a map:
on a local process pool (`concurrent.futures`, one process per core by default), or on a Ray
cluster when given an address (`ray="auto"` joins the cluster Ray finds, or the one this process
already started; any other text is a cluster address). Results come back in the order of the
cases, whatever ran where, so a sweep gives the same results on the pool and on Ray when the
function is deterministic (a search with `num_simulations` and no time budget is).

Pool workers are spawned, not forked: a case traces with JAX, which is not safe to fork once
started. `fn` must therefore be importable by name (a module-level function), and a case and its
result picklable. Ray is an optional dependency (`pip install 'toast-explorer[ray]'`).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from toast_core.errors import ToastError, bad_value


def sweep(
    fn: Callable,
    cases: Sequence,
    workers: int | None = None,
    ray: str | None = None,
) -> list:
    """`[fn(case) for case in cases]`, computed on `workers` processes (default: one per core)
    or on the Ray cluster at `ray` ("auto" or an address)."""
    if not callable(fn):
        raise ToastError(bad_value("fn", fn, "a module-level function of one case"))
    cases = list(cases)
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ToastError(bad_value("workers", workers, "a positive int"))
    if ray is not None:
        if not isinstance(ray, str) or not ray:
            raise ToastError(bad_value("ray", ray, '"auto" or a Ray cluster address'))
        return _on_ray(fn, cases, ray)
    n = min(workers or os.cpu_count() or 1, max(len(cases), 1))
    if n == 1:
        return [fn(c) for c in cases]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        return list(pool.map(fn, cases))


def runtime_env() -> dict:
    """The environment Ray workers need to run the cases as this process would: the same import
    path (so `fn` imports by name) and the same XLA flags (simulated devices)."""
    env = {"PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    if "XLA_FLAGS" in os.environ:
        env["XLA_FLAGS"] = os.environ["XLA_FLAGS"]
    return {"env_vars": env}


def _on_ray(fn: Callable, cases: list, address: str) -> list:
    try:
        import ray
    except ImportError:
        raise ToastError(
            bad_value("ray", address, "Ray installed (pip install 'toast-explorer[ray]')")
        ) from None
    if not ray.is_initialized():
        ray.init(address=address, runtime_env=runtime_env(), log_to_driver=False)
    remote = ray.remote(fn).options(runtime_env=runtime_env())
    return ray.get([remote.remote(c) for c in cases])
