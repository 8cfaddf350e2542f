"""Strategies: construction, legality errors collected in one message, JSON, notation, specs."""

from __future__ import annotations

import functools
import json

import lookup
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P
from lookup import dim_name, value_id

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.strategy.strategy import SCHEMA_VERSION

MESH = tc.MeshSpec({"data": 2, "model": 4})
HW = tc.hardware("tpu-v5e")


@functools.cache
def _analysis(name: str, train: bool) -> tc.Analysis:
    w = MODEL_ZOO[name](size="tiny", train=train)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


@pytest.fixture(scope="module")
def mlp_fwd() -> tc.Analysis:
    return _analysis("mlp", train=False)


@pytest.fixture(scope="module")
def mlp_train() -> tc.Analysis:
    return _analysis("mlp", train=True)


def raised(fn) -> str:
    with pytest.raises(tc.StrategyError) as info:
        fn()
    return str(info.value)


# -- construction -----------------------------------------------------------------------------


def test_make_accepts_names_ids_labels_and_axis_strings(mlp_fwd):
    batch, hidden = dim_name(mlp_fwd, "x", 0), dim_name(mlp_fwd, "params.w1", 1)
    by_name = tc.Strategy.make(mlp_fwd, {batch: "data", hidden: ("model",)})
    by_id = tc.Strategy.make(mlp_fwd, {int(batch[1:]): ["data"], int(hidden[1:]): "model"})
    label = mlp_fwd.named_dim(hidden).label
    by_label = tc.Strategy.make(mlp_fwd, {batch: "data", label: "model"})
    assert by_name == by_id == by_label
    assert by_name.shardings == tuple(sorted({batch: ("data",), hidden: ("model",)}.items()))
    assert by_name.axes_of(batch) == ("data",) and by_name.axes_of("N999") == ()
    # Replicated entries are dropped, so strategies compare by what they shard.
    assert tc.Strategy.make(mlp_fwd, {batch: "data", hidden: ()}) == tc.Strategy.make(
        mlp_fwd, {batch: "data"}
    )
    hash(by_name)  # frozen and hashable


def test_make_collects_every_unknown_named_dim(mlp_fwd):
    message = raised(lambda: tc.Strategy.make(mlp_fwd, {"N99": "data", "N98": "model"}))
    assert "N99" in message and "N98" in message


def test_make_rejects_bad_options(mlp_train):
    assert "options[K0]=7" in raised(lambda: tc.Strategy.make(mlp_train, {}, options={0: 7}))
    assert "conflict=9" in raised(lambda: tc.Strategy.make(mlp_train, {}, options={9: 0}))
    assert "K0" in raised(lambda: tc.Strategy.make(mlp_train, {}, options=[(0, 0), (0, 1)]))
    # After a cut the named dim is split: its whole name means every part (as in pins), a part
    # that does not exist is an error.
    conflict = mlp_train.conflicts[0]
    whole = f"N{conflict.named_dims[0]}"
    split = tc.Strategy.make(mlp_train, {whole: "data"}, options={0: 0})
    parts = [d.name for d in split.resolution(mlp_train).dims if d.name.startswith(whole + ".")]
    assert len(parts) > 1 and {n for n, _ in split.shardings} == set(parts)
    message = raised(lambda: tc.Strategy.make(mlp_train, {whole + ".9": "data"}, options={0: 0}))
    assert repr(whole + ".9") in message


# -- validate ---------------------------------------------------------------------------------


def test_validate_collects_all_problems_in_one_error(mlp_train):
    batch = dim_name(mlp_train, "batch.x", 0)
    feature = dim_name(mlp_train, "batch.x", 1)
    hidden = dim_name(mlp_train, "params.w1", 1)
    out = dim_name(mlp_train, "batch.y", 1)
    strategy = tc.Strategy(
        shardings=(
            ("N99", ("data",)),  # unknown named dim
            (hidden, ("bogus",)),  # unknown mesh axis
            (out, ("model", "model")),  # repeated mesh axis in one entry
            (batch, ("data",)),
            (feature, ("data",)),  # x[B_data, D_data]: data twice in one value
        ),
        name="bad",
    )
    message = raised(lambda: strategy.validate(mlp_train, MESH))
    assert message.startswith("illegal strategy 'bad'")
    assert "named dim='N99'" in message
    assert f"shardings[{hidden}]='bogus'" in message and "data=2,model=4" in message
    assert f"shardings[{out}]=('model', 'model')" in message
    assert "batch.x[16, 64] would hold mesh axis 'data' twice" in message
    assert f"batch.x[{batch}_data, {feature}_data]" in message


def test_validate_names_dim_size_and_axis_when_not_divisible(mlp_fwd):
    mesh = tc.MeshSpec({"data": 3, "model": 5})
    batch, hidden = dim_name(mlp_fwd, "x", 0), dim_name(mlp_fwd, "params.w1", 1)
    strategy = tc.Strategy.make(mlp_fwd, {batch: "data", hidden: ("data", "model")})
    message = raised(lambda: strategy.validate(mlp_fwd, mesh))
    assert f"named dim {batch} of size 16 is not divisible by mesh axes data (3 ways)" in message
    assert f"named dim {hidden} of size 128 is not divisible by mesh axes dataxmodel (15 ways)" in (
        message
    )


