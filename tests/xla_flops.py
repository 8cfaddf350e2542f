"""Predicted and compiled flops of a small program (under the data-parallel baseline, replicated
on one device, or unsharded), for the tests that hold the cost model's counts to XLA's
`cost_analysis()`."""

import jax

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


def replicated_ratio(fn, args) -> float:
    """predicted / compiled flops of `fn` on one device (replicated)."""
    mesh = tc.MeshSpec({"data": 1})
    ana = tc.analyze(tc.trace(fn, *args))
    strategy = tc.baselines.replicated(ana, mesh)
    rep = tc.validate(fn, args, ana, strategy, tc.jax_mesh(mesh), tc.hardware("tpu-v5e"))
    assert rep.numerics_ok
    return rep.predicted_flops / rep.compiled_flops


def unsharded_flops(fn, *args) -> tuple[float, float]:
    """(the cost model's flops of one execution, XLA's `cost_analysis()` flops), unsharded.

    A loop's control (its counter's compare and add, `cost.loop_control`) and a `TopK` custom
    call's -1 (`cost.top_k_sorts`) are counted as `validate.cpu_flops` counts them: without the
    control a minimized loop program misses by those two flops alone (seed 18 #279, a 2-step
    `scan` of `0.5 * c + x`: 2 of XLA's 4)."""
    from toast_core.cost.flops import op_flops
    from toast_core.cost.loop_control import loop_control_flops
    from toast_core.cost.simplify import flop_executions
    from toast_core.cost.top_k_sorts import top_k_call_flops

    prog = tc.trace(fn, *args)
    scale = flop_executions(prog)
    predicted = sum(op_flops(op, prog) * scale[op.index] for op in prog.ops)
    predicted += loop_control_flops(prog) + top_k_call_flops(prog)
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return predicted, cost.get("flops", 0.0)
