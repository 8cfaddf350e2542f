"""Root-parallel MCTS: independent searches in N processes, the best of them kept.

A search is single-threaded Python; a machine with N cores runs N of them at once, each with its
own tree and its own seed (`seed`, `seed + 1`, ...), and the best strategy any of them found is
the answer (root parallelization: no locks, no shared tree, N times the states for the same
time). With `num_simulations` set and `budget_s=None` every worker is deterministic for its seed
and the winner is chosen by score, ties to the lowest seed, so the result is deterministic too.

Workers are forked (`fork` start method): an `Analysis` holds JAX objects that do not pickle,
and a forked child shares the parent's analysis, evaluator and space without copying them. The
children run NumPy and SciPy only, never JAX. Where `fork` is not available the search runs its
workers one after another in this process (same results, no speed-up).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

from toast_core.analysis import Analysis
from toast_core.cost import Score, evaluator
from toast_core.cost.incremental import incremental_tables
from toast_core.mesh import HardwareSpec, MeshSpec
from toast_core.search.scoring import better
from toast_core.search.types import SearchSettings
from toast_core.strategy import space_of

#: The fraction of the budget a worker may use: the rest pays for collecting the results and
#: pricing the winner in full.
WORKER_SHARE = 0.9

_SHARED: tuple | None = None  # (ana, mesh, hw) inherited by forked workers


def _worker(st: SearchSettings) -> dict:
    from toast_core.search.mcts import search_iter

    ana, mesh, hw = _SHARED
    last = None
    history = []
    for ev in search_iter(ana, mesh, hw, **_fields(st)):
        history.append((ev.iteration, ev.elapsed_s, ev.best_step_time_s))
        last = ev
    return {
        "best": last.best_strategy,
        "score": Score(last.best_step_time_s, 0.0, 0.0, last.best_peak_bytes, last.best_fits),
        "iterations": last.iteration,
        "evaluations": last.evaluations,
        "elapsed_s": last.elapsed_s,
        "history": history,
        "baselines": last.baselines,
    }


def _fields(st: SearchSettings) -> dict:
    return {f.name: getattr(st, f.name) for f in dataclasses.fields(st)}


def run_workers(ana: Analysis, mesh: MeshSpec, hw: HardwareSpec, st: SearchSettings) -> dict:
    """Runs `st.workers` independent searches (seeds st.seed + k) and merges them: the best
    strategy by score (ties to the lowest seed), iterations and evaluations summed, the history
    as the best step time known at each moment."""
    global _SHARED
    start = time.perf_counter()
    n = st.workers
    budget = None if st.budget_s is None else st.budget_s * WORKER_SHARE
    settings = [
        dataclasses.replace(st, seed=st.seed + k, workers=1, budget_s=budget) for k in range(n)
    ]
    _SHARED = (ana, mesh, hw)
    # Built once here, inherited by every fork (else each worker would build its own copy).
    incremental_tables(evaluator(ana, mesh, hw, st.cost_options))
    space_of(ana, mesh)
    try:
        if "fork" in multiprocessing.get_all_start_methods():
            ctx = multiprocessing.get_context("fork")
            with warnings.catch_warnings():
                # JAX warns at every fork; the workers never call JAX (see the module essay).
                warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
                with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
                    results = list(pool.map(_worker, settings))
        else:
            results = [_worker(s) for s in settings]
    finally:
        _SHARED = None
    best = 0
    for k in range(1, n):
        if better(results[k]["score"], results[best]["score"]):
            best = k
    history, best_so_far = [], float("inf")
    for it, t, s in sorted((h for r in results for h in r["history"]), key=lambda h: h[1]):
        best_so_far = min(best_so_far, s)
        history.append((it, t, best_so_far))
    return {
        "best": results[best]["best"],
        "iterations": sum(r["iterations"] for r in results),
        "evaluations": sum(r["evaluations"] for r in results),
        "elapsed_s": time.perf_counter() - start,
        "history": tuple(history),
        "baselines": results[0]["baselines"],
        "winner": best,
    }
