"""Textbook baselines: FSDP shards every weight, and data parallel finds the real batch dim."""

from __future__ import annotations

import pytest

import demos
import toast_core as tc
from toast_core.search.baselines import batch_dims

MESH = tc.MeshSpec({"data": 8})
HW = tc.hardware("tpu-v5e")


def analyze(name: str, **overrides):
    w = demos.MODEL_ZOO[name](train=True, **overrides)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


@pytest.fixture(scope="module")
def llama():
    return analyze("llama")


def sharded_on_data(ana, strategy, vid) -> bool:
    return any("data" in axes for axes in strategy.value_axes(ana, MESH, vid))


def test_fsdp_shards_every_llama_weight_that_can_be(llama):
    """ZeRO-3: every weight matrix (attention, SwiGLU, embedding, head) and the norm scales
    are divided over the data axis, so weights, gradients and Adam state take 1/8 each."""
    fsdp = tc.baselines.fsdp(llama, MESH)
    prog = llama.program
    # Weights and Adam moments (the step counter is a scalar).
    persistent = [v for v in prog.inputs if prog.values[v].is_persistent and prog.values[v].rank]
    assert len(persistent) > 3 * 9 * 2
    unsharded = [
        prog.values[v].display() for v in persistent if not sharded_on_data(llama, fsdp, v)
    ]
    assert unsharded == []
    report = tc.estimate(llama, fsdp, MESH, HW)
    inputs = [prog.values[v] for v in prog.inputs if prog.values[v].role != "literal"]
    expected = sum(v.nbytes / 8 if v.rank else v.nbytes for v in inputs)
    assert report.persistent_bytes == pytest.approx(expected, rel=1e-9)


def test_fsdp_shards_each_weight_along_its_largest_dim(llama):
    fsdp = tc.baselines.fsdp(llama, MESH)
    prog = llama.program
    for v in prog.inputs:
        val = prog.values[v]
        if val.role != "parameter" or val.rank != 2 or "mlp" not in val.name:
            continue
        axes = fsdp.value_axes(llama, MESH, v)
        big = max(range(2), key=lambda d: val.shape[d])
        assert "data" in axes[big], (val.display(), axes)


def test_gradient_accumulation_batch_is_the_microbatch_rows_not_the_loop():
    """x[M, B, D] is read one microbatch x[i] per fori_loop iteration: dim 0 is the loop, the
    batch is dim 1 (M=4 does not even divide 8 devices)."""
    ana = analyze("grad-accum")
    prog = ana.program
    x = next(prog.values[v] for v in prog.inputs if prog.values[v].name == "batch.x")
    assert batch_dims(ana)[0] == ana.value_named_dims(x.id)[1][0]
    for name in ("data_parallel", "fsdp"):
        strategy, why = tc.baselines.all(ana, MESH)[name]
        assert strategy is not None, why
        assert strategy.value_axes(ana, MESH, x.id)[1] == ("data",), name
        assert strategy.value_axes(ana, MESH, x.id)[0] == ()
    fsdp = tc.baselines.fsdp(ana, MESH)
    params = [v for v in prog.inputs if prog.values[v].role == "parameter"]
    assert all(sharded_on_data(ana, fsdp, v) for v in params)


def test_batch_of_an_ordinary_step_is_still_dim_0():
    ana = analyze("gpt")
    prog = ana.program
    tokens = max(
        (prog.values[v] for v in prog.inputs if prog.values[v].role == "input"),
        key=lambda v: (v.nbytes, -v.id),
    )
    assert batch_dims(ana)[0] == ana.value_named_dims(tokens.id)[0][0]


def test_fsdp_megatron_is_dp_megatron_with_every_weight_also_on_the_data_axis():
    ana = analyze("gpt")
    mesh = tc.MeshSpec({"data": 2, "model": 4})
    dpm = tc.baselines.dp_megatron(ana, mesh)
    both = tc.baselines.fsdp_megatron(ana, mesh)
    prog = ana.program
    weights = [v for v in prog.inputs if prog.values[v].role == "parameter" and prog.values[v].rank]
    for v in weights:
        before, after = dpm.value_axes(ana, mesh, v), both.value_axes(ana, mesh, v)
        assert any("data" in axes for axes in after), prog.values[v].display()
        # Megatron's model axis stays where dp_megatron put it.
        assert [("model" in a) for a in before] == [("model" in a) for a in after]
    hw = tc.hardware("tpu-v5e")
    assert (
        tc.estimate(ana, both, mesh, hw).persistent_bytes
        < tc.estimate(ana, dpm, mesh, hw).persistent_bytes / 1.9
    )


@pytest.mark.parametrize("mesh", ["data=2,model=4", "data=2,fsdp=2,model=2"])
def test_the_builders_quick_refusal_agrees_with_the_whole_check(mesh):
    """The baseline builder refuses some tries by the incremental check before the whole
    one: on Megatron's tries (every named dim, each mesh axis, after data parallel), every
    quick refusal must be a strategy `validate` rejects, and some tries must be refused."""
    from toast_core.errors import StrategyError
    from toast_core.search.baselines import _Builder

    ana = analyze("gpt", size="tiny")
    m = tc.MeshSpec.parse(mesh)
    b = _Builder(ana, m, "check")
    b.shardings = dict(tc.baselines.data_parallel(ana, m).shardings)
    refused = 0
    for nd in ana.named_dims:
        for axis in m.axis_names:
            name = f"N{nd.id}"
            if not b._refused([name], (axis,)):
                continue
            refused += 1
            candidate = tc.Strategy.make(ana, {**b.shardings, name: (axis,)}, b.options)
            with pytest.raises(StrategyError):
                candidate.validate(ana, m)
    assert refused > 0
