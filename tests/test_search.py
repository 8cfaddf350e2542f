"""The search: determinism, pins and forbids, memory feasibility, baselines, streaming, optimality.

Judges: the exhaustive enumeration of the decision space (the optimum under the cost model), the
baselines, the cost model itself (every returned report re-estimated), and XLA (the returned
strategy compiles and computes what the unsharded function computes).
"""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.search.exhaustive import exhaustive_search

HW = tc.hardware("tpu-v5e")
MESH_2X4 = tc.MeshSpec({"data": 2, "model": 4})
MESH_8 = tc.MeshSpec({"data": 8})


@functools.cache
def workload(name: str, **config):
    w = MODEL_ZOO[name](size="tiny", train=True, **config)
    return w.fn, w.args, tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


def mlp() -> tc.Analysis:
    return workload("mlp")[2]


def gpt() -> tc.Analysis:
    return workload("gpt")[2]


def chip(**overrides) -> tc.HardwareSpec:
    return tc.hardware(HW.to_dict() | {"name": "custom"} | overrides)


def dim_of(ana: tc.Analysis, value: str, dim: int) -> int:
    vid = next(v.id for v in ana.program.values if v.name == value)
    (d,) = ana.value_named_dims(vid)[dim]
    return d


def parts(ana: tc.Analysis, strategy: tc.Strategy, named_dim: int) -> list[str]:
    """Names of the pieces of a named dim after the strategy's cuts."""
    return [d.name for d in strategy.resolution(ana).dims if d.parent == named_dim]


def search(ana, mesh=MESH_2X4, hw=HW, sims=30, **kw) -> tc.SearchResult:
    return tc.search(ana, mesh, hw, budget_s=None, num_simulations=sims, **kw)


def best_feasible_baseline_s(ana, mesh, hw) -> float:
    times = [
        r.step_time_s
        for r in (
            tc.estimate(ana, s, mesh, hw) for s, _ in tc.baselines.all(ana, mesh).values() if s
        )
        if r.fits
    ]
    return min(times)


# -- determinism ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7])
def test_equal_seeds_give_identical_results(seed):
    ana = workload("mlp", batch=256, d_in=512, hidden=2048, d_out=512)[2]
    hw = chip(hbm_capacity_bytes=12 * 2**20)
    first = search(ana, MESH_2X4, hw, sims=40, seed=seed)
    second = search(ana, MESH_2X4, hw, sims=40, seed=seed)
    assert first.best == second.best
    assert first.report.step_time_s == second.report.step_time_s
    assert first.iterations == second.iterations > 0
    assert first.evaluations == second.evaluations
    assert [h[0] for h in first.history] == [h[0] for h in second.history]
    assert [h[2] for h in first.history] == [h[2] for h in second.history]


def test_a_budget_is_required_and_checked():
    with pytest.raises(tc.ToastError, match="budget_s=None"):
        tc.search(mlp(), MESH_2X4, HW, budget_s=None)
    with pytest.raises(tc.ToastError, match="budget_s=-1"):
        tc.search(mlp(), MESH_2X4, HW, budget_s=-1)
    with pytest.raises(tc.ToastError, match="num_simulations=2.5"):
        tc.search(mlp(), MESH_2X4, HW, budget_s=None, num_simulations=2.5)


def test_a_time_budget_alone_returns_a_legal_strategy():
    result = tc.search(mlp(), MESH_2X4, HW, budget_s=0.3)
    result.best.validate(mlp(), MESH_2X4)
    assert result.elapsed_s < 5


# -- pins and forbids -------------------------------------------------------------------------


def pin_cases():
    ana = mlp()
    b, f = dim_of(ana, "batch.x", 0), dim_of(ana, "params.w1", 1)
    return [
        ("mlp", [f"N{b}@model"], ["!K0=1"]),
        ("mlp", ["batch.x.0@data", "K0=0"], [f"!N{f}@data"]),
        ("mlp", ["x.0@data+model"], []),
        ("mlp", ["K0=0", "K2=1"], [f"!N{b}@data", "!K1=1"]),
        ("mlp", [f"N{f}@-"], [f"!N{b}@model"]),
        ("gpt", ["tokens.0@data", "K0=0"], ["!N1@model"]),
    ]


