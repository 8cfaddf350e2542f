"""Searches on several cores and sweeps on a process pool or Ray; time budgets that hold."""

from __future__ import annotations

import functools
import time

import pytest

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.cli import search_case
from toast_core.search.sweep import sweep

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 2, "model": 4})
TIMINGS = ("analysis_s", "search_s")


@functools.cache
def _ana(model: str, size: str = "tiny") -> tc.Analysis:
    w = MODEL_ZOO[model](size=size, train=True)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


def test_parallel_search_is_deterministic_and_no_worse_than_one_worker():
    ana = _ana("gpt")
    kw = dict(budget_s=None, num_simulations=12, seed=3)
    one = tc.search(ana, MESH, HW, **kw)
    a = tc.search(ana, MESH, HW, workers=2, **kw)
    b = tc.search(ana, MESH, HW, workers=2, **kw)
    assert a.best == b.best and a.report.step_time_s == b.report.step_time_s
    assert a.iterations == 2 * one.iterations  # two trees, each its full share
    assert a.report.step_time_s <= one.report.step_time_s * (1 + 1e-12)
    assert a.evaluations > one.evaluations


def test_bad_workers_are_named():
    with pytest.raises(tc.ToastError, match="workers"):
        tc.search(_ana("mlp"), MESH, HW, num_simulations=2, budget_s=None, workers=0)
    with pytest.raises(tc.ToastError, match="workers"):
        sweep(search_case, [], workers=-1)
    with pytest.raises(tc.ToastError, match="fn"):
        sweep(3, [])


@pytest.mark.slow
@pytest.mark.parametrize("model,size", [("gpt", "tiny"), ("unet", "tiny"), ("gpt", "gpt2")])
def test_time_budget_holds_and_the_tree_runs(model, size):
    ana = _ana(model, size)
    budget = 2.0
    t0 = time.perf_counter()
    r = tc.search(ana, MESH, HW, budget_s=budget)
    wall = time.perf_counter() - t0
    assert wall <= 1.1 * budget, wall
    assert r.iterations > 0


def _cases() -> list[dict]:
    return [
        {
            "target": t,
            "size": "tiny",
            "mesh": m,
            "hardware": h,
            "budget_s": None,
            "num_simulations": 4,
            "seed": 1,
        }
        for t in ("mlp", "gpt")
        for m in ("data=8", "data=2,model=4", "data=2,fsdp=2,model=2")
        for h in ("tpu-v5e", "h100-80gb")
    ]


def _without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:os.fork")  # Ray starts its processes by fork + exec
def test_a_sweep_gives_the_same_results_on_a_process_pool_and_on_ray():
    ray = pytest.importorskip("ray")
    cases = _cases()
    assert len(cases) == 12
    pool = _without_timings(sweep(search_case, cases, workers=2))
    assert [r["target"] for r in pool] == [c["target"] for c in cases]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = _without_timings(sweep(search_case, cases, ray="auto"))
    finally:
        ray.shutdown()
    assert on_ray == pool
