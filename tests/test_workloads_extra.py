"""The independently written workloads (demos/workloads_extra.py): each exercises one primitive or
pattern the cost model once missed, so each must trace and analyze with no unknown primitive,
search without error, and validate numerically under every applicable baseline."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import toast_core as tc
from demos import MODEL_ZOO
from demos.workloads_extra import EXTRA_ZOO

MESH = tc.MeshSpec({"data": 2, "model": 4})
HW = tc.hardware("tpu-v5e")

# The primitive each workload exists for, which must reach the analysis (else it tests nothing).
EXERCISES = {
    "decoder": "dot_general",
    "dropout": "random_bits",
    "batchnorm": "rsqrt",
    "grad-accum": "scan",  # fori_loop with static bounds
    "convnet": "select_and_scatter_add",
    "vit": "tile",
    "label-smoothing": "custom_jvp_call",  # log_softmax of the smoothed targets
}


def _analysis(name: str):
    w = MODEL_ZOO[name](size="tiny", train=True)
    return w, tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


def test_every_extra_workload_is_in_the_zoo():
    assert set(EXTRA_ZOO) <= set(MODEL_ZOO) and set(EXERCISES) == set(EXTRA_ZOO)


@pytest.mark.parametrize("name", sorted(EXTRA_ZOO))
def test_extra_workload_traces_analyzes_and_searches(name):
    w, ana = _analysis(name)
    assert not ana.diagnostics, ana.diagnostics
    jaxpr = str(jax.make_jaxpr(w.fn)(*w.args))
    assert EXERCISES[name] in jaxpr, (name, EXERCISES[name])
    result = tc.search(ana, MESH, HW, budget_s=None, num_simulations=10, seed=0)
    assert result.feasible and result.report.step_time_s > 0


def test_batchnorm_returns_updated_running_statistics():
    w = MODEL_ZOO["batchnorm"](train=True)
    _, stats, _ = jax.jit(w.fn)(*w.args)
    assert not np.allclose(stats["mean"], w.args[1]["mean"])
    assert not np.allclose(stats["var"], w.args[1]["var"])


def test_dropout_depends_on_the_key_passed_in():
    w = MODEL_ZOO["dropout"](train=True)
    params, batch, key = w.args
    a = jax.jit(w.fn)(params, batch, key)[-1]
    b = jax.jit(w.fn)(params, batch, key + 1)[-1]
    assert float(a) != float(b)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXTRA_ZOO))
def test_extra_workload_baselines_validate_on_2x4(name):
    w, ana = _analysis(name)
    jm = tc.jax_mesh(MESH)
    plans = {n: s for n, (s, _) in tc.baselines.all(ana, MESH).items() if s is not None}
    assert len(plans) >= 2, plans
    for plan, strategy in plans.items():
        rep = tc.validate(w.fn, w.args, ana, strategy, jm, HW)
        assert rep.numerics_ok, (name, plan, rep.numerics_mismatches)
        # Flops, bytes, memory and step time are measured by bench/fidelity.py, not asserted
        # here: the cost model misses some of them today (grad-accum's FSDP flops: 3.9x).