def assert_honoured(ana, mesh, strategy: tc.Strategy, pins, forbids) -> None:
    strategy.validate(ana, mesh)
    options = dict(strategy.options)
    for text in pins:
        pin = tc.parse_pin(text)
        if pin.kind == "option":
            assert options.get(pin.conflict) == pin.option, (text, strategy.options)
        elif pin.ref.startswith("N"):
            for name in parts(ana, strategy, int(pin.ref[1:])):
                assert strategy.axes_of(name) == pin.axes, (text, name, strategy.shardings)
        else:
            value, dim = pin.ref.rsplit(".", 1)
            vid = next(
                v.id for v in ana.program.values if v.name.split(".")[-1] == value.split(".")[-1]
            )
            assert strategy.value_axes(ana, mesh, vid)[int(dim)] == pin.axes, (
                text,
                strategy.shardings,
            )
    for text in forbids:
        pin = tc.parse_pin(text)
        if pin.kind == "option":
            assert options.get(pin.conflict) != pin.option, (text, strategy.options)
        else:
            for name in parts(ana, strategy, int(pin.ref[1:])):
                assert pin.axes[0] not in strategy.axes_of(name), (text, strategy.shardings)


@pytest.mark.parametrize(("model", "pins", "forbids"), pin_cases())
def test_pins_and_forbids_are_honoured_by_search(model, pins, forbids):
    ana = mlp() if model == "mlp" else gpt()
    result = search(ana, MESH_2X4, HW, sims=25, pins=pins, forbids=forbids)
    assert_honoured(ana, MESH_2X4, result.best, pins, forbids)
    report = tc.estimate(ana, result.best, MESH_2X4, HW)
    assert report.step_time_s == pytest.approx(result.report.step_time_s)


@pytest.mark.parametrize(("model", "pins", "forbids"), pin_cases())
def test_pins_and_forbids_are_honoured_by_every_search_event(model, pins, forbids):
    ana = mlp() if model == "mlp" else gpt()
    hw = chip(peak_flops_per_s=1e10)  # compute-bound: sharding pays, so the search moves
    events = list(
        tc.search_iter(
            ana,
            MESH_2X4,
            hw,
            budget_s=None,
            num_simulations=15,
            pins=pins,
            forbids=forbids,
            report_every_s=0.0,
        )
    )
    assert len(events) >= 2
    for event in events:
        assert_honoured(ana, MESH_2X4, event.best_strategy, pins, forbids)


@pytest.mark.parametrize(
    ("pins", "forbids", "named"),
    [
        (["N3@data", "N3@model"], [], ["N3@data", "N3@model"]),
        (["K0=0", "K0=1"], [], ["K0=0", "K0=1"]),
        (["N3@data"], ["!N3@data"], ["N3@data", "!N3@data"]),
        (["K0=1"], ["!K0=1"], ["K0=1", "!K0=1"]),
        (["batch.x.0@data", "N3@model"], [], ["batch.x.0@data", "N3@model"]),
    ],
)
def test_contradictory_pins_name_both(pins, forbids, named):
    ana = mlp()
    pins = [p.replace("N3", f"N{dim_of(ana, 'batch.x', 0)}") for p in pins]
    forbids = [p.replace("N3", f"N{dim_of(ana, 'batch.x', 0)}") for p in forbids]
    named = [p.replace("N3", f"N{dim_of(ana, 'batch.x', 0)}") for p in named]
    with pytest.raises(tc.PinError) as info:
        search(ana, sims=1, pins=pins, forbids=forbids)
    message = str(info.value)
    for text in named:
        assert f"`{text}`" in message, message


@pytest.mark.parametrize(
    "text",
    [
        "N3@@model",
        "K0=x",
        "@data",
        "N3",
        "",
        "   ",
        "!N3@data+model",
        "!K0=none",
        "K=1",
        "N3@mo-del",
    ],
)
def test_bad_pin_syntax_names_the_text(text):
    with pytest.raises(tc.PinError) as info:
        tc.parse_pin(text)
    assert repr(text) in str(info.value)
    with pytest.raises(tc.PinError):
        search(mlp(), sims=1, pins=[text])


@pytest.mark.parametrize(
    ("pins", "forbids", "shown"),
    [
        (["N99@data"], [], "N99@data"),
        (["N0@bogus"], [], "'bogus'"),
        (["K9=0"], [], "K9"),
        (["K0=7"], [], "K0=7"),
        (["nothing.0@data"], [], "nothing.0@data"),
        (["batch.x.5@data"], [], "batch.x.5@data"),
        ([], ["!K9=0"], "K9"),
        ([], ["!K0=7"], "!K0=7"),
        ([], ["!N0@bogus"], "'bogus'"),
        ([], ["N0@data"], "pins"),
    ],
)
def test_pins_that_name_nothing_raise_pin_error(pins, forbids, shown):
    with pytest.raises(tc.PinError) as info:
        search(mlp(), sims=1, pins=pins, forbids=forbids)
    assert shown in str(info.value)


