"""Collectives as XLA emits them: its combiner passes merge independent collectives into one op.

The cost model finds one collective per partial sum, cut or replicate factor; XLA then runs
combiner passes over the partitioned program (openxla/xla `xla/service/all_reduce_combiner.cc`,
`all_gather_combiner.cc`, `reduce_scatter_combiner.cc`, all driven by `CombineInstructionsByKey` in
`xla/service/collective_combiner_utils.h`) that merge collectives into one op with a tuple
operand, so the fixed latency (alpha) is paid once per combined op instead of once per tensor.
A data-parallel train step's 15 gradient all-reduces compile into ONE all-reduce of a 15-tuple.

The rule, per computation (a loop body is its own computation), as `CombineInstructionsByKey`
applies it:

1. Collectives are keyed: same kind, same replica groups (here: same mesh axes), same element
   type and reduction computation (`xla/service/all_reduce_key.cc`: reduction opcode, element
   type, domain, channel id, global device ids, replica groups). Only equal keys merge.
2. Walking the computation in post order, the first collective not yet placed opens a group of
   its key; each later collective of that key joins it unless (a) its result alone is over the
   byte threshold (it stays alone and the group stays open), (b) the group's result bytes plus
   its own would exceed the threshold, (c) it is reachable from (data-dependent on) a member, or
   (d) the group already has `combine_threshold_count` (256) members. On (b), (c) or (d) the group
   is closed and the collective opens the next group of its key.
3. Bytes are the collective's result shape (`ShapeUtil::ByteSizeOf(instruction->shape())`).

Thresholds differ per backend (`HardwareSpec.combine_threshold_bytes`): GPU and (by default
assumption) TPU combine all-reduce, all-gather and reduce-scatter up to 30 MiB + 7; the CPU
compiler combines only all-reduces, without a byte limit (`XLA_CPU_COMBINE`).

Dependence. Our program order is a topological order like XLA's post order. A collective sits at
a *site*: on the result of an op (a partial sum, reduced before any use reads it) or on one use
(a value resharded before one op reads it). `site_inputs` gives, per site, the set of sites whose
output its input transitively depends on (a bitset over sites), computed once per program. This
is conservative in one way and optimistic in another, both measured against XLA on the zoo (see
bench/collective_ops.py): XLA may see fewer dependences (the partitioner can reorder), and
combining one group adds dependences that can split a later group (not modelled).

Worked example: a 2-layer MLP train step under data parallel has 3 gradient all-reduces over
`data` (two weight gradients and a bias gradient), none reading another's output: one combined
all-reduce of a 3-tuple, paying `2 * (n - 1) * alpha` once, plus each member's bandwidth term.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from toast_core.errors import ToastError, bad_value

__all__ = [
    "COMBINE_COUNT",
    "CombinedOp",
    "combine",
    "post_order",
    "region_of_ops",
    "site_inputs",
]

#: `combine_threshold_count` of every combiner in XLA's CPU and GPU pipelines
#: (xla/service/cpu/cpu_compiler.cc `kCombineCount = 256`; xla/service/gpu/gpu_compiler.cc).
COMBINE_COUNT = 256


@dataclass(frozen=True, slots=True)
class CombinedOp:
    """One collective op as XLA emits it after combining: its members are indices into
    `CostReport.collectives` (a single member when nothing merged with it)."""

    kind: str
    mesh_axes: tuple[str, ...]
    members: tuple[int, ...]
    bytes: float  # sum of the members' V (full buffers on the mesh axes)
    result_bytes: float  # sum of the members' per-device results: the tuple XLA shows
    time_s: float  # alpha once plus every member's bandwidth term
    count: int = 1  # executions per step (loop trip count)


def region_of_ops(primitives: Sequence[str], depths: Sequence[int]) -> list[int]:
    """Index of the innermost region start op (`scan_start`, `while_start`, `cond_start`) around
    each op, -1 at top level: the computation XLA puts it in (combiners work per computation).
    A `*_start` / `*_end` op itself belongs to the enclosing computation.

    `depths[i]` is op i's `region_depth`. The depth, not a stack of starts and ends, tells which
    start an op belongs to: the tracer opens a cond with one `cond_start` per branch and closes
    all of them with a single `cond_end`, so the next branch's start replaces the previous one at
    its depth (a nested cond inside a branch is closed before the next branch opens).
    """
    if len(depths) != len(primitives):
        raise ToastError(bad_value("depths", len(depths), f"{len(primitives)} entries"))
    open_at: list[int] = []  # open_at[d]: the start op of the computation at depth d + 1
    out = []
    for index, (primitive, depth) in enumerate(zip(primitives, depths)):
        out.append(open_at[depth - 1] if depth > 0 else -1)
        if primitive.endswith("_start"):
            del open_at[depth:]
            open_at.append(index)
    return out


def post_order(
    operands: Sequence[Sequence[int]],
    results: Sequence[Sequence[int]],
    outputs: Sequence[int],
) -> list[int]:
    """Rank of every op in the post order XLA's combiners walk (`MakeInstructionPostOrder`): a
    depth-first search from the outputs in order, each op after its operands' producers, in
    operand order; ops no output needs come last, in program order.

    The rank decides which independent collectives end up next to each other: in a train step,
    the loss's partial sums come after the whole backward pass in this order, not before it as
    in program order, and they combine with the backward pass's last ones.
    """
    producer: dict[int, int] = {}
    for op, values in enumerate(results):
        for value in values:
            producer[value] = op
    rank = [-1] * len(operands)
    next_rank = 0
    visited = [False] * len(operands)
    for root in outputs:
        start = producer.get(root)
        if start is None or visited[start]:
            continue
        visited[start] = True
        stack = [(start, 0)]
        while stack:
            op, k = stack[-1]
            if k < len(operands[op]):
                stack[-1] = (op, k + 1)
                child = producer.get(operands[op][k])
                if child is not None and not visited[child]:
                    visited[child] = True
                    stack.append((child, 0))
                continue
            stack.pop()
            rank[op] = next_rank
            next_rank += 1
    for op in range(len(operands)):
        if rank[op] < 0:
            rank[op] = next_rank
            next_rank += 1
    return rank


def site_inputs(
    operands: Sequence[Sequence[int]],
    results: Sequence[Sequence[int]],
    sites: Sequence[tuple[str, int, int]],
) -> list[int]:
    """Per site, the bitset (a Python int, bit k = site k) of sites its input depends on.

    `operands[o]` / `results[o]` are op o's value ids in program (topological) order. A site is
    `("result", op, value)`: a collective on `value` right after `op` produces it (it reads the
    unreduced result, every use reads its output); or `("use", op, value)`: a collective on
    `value` before `op` reads it (its output feeds only `op`). Sites on the same (op, value)
    should be one site: their collectives then never merge (they run one after the other).
    """
    use_bits: dict[tuple[int, int], int] = {}
    result_bits: dict[int, int] = {}
    for k, (where, op, value) in enumerate(sites):
        if where == "use":
            use_bits[(op, value)] = use_bits.get((op, value), 0) | 1 << k
        elif where == "result":
            result_bits[value] = result_bits.get(value, 0) | 1 << k
        else:
            raise ToastError(bad_value("sites", (where, op, value), "('result'|'use', op, value)"))
    wanted_op = {op for where, op, _ in sites if where == "result"}
    wanted_use = {(op, value) for where, op, value in sites if where == "use"}
    last_use: dict[int, int] = {}
    for op, values in enumerate(operands):
        for value in values:
            last_use[value] = op
    reach: dict[int, int] = {}  # value -> sites its (reduced) value depends on; freed when dead
    op_reach: dict[int, int] = {}
    use_reach: dict[tuple[int, int], int] = {}
    for op, (ins, outs) in enumerate(zip(operands, results)):
        bits = 0
        for value in ins:
            before = reach.get(value, 0)
            if (op, value) in wanted_use:
                use_reach[(op, value)] = before
            bits |= before | use_bits.get((op, value), 0)
        if op in wanted_op:
            op_reach[op] = bits
        for value in outs:
            reach[value] = bits | result_bits.get(value, 0)
        for value in ins:
            if last_use.get(value) == op:
                reach.pop(value, None)
    return [
        op_reach.get(op, 0) if where == "result" else use_reach.get((op, value), 0)
        for where, op, value in sites
    ]


def combine(
    kinds: Sequence[Hashable],
    keys: Sequence[Hashable],
    result_bytes: Sequence[float],
    order: Sequence[int] | None,
    sites: Sequence[int],
    inputs: Sequence[int],
    thresholds: Mapping[Hashable, float],
    max_count: int = COMBINE_COUNT,
) -> list[int]:
    """Combined-op id of every collective: the index of the first member of its group.

    Collective i has kind `kinds[i]` (a name or code), combiner key `keys[i]` (equal keys may
    merge; the caller puts kind, mesh axes, element type, reduction and computation in it),
    per-device result size `result_bytes[i]`, position `order[i]` in XLA's post order (ties keep
    list order; None: the list is in that order already), and site `sites[i]`; `inputs[s]` is
    the bitset of sites site s depends on (`site_inputs`). A kind missing from `thresholds` (or
    at 0) never combines. Implements the module essay's rule; it is on the search's hot path.
    """
    n = len(kinds)
    if not all(len(x) == n for x in (keys, result_bytes, sites)) or (
        order is not None and len(order) != n
    ):
        raise ToastError(bad_value("kinds", n, "as many entries as keys, bytes, order and sites"))
    group = list(range(n))
    walk = range(n) if order is None else sorted(range(n), key=lambda j: (order[j], j))
    open_groups: dict[Hashable, list] = {}  # key -> [id, bytes, count, site bits, threshold]
    get = open_groups.get
    for i in walk:
        size = result_bytes[i]
        site = sites[i]
        current = get(keys[i])
        if current is not None:
            if (
                current[1] + size <= current[4]
                and current[2] < max_count
                and not (inputs[site] | 1 << site) & current[3]
            ):
                group[i] = current[0]
                current[1] += size
                current[2] += 1
                current[3] |= 1 << site
                continue
            if size <= current[4]:
                open_groups[keys[i]] = [i, size, 1, 1 << site, current[4]]
            continue
        threshold = thresholds.get(kinds[i], 0.0)
        if 0 < threshold and size <= threshold:
            open_groups[keys[i]] = [i, size, 1, 1 << site, threshold]
    return group