def test_validate_reports_double_axis_on_an_op(mlp_fwd):
    # x[B, D] @ w1[D, F]: B and F never share a value... but D and F share w1.
    feature, hidden = dim_name(mlp_fwd, "x", 1), dim_name(mlp_fwd, "params.w1", 1)
    message = raised(
        lambda: tc.Strategy.make(mlp_fwd, {feature: "model", hidden: "model"}).validate(
            mlp_fwd, MESH
        )
    )
    assert "params.w1[64, 128] would hold mesh axis 'model' twice" in message


def test_legal_strategies_validate_and_fine_masks(mlp_fwd):
    batch, hidden = dim_name(mlp_fwd, "x", 0), dim_name(mlp_fwd, "params.w1", 1)
    strategy = tc.Strategy.make(mlp_fwd, {batch: "data", hidden: "model"})
    strategy.validate(mlp_fwd, MESH)
    masks = strategy.fine_masks(mlp_fwd, MESH)
    res = strategy.resolution(mlp_fwd)
    assert {int(masks[f]) for f in res.by_name(batch).fine} == {0b01}
    assert {int(masks[f]) for f in res.by_name(hidden).fine} == {0b10}


# -- JSON -------------------------------------------------------------------------------------


def test_json_document_has_schema_version_mesh_and_program(mlp_train):
    batch = dim_name(mlp_train, "batch.x", 0)
    strategy = tc.Strategy.make(mlp_train, {batch: ("data", "model")}, options={0: 1}, name="s")
    doc = json.loads(strategy.to_json(MESH, program="train_step"))
    assert doc["schema"] == SCHEMA_VERSION
    assert doc["name"] == "s" and doc["program"] == "train_step"
    assert doc["mesh"] == {"data": 2, "model": 4}
    assert doc["options"] == [{"conflict": "K0", "option": 1}]
    assert doc["shardings"] == {batch: ["data", "model"]}
    assert tc.Strategy.from_json(strategy.to_json(), mlp_train) == strategy


def test_json_accepts_one_mesh_axis_as_a_string(mlp_fwd):
    batch = dim_name(mlp_fwd, "x", 0)
    text = json.dumps({"schema": SCHEMA_VERSION, "shardings": {batch: "data"}})
    assert tc.Strategy.from_json(text, mlp_fwd).axes_of(batch) == ("data",)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("{not json", "text='{not json'"),
        (None, "text='None'"),
        ("[1, 2]", "schema=[1, 2]"),
        ('{"schema": 99}', "schema=99"),
        ('{"shardings": {}}', "schema=None"),
        ('{"schema": 1, "shardings": ["N0"]}', "options and shardings"),
        ('{"schema": 1, "options": [{"option": 0}]}', "options and shardings"),
        ('{"schema": 1, "options": [{"conflict": "K9", "option": 0}]}', "conflict=9"),
        ('{"schema": 1, "options": [{"conflict": "K0", "option": 5}]}', "options[K0]=5"),
        ('{"schema": 1, "shardings": {"N77": ["data"]}}', "shardings='N77'"),
    ],
)
def test_bad_json_raises_strategy_error(mlp_train, text, shown):
    message = raised(lambda: tc.Strategy.from_json(text, mlp_train))
    assert shown in message


def random_legal_strategy(data, ana: tc.Analysis, mesh: tc.MeshSpec) -> tc.Strategy:
    return lookup.random_legal_strategy(data, ana, mesh, (0, 8), "random")


@settings(max_examples=30)
@given(data=st.data())
def test_json_round_trip_of_random_legal_strategies(data):
    mlp_train = _analysis("mlp", train=True)
    mesh = data.draw(
        st.sampled_from(
            [MESH, tc.MeshSpec({"data": 8}), tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2})]
        )
    )
    strategy = random_legal_strategy(data, mlp_train, mesh)
    strategy.validate(mlp_train, mesh)
    back = tc.Strategy.from_json(strategy.to_json(mesh, "train_step"), mlp_train)
    assert back == strategy
    back.validate(mlp_train, mesh)
    assert back.describe(mlp_train, mesh) == strategy.describe(mlp_train, mesh)


# -- presentation -----------------------------------------------------------------------------


def test_describe_in_scaling_book_notation(mlp_fwd):
    b, d = dim_name(mlp_fwd, "x", 0), dim_name(mlp_fwd, "x", 1)
    f, o = dim_name(mlp_fwd, "params.w1", 1), dim_name(mlp_fwd, "params.w2", 1)
    strategy = tc.Strategy.make(mlp_fwd, {b: "data", f: "model"})
    assert strategy.describe(mlp_fwd, MESH) == [
        f"params.w1[{d}, {f}_model]",
        f"params.w2[{f}_model, {o}]",
        f"x[{b}_data, {d}]",
        f"out[{b}_data, {o}]",
    ]
    both = tc.Strategy.make(mlp_fwd, {b: ("data", "model")})
    assert both.notation_of(mlp_fwd, MESH, value_id(mlp_fwd, "x")) == f"x[{b}_data_model, {d}]"