def test_forbids_may_be_given_among_the_pins():
    ana = mlp()
    b = dim_of(ana, "batch.x", 0)
    apart = search(ana, sims=10, forbids=[f"!N{b}@data"])
    among = search(ana, sims=10, pins=[f"!N{b}@data"])
    assert among.best == apart.best
    assert "data" not in among.best.axes_of(f"N{b}")


def test_ambiguous_value_pin_lists_the_candidates():
    with pytest.raises(tc.PinError) as info:
        search(gpt(), sims=1, pins=["w_fc.1@model"])
    assert "params.blocks[0].mlp.w_fc" in str(info.value)


def test_parse_pin_forms():
    assert tc.parse_pin("N3@data+model") == tc.Pin(
        "N3@data+model", "dim", False, "N3", ("data", "model")
    )
    assert tc.parse_pin("N3@-").axes == ()
    assert tc.parse_pin(" ! N3 @ data ").forbid
    option = tc.parse_pin("K2=none")
    assert (option.kind, option.conflict, option.option) == ("option", 2, None)
    assert tc.parse_pin("!K2=1").forbid


# -- memory feasibility -----------------------------------------------------------------------


def test_search_finds_a_plan_that_fits_when_data_parallel_does_not():
    ana = mlp()
    hw = chip(hbm_capacity_bytes=60_000)
    dp = tc.estimate(ana, tc.baselines.data_parallel(ana, MESH_8), MESH_8, hw)
    assert not dp.fits, "the scenario needs data parallel's replicated weights to overflow"
    result = search(ana, MESH_8, hw, sims=40)
    assert result.feasible and result.report.fits and not result.warnings
    assert result.report.peak_bytes <= 60_000 * 0.9
    assert result.baselines["data_parallel"] is None  # infeasible baselines carry no time
    assert result.report.step_time_s <= best_feasible_baseline_s(ana, MESH_8, hw) * (1 + 1e-9)


def test_baselines_go_on_past_their_window_until_one_fits():
    """A closed window (deadline already past) stops the baselines only once one fits, or at
    `until`: the search must not start from no feasible plan because the machine was slow."""
    from toast_core.search import seeding
    from toast_core.search.mcts import _Run
    from toast_core.search.types import SearchSettings

    ana = mlp()
    hw = chip(hbm_capacity_bytes=60_000)
    past, future = 0.0, float("inf")

    def seeded(until):
        run = _Run(ana, MESH_8, hw, SearchSettings(budget_s=None, num_simulations=1))
        return seeding.score_baselines(run.scorer, run.env, past, until)[0]

    assert all(t is None for t in seeded(None).values())  # the window alone: nothing scored
    every = seeded(future)
    scored = [name for name, t in every.items() if t is not None]
    assert len(scored) == 1, "it stops at the first baseline that fits"
    assert list(every).index(scored[0]) > 0, "the scenario needs the first baselines not to fit"


def test_when_nothing_fits_the_least_infeasible_plan_is_flagged_loudly():
    ana = mlp()
    hw = chip(hbm_capacity_bytes=10_000)
    with pytest.warns(RuntimeWarning, match="NO MEMORY-FEASIBLE STRATEGY"):
        result = search(ana, MESH_8, hw, sims=40)
    assert not result.feasible and not result.report.fits
    assert result.warnings and "NO MEMORY-FEASIBLE" in result.warnings[0]
    # The least infeasible: no baseline and no state of the whole decision space needs less.
    for strategy, _ in tc.baselines.all(ana, MESH_8).values():
        if strategy is not None:
            assert result.report.peak_bytes <= tc.estimate(ana, strategy, MESH_8, hw).peak_bytes
    optimum, _, _ = exhaustive_search(ana, MESH_8, hw)
    assert result.report.peak_bytes == tc.estimate(ana, optimum, MESH_8, hw).peak_bytes


def test_no_warning_when_the_plan_fits():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = search(mlp(), MESH_8, HW, sims=10)
    assert result.feasible and result.warnings == ()


