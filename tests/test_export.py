"""The exported plan module compiles to what `tc.shard` compiles; in/out specs alone may not."""

from __future__ import annotations

import importlib.util

import jax
import pytest
from jax.sharding import NamedSharding

import toast_core as tc
from demos import MODEL_ZOO
from toast_core.apply.hlo import collective_bytes_by_kind

MESH = tc.MeshSpec({"data": 2, "model": 4})
HW = tc.hardware("tpu-v5e")


def load_module(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled_bytes(jitted, args) -> dict:
    return collective_bytes_by_kind(jitted.lower(*args).compile().as_text())


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_exported_module_reproduces_the_plan(tmp_path, model):
    w = MODEL_ZOO[model](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args))
    plan = tc.baselines.fsdp(ana, MESH)
    path = tmp_path / "my_plan.py"
    path.write_text(tc.plan_module(ana, plan, MESH))
    module = load_module(path)
    jmesh = tc.jax_mesh(MESH)
    exported = compiled_bytes(module.shard(w.fn, *w.args, mesh=jmesh), w.args)
    direct = compiled_bytes(tc.shard(w.fn, ana, plan, jmesh), w.args)
    assert exported == direct
    # The specs in the module are the plan's argument and result layouts.
    ins, outs = tc.partition_specs(ana, plan, jmesh)
    assert repr(module.IN_SPECS) == repr(ins) and repr(module.OUT_SPECS) == repr(outs)


@pytest.mark.slow
def test_in_out_specs_alone_do_not_reproduce_a_plan_with_cuts():
    """FSDP's weights are gathered at every use: with only the in/out specs XLA chooses its own
    internal layouts, and its collectives differ from the plan's."""
    w = MODEL_ZOO["gpt"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args))
    plan = tc.baselines.fsdp(ana, MESH)
    jmesh = tc.jax_mesh(MESH)
    ins, outs = tc.partition_specs(ana, plan, jmesh)

    def named(tree):
        return jax.tree.map(lambda s: NamedSharding(jmesh, s), tree)

    specs_only = jax.jit(w.fn, in_shardings=named(ins), out_shardings=named(outs))
    assert compiled_bytes(specs_only, w.args) != compiled_bytes(
        tc.shard(w.fn, ana, plan, jmesh), w.args
    )


def test_the_module_refuses_another_program(tmp_path):
    w = MODEL_ZOO["mlp"](size="tiny", train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args))
    path = tmp_path / "plan.py"
    path.write_text(tc.plan_module(ana, tc.baselines.data_parallel(ana, MESH), MESH))
    module = load_module(path)
    other = MODEL_ZOO["gpt"](size="tiny", train=True)
    with pytest.raises(tc.ToastError, match="made for"):
        module.shard(other.fn, *other.args, mesh=tc.jax_mesh(MESH))
