"""One op under a strategy: what each device holds, which sharding case it is, what it costs.

The scaling book explains a sharded matmul by its case: with `A[I, J] @ B[J, K]`,

* **replicated** - no dim sharded: every device does the whole product;
* **batch-sharded** - only free dims (I, K, batch dims) sharded, e.g. `A[I_data, J] @ B[J, K]`:
  each device multiplies its own block, no communication;
* **contracting-sharded** - J sharded on both operands, `A[I, J_model] @ B[J_model, K]`: each
  device holds a partial sum of the whole result, reduced over `model` (all-reduce or
  reduce-scatter);
* **both** - free dims and J sharded: a block of partial sums, reduced over J's mesh axes.

`op_view` says which case an op is, for every op, not only matmuls: a dim of an operand that does
not reach the result (a contracting dim, a reduced dim) is reduced by the op, and sharding it
leaves partial sums. It reads the operand *uses* (what the op sees after any resharding at a cut),
the result values, the report's per-op flops and bytes and the collectives the cost model
attributes to the op.

    view = op_view(ana, strategy, mesh, report, 42)
    view.case, view.operands   # "contracting-sharded", ("x[N0, N1_model]", "w[N1_model, N2]")
"""

from __future__ import annotations

from dataclasses import dataclass

from toast_core.analysis import Analysis
from toast_core.cost.model import Collective, CostReport
from toast_core.errors import ToastError, bad_value
from toast_core.ir.primitives import REDUCTIONS
from toast_core.mesh import MeshSpec
from toast_core.strategy import Strategy, space_of

#: Primitives that reduce the dims of their operands absent from their result.
REDUCING = REDUCTIONS | {"dot_general", "conv_general_dilated", "argmax", "argmin"}

CASES = (
    "replicated",
    "batch-sharded",
    "contracting-sharded",
    "both",
    "sharded",  # an op that reduces nothing, some dims sharded
)


@dataclass(frozen=True)
class OpView:
    """One op of the program under a strategy (see module doc)."""

    op: int
    primitive: str
    where: str
    operands: tuple[str, ...]  # each operand use in scaling-book notation, `x[N0_data, N1]`
    results: tuple[str, ...]
    case: str  # one of CASES
    explanation: str  # the case in a sentence, with the mesh axes
    reduced_axes: tuple[str, ...]  # mesh axes of the sharded dims the op reduces (partial sums)
    flops_per_device: float
    bytes_per_device: float
    compute_s: float
    collectives: tuple[Collective, ...]

    @property
    def comm_s(self) -> float:
        return sum(c.time_s * c.count for c in self.collectives)


def op_view(
    ana: Analysis, strategy: Strategy, mesh: MeshSpec, report: CostReport, op: int
) -> OpView:
    """The view of op `op` (its index in `ana.program.ops`) under `strategy`; `report` must be
    the strategy's cost report on `mesh` (it carries the per-op costs and the collectives)."""
    prog = ana.program
    if not isinstance(op, int) or not 0 <= op < len(prog.ops):
        raise ToastError(bad_value("op", op, f"an op index in 0..{len(prog.ops) - 1}"))
    if len(report.op_costs) != len(prog.ops):
        raise ToastError(
            bad_value(
                "report", f"{len(report.op_costs)} op costs", f"{len(prog.ops)} (this program)"
            )
        )
    space = space_of(ana, mesh)
    masks = space.masks_of(strategy.shardings, strategy.options)
    res = strategy.resolution(ana)
    o = prog.ops[op]
    lay = space.layout

    def text(vid: int, dims) -> str:
        v = prog.values[vid]
        parts = []
        for fines, size in zip(dims, v.shape):
            if not fines:
                parts.append(str(size))
                continue
            sub = []
            for f in fines:
                axes = space.axes.names_of(int(masks[f]))
                nm = res.dims[int(res.fine_to_dim[f])].name
                sub.append(nm + ("_" + "_".join(axes) if axes else ""))
            parts.append("*".join(sub))
        return f"{v.name}[{', '.join(parts)}]"

    use_dims = [lay.use_dim_fine.get((op, p)) for p in range(len(o.operands))]
    operands = tuple(
        text(vid, dims if dims is not None else lay.value_dim_fine[vid])
        for vid, dims in zip(o.operands, use_dims)
    )
    results = tuple(text(vid, lay.value_dim_fine[vid]) for vid in o.results)
    result_fines = {f for vid in o.results for d in lay.value_dim_fine[vid] for f in d}
    operand_fines = {f for dims in use_dims if dims for d in dims for f in d}
    sharded = {f for f in operand_fines | result_fines if int(masks[f])}
    reduced = (
        sorted(f for f in operand_fines - result_fines if int(masks[f]))
        if o.primitive in REDUCING
        else []
    )
    reduced_axes = tuple(
        a for a in mesh.axis_names if any(a in space.axes.names_of(int(masks[f])) for f in reduced)
    )
    free_axes = tuple(
        a
        for a in mesh.axis_names
        if any(a in space.axes.names_of(int(masks[f])) for f in sharded - set(reduced))
    )
    case, why = _case(o.primitive, bool(sharded), free_axes, reduced_axes)
    cost = report.op_costs[op]
    return OpView(
        op=op,
        primitive=o.primitive,
        where=o.where(),
        operands=operands,
        results=results,
        case=case,
        explanation=why,
        reduced_axes=reduced_axes,
        flops_per_device=cost.flops,
        bytes_per_device=cost.bytes,
        compute_s=cost.time_s,
        collectives=tuple(c for c in report.collectives if c.op == op),
    )


def _case(primitive: str, any_sharded: bool, free_axes, reduced_axes) -> tuple[str, str]:
    def on(axes) -> str:
        return "+".join(axes)

    if not any_sharded:
        return "replicated", "No dim sharded: every device computes the whole op."
    reduces = primitive in REDUCING
    if reduced_axes and free_axes:
        return "both", (
            f"Free dims sharded on {on(free_axes)} and a reduced dim on {on(reduced_axes)}: each "
            f"device holds partial sums of its block, summed over {on(reduced_axes)}."
        )
    if reduced_axes:
        return "contracting-sharded", (
            f"A dim the op reduces is sharded on {on(reduced_axes)}: each device holds partial "
            f"sums of the whole result, summed over {on(reduced_axes)} (all-reduce or "
            "reduce-scatter)."
        )
    if reduces:
        return "batch-sharded", (
            f"Only free dims sharded (on {on(free_axes)}), no reduced dim: each device computes "
            "its own block, no communication for the op itself."
        )
    return "sharded", (
        f"Dims sharded on {on(free_axes)}: each device computes its block of the "
        f"{primitive} result."
    )


def costliest_ops(report: CostReport, n: int = 20) -> tuple[int, ...]:
    """Indices of the `n` ops with the largest compute plus communication time."""
    if n < 0:
        raise ToastError(bad_value("n", n, "a count >= 0"))
    comm = [0.0] * len(report.op_costs)
    for c in report.collectives:
        if 0 <= c.op < len(comm):
            comm[c.op] += c.time_s * c.count
    order = sorted(
        range(len(report.op_costs)), key=lambda i: -(report.op_costs[i].time_s + comm[i])
    )
    return tuple(order[:n])