# -- never worse than a baseline --------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "mesh", "hw"),
    [
        ("mlp", MESH_2X4, HW),
        ("mlp", MESH_8, chip(hbm_capacity_bytes=100_000)),
        ("gpt", MESH_2X4, HW),
        ("gpt", MESH_2X4, chip(peak_flops_per_s=1e10, hbm_bytes_per_s=1e10)),
        (
            "gpt",
            tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2}, slow_axes=("data",)),
            chip(peak_flops_per_s=1e10),
        ),
    ],
    ids=["mlp-2x4", "mlp-8-small-hbm", "gpt-2x4", "gpt-2x4-slow-chip", "gpt-2x2x2-dcn"],
)
def test_search_is_never_worse_than_the_best_baseline(model, mesh, hw):
    ana = mlp() if model == "mlp" else gpt()
    result = search(ana, mesh, hw, sims=20)
    assert result.feasible
    assert result.report.step_time_s <= best_feasible_baseline_s(ana, mesh, hw) * (1 + 1e-9)
    feasible = [t for t in result.baselines.values() if t is not None]
    assert result.report.step_time_s <= min(feasible) * (1 + 1e-9)
    assert result.time_to_best_baseline_s is not None


# -- streaming --------------------------------------------------------------------------------


def test_search_iter_streams_increasing_iterations_and_an_anytime_best():
    ana = gpt()
    hw = chip(peak_flops_per_s=1e10, hbm_bytes_per_s=1e10)
    events = list(
        tc.search_iter(ana, MESH_2X4, hw, budget_s=None, num_simulations=12, report_every_s=0.0)
    )
    iterations = [e.iteration for e in events]
    assert iterations[0] == 0 and events[-1].done and not any(e.done for e in events[:-1])
    # The best baseline at once, the greedy descents, one event per simulation, the final event.
    assert iterations[:-1] == [0, *range(13)] and iterations[-1] == 12
    times = [e.best_step_time_s for e in events]
    assert all(b <= a for a, b in zip(times, times[1:])), "the best so far never gets worse"
    assert all(b.elapsed_s >= a.elapsed_s for a, b in zip(events, events[1:]))
    assert all(b.evaluations >= a.evaluations > 0 for a, b in zip(events, events[1:]))
    assert all(e.tree_size >= 1 for e in events[2:])
    for e in (events[0], events[-1]):
        report = tc.estimate(ana, e.best_strategy, MESH_2X4, hw)
        assert report.step_time_s == pytest.approx(e.best_step_time_s)


def test_search_iter_can_be_stopped_early_keeping_the_best_so_far():
    ana = gpt()
    hw = chip(peak_flops_per_s=1e10, hbm_bytes_per_s=1e10)
    seen = []
    for event in tc.search_iter(ana, MESH_2X4, hw, budget_s=60.0, report_every_s=0.0):
        seen.append(event)
        if event.iteration >= 3:
            break
    assert seen[-1].iteration == 3 and not seen[-1].done
    kept = seen[-1].best_strategy
    kept.validate(ana, MESH_2X4)
    assert tc.estimate(ana, kept, MESH_2X4, hw).step_time_s == pytest.approx(
        seen[-1].best_step_time_s
    )
    assert seen[-1].best_step_time_s <= best_feasible_baseline_s(ana, MESH_2X4, hw) * (1 + 1e-9)
    assert seen[-1].elapsed_s < 30


# -- optimality against exhaustive enumeration ------------------------------------------------


@pytest.mark.parametrize(
    ("config", "mesh", "hw"),
    [
        # Big weights on 4 chips: the optimum shards the hidden dim, not the batch.
        (dict(batch=256, d_in=1024, hidden=4096, d_out=1024), tc.MeshSpec({"data": 4}), HW),
        # Tiny HBM: the optimum cuts a weight off the batch's mesh axis - no baseline does that.
        ({}, MESH_8, chip(hbm_capacity_bytes=100_000)),
    ],
    ids=["big-mlp-on-4", "mlp-on-8-small-hbm"],
)
def test_exhaustive_search_bounds_mcts_and_enough_simulations_reach_it(config, mesh, hw):
    ana = workload("mlp", **config)[2]
    optimum, optimum_s, n_states = exhaustive_search(ana, mesh, hw)
    assert n_states > 100
    replicated = tc.estimate(ana, tc.Strategy(), mesh, hw)
    assert optimum.shardings and (not replicated.fits or optimum_s < replicated.step_time_s)
    assert tc.estimate(ana, optimum, mesh, hw).fits
    for seed, sims in ((0, 0), (1, 5), (2, 25)):
        result = search(ana, mesh, hw, sims=sims, seed=seed)
        assert optimum_s <= result.report.step_time_s * (1 + 1e-9)
    reached = search(ana, mesh, hw, sims=200, seed=0)
    assert reached.report.step_time_s == pytest.approx(optimum_s, rel=1e-9)


