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

from itertools import repeat

from toast_core.ir import primitives as prim
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
    ops from the last to the first (readers before producers).

    Kept per op as tables over its fusion roots, filled in bulk: a large model's cheap ops are
    computed in up to ~1,400 fusions each (GPT-3 175B: the residual stream's [B, S, D] ops,
    read by later layers' fusions and the gradient's), 1.9 M (op, fusion) pairs in all, which
    a walk fusion by fusion took 4.9 s CPU over. In most of those pairs one reader of the op is
    in the fusion, and the op inherits its count (`_inherit`, or `_share` when the reader's
    table fits whole: a reader's count is already the sum over its users); only fusions where
    several readers meet are walked (`_merge`, 57 K of the pairs there), and only where their
    user sets overlap is a sum over users needed."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.uses = prog.uses()
        # Per op: its usage count and indexing users in each fusion it was kept in (a fusion
        # it is missing from counts 1, the op its own user, as does the fusion it roots).
        self._count: dict[int, dict[int, int]] = {}
        self._users: dict[int, dict[int, frozenset[int]]] = {}

    def _usage(self, o: int, root: int) -> tuple[int, frozenset[int]]:
        if o == root:
            return 1, frozenset((o,))
        count, users = self._count.get(o), self._users.get(o)
        return (
            1 if count is None else count.get(root, 1),
            frozenset((o,)) if users is None else users.get(root, frozenset((o,))),
        )

    def limit(self, op, proposed: frozenset[int], roots: list[frozenset[int]]) -> frozenset[int]:
        """`proposed` (the fusions `op` would be computed in) without those where emitting it
        would be duplicated past `ALLOWED_CODE_DUPLICATION`; `op` then roots a fusion of its
        own. Records `op`'s usage in the fusions kept.

        In each fusion, `op` is emitted once per evaluation of each reader there (the sum of
        their counts); its indexing users are each reader's own (a reader of its shape) or
        the reader itself, and its count the sum of its users' counts (none in a fusion
        without a reader of it)."""
        branching = _is_branching(self.prog, op)
        if branching and self._users_in_fusions(op, roots) > 1:
            return self._first_into_reductions(op, roots)
        wanted = proposed - {op.index}
        if wanted and min(wanted) < 0:  # placeholder fusions: no usage recorded
            wanted = frozenset(root for root in wanted if root >= 0)
        if not wanted:
            return proposed
        cap = 1 if branching else ALLOWED_CODE_DUPLICATION
        if op.primitive in _ALWAYS_FUSED and not branching:
            cap = None
        readers = self._readers(op, roots)
        if len(readers) == 1 and self._share(op.index, readers, wanted, cap):
            return proposed
        counts: dict[int, int] = {}
        held: dict[int, frozenset[int]] = {}
        cut: set[int] = set()
        seen: set[int] = set()
        shared: set[int] = set()
        reading = [wanted & roots[o] for o, _ in readers]
        for fusions in reading:
            shared |= seen & fusions
            seen |= fusions
        for ((o, same), times), fusions in zip(readers.items(), reading):
            alone = fusions - shared if shared else fusions
            self._inherit(o, same, times, alone, cap, counts, held, cut)
        if shared:
            self._merge(readers, shared, roots, cap, counts, held, cut)
        for root in wanted - seen:
            counts[root] = 0
            held[root] = frozenset()
        self._count[op.index], self._users[op.index] = counts, held
        if not cut:
            return proposed
        return frozenset(root for root in proposed if root not in cut) | {op.index}

    def _readers(self, op, roots: list[frozenset[int]]) -> dict[tuple[int, bool], int]:
        """`op`'s readers computed in some fusion, each with whether it reads at its own index
        (a reader of `op`'s shape or an index-reusing one), and how many times it reads."""
        out: dict[tuple[int, bool], int] = {}
        for r in op.results:
            shape = self.prog.values[r].shape
            for o, _ in self.uses[r]:
                if not roots[o]:
                    continue
                reader = self.prog.ops[o]
                same = reader.primitive in _INDEX_REUSING or bool(
                    reader.results and self.prog.values[reader.results[0]].shape == shape
                )
                out[(o, same)] = out.get((o, same), 0) + 1
        return out

    def _share(self, i, readers, wanted, cap) -> bool:
        """Whether op `i`, read by one reader in exactly the fusions that reader has counts in
        and nowhere past `cap`, took that reader's tables: its counts, and its users too when
        it reads at its own index. Shared, not copied (no table changes once made): an
        elementwise chain's ops hold one table (GPT-3 175B: 0.2 s of the 0.8 s left here)."""
        (((o, same), times),) = readers.items()
        count = self._count.get(o)
        if count is None or count.keys() != wanted:
            return False
        if cap is not None and times * max(count.values()) > cap:
            return False
        self._count[i] = count
        self._users[i] = self._users[o] if same else dict.fromkeys(wanted, frozenset((o,)))
        return True

    def _inherit(self, o, same, times, fusions, cap, counts, held, cut) -> None:
        """The usage, in `fusions` where reader `o` alone reads the op (`times` times), of the
        op: `o`'s count (itself the sum of its users' counts) and `o`'s own users (or `o`), or
        `fusions` where that is emitted more than `cap` times added to `cut`. One pass over
        the fusions: no sum over users is needed."""
        if not fusions:
            return
        count, users = self._count.get(o), self._users.get(o)
        own = frozenset((o,))
        # zip/map rather than comprehensions: these run over 1.9 M (op, fusion) pairs at GPT-3.
        if count is None:
            got = dict.fromkeys(fusions, 1)
        else:
            got = dict(zip(fusions, map(count.get, fusions, repeat(1))))
        if cap is not None and times * max(got.values()) > cap:
            over = {root for root, c in got.items() if times * c > cap}
            cut |= over
            got = {root: c for root, c in got.items() if root not in over}
        counts.update(got)
        if same and users is not None:
            held.update(zip(got, map(users.get, got, repeat(own))))
        else:
            held.update(dict.fromkeys(got, own))

    def _merge(self, readers, fusions, roots, cap, counts, held, cut) -> None:
        """`_inherit` for `fusions` where several readers meet, fusion by fusion: where their
        user sets are disjoint, the count is the sum of the readers' counts."""
        table = []
        for (o, same), times in readers.items():
            users = self._users.get(o) if same else None
            table.append((roots[o], self._count.get(o), users, frozenset((o,)), times))
        for root in fusions:
            emitted = total = 0
            sets = []
            for reading, count, users, own, times in table:
                if root not in reading:
                    continue
                c = 1 if count is None else count.get(root, 1)
                emitted += times * c
                total += c
                sets.append(own if users is None else users.get(root, own))
            if cap is not None and emitted > cap:
                cut.add(root)
                continue
            union = frozenset().union(*sets)
            if len(union) != sum(map(len, sets)):
                total = sum(self._usage(u, root)[0] for u in union)
            counts[root] = total
            held[root] = union

    def _first_into_reductions(self, op, roots: list[frozenset[int]]) -> frozenset[int]:
        """The fusions of a branching `op` read several times: its own, and those of the
        reductions reading it that root a fusion of their own. XLA:CPU asks
        `CodeDuplicationTooHigh` only of a consumer that is a fusion already; a reduction is a
        plain instruction when its first producer is fused (its other operand, the init
        constant, is never fused alone), so `op` goes into it (measured: `var(pad(digamma(x *
        x + 1)), axis=0)` computes the pad stored and again inside the mean's reduction, with
        digamma's cheap part in both; fuzz seed 19 #829, 0.74 of XLA's flops counted once).
        Read by such reductions only, it is in theirs alone (`sum(p, 0) + sum(p, 1)[:, None]
        + max(p, 0)` on a pad: three fusions, each with the pad)."""
        readers = {o for r in op.results for o, _ in self.uses[r]}
        into = frozenset(
            o
            for o in readers
            if roots[o] == frozenset((o,)) and self.prog.ops[o].primitive in prim.FUSED_REDUCTIONS
        )
        if into == readers:  # all fused: nothing else reads it, XLA removes it
            return into
        return into | {op.index}

    def _users_in_fusions(self, op, roots: list[frozenset[int]]) -> int:
        """`op`'s users as XLA's `UserCount` sees them: a reader computed in several fusions is
        a user in each."""
        return sum(len(roots[o]) or 1 for r in op.results for o, _ in self.uses[r])
