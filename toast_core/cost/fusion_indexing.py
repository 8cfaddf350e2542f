"""XLA's limit on code duplication inside one loop fusion (`fusion.fusion_work` applies it).

A loop fusion computes each element of its root by evaluating the fused ops at the index the
root asks for. An op read at an index its reader computes anew (a slice, a pad, a concatenate,
a broadcast: any reader whose shape differs from the value's, a transpose aside) is evaluated
once per such indexing, so a value reached through several slices is emitted several times.
XLA counts those evaluations (`FusionNodeIndexingEvaluation`) and refuses to fuse a producer
into a fusion where it would be emitted more than 15 times (`CodeDuplicationTooHigh`); the
producer is then a fusion of its own, and the cheap ops feeding it are duplicated into that new
fusion as into any other.

This is what splits an associative scan's gradient, the form JAX gives cummax, cummin, cumprod
and cumlogsumexp under `jax.grad`: the transposed scan reads each level of the forward tree
through strided slices and interior pads, the indexings multiply down the tree, and XLA:CPU
cuts the backward into many small fusions (rooted at the interior pads), each recomputing the
part of the forward tree it reads (measured: `grad(sum(sin(cumprod(x, 0))))` on x[16, 8]
computes the forward's last add and its cosine in 11 fusions; the model without the limit put
everything in 5 and predicted 0.80 of XLA's 4,992 flops).

Counting, per fusion root and op: an op's indexing users are its readers in that fusion that
compute a new index, or the indexing users of a reader of its own shape (the index passes
through an elementwise op unchanged), each distinct user counted once; the op's usage count
is the sum of its indexing users' counts, the root's being 1; emitting a producer into the
fusion costs the sum of its readers' usage counts there. Broadcasts are always fused.

A branching op (a pad, concatenate or dynamic-update-slice) is held tighter: XLA fuses it only
where it is emitted once and has one user. The transposed trees of prod's and the cumulative
ops' gradients interleave each level with pads read by two copies of the next level's ops, so
each such pad roots a fusion recomputing the forward ops it reads (measured on the minimized
fuzz programs of that class, seed 18: 2 of 26 within 5 % of XLA's flops without this, 14 with
it; `grad(sum(sin(cumlogsumexp(x, 0))))` on x[16, 8] 1.41 -> 1.04 of XLA's flops).
"""

from __future__ import annotations

from toast_core.ir.program import Program

#: XLA's `FusionNodeIndexingEvaluation::kAllowedCodeDuplication`.
ALLOWED_CODE_DUPLICATION = 15

#: Ops XLA fuses whatever the duplication (`CodeDuplicationTooHigh` exempts broadcasts).
_ALWAYS_FUSED = frozenset({"broadcast_in_dim"})

#: Ops whose elemental code opens a branch (XLA's `ElementalIrEmitter::OpInvalidatesCache`
#: lists pad, concatenate and dynamic-update-slice with reductions, reduce-windows and dots,
#: which other rules keep apart): a value computed in a branch is not reused by the next
#: evaluation, so `CodeDuplicationTooHigh` refuses to fuse one unless it is emitted once in
#: the fusion and has one user (a fusion's user being each reader of its parameter).
_BRANCHING = frozenset({"pad", "dynamic_update_slice", "concatenate"})


def _is_branching(prog: Program, op) -> bool:
    """Whether XLA emits `op` as a branching op: one of `_BRANCHING`, save the pads its
    simplifier makes slices (no positive edge or interior padding: the gradient of a slice).
    A pad of an empty value is kept, though XLA makes it a broadcast: exempting it took
    `grad(sum(sin(cumprod(x, 0))))` on x[16, 8] from 0.87 to 0.83 of XLA's flops when the
    model still counted the empty ops feeding it (not measured again since empty values are
    constants that read nothing, `fusion`)."""
    if op.primitive not in _BRANCHING:
        return False
    if op.primitive != "pad":
        return True
    return any(lo > 0 or hi > 0 or mid > 0 for lo, hi, mid in op.param("padding_config", ()))


#: Readers that reuse their operand's index although their shape differs from it.
_INDEX_REUSING = frozenset({"transpose"})


class IndexingCounts:
    """Per (op, fusion root) usage counts and indexing users, filled as `fusion_work` walks the
    ops from the last to the first (readers before producers)."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.uses = prog.uses()
        self._count: dict[tuple[int, int], int] = {}
        self._users: dict[tuple[int, int], frozenset[int]] = {}

    def _usage(self, o: int, root: int) -> tuple[int, frozenset[int]]:
        if o == root:
            return 1, frozenset((o,))
        key = (o, root)
        return self._count.get(key, 1), self._users.get(key, frozenset((o,)))

    def limit(self, op, proposed: frozenset[int], roots: list[frozenset[int]]) -> frozenset[int]:
        """`proposed` (the fusions `op` would be computed in) without those where emitting it
        would be duplicated past `ALLOWED_CODE_DUPLICATION`; `op` then roots a fusion of its
        own. Records `op`'s usage in the fusions kept."""
        kept = []
        cut = False
        branching = _is_branching(self.prog, op)
        if branching and self._users_in_fusions(op, roots) > 1:
            return frozenset((op.index,))
        for root in proposed:
            if root == op.index or root < 0:
                kept.append(root)
                continue
            emitted = 0
            users: set[int] = set()
            for r in op.results:
                shape = self.prog.values[r].shape
                for o, _ in self.uses[r]:
                    if root not in roots[o]:
                        continue
                    count, own = self._usage(o, root)
                    emitted += count
                    reader = self.prog.ops[o]
                    same = reader.primitive in _INDEX_REUSING or (
                        reader.results and self.prog.values[reader.results[0]].shape == shape
                    )
                    users |= own if same else {o}
            if (emitted > ALLOWED_CODE_DUPLICATION and op.primitive not in _ALWAYS_FUSED) or (
                emitted > 1 and branching
            ):
                cut = True
                continue
            kept.append(root)
            frozen = frozenset(users)
            self._users[(op.index, root)] = frozen
            self._count[(op.index, root)] = sum(self._usage(u, root)[0] for u in frozen)
        if cut:
            kept.append(op.index)
        return frozenset(kept)

    def _users_in_fusions(self, op, roots: list[frozenset[int]]) -> int:
        """`op`'s users as XLA's `UserCount` sees them: a reader computed in several fusions is
        a user in each."""
        return sum(len(roots[o]) or 1 for r in op.results for o, _ in self.uses[r])
