"""Predicted and compiled per-device flops of a small program under the data-parallel baseline,
for the tests that hold the cost model's counts to XLA's `cost_analysis()`."""

import toast_core as tc


def predicted_and_compiled(fn, args, axes: dict[str, int]) -> tuple[float, float]:
    """(predicted, compiled) flops per device of `fn` under the data-parallel baseline on `axes`
    (the numerics must agree: a count of a wrong program proves nothing)."""
    mesh = tc.MeshSpec(axes)
    ana = tc.analyze(tc.trace(fn, *args))
    strategy = tc.baselines.data_parallel(ana, mesh)
    assert strategy is not None
    rep = tc.validate(fn, args, ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"))
    assert rep.numerics_ok
    return rep.predicted_flops, rep.compiled_flops
