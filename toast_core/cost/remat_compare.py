"""What a plan's rematerialization buys and costs: the plan beside the same plan without remat.

A remat policy trades memory for time: the residuals it drops are no longer live across the step
(lower peak), and the forward ops that make them run again in the backward (more flops, and the
collectives those ops cause run again). `remat_comparison` prices both sides with the cost model
and attributes the difference to each remat group, so a user can see which layers recompute,
what that costs, and whether the plan would fit without it.

Both `CostReport`s carry the per-device memory timeline (`memory_timeline`: persistent inputs plus
live intermediates after each op, in program order), so the two curves can be drawn on one chart.

Worked example: GPT-2 small (S=1024, bf16, batch 8) on one tpu-v5e, replicated: without remat
the peak is 17.7 GiB, over the 14.4 GiB usable; `remat[blocks]=full` (12 layers) keeps one
[B, S, D] value per layer and recomputes the rest in the backward: peak 8.4 GiB (fits), step
96 -> 117 ms, recompute 14 % of the flops. `dots` keeps the matmul outputs: peak 11.7 GiB, only
0.4 % more flops but +10 ms, as the recomputed elementwise ops are bound by HBM bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from toast_core.analysis import Analysis
from toast_core.cost.model import CostOptions, CostReport, evaluator
from toast_core.errors import ToastError, bad_value
from toast_core.mesh import HardwareSpec, MeshSpec
from toast_core.strategy import Strategy
from toast_core.strategy.remat import POLICIES, remat_space


@dataclass(frozen=True)
class RematGroupCost:
    """One remat group under a plan: its policy, its layers, what it recomputes and drops, and
    what it changes against the same plan with this group alone at `none`."""

    group: str
    policy: str  # none | dots | full
    layers: tuple[str, ...]  # `blocks[0]`, `blocks[1]`, ... (a non-repeated block: its name)
    recompute_ops: int  # forward ops run again in the backward (all layers of the group)
    recompute_flops_per_device: float  # flops of the recomputed ops that also run forward
    dropped_bytes_per_device: float  # residuals no longer kept across the step (all layers)
    step_time_delta_s: float  # plan minus (plan with this group at `none`); >= 0 usually
    peak_delta_bytes: float  # plan minus (plan with this group at `none`); <= 0 usually


@dataclass(frozen=True)
class RematComparison:
    """A plan with its remat policies (`with_remat`) and without any (`without_remat`), and one
    row per remat group of the program (`groups`; groups the plan leaves at `none` included,
    with zero deltas, so the user sees what could be recomputed)."""

    with_remat: CostReport
    without_remat: CostReport
    groups: tuple[RematGroupCost, ...]

    @property
    def step_time_delta_s(self) -> float:
        return self.with_remat.step_time_s - self.without_remat.step_time_s

    @property
    def peak_delta_bytes(self) -> float:
        return self.with_remat.peak_bytes - self.without_remat.peak_bytes

    @property
    def recompute_flops_fraction(self) -> float:
        """Recomputed flops over the plan's flops per device (recomputation included)."""
        r = self.with_remat
        return r.recompute_flops_per_device / r.flops_per_device if r.flops_per_device else 0.0


def remat_comparison(
    ana: Analysis,
    strategy: Strategy,
    mesh: MeshSpec,
    hw: HardwareSpec | str,
    options: CostOptions | None = None,
) -> RematComparison:
    """Prices `strategy` with and without its remat policies, and each remat group's share (one
    cost report per group the plan recomputes, plus two)."""
    if not isinstance(strategy, Strategy):
        raise ToastError(bad_value("strategy", strategy, "a tc.Strategy"))
    ev = evaluator(ana, mesh, hw, options)
    with_remat = ev.report(strategy)
    plain = strategy.with_remat(ana, None)
    without = ev.report(plain) if strategy.remat else with_remat
    masks = strategy.fine_masks(ana, mesh)
    _, value_local, op_logdeg = ev._local(masks)
    flops_local = ev._compute(value_local, op_logdeg, ev._read_extra(masks, value_local))[0]
    space = remat_space(ana)
    rows = []
    for group in space.groups:
        policy = strategy.remat_policy(group.name)
        effect = group.effects[POLICIES.index(policy)]
        if policy == "none":
            step_delta = peak_delta = 0.0
        else:
            rest = {g: p for g, p in strategy.remat if g != group.name}
            alone = ev.report(strategy.with_remat(ana, rest))
            step_delta = with_remat.step_time_s - alone.step_time_s
            peak_delta = with_remat.peak_bytes - alone.peak_bytes
        rows.append(
            RematGroupCost(
                group.name,
                policy,
                group.layers,
                len(effect.recompute_ops),
                float(flops_local[effect.twice_ops].sum()),
                float(value_local[effect.values].sum()),
                step_delta,
                peak_delta,
            )
        )
    return RematComparison(with_remat, without, tuple(rows))


def remat_groups(ana: Analysis) -> tuple[str, ...]:
    """Names of the program's remat groups (what `remat[...]` pins may name), largest first;
    empty for a program without a backward part."""
    return remat_space(ana).names
