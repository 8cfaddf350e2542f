"""`tc.explain`: every decision of a plan against its alternatives, priced by the cost model."""

from __future__ import annotations

import json
import math

import pytest
from lookup import dim_name, zoo_analysis

import toast_core as tc
import toast_core.cli as cli

MESH = tc.MeshSpec({"data": 2, "model": 4})
HW = tc.hardware("tpu-v5e")


analysis = zoo_analysis


def test_every_decision_meets_every_mesh_axis_set():
    ana = analysis()
    dp = tc.baselines.data_parallel(ana, MESH)
    table = tc.explain(ana, dp, MESH, HW)
    batch = dim_name(ana, "batch.x", 0)
    batch_rows = {r.alternative: r for r in table.rows if r.decision == batch}
    current = dict(dp.shardings)[batch]
    # Every other set of mesh axes (replicated, data, model, both) is offered, legal or not.
    assert set(batch_rows) == {"-", "data", "model", "data+model"} - {"+".join(current)}
    assert all(r.current == "+".join(current) for r in batch_rows.values())
    replicated = batch_rows["-"]
    assert replicated.legal and replicated.pins == (f"{batch}@-",)
    # Replicating the batch removes data parallelism's gradient all-reduces.
    assert any(v.startswith("all-reduce over data") for v in replicated.vanish)


def test_numbers_are_the_cost_model_of_the_alternative():
    ana = analysis("gpt")
    plan = tc.baselines.dp_megatron(ana, MESH)
    table = tc.explain(ana, plan, MESH, HW)
    base = tc.estimate(ana, plan, MESH, HW)
    assert table.report.step_time_s == base.step_time_s
    checked = 0
    for row in table.rows:
        if not row.legal or row.decision.startswith("K") or len(row.pins) != 1:
            continue
        pinned = tc.check_pins(ana, MESH, list(row.pins))
        ref, _, _ = row.pins[0].partition("@")
        shardings = {n: a for n, a in plan.shardings if tc.parent_name(n) != ref}
        shardings.update(pinned.shardings)
        alt = tc.Strategy.make(ana, shardings, plan.options)
        assert tc.estimate(ana, alt, MESH, HW).step_time_s == pytest.approx(row.step_time_s)
        assert math.isclose(row.delta_step_s, row.step_time_s - base.step_time_s)
        checked += 1
    assert checked >= 5


def test_rows_come_by_consequence_and_illegal_ones_say_why():
    ana = analysis("gpt")
    table = tc.explain(ana, tc.baselines.megatron(ana, MESH), MESH, HW)
    legal = [r for r in table.rows if r.legal]
    fitting = [r for r in legal if r.fits]
    deltas = [abs(r.delta_step_s) for r in fitting]
    assert deltas == sorted(deltas, reverse=True)
    illegal = [r for r in table.rows if not r.legal]
    assert illegal and all(r.why_illegal for r in illegal)
    assert table.rows.index(illegal[0]) > table.rows.index(legal[-1])


def test_best_alternative_is_the_fastest_fitting_change():
    ana = analysis()
    table = tc.explain(ana, tc.Strategy(name="replicated"), MESH, HW)
    best = table.best_alternative()
    faster = [r for r in table.rows if r.legal and r.fits and r.delta_step_s < 0]
    if faster:
        assert best.delta_step_s == min(r.delta_step_s for r in faster)
    else:
        assert best is None


def test_cli_explain_json(capsys):
    assert cli.main(["explain", "mlp", "--baseline", "data_parallel", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["what_if"] and {"decision", "alternative", "pins", "delta_step_s"} <= set(
        doc["what_if"][0]
    )


def test_cli_explain_table(capsys):
    assert cli.main(["explain", "mlp", "--baseline", "data_parallel", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "What if one decision changed" in out and "data_parallel" in out