def test_exhaustive_search_refuses_large_spaces():
    with pytest.raises(tc.ToastError, match="max_states=50"):
        exhaustive_search(mlp(), MESH_2X4, HW, max_states=50)


def test_exhaustive_search_honours_pins():
    ana = mlp()
    b = dim_of(ana, "batch.x", 0)
    best, step_s, _ = exhaustive_search(ana, MESH_8, HW, pins=[f"N{b}@data"])
    assert best.axes_of(f"N{b}") == ("data",)
    assert step_s == pytest.approx(tc.estimate(ana, best, MESH_8, HW).step_time_s)


# -- the found strategy runs ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "hw"),
    [
        ("mlp", chip(hbm_capacity_bytes=100_000)),
        ("gpt", chip(peak_flops_per_s=1e10, hbm_bytes_per_s=1e10)),
    ],
    ids=["mlp-small-hbm", "gpt-slow-chip"],
)
def test_the_found_strategy_compiles_and_matches_numerics(model, hw):
    fn, args, ana = workload(model)
    result = search(ana, MESH_2X4, hw, sims=30)
    assert result.best.shardings, "the scenario should make sharding pay"
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(fn, args, ana, result.best, mesh, hw)
    assert check.numerics_ok, check.max_abs_error
    assert check.flops_ratio == pytest.approx(1.0, abs=0.1)


def test_events_show_the_top_of_the_tree():
    ana = gpt()
    *_, last = tc.search_iter(ana, MESH_2X4, HW, budget_s=None, num_simulations=40)
    top = last.tree_top
    assert top and top[0].depth == 1 and top[0].parent == -1
    first = [e for e in top if e.depth == 1]
    assert sum(e.visits for e in first) <= 40
    assert [e.visits for e in first] == sorted((e.visits for e in first), reverse=True)
    for e in top:
        assert 0.0 <= e.mean_value <= 1.0
        if e.depth == 2:
            parent = top[e.parent]
            assert parent.depth == 1 and e.visits <= parent.visits
    assert all(e.action.startswith(("shard ", "resolve ", "stop")) for e in top)


def test_a_frozen_plan_leaves_nothing_to_decide():
    ana = gpt()
    found = search(ana, sims=20)
    frozen = tc.frozen_pins(ana, found.best)
    assert any(p.startswith("remat[") for p in frozen) or not found.best.remat
    again = search(ana, sims=20, pins=frozen)
    assert again.iterations == 0
    assert again.best.shardings == found.best.shardings
    assert again.best.options == found.best.options


def test_a_program_with_no_work_is_searched():
    """An identity transpose costs nothing: every plan's step time and the reference are 0 (the
    fuzzer's seed-12 #769 divided by zero in the reward)."""
    import jax.numpy as jnp

    def forward(x):
        return (jnp.transpose(x, (0, 1)),)

    ana = tc.analyze(tc.trace(forward, jax.ShapeDtypeStruct((2, 2), jnp.float32)))
    res = tc.search(
        ana, tc.MeshSpec({"data": 2, "model": 4}), "tpu-v5e", num_simulations=10, budget_s=None
    )
    assert res.report.step_time_s == 0.0 and res.iterations == 10


def test_the_epilogue_reserve_grows_with_program_size_and_slowdown():
    """The tree and polish stop early enough for the final report: 4.5 us of CPU per op,
    times the slowdown seen so far (wall over CPU time), never less than one."""
    import time

    from toast_core.search.mcts import EPILOGUE_CPU_S_PER_OP, _epilogue_start, epilogue_reserve

    per_op = EPILOGUE_CPU_S_PER_OP
    assert epilogue_reserve(0.0, 0.0, 40_000) == pytest.approx(per_op * 40_000)  # no slowdown
    assert epilogue_reserve(0.5, 1.0, 40_000) == pytest.approx(per_op * 40_000)  # never below 1
    slow = epilogue_reserve(1.0, 0.25, 40_000)  # a quarter second of CPU in one of wall: 4x
    assert slow == pytest.approx(4 * per_op * 40_000)
    assert epilogue_reserve(1.0, 0.25, 600) < slow / 50
    # The deadline is the budget's end less the reserve at the slowdown seen since `start`.
    start = time.perf_counter() - 1.0
    end = _epilogue_start(start, time.process_time() - 10.0, 5.0, 40_000)  # CPU > wall: 1x
    assert start + 5.0 - end == pytest.approx(per_op * 40_000)
