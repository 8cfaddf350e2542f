"""XLA-style loop fusion, as far as the cost model needs it.

XLA fuses chains of elementwise and layout ops into loops, so only some values touch HBM (they are
*materialized*), and a cheap producer read by several fusions is fused into each of them and
computed once per fusion: the compiled program executes more elementwise flops than the jaxpr has.
On a GPT train step that duplication is a third of the non-matmul flops `cost_analysis()` counts
(the backward fusions recompute the forward's bias adds, GELU and layer-norm terms), and more of the
per-device flops once the matmuls are sharded and those replicated terms are not.

Expensive producers (most transcendentals, divisions, reductions) are never duplicated: XLA keeps
one copy and reads its result.
"""

from __future__ import annotations

from toast_core.ir import primitives as prim
from toast_core.ir.program import Program

#: Reductions XLA fuses with the elementwise ops feeding them (as fusion roots).
_REDUCTIONS = prim.FUSED_REDUCTIONS | prim.ARG_REDUCTIONS

#: Ops XLA fuses into loops: elementwise maps, layout changes, and reductions.
FUSIBLE = prim.ELEMENTWISE | prim.FUSIBLE_LAYOUT | _REDUCTIONS

#: Fusible ops XLA computes once even when several fusions read them (measured: exp, log, tanh,
#: sqrt, logistic, divisions... are kept once; sin, cos and tan are duplicated like cheap ops).
NOT_DUPLICATED = (
    (prim.TRANSCENDENTAL - prim.DUPLICATED_TRANSCENDENTAL)
    | prim.EXPANDED_TRANSCENDENTAL
    | {"div"}
    | _REDUCTIONS
)


def materialized(prog: Program) -> list[bool]:
    """Whether each value is written to and read from HBM: a value made by a fusible op and read
    only by fusible ops stays in registers. Program inputs and outputs, and values a non-fusible op
    makes or reads, are materialized."""
    producers = prog.producers()
    uses = prog.uses()
    outputs = set(prog.outputs)  # of the program as given (a `simplify.rewired` one too)
    out = []
    for v in prog.values:
        p = producers[v.id]
        if p is None or v.id in outputs or prog.ops[p].primitive not in FUSIBLE:
            out.append(True)
            continue
        out.append(
            not uses[v.id] or any(prog.ops[o].primitive not in FUSIBLE for o, _ in uses[v.id])
        )
    return out


def fusion_copies(prog: Program, is_materialized: list[bool]) -> list[int]:
    """How many times each op is computed: once per fusion that contains it.

    An op whose result is materialized, or that XLA does not duplicate, is the root of its own
    fusion; any other op is fused into the fusions of all its readers. Walking the (topologically
    ordered) ops backwards, each op's set of fusion roots is the union of its readers' sets.
    """
    uses = prog.uses()
    roots: list[frozenset[int]] = [frozenset()] * len(prog.ops)
    for op in reversed(prog.ops):
        own = (
            op.primitive not in FUSIBLE
            or op.primitive in NOT_DUPLICATED
            or any(is_materialized[r] for r in op.results)
        )
        readers = frozenset().union(*(roots[o] for r in op.results for o, _ in uses[r]))
        roots[op.index] = frozenset((op.index,)) if own or not readers else readers
    return [len(r) for r in roots]


def fused_away(prog: Program, is_materialized: list[bool]) -> list[bool]:
    """Whether each value never exists as a buffer: XLA fuses its producer into every reader,
    which recomputes it from smaller operands. The causal mask `where(tril(ones(S, S))[None,
    None], scores, -inf)` broadcast to [B, H, S, S] is one: no [B, H, S, S] predicate is ever
    allocated, forward or backward, only the [S, S] one (measured with `memory_analysis()`;
    tests/test_memory_fusion.py). Only such expansions (broadcasts, iota masks, upcasts: a
    value larger than what it is recomputed from) count: a fused same-size elementwise value
    trades its buffer for its operands' longer lives, and XLA keeps many of those anyway (a
    producer read by several fusions is often computed once). An op XLA does not duplicate
    (exp, tanh, a reduction) roots its own fusion, so its result is a buffer."""
    source_bytes = [0.0] * len(prog.values)  # bytes a fused value is recomputed from
    out = [False] * len(prog.values)
    for op in prog.ops:
        if op.primitive not in FUSIBLE or op.primitive in NOT_DUPLICATED:
            continue
        src = sum(source_bytes[x] if out[x] else prog.values[x].nbytes for x in op.operands)
        for r in op.results:
            if not is_materialized[r] and src < prog.values[r].nbytes:
                out[r], source_bytes[r] = True, src
    return out