def test_describe_after_a_cut_names_the_parts(mlp_train):
    """FSDP on w1: cutting the axis clash splits the hidden named dim into parts N<k>.<i>."""
    mesh = tc.MeshSpec({"data": 8})
    fsdp = tc.baselines.fsdp(mlp_train, mesh)
    assert fsdp is not None and fsdp.options
    lines = fsdp.describe(mlp_train, mesh)
    w1 = next(line for line in lines if line.startswith("params.w1["))
    x = next(line for line in lines if line.startswith("batch.x["))
    assert "_data" in w1 and "." in w1.split("[")[1]  # a part of a cut named dim, on data
    assert (
        x
        == f"batch.x[{dim_name(mlp_train, 'batch.x', 0)}_data, {dim_name(mlp_train, 'batch.x', 1)}]"
    )


def test_value_layouts_match_value_axes_and_notation_one_by_one(mlp_train):
    mesh = tc.MeshSpec({"data": 8})
    fsdp = tc.baselines.fsdp(mlp_train, mesh)
    prog = mlp_train.program
    vids = list(dict.fromkeys(prog.inputs + prog.outputs))
    assert fsdp.value_layouts(mlp_train, mesh, vids) == [
        (fsdp.value_axes(mlp_train, mesh, v), fsdp.notation_of(mlp_train, mesh, v)) for v in vids
    ]


def test_partition_specs_mirror_the_pytrees(mlp_train):
    b = dim_name(mlp_train, "batch.x", 0)
    f = dim_name(mlp_train, "params.w1", 1)
    strategy = tc.Strategy.make(mlp_train, {b: "data", f: "model"})
    ins, outs = tc.partition_specs(mlp_train, strategy, MESH)
    assert ins == (
        {"w1": P(None, "model"), "w2": P("model", None)},
        {"x": P("data", None), "y": P("data", None)},
    )
    assert outs == ({"w1": P(None, "model"), "w2": P("model", None)}, P())
    dp = tc.Strategy.make(mlp_train, {b: ("data", "model")})
    ins, _ = tc.partition_specs(mlp_train, dp, MESH)
    assert ins[1] == {"x": P(("data", "model"), None), "y": P(("data", "model"), None)}


def test_partition_specs_reject_illegal_strategies(mlp_train):
    strategy = tc.Strategy.make(mlp_train, {dim_name(mlp_train, "batch.x", 0): "nope"})
    with pytest.raises(tc.StrategyError, match="nope"):
        tc.partition_specs(mlp_train, strategy, MESH)


def test_a_step_checks_divisibility_for_every_part_of_a_unit():
    """Regression (fuzzer): after a resolution, one unit may group named dims that already hold
    different mesh axes; adding an axis must keep every one of them divisible, or the search
    builds a state that `Strategy.validate` rejects."""
    import jax.numpy as jnp

    from toast_core.strategy import State, Unit, space_of

    ana = tc.analyze(tc.trace(lambda x: jnp.tanh(x) * 2.0, jnp.ones((2, 2))))
    mesh = tc.MeshSpec({"a": 2, "b": 2, "c": 2})
    space = space_of(ana, mesh)
    rows, cols = (space.resolution(()).by_name(dim_name(ana, "x", d)) for d in (0, 1))
    masks = np.zeros(ana.n_fine, dtype=np.int64)
    masks[list(rows.fine)] = space.axes.mask("c")  # dim 0 already on c, dim 1 replicated
    unit = Unit((cols.name, rows.name), cols.fine + rows.fine, 2, 0.0)
    reason = space.why_illegal_shard(State((), masks), unit, space.axes.index("a"))
    assert reason is not None and "not divisible" in reason
    # The same step on the replicated dim alone is legal.
    alone = Unit((cols.name,), cols.fine, 2, 0.0)
    assert space.why_illegal_shard(State((), masks), alone, space.axes.index("a")) is None


def test_search_survives_conflicts_without_options():
    """Regression (fuzzer): a conv train step has reshape conflicts with no option; the rollout
    once drew an option among zero (`integers(0)`)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def loss(p, x0):
        x = jnp.transpose(x0, (1, 2, 0))
        y = lax.conv_general_dilated(
            x, p["k"], (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC")
        )
        return jnp.prod(1 + 0.1 * jnp.tanh(jnp.swapaxes(y, 1, 2)), 2).sum()

    def step(p, m, x0):
        g = jax.grad(loss)(p, x0)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        return jax.tree.map(lambda p, m: p - 1e-3 * m, p, m), m

    p = {"k": jnp.ones((3, 3, 12))}
    ana = tc.analyze(tc.trace(step, p, p, jnp.ones((3, 24, 6))))
    assert any(not c.options for c in ana.conflicts)
    mesh = tc.MeshSpec({"data": 2, "model": 4})
    result = tc.search(ana, mesh, tc.hardware("tpu-v5e"), budget_s=None, num_simulations=120)
    result.best.validate(ana, mesh)
